//! gpt-oss checkpoints pack each layer's routed experts into four tensors under `model.layers.{l}.mlp.experts.`:
//! `gate_up_proj` `[experts, hidden, 2 * width]` (input-major, the gate and up columns interleaved),
//! `gate_up_proj_bias` `[experts, 2 * width]` (interleaved too), `down_proj` `[experts, width, hidden]` and
//! `down_proj_bias` `[experts, hidden]`. OpenAI's release stores the two matrices as MXFP4 instead, already
//! output-major: `{gate_up,down}_proj_blocks` `[experts, out, in / 32, 16]` (u8, two 4-bit e2m1 values a byte, the
//! low nibble first) with `*_scales` `[experts, out, in / 32]` (u8, a power-of-two exponent biased by 127 for each
//! 32 values). Either form is unpacked here, in f32, into the per-expert tensors the model reads (`names::moe_names`:
//! `experts.{e}.{gate,up,down}_proj.{weight,bias}`, matrices `[out, in]`, gate and up rows apart), so sharding,
//! stacking and upload treat gpt-oss like any other mixture of experts. The packed 4-bit form is not kept on the
//! device: every backend multiplies 16-bit or f32 weights.

use candle_core::{DType, Device, Tensor};

use crate::config::ModelParams;
use crate::weights::names::moe_names;
use crate::{ModelError, Result};

/// The e2m1 values of the 16 4-bit codes (sign bit high).
const FP4_VALUES: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// Values per MXFP4 scale (16 bytes of blocks).
const BLOCK: usize = 32;

/// Whether `name` (an expected tensor) is one of the per-expert tensors unpacked here rather than read by name.
pub fn is_unpacked(params: &ModelParams, name: &str) -> bool {
    params.architecture == crate::config::Architecture::GptOss && name.contains(".mlp.experts.")
}

/// The packed tensors of layer `layer` as the checkpoint names them (for error messages and shape checks).
fn packed(layer: usize, what: &str) -> String {
    format!("model.layers.{layer}.mlp.experts.{what}")
}

/// Reads the checkpoint tensor `name`, if the checkpoint has it.
pub type Reader<'a> = dyn Fn(&str) -> Result<Option<Tensor>> + 'a;

/// Layer `layer`'s experts for which `want(e)` holds, unpacked into their per-expert names (f32).
pub fn unpack_layer(
    read: &Reader<'_>,
    params: &ModelParams,
    layer: usize,
    want: &dyn Fn(usize) -> bool,
) -> Result<Vec<(String, Tensor)>> {
    let m = params.moe.as_ref().ok_or_else(|| ModelError::Weights("gpt-oss experts without a MoE config".into()))?;
    let (experts, h, w) = (m.num_experts, params.hidden_size, m.expert_intermediate);
    let need = |what: &str| -> Result<Tensor> {
        read(&packed(layer, what))?
            .ok_or_else(|| ModelError::Weights(format!("the checkpoint has no tensor `{}`", packed(layer, what))))
    };
    // [experts, out, in] f32, output-major.
    let matrix = |what: &str, out: usize, inp: usize| -> Result<Tensor> {
        match read(&packed(layer, &format!("{what}_blocks")))? {
            Some(blocks) => {
                dequantize(&blocks, &need(&format!("{what}_scales"))?, [experts, out, inp], &packed(layer, what))
            }
            None => {
                let t = need(what)?;
                check_shape(&t, &[experts, inp, out], &packed(layer, what))?;
                Ok(t.to_dtype(DType::F32)?.transpose(1, 2)?.contiguous()?)
            }
        }
    };
    let gate_up = matrix("gate_up_proj", 2 * w, h)?;
    let down = matrix("down_proj", h, w)?;
    let gate_up_bias = need("gate_up_proj_bias")?;
    check_shape(&gate_up_bias, &[experts, 2 * w], &packed(layer, "gate_up_proj_bias"))?;
    let down_bias = need("down_proj_bias")?;
    check_shape(&down_bias, &[experts, h], &packed(layer, "down_proj_bias"))?;
    let (gate_up_bias, down_bias) = (gate_up_bias.to_dtype(DType::F32)?, down_bias.to_dtype(DType::F32)?);
    // Row 2i of the fused projection is gate row i, row 2i + 1 up row i.
    let even: Vec<u32> = (0..w as u32).map(|i| 2 * i).collect();
    let odd: Vec<u32> = (0..w as u32).map(|i| 2 * i + 1).collect();
    let (even, odd) = (Tensor::new(even, &Device::Cpu)?, Tensor::new(odd, &Device::Cpu)?);
    let names = moe_names(params, layer);
    let mut out = Vec::new();
    for (e, [gate, up, d]) in names.experts.iter().enumerate().filter(|(e, _)| want(*e)) {
        let gu = gate_up.get(e)?;
        let gub = gate_up_bias.get(e)?;
        out.push((format!("{gate}.weight"), gu.index_select(&even, 0)?));
        out.push((format!("{up}.weight"), gu.index_select(&odd, 0)?));
        out.push((format!("{gate}.bias"), gub.index_select(&even, 0)?));
        out.push((format!("{up}.bias"), gub.index_select(&odd, 0)?));
        out.push((format!("{d}.weight"), down.get(e)?));
        out.push((format!("{d}.bias"), down_bias.get(e)?));
    }
    Ok(out)
}

fn check_shape(t: &Tensor, want: &[usize], name: &str) -> Result<()> {
    if t.dims() != want {
        return Err(ModelError::Weights(format!(
            "tensor `{name}` has shape {:?}, but the config implies {want:?}",
            t.dims()
        )));
    }
    Ok(())
}

/// MXFP4 `blocks` `[experts, out, in / 32, 16]` and `scales` `[experts, out, in / 32]` (u8) -> `[experts, out, in]`
/// f32: value `2j` of a block is the low nibble of byte `j`, `2j + 1` the high one, each times 2^(scale - 127).
pub fn dequantize(blocks: &Tensor, scales: &Tensor, [experts, out, inp]: [usize; 3], name: &str) -> Result<Tensor> {
    if !inp.is_multiple_of(BLOCK) {
        return Err(ModelError::Weights(format!("`{name}`: {inp} inputs are not a whole number of MXFP4 blocks")));
    }
    let groups = inp / BLOCK;
    check_shape(blocks, &[experts, out, groups, BLOCK / 2], &format!("{name}_blocks"))?;
    check_shape(scales, &[experts, out, groups], &format!("{name}_scales"))?;
    if blocks.dtype() != DType::U8 || scales.dtype() != DType::U8 {
        return Err(ModelError::Weights(format!("`{name}_blocks` / `{name}_scales` must be stored as u8")));
    }
    let bytes = blocks.flatten_all()?.to_vec1::<u8>()?;
    let exps = scales.flatten_all()?.to_vec1::<u8>()?;
    let mut values = vec![0f32; bytes.len() * 2];
    for ((v, b), &s) in values.chunks_exact_mut(BLOCK).zip(bytes.chunks_exact(BLOCK / 2)).zip(&exps) {
        let scale = 2f32.powi(i32::from(s) - 127);
        for (pair, &byte) in v.chunks_exact_mut(2).zip(b) {
            pair[0] = FP4_VALUES[usize::from(byte & 0x0f)] * scale;
            pair[1] = FP4_VALUES[usize::from(byte >> 4)] * scale;
        }
    }
    Ok(Tensor::from_vec(values, (experts, out, inp), &Device::Cpu)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes and scales chosen by hand: each nibble's e2m1 value, low nibble first, times its block's power of two.
    #[test]
    fn mxfp4_values_low_nibble_first_scaled_per_block() {
        // One expert, one row of 64 inputs (two blocks): bytes 0x21 then 0xf7.., scales 2^0 and 2^-2.
        let mut bytes = vec![0u8; 32];
        bytes[0] = 0x21; // values 0.5 (code 1), then 1.0 (code 2)
        bytes[1] = 0xf7; // 6.0 (code 7), then -6.0 (code 15)
        bytes[16] = 0x9c; // -2.0 (code 12), then -0.5 (code 9)
        let blocks = Tensor::from_vec(bytes, (1, 1, 2, 16), &Device::Cpu).unwrap();
        let scales = Tensor::from_vec(vec![127u8, 125], (1, 1, 2), &Device::Cpu).unwrap();
        let v = dequantize(&blocks, &scales, [1, 1, 64], "t").unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(&v[..4], &[0.5, 1.0, 6.0, -6.0]);
        assert!(v[4..32].iter().all(|x| *x == 0.0));
        assert_eq!(&v[32..34], &[-0.5, -0.125]);
    }

    #[test]
    fn wrong_shapes_are_named() {
        let blocks = Tensor::zeros((1, 2, 2, 16), DType::U8, &Device::Cpu).unwrap();
        let scales = Tensor::zeros((1, 2, 3), DType::U8, &Device::Cpu).unwrap();
        let err = dequantize(&blocks, &scales, [1, 2, 64], "w").unwrap_err().to_string();
        assert!(err.contains("w_scales"), "{err}");
        let err = dequantize(&blocks, &scales, [1, 2, 48], "w").unwrap_err().to_string();
        assert!(err.contains("MXFP4 blocks"), "{err}");
    }
}
