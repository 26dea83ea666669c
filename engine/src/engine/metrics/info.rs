//! `vllm:cache_config_info`: vLLM's info gauge (always 1) whose labels are its `CacheConfig` fields, each value
//! written as Python's `str()` writes it. rserve fills in the fields it has an equivalent for; the server crate's test
//! checks every label name against vLLM's `CacheConfig` fields (`tests/fixtures/vllm/metrics.json`).

/// The KV cache configuration as vLLM's `CacheConfig` names it.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheInfo {
    pub block_size: usize,
    pub gpu_memory_utilization: f64,
    pub cache_dtype: String,
    pub enable_prefix_caching: bool,
    pub num_gpu_blocks: usize,
    pub kv_cache_memory_bytes: Option<u64>,
}

/// `str(x)` of a Python float: always a decimal point (`0.9`, `1.0`).
fn py_float(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 {
        format!("{v:.1}")
    } else {
        v.to_string()
    }
}

fn py_bool(v: bool) -> String {
    if v { "True" } else { "False" }.to_owned()
}

impl CacheInfo {
    /// (label, value) pairs, in `CacheConfig`'s field order.
    pub fn labels(&self) -> Vec<(&'static str, String)> {
        vec![
            ("block_size", self.block_size.to_string()),
            ("gpu_memory_utilization", py_float(self.gpu_memory_utilization)),
            ("cache_dtype", self.cache_dtype.clone()),
            ("is_attention_free", py_bool(false)),
            ("enable_prefix_caching", py_bool(self.enable_prefix_caching)),
            ("num_gpu_blocks", self.num_gpu_blocks.to_string()),
            ("kv_cache_size_tokens", (self.num_gpu_blocks * self.block_size).to_string()),
            ("kv_cache_memory_bytes", self.kv_cache_memory_bytes.map_or_else(|| "None".to_owned(), |b| b.to_string())),
        ]
    }
}

impl Default for CacheInfo {
    fn default() -> Self {
        Self {
            block_size: 16,
            gpu_memory_utilization: 0.9,
            cache_dtype: "auto".into(),
            enable_prefix_caching: true,
            num_gpu_blocks: 0,
            kv_cache_memory_bytes: None,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn values_are_written_as_python_does() {
        assert_eq!(super::py_float(1.0), "1.0");
        assert_eq!(super::py_float(0.9), "0.9");
        assert_eq!(super::py_bool(true), "True");
    }
}
