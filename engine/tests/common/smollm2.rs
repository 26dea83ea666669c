//! SmolLM2-135M (the test model) loaded as the engine's tests run it: resolved from its GGUF file, weights in f32.

use candle_core::DType;
use rserve_engine::config::ModelParams;
use rserve_engine::source::{resolve_model, ResolveOptions};
use rserve_engine::weights::Weights;

/// The model's parameters and its weights dequantized to f32.
pub fn load_f32() -> (ModelParams, Weights) {
    let path = rserve_tests::smollm2_gguf();
    let resolved =
        resolve_model(path.to_str().unwrap(), &ResolveOptions::with_cache_dir(std::env::temp_dir())).unwrap();
    let params = resolved.load_params().unwrap();
    let weights = rserve_engine::weights::load(&resolved, &params, DType::F32).unwrap();
    (params, weights)
}
