//! Assembles a `Plan` from a `ModelShape` and the options: the model-wide numbers, the layout choice, the
//! what-ifs, the warnings, and the formula of every line.

use super::device::DeviceProfile;
use super::dtype::{resolve_dtype, resolve_kv_dtype};
use super::layout::{preferred_tp, valid_pp, valid_tp, LayoutPlan, Sizing};
use super::memory::{self, usable_bytes};
use super::params::count_params;
use super::render::{gb, list, params as fmt_params};
use super::shape::{Attention, ModelShape};
use super::{ContextOption, DeviceChoice, Line, ParamSource, Plan, PlanOptions};
use crate::{EngineError, Result};

fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn line(name: &str, value: String, formula: String) -> Line {
    Line { name: name.to_string(), value, formula }
}

fn check_options(opts: &PlanOptions) -> Result<()> {
    let u = opts.gpu_memory_utilization;
    if !(u > 0.0 && u <= 1.0) {
        return Err(EngineError::InvalidArgument(format!("--gpu-memory-utilization must be in (0, 1], got {u}")));
    }
    if opts.block_size == 0 {
        return Err(EngineError::InvalidArgument("--block-size must be positive".into()));
    }
    if opts.step.max_num_batched_tokens == 0 || opts.step.max_num_seqs == 0 {
        return Err(EngineError::InvalidArgument(
            "--max-num-batched-tokens and --max-num-seqs must be positive".into(),
        ));
    }
    if opts.tp == Some(0) || opts.pp == Some(0) || opts.dp == Some(0) {
        return Err(EngineError::InvalidArgument("--tp, --pp and --dp must be at least 1".into()));
    }
    Ok(())
}

fn max_model_len(shape: &ModelShape, requested: Option<usize>) -> Result<usize> {
    match (requested, shape.max_position_embeddings) {
        (Some(0), _) => Err(EngineError::InvalidArgument("--max-model-len must be positive".into())),
        (Some(l), Some(max)) if l > max => Err(EngineError::InvalidArgument(format!(
            "--max-model-len {l} exceeds the model's max_position_embeddings {max}"
        ))),
        (Some(l), _) => Ok(l),
        (None, Some(max)) => Ok(max),
        (None, None) => {
            Err(EngineError::InvalidArgument("the config has no max_position_embeddings; pass --max-model-len".into()))
        }
    }
}

/// The KV formula of a whole-model token, spelled out.
fn kv_formula(shape: &ModelShape, layers: usize, kv_heads: usize, elem: usize, dtype: &str) -> String {
    match shape.attention {
        Attention::Standard => format!(
            "{} x 2 (K, V) x {} x {} head dim x {elem} B ({dtype})",
            plural(layers, "layer"),
            plural(kv_heads, "KV head"),
            shape.head_dim
        ),
        Attention::Latent(m) => format!(
            "{layers} layers x ({} kv_lora_rank + {} qk_rope_head_dim) x {elem} B ({dtype}; latent attention)",
            m.kv_lora_rank, m.qk_rope_head_dim
        ),
    }
}

fn warnings(shape: &ModelShape, plan_len: usize, dense_seq: u64, windowed: Option<u64>) -> Vec<String> {
    let mut w = Vec::new();
    if let Attention::Latent(m) = shape.attention {
        w.push(format!(
            "multi-head latent attention: the per-token formula layers x 2 x KV heads x head dim does not apply; KV is \
             the compressed latent, layers x ({} + {}) values per token, the same on every TP rank (vLLM's MLA cache)",
            m.kv_lora_rank, m.qk_rope_head_dim
        ));
    }
    if let (Some(s), Some(win)) = (shape.sliding, windowed) {
        let kind =
            if s.sliding_layers == shape.num_layers { "all".to_string() } else { "interleaved local/global:".into() };
        w.push(format!(
            "sliding-window attention ({kind} {} of {} layers see only the last {} tokens): a sequence of {plan_len} \
             tokens holds {} of KV (the cache frees blocks outside the window), not the {} of the per-token formula",
            s.sliding_layers,
            shape.num_layers,
            s.window,
            gb(win),
            gb(dense_seq)
        ));
    }
    for (kind, n) in &shape.other_layers {
        w.push(format!(
            "{n} layers are `{kind}`: the per-token KV formula does not describe them (counted {} a KV cache)",
            if kind.contains("attention") && !kind.contains("linear") { "as full attention with" } else { "without" }
        ));
    }
    match shape.quantization.as_deref() {
        Some("mxfp4") if shape.model_type == "gpt_oss" => w.push(
            "the experts are MXFP4 in the checkpoint (4.25 bits a parameter); rserve dequantizes them at load, so \
             weights memory is counted at --dtype bytes per parameter"
                .into(),
        ),
        Some(q) => w.push(format!(
            "the checkpoint is quantized ({q}): weights memory is counted at --dtype bytes per parameter"
        )),
        None => {}
    }
    let served = [
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Phi3ForCausalLM",
        "MixtralForCausalLM",
        "Qwen3MoeForCausalLM",
        "GptOssForCausalLM",
        "llama (GGUF)",
        "qwen2 (GGUF)",
        "qwen3 (GGUF)",
    ];
    if !served.contains(&shape.architecture.as_str()) {
        w.push(format!("`rserve serve` cannot run {} yet (this plan is for sizing only)", shape.architecture));
    }
    w.extend(shape.notes.iter().cloned());
    w
}

/// Plans an already-read shape (`headers`: a parameter count from the weight files, if any). Public as
/// `plan::plan_shape`.
pub fn plan(
    model: &str,
    source: &str,
    shape: ModelShape,
    headers: Option<(u64, ParamSource)>,
    opts: &PlanOptions,
) -> Result<Plan> {
    check_options(opts)?;
    let device = match &opts.device {
        DeviceChoice::Profile(name) => DeviceProfile::named(name)?,
        DeviceChoice::Memory(bytes) => DeviceProfile::with_memory(*bytes)?,
    };
    let (dtype, dtype_reason) = resolve_dtype(opts.dtype, &shape, device.host);
    let (kv_dtype, kv_reason) = resolve_kv_dtype(opts.kv_cache_dtype, dtype, device.host);
    let counts = count_params(&shape);
    let (parameters, parameters_source) = headers.unwrap_or((counts.total, ParamSource::ConfigShapes));
    let weights_bytes = parameters * dtype.bytes() as u64;
    let len = max_model_len(&shape, opts.max_model_len)?;
    let kv_token = memory::kv_bytes_per_token(&shape, kv_dtype.bytes());
    let dense_seq = kv_token * len as u64;
    // Sliding-window layers keep only their window (rserve's cache frees the blocks before it): a sequence holds
    // every global layer's tokens and each sliding layer's last `window` tokens.
    let windowed = shape.sliding.filter(|s| s.window < len).map(|s| {
        let per_layer = kv_token / shape.kv_layers().max(1) as u64;
        let full = shape.kv_layers().saturating_sub(s.sliding_layers) as u64;
        per_layer * (full * len as u64 + s.sliding_layers as u64 * s.window as u64)
    });
    let kv_seq = windowed.unwrap_or(dense_seq);
    let min_memory = weights_bytes + kv_seq;
    let usable = usable_bytes(device.memory_bytes, opts.gpu_memory_utilization);
    let devices_needed = min_memory.div_ceil(usable.max(1)) as usize;

    let tps = valid_tp(&shape, &device);
    let preferred = preferred_tp(&shape, &tps);
    let pps = valid_pp(shape.num_layers);
    if let Some(t) = opts.tp {
        if !device.tp_sizes.contains(&t) {
            return Err(EngineError::InvalidArgument(format!(
                "--tp {t}: TP stays inside a node, and the {} profile allows {}",
                device.name,
                list(&device.tp_sizes)
            )));
        }
        if !tps.contains(&t) {
            return Err(EngineError::InvalidArgument(format!(
                "--tp {t} does not split {} attention heads / {} KV heads evenly; valid: {}",
                shape.num_heads,
                shape.num_kv_heads,
                list(&tps)
            )));
        }
    }
    if let Some(p) = opts.pp {
        if !shape.num_layers.is_multiple_of(p) {
            return Err(EngineError::InvalidArgument(format!(
                "--pp {p} does not divide the {} layers evenly; valid: {}",
                shape.num_layers,
                list(&pps)
            )));
        }
    }
    let sizing = Sizing {
        shape: &shape,
        params: &counts,
        weights_bytes,
        kv_elem_bytes: kv_dtype.bytes(),
        device: &device,
        utilization: opts.gpu_memory_utilization,
        block_size: opts.block_size,
        step: opts.step,
        kv_cache_memory_bytes: opts.kv_cache_memory_bytes,
    };
    let search_tp: Vec<usize> = opts.tp.map_or_else(|| tps.clone(), |t| vec![t]);
    // The CPU backend runs on one host: pipeline stages across hosts only when asked for.
    let search_pp: Vec<usize> = opts.pp.map_or_else(|| if device.host { vec![1] } else { pps.clone() }, |p| vec![p]);
    let (layout, forced) = match (opts.tp, opts.pp) {
        (Some(t), Some(p)) => (Some(sizing.evaluate(t, p, len)), true),
        _ => (sizing.choose(&search_tp, &search_pp, devices_needed, len), false),
    };

    let mut warn = warnings(&shape, len, dense_seq, windowed);
    match &layout {
        None => warn.push(format!(
            "no valid layout holds one {len}-token sequence (tried TP {} x PP {}); lower --max-model-len{}",
            list(&search_tp),
            list(&search_pp),
            if device.host { " or raise --kv-cache-memory-bytes" } else { "" }
        )),
        Some(l) if !l.fits() => warn.push(format!(
            "TP={} x PP={} cannot hold one {len}-token sequence: {} of KV per device buys {} tokens",
            l.tp,
            l.pp,
            gb(l.kv_bytes_per_device),
            l.kv_tokens
        )),
        Some(l) if forced && l.devices < devices_needed => warn.push(format!(
            "TP={} x PP={} is {} devices, fewer than the {devices_needed} the memory needs",
            l.tp, l.pp, l.devices
        )),
        _ => {}
    }
    if let Some(l) = layout.as_ref().filter(|l| l.kv_heads_replicated) {
        warn.push(format!("TP={} replicates KV heads: {} KV heads on {} ranks", l.tp, shape.num_kv_heads, l.tp));
    }

    let shorter_context =
        shorter_contexts(&sizing, &search_tp, &search_pp, layout.as_ref(), len, weights_bytes, usable, kv_token);
    let larger_pp = match &layout {
        // The CPU backend runs on one host; pipeline stages across hosts are not a what-if there.
        Some(_) if device.host => Vec::new(),
        Some(l) => pps.iter().filter(|p| **p > l.pp).take(3).map(|p| sizing.evaluate(l.tp, *p, len)).collect(),
        None => Vec::new(),
    };

    let mut plan = Plan {
        model: model.to_string(),
        source: source.to_string(),
        device,
        dtype,
        dtype_reason,
        kv_cache_dtype: kv_dtype,
        kv_cache_dtype_reason: kv_reason,
        max_model_len: len,
        gpu_memory_utilization: opts.gpu_memory_utilization,
        block_size: opts.block_size,
        step: opts.step,
        kv_cache_memory_bytes: opts.kv_cache_memory_bytes,
        parameters,
        parameters_source,
        parameters_from_config: counts.total,
        active_parameters: shape.moe.as_ref().map(|_| counts.active),
        weights_bytes,
        kv_bytes_per_token: kv_token,
        kv_bytes_per_sequence: kv_seq,
        kv_bytes_per_sequence_windowed: windowed,
        min_memory_bytes: min_memory,
        usable_bytes_per_device: usable,
        devices_needed,
        valid_tp: tps,
        preferred_tp: preferred,
        valid_pp: pps,
        layout,
        data_parallel: opts.dp,
        shorter_context,
        larger_pp,
        warnings: warn,
        lines: Vec::new(),
        shape,
    };
    plan.lines = lines(&plan, &counts, forced);
    Ok(plan)
}

/// Halvings of the context (down to 1024 tokens, at most four): what each costs and buys.
#[allow(clippy::too_many_arguments)]
fn shorter_contexts(
    sizing: &Sizing<'_>,
    tps: &[usize],
    pps: &[usize],
    chosen: Option<&LayoutPlan>,
    len: usize,
    weights: u64,
    usable: u64,
    kv_token: u64,
) -> Vec<ContextOption> {
    let mut out = Vec::new();
    let mut l = len / 2;
    while l >= 1024 && out.len() < 4 {
        let kv = kv_token * l as u64;
        let needed = (weights + kv).div_ceil(usable.max(1)) as usize;
        out.push(ContextOption {
            max_model_len: l,
            kv_bytes_per_sequence: kv,
            min_memory_bytes: weights + kv,
            devices_needed: needed,
            smallest_layout: sizing.choose(tps, pps, needed, l).map(|p| (p.tp, p.pp)),
            requests_on_chosen_layout: chosen.map(|c| sizing.evaluate(c.tp, c.pp, l).full_context_requests),
        });
        l /= 2;
    }
    out
}

fn lines(p: &Plan, counts: &super::params::ParamCount, forced: bool) -> Vec<Line> {
    let s = &p.shape;
    let dt = p.dtype.name();
    let kvdt = p.kv_cache_dtype.name();
    let mut out = Vec::new();
    let per_layer = {
        let lo = counts.per_layer.iter().min().copied().unwrap_or(0);
        let hi = counts.per_layer.iter().max().copied().unwrap_or(0);
        if lo == hi {
            format!("{} layers x {}", s.num_layers, fmt_params(lo))
        } else {
            format!("{} layers of {} to {}", s.num_layers, fmt_params(lo), fmt_params(hi))
        }
    };
    let shapes = format!(
        "embeddings {} x {}{} + {per_layer} + final norm {}{}",
        s.vocab_size,
        s.hidden_size,
        if counts.lm_head > 0 {
            format!(" + output head {} x {}", s.vocab_size, s.hidden_size)
        } else {
            " (output head tied)".into()
        },
        s.hidden_size,
        if counts.vision > 0 {
            format!(" + vision tower and projector {}", fmt_params(counts.vision))
        } else {
            String::new()
        }
    );
    let formula = match p.parameters_source {
        ParamSource::ConfigShapes => format!("config shapes: {shapes}"),
        ParamSource::SafetensorsHeaders => format!("safetensors headers (config shapes: {})", fmt_params(counts.total)),
        ParamSource::GgufTensorDirectory => {
            format!("GGUF tensor directory (config shapes: {})", fmt_params(counts.total))
        }
    };
    out.push(line("parameters", fmt_params(p.parameters), formula));
    if let (Some(active), Some(m)) = (p.active_parameters, &s.moe) {
        out.push(line(
            "active parameters",
            fmt_params(active),
            format!(
                "per token: {} of {} experts in {} routed layers (expert MLP {} wide; config shapes)",
                m.experts_per_token, m.experts, m.moe_layers, m.expert_intermediate
            ),
        ));
    }
    out.push(line(
        "weights memory",
        gb(p.weights_bytes),
        format!("{} parameters x {} B ({dt})", fmt_params(p.parameters), p.dtype.bytes()),
    ));
    out.push(line(
        "KV bytes per token",
        format!("{} B", p.kv_bytes_per_token),
        kv_formula(s, s.kv_layers(), s.num_kv_heads, p.kv_cache_dtype.bytes(), kvdt),
    ));
    let per_sequence = match (s.sliding, p.kv_bytes_per_sequence_windowed) {
        // Sliding-window layers hold their window only (the cache frees the blocks before it).
        (Some(w), Some(_)) => {
            let per_layer = p.kv_bytes_per_token / s.kv_layers().max(1) as u64;
            let global = s.kv_layers().saturating_sub(w.sliding_layers);
            format!(
                "{per_layer} B per layer and token x ({global} global layers x {} tokens + {} sliding layers x {} \
                 window tokens)",
                p.max_model_len, w.sliding_layers, w.window
            )
        }
        _ => format!("{} B x {} tokens", p.kv_bytes_per_token, p.max_model_len),
    };
    out.push(line("KV per sequence", gb(p.kv_bytes_per_sequence), per_sequence));
    out.push(line(
        "minimum memory",
        gb(p.min_memory_bytes),
        format!(
            "weights {} + KV of one {}-token sequence {}",
            gb(p.weights_bytes),
            p.max_model_len,
            gb(p.kv_bytes_per_sequence)
        ),
    ));
    out.push(line(
        "memory per device",
        gb(p.device.memory_bytes),
        format!(
            "usable {} = {} x {} ({})",
            gb(p.usable_bytes_per_device),
            gb(p.device.memory_bytes),
            p.gpu_memory_utilization,
            p.device.source
        ),
    ));
    let ratio = p.min_memory_bytes as f64 / p.usable_bytes_per_device.max(1) as f64;
    out.push(line(
        "devices needed",
        p.devices_needed.to_string(),
        format!(
            "ceil({} / {}) = ceil({ratio:.2}), then rounded up to a valid TP x PP",
            gb(p.min_memory_bytes),
            gb(p.usable_bytes_per_device)
        ),
    ));
    let replicating: Vec<usize> = p.valid_tp.iter().copied().filter(|t| !p.preferred_tp.contains(t)).collect();
    let kv_note = match s.attention {
        Attention::Latent(_) => "the latent KV is replicated on every rank".to_string(),
        Attention::Standard if replicating.is_empty() => format!("all split the {} KV heads", s.num_kv_heads),
        Attention::Standard => format!(
            "{} replicate the {} KV heads; prefer {}",
            list(&replicating),
            s.num_kv_heads,
            list(&p.preferred_tp)
        ),
    };
    out.push(line(
        "valid TP sizes",
        list(&p.valid_tp),
        format!(
            "divide the {} attention heads, inside one node ({} allows {}); {kv_note}",
            s.num_heads,
            p.device.name,
            list(&p.device.tp_sizes)
        ),
    ));
    out.push(line(
        "valid PP sizes",
        list(&p.valid_pp),
        format!("divide the {} layers evenly; usually the number of nodes", s.num_layers),
    ));
    if let Some(l) = &p.layout {
        layout_lines(p, l, forced, &mut out);
    }
    out
}

fn layout_lines(p: &Plan, l: &LayoutPlan, forced: bool, out: &mut Vec<Line>) {
    let s = &p.shape;
    let why = if forced {
        "as given by --tp / --pp".to_string()
    } else {
        format!("smallest valid TP x PP >= {} that holds a full-context sequence", p.devices_needed)
    };
    out.push(line(
        "layout",
        format!("TP={} x PP={}", l.tp, l.pp),
        format!(
            "{} on {}, {} layers per stage; {why}",
            plural(l.devices, "device"),
            plural(l.nodes, "node"),
            l.layers_per_stage
        ),
    ));
    out.push(line(
        "weights per device",
        gb(l.weights_per_device_bytes),
        format!(
            "largest stage's share of {} weights / TP {} (first stage: embeddings, last: output head)",
            gb(p.weights_bytes),
            l.tp
        ),
    ));
    let headroom = p.device.memory_bytes - p.usable_bytes_per_device.min(p.device.memory_bytes);
    out.push(line(
        "activations per device",
        gb(l.activation_bytes_per_device),
        format!(
            "{} tokens x {} values x {} B + {} seqs x {} logits x 4 B; {} fit the {} headroom (1 - {}): {} taken from KV",
            p.step.max_num_batched_tokens,
            memory::activation_values_per_token(s, l.tp),
            p.dtype.bytes(),
            p.step.max_num_seqs.min(p.step.max_num_batched_tokens),
            s.vocab_size.div_ceil(l.tp),
            if l.activation_reserve_per_device == 0 { "they" } else { "they do not" },
            gb(headroom),
            p.gpu_memory_utilization,
            gb(l.activation_reserve_per_device)
        ),
    ));
    let parts = format!(
        "{} usable - {} weights - {} activations beyond headroom",
        gb(p.usable_bytes_per_device),
        gb(l.weights_per_device_bytes),
        gb(l.activation_reserve_per_device)
    );
    let kv_rule = match p.kv_cache_memory_bytes {
        Some(b) => format!("--kv-cache-memory-bytes {b}"),
        None if p.device.host => format!("min(4 GiB, {parts}): the CPU backend's rule"),
        None => parts,
    };
    out.push(line("KV memory per device", gb(l.kv_bytes_per_device), kv_rule));
    out.push(line(
        "KV memory left",
        gb(l.kv_bytes_total),
        format!("{} x {}", plural(l.devices, "device"), gb(l.kv_bytes_per_device)),
    ));
    let kv_heads = match s.attention {
        Attention::Standard => memory::kv_heads_per_rank(s, l.tp),
        Attention::Latent(_) => 0,
    };
    // A block spans the layers of one KV cache group (every layer of the stage without sliding-window layers).
    let groups = memory::KvGroups::of(s);
    let block_layers = groups.block_layers(s.kv_layers().div_ceil(l.pp));
    let mut per_token = kv_formula(s, block_layers, kv_heads, p.kv_cache_dtype.bytes(), p.kv_cache_dtype.name());
    if groups.num_groups() > 1 {
        per_token += &format!(
            "; a block spans one of {} KV cache groups ({} global, {} sliding-window)",
            groups.num_groups(),
            groups.full_groups,
            groups.sliding_groups
        );
    }
    out.push(line("KV per token per device", format!("{} B", l.kv_bytes_per_token_per_device), per_token));
    out.push(line(
        "KV cache size",
        format!("{} tokens", l.kv_tokens),
        format!(
            "floor({} / ({} B x {}-token blocks)) = {} blocks{}",
            gb(l.kv_bytes_per_device),
            l.kv_bytes_per_token_per_device,
            p.block_size,
            l.num_blocks_per_device,
            if groups.num_groups() > 1 {
                format!(", less the null block, shared by the {} groups", groups.num_groups())
            } else {
                String::new()
            }
        ),
    ));
    out.push(line(
        "full-context requests",
        l.full_context_requests.to_string(),
        format!(
            "floor({} blocks / {} blocks per {}-token request); concurrency {:.2}x",
            l.num_blocks_per_device.saturating_sub(groups.reserved_blocks()),
            groups.blocks_per_request(l.max_model_len, p.block_size, p.step.max_num_batched_tokens),
            l.max_model_len,
            l.max_concurrency
        ),
    ));
}
