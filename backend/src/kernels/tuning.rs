//! `KernelTuning`: which kernel variant each op takes on a device, decided once when the backend opens (from the
//! device's kind and capabilities) and validated, instead of switches read from the environment. The defaults are
//! the measured winners; BENCHMARKS.md, "How the defaults were chosen", has the measurements.
//!
//! Tools that compare variants (`cuda_check bench`, `engine/examples/cuda_check/timings.rs`) change a field through
//! `set("key=value")`, which refuses an unknown key or a bad value.

use rserve_kernels::launch::{ATTN_MAX_PARTITION, GEMV_PDL_ROWS};

use crate::cpu::be;
use crate::error::Result;

/// A device's current tuning: set once when the backend opens; tools and tests may replace it with another valid
/// one (`set` validates first).
#[derive(Debug)]
pub struct TuningCell(std::cell::Cell<KernelTuning>);

impl TuningCell {
    pub fn new(t: KernelTuning) -> Self {
        Self(std::cell::Cell::new(t))
    }

    pub fn get(&self) -> KernelTuning {
        self.0.get()
    }

    /// Replaces the tuning; an invalid one is refused and changes nothing.
    pub fn set(&self, t: KernelTuning) -> Result<()> {
        t.validate()?;
        self.0.set(t);
        Ok(())
    }
}

/// Which matrix-multiply kernels run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulPath {
    /// `matmul_wi_*` at every row count: CPU OpenCL compilers vectorise across work-items.
    WorkItem,
    /// GPUs: `matmul_vec_*` / `matmul_rows_*` for decode-sized row counts, `matmul_tiled_*` above.
    SubGroup,
    /// The device's own library (cuBLAS on CUDA) through `KernelDevice::vendor_matmul`.
    Vendor,
    /// Level Zero on PVC: `SubGroup`, except bf16 weights (k a multiple of 16) above `GEMV_ROWS` rows (prefill,
    /// batched decode), which take the matrix engine (`matmul_xmx_bf16`).
    Xmx,
    /// `Xmx`'s kernel with the matrix built-in emulated (`matmul_xmx_bf16_emu`) for bf16 weights at every row count,
    /// `SubGroup` otherwise: how the op tests run the XMX kernel's tiling on the CPU runtime.
    XmxEmulated,
}

/// Keys per split-KV partition of the decode attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partition {
    /// The same size at every row count (a power of two, 16 ..= `ATTN_MAX_PARTITION`).
    Fixed(usize),
    /// Short partitions when few rows must fill the device: 16 keys at one row, 32 up to 16 rows, then 64.
    ByRows,
}

/// The variant choices of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelTuning {
    pub matmul: MatmulPath,
    /// Launch kernels with programmatic dependent launch (CUDA sm_90+): a kernel may be scheduled while the one
    /// before it drains; each waits in `GRID_DEP_SYNC()`.
    pub pdl: bool,
    /// Most rows of 16-bit activations a decode matmul may have to take the asynchronous-copy GEMV
    /// (`matmul_pdla_*`, needs `pdl`); 0: never.
    pub async_gemv_rows: usize,
    pub partition: Partition,
    /// Above this many decode rows the decode kernel combines its own split-KV partitions (CUDA); None: always the
    /// separate `paged_attention_reduce` launch.
    pub fused_reduce_above: Option<usize>,
    /// Up to this many decode rows the latency variant of the decode attention runs (CUDA); 0: never.
    pub latency_rows: usize,
}

impl KernelTuning {
    /// OpenCL on a CPU device (work-item matmuls) or a GPU.
    pub fn opencl(is_cpu: bool) -> Self {
        Self { matmul: if is_cpu { MatmulPath::WorkItem } else { MatmulPath::SubGroup }, ..Self::portable() }
    }

    /// Level Zero (Intel GPUs).
    pub fn level_zero() -> Self {
        Self::portable()
    }

    /// Level Zero on a device that built the matrix-engine module (PVC).
    pub fn level_zero_xmx() -> Self {
        Self { matmul: MatmulPath::Xmx, ..Self::portable() }
    }

    /// CUDA on a device of compute capability `cc`: cuBLAS, and on sm_90+ programmatic dependent launch with the
    /// asynchronous-copy GEMV at one row; short split-KV partitions, the fused reduce above 16 rows, the latency
    /// attention up to 16.
    pub fn cuda(cc: (i32, i32)) -> Self {
        let pdl = cc.0 >= 9;
        Self {
            matmul: MatmulPath::Vendor,
            pdl,
            async_gemv_rows: if pdl { 1 } else { 0 },
            partition: Partition::ByRows,
            fused_reduce_above: Some(16),
            latency_rows: 16,
        }
    }

    fn portable() -> Self {
        Self {
            matmul: MatmulPath::SubGroup,
            pdl: false,
            async_gemv_rows: 0,
            partition: Partition::Fixed(ATTN_MAX_PARTITION),
            fused_reduce_above: None,
            latency_rows: 0,
        }
    }

    /// Keys per partition of a decode launch of `rows` rows.
    pub fn partition_size(&self, rows: usize) -> usize {
        match self.partition {
            Partition::Fixed(p) => p,
            Partition::ByRows => match rows {
                0..=1 => 16,
                2..=16 => 32,
                _ => 64,
            },
        }
    }

    /// The one split-KV rule: partitions of a decode launch of `rows` rows whose longest context is `longest`
    /// keys, rounded up to a power of two so one plan (and one captured graph) serves every context up to that
    /// size (the kernels skip partitions past a row's own context); 0 without decode rows.
    pub fn decode_parts(&self, longest: usize, rows: usize) -> usize {
        if longest == 0 || rows == 0 {
            return 0;
        }
        longest.div_ceil(self.partition_size(rows)).next_power_of_two()
    }

    /// Whether the decode kernel of `rows` rows reduces its `parts` partitions itself.
    pub fn fused_reduce(&self, parts: usize, rows: usize) -> bool {
        self.fused_reduce_above.is_some_and(|r| rows > r) && parts > 1 && parts <= ATTN_MAX_PARTITION
    }

    /// Checks every field's range.
    pub fn validate(&self) -> Result<()> {
        if let Partition::Fixed(p) = self.partition {
            if !p.is_power_of_two() || !(16..=ATTN_MAX_PARTITION).contains(&p) {
                return Err(be(format!(
                    "kernel tuning: partition {p} must be a power of two in 16..={ATTN_MAX_PARTITION}"
                )));
            }
        }
        if self.async_gemv_rows > GEMV_PDL_ROWS {
            return Err(be(format!(
                "kernel tuning: async_gemv_rows {} is above {GEMV_PDL_ROWS}",
                self.async_gemv_rows
            )));
        }
        if self.async_gemv_rows > 0 && !self.pdl {
            return Err(be("kernel tuning: async_gemv_rows needs pdl=on"));
        }
        Ok(())
    }

    /// Changes one field from `key=value` (`matmul=work-item|sub-group|vendor|xmx|xmx-emulated`, `pdl=on|off`,
    /// `async_gemv_rows=N`, `partition=by-rows|N`, `fused_reduce_above=N|off`, `latency_rows=N`), then validates.
    pub fn set(&mut self, setting: &str) -> Result<()> {
        let (key, value) =
            setting.split_once('=').ok_or_else(|| be(format!("kernel tuning: '{setting}' is not key=value")))?;
        let bad = || be(format!("kernel tuning: bad value '{value}' for {key}"));
        let num = || value.parse::<usize>().map_err(|_| bad());
        let mut next = *self;
        match key {
            "matmul" => {
                next.matmul = match value {
                    "work-item" => MatmulPath::WorkItem,
                    "sub-group" => MatmulPath::SubGroup,
                    "vendor" => MatmulPath::Vendor,
                    "xmx" => MatmulPath::Xmx,
                    "xmx-emulated" => MatmulPath::XmxEmulated,
                    _ => return Err(bad()),
                }
            }
            "pdl" => {
                next.pdl = match value {
                    "on" => true,
                    "off" => false,
                    _ => return Err(bad()),
                }
            }
            "async_gemv_rows" => next.async_gemv_rows = num()?,
            "partition" => {
                next.partition = if value == "by-rows" { Partition::ByRows } else { Partition::Fixed(num()?) }
            }
            "fused_reduce_above" => next.fused_reduce_above = if value == "off" { None } else { Some(num()?) },
            "latency_rows" => next.latency_rows = num()?,
            _ => return Err(be(format!("kernel tuning: unknown key '{key}'"))),
        }
        next.validate()?;
        *self = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_parts_follow_rows_and_round_to_powers_of_two() {
        let cuda = KernelTuning::cuda((9, 0));
        assert_eq!(cuda.decode_parts(0, 1), 0);
        assert_eq!(cuda.decode_parts(17, 1), 2);
        assert_eq!(cuda.decode_parts(33, 1), 4);
        assert_eq!(cuda.decode_parts(100, 8), 4);
        assert_eq!(cuda.decode_parts(100, 64), 2);
        let portable = KernelTuning::level_zero();
        assert_eq!(portable.decode_parts(256, 3), 1);
        assert_eq!(portable.decode_parts(257, 3), 2);
        assert_eq!(portable.decode_parts(769, 3), 4);
        assert!(!portable.fused_reduce(4, 64));
        assert!(cuda.fused_reduce(4, 17) && !cuda.fused_reduce(4, 16) && !cuda.fused_reduce(1, 64));
    }

    #[test]
    fn settings_are_validated() {
        let mut t = KernelTuning::cuda((9, 0));
        t.set("partition=32").unwrap();
        assert_eq!(t.partition, Partition::Fixed(32));
        assert!(t.set("partition=48").is_err());
        assert!(t.set("partition=512").is_err());
        assert!(t.set("speed=fast").is_err());
        assert!(t.set("latency_rows").is_err());
        t.set("fused_reduce_above=off").unwrap();
        assert_eq!(t.fused_reduce_above, None);
        assert!(t.set("async_gemv_rows=5").is_err());
        t.set("pdl=off").map(drop).unwrap_err(); // async GEMV rows still 1: needs pdl
        t.set("async_gemv_rows=0").unwrap();
        t.set("pdl=off").unwrap();
        assert_eq!(t.partition, Partition::Fixed(32), "a refused setting changes nothing");
        assert_eq!(KernelTuning::opencl(true).matmul, MatmulPath::WorkItem);
        assert_eq!(KernelTuning::cuda((8, 0)).async_gemv_rows, 0);
    }
}
