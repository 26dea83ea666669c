//! The readable form of a `Plan`: a header, one line per number with its formula, the start-up log lines the
//! server would print on the chosen layout, the what-if tables, and the warnings. Also the number formats.

use std::fmt::Write;

use super::Plan;

/// Bytes in decimal gigabytes (the unit of device data sheets), one decimal.
pub(super) fn gb(bytes: u64) -> String {
    let g = bytes as f64 / 1e9;
    if bytes > 0 && g < 0.1 {
        format!("{:.1} MB", bytes as f64 / 1e6)
    } else {
        format!("{g:.1} GB")
    }
}

/// Bytes in GiB, two decimals (the unit of the start-up log).
pub(super) fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// A parameter count in billions or millions.
pub(super) fn params(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2} B", n as f64 / 1e9)
    } else {
        format!("{:.2} M", n as f64 / 1e6)
    }
}

pub(super) fn list(xs: &[usize]) -> String {
    xs.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}

/// Renders the plan.
pub(super) fn text(p: &Plan) -> String {
    let s = &p.shape;
    let mut o = String::new();
    let _ = writeln!(o, "rserve plan: {}", p.model);
    let _ = writeln!(o, "  config     {}", p.source);
    let _ = writeln!(
        o,
        "  model      {}: {} layers, hidden {}, {} heads / {} KV heads x {}, MLP {}, vocab {}",
        s.architecture,
        s.num_layers,
        s.hidden_size,
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
        s.intermediate_size,
        s.vocab_size
    );
    let _ = writeln!(
        o,
        "  device     {}: {} each ({}), utilization {}, {} per node",
        p.device.name,
        gb(p.device.memory_bytes),
        gib(p.device.memory_bytes),
        p.gpu_memory_utilization,
        p.device.devices_per_node
    );
    let _ = writeln!(
        o,
        "  precision  weights {} ({}), KV cache {} ({})",
        p.dtype.name(),
        p.dtype_reason,
        p.kv_cache_dtype.name(),
        p.kv_cache_dtype_reason
    );
    let _ = writeln!(
        o,
        "  context    {} tokens per request, block size {}, steps of {} tokens / {} sequences",
        p.max_model_len, p.block_size, p.step.max_num_batched_tokens, p.step.max_num_seqs
    );
    let _ = writeln!(o);
    let _ = writeln!(o, "  {:<24} {:<16} formula", "quantity", "value");
    for l in &p.lines {
        let _ = writeln!(o, "  {:<24} {:<16} {}", l.name, l.value, l.formula);
    }
    if let Some(l) = &p.layout {
        let _ = writeln!(o);
        let _ = writeln!(o, "start-up log on TP={} x PP={} (each device):", l.tp, l.pp);
        let _ = writeln!(o, "  Available KV cache memory: {}", gib(l.kv_bytes_per_device));
        let _ = writeln!(o, "  KV cache size: {} tokens", l.kv_tokens);
        let _ =
            writeln!(o, "  Maximum concurrency for {} tokens per request: {:.2}x", l.max_model_len, l.max_concurrency);
        data_parallel(&mut o, &p.model, l, p.device.devices_per_node, p.data_parallel);
    }
    if !p.shorter_context.is_empty() {
        let _ = writeln!(o);
        let on = p.layout.as_ref().map(|l| format!(" on TP={} x PP={}", l.tp, l.pp)).unwrap_or_default();
        let _ = writeln!(o, "a smaller --max-model-len{on}:");
        let _ = writeln!(
            o,
            "  {:<14} {:<16} {:<15} {:<15} {:<16} full-context requests",
            "max-model-len", "KV per sequence", "minimum memory", "devices needed", "smallest layout"
        );
        for c in &p.shorter_context {
            let layout = c.smallest_layout.map(|(t, pp)| format!("TP={t} x PP={pp}")).unwrap_or_else(|| "none".into());
            let req = c.requests_on_chosen_layout.map(|r| r.to_string()).unwrap_or_else(|| "-".into());
            let _ = writeln!(
                o,
                "  {:<14} {:<16} {:<15} {:<15} {:<16} {}",
                c.max_model_len,
                gb(c.kv_bytes_per_sequence),
                gb(c.min_memory_bytes),
                c.devices_needed,
                layout,
                req
            );
        }
    }
    if !p.larger_pp.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(o, "a larger PP ({} tokens per request):", p.max_model_len);
        let _ = writeln!(
            o,
            "  {:<14} {:<8} {:<6} {:<16} {:<16} full-context requests",
            "layout", "devices", "nodes", "KV memory left", "KV cache size"
        );
        for l in &p.larger_pp {
            let _ = writeln!(
                o,
                "  {:<14} {:<8} {:<6} {:<16} {:<16} {}",
                format!("TP={} x PP={}", l.tp, l.pp),
                l.devices,
                l.nodes,
                gb(l.kv_bytes_total),
                format!("{} tokens", l.kv_tokens),
                l.full_context_requests
            );
        }
    }
    if !p.warnings.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(o, "warnings:");
        for w in &p.warnings {
            let _ = writeln!(o, "  - {w}");
        }
    }
    o
}

/// The data-parallel layout (`-dp`): how many replicas of the chosen layout one node holds, or with `dp` given the
/// replicas asked for; and where each replica's MPI ranks are (replica-major, `per_node` ranks to a node, as
/// `dist::layout::World` lays them out) with the command that starts them.
fn data_parallel(o: &mut String, model: &str, l: &super::layout::LayoutPlan, per_node: usize, dp: Option<usize>) {
    let per_replica = l.tp * l.pp;
    if per_node < 2 && dp.is_none() {
        return;
    }
    let _ = writeln!(o);
    let n = match dp {
        Some(n) => n,
        None if per_replica > per_node => {
            let _ = writeln!(
                o,
                "data parallel: one replica of TP={} x PP={} takes {per_replica} devices ({} nodes); -dp N runs N of \
                 them as one job of N x {per_replica} MPI ranks",
                l.tp, l.pp, l.nodes
            );
            return;
        }
        None => per_node / per_replica,
    };
    let ranks = n * per_replica;
    // Ranks per node: whole TP groups only (a TP group all-reduces every layer; it must not straddle two nodes).
    let ppn = if l.tp <= per_node { per_node - per_node % l.tp } else { per_node }.max(1);
    let nodes = ranks.div_ceil(ppn);
    match dp {
        Some(_) => {
            let _ = writeln!(
                o,
                "data parallel: {n} replicas of TP={} x PP={}, {ranks} devices on {nodes} node(s) ({ppn} ranks of {per_node} \
                 devices each)",
                l.tp, l.pp
            );
        }
        None => {
            let _ = writeln!(
                o,
                "data parallel on one node ({per_node} devices): {n} replicas of TP={} x PP={}",
                l.tp, l.pp
            );
        }
    }
    let _ = writeln!(
        o,
        "  KV cache {} tokens per replica, {} in all; {} full-context requests at once",
        l.kv_tokens,
        l.kv_tokens * n as u64,
        l.full_context_requests * n as u64
    );
    if per_replica == 1 && nodes == 1 {
        let _ = writeln!(o, "  rserve {model} -dp {n}        (replica i on device i)");
        return;
    }
    let mut flags = format!("-dp {n}");
    if l.tp > 1 {
        flags += &format!(" -tp {}", l.tp);
    }
    if l.pp > 1 {
        flags += &format!(" -pp {}", l.pp);
    }
    let ppn_flag = if nodes > 1 || ppn < per_node { format!(" --ppn {ppn}") } else { String::new() };
    let _ = writeln!(o, "  mpiexec -n {ranks}{ppn_flag} rserve {model} {flags}");
    let _ = writeln!(o, "  MPI ranks, replica-major (rank 0 serves and schedules every replica):");
    let shown = n.min(16);
    for r in 0..shown {
        let (first, last) = (r * per_replica, (r + 1) * per_replica - 1);
        let (n0, n1) = (first / ppn, last / ppn);
        let on = if n0 == n1 { format!("node {n0}") } else { format!("nodes {n0}-{n1}") };
        let stages = (0..l.pp)
            .map(|s| format!("stage {s}: ranks {}-{}", first + s * l.tp, first + s * l.tp + l.tp - 1))
            .collect::<Vec<_>>()
            .join(", ");
        let detail = if l.pp > 1 { format!(" ({stages})") } else { String::new() };
        let _ = writeln!(o, "    replica {r}: ranks {first}-{last} on {on}{detail}");
    }
    if n > shown {
        let _ = writeln!(o, "    ... {} more replicas of {per_replica} ranks each", n - shown);
    }
}
