//! `rserve convert GGUF OUT_DIR`: write a GGUF model as a Hugging Face style folder (the engine does the work).

use anyhow::Context;

use crate::cli::ConvertArgs;

pub fn run(args: ConvertArgs) -> anyhow::Result<()> {
    let dtype = args.candle_dtype()?;
    rserve_engine::convert::gguf_to_hf_dir(&args.gguf, &args.out_dir, dtype)
        .with_context(|| format!("converting {}", args.gguf.display()))?;
    tracing::info!("Wrote {} as {:?} to {}", args.gguf.display(), dtype, args.out_dir.display());
    Ok(())
}
