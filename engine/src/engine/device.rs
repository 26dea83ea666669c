//! Device selection: which backend runs the model (`--device`), how much memory it offers for the KV budget, and
//! building the `StepRunner` on it. New backends add an arm here; nothing else in the engine changes.

use crate::backend::cpu::CpuBackend;
use crate::config::ModelParams;
use crate::error::{EngineError, Result};
use crate::runner::{ModelRunner, RunnerOptions, StepRunner};
use crate::weights::Weights;

/// A chosen device, before the model is on it.
pub enum Device {
    Cpu(CpuBackend),
    #[cfg(feature = "level-zero")]
    LevelZero(crate::backend::level_zero::LevelZeroBackend),
    #[cfg(feature = "opencl")]
    OpenCl(crate::backend::opencl::OpenClBackend),
    #[cfg(feature = "cuda")]
    Cuda(crate::backend::cuda::CudaBackend),
}

impl Device {
    /// Resolves `--device` with the options of its backend (`--device opencl` with `--opencl-platform/-device`).
    pub fn select_for(cfg: &super::config::EngineConfig) -> Result<Self> {
        match cfg.device.as_str() {
            #[cfg(feature = "opencl")]
            "opencl" => {
                let opts = crate::backend::opencl::OpenClOptions {
                    platform: cfg.opencl_platform.clone(),
                    device: cfg.opencl_device,
                };
                crate::backend::opencl::OpenClBackend::new(&opts).map(Device::OpenCl).map_err(|e| match e.into() {
                    EngineError::Backend(msg) => EngineError::Backend(format!("--device opencl: {msg}")),
                    other => other,
                })
            }
            "cpu" => Ok(Device::Cpu(Self::cpu_for(cfg)?)),
            "auto" => match Self::select("auto")? {
                Device::Cpu(_) => Ok(Device::Cpu(Self::cpu_for(cfg)?)),
                #[allow(unreachable_patterns)] // a CPU-only build has no other device
                other => Ok(other),
            },
            name => Self::select(name),
        }
    }

    /// The CPU backend with packed GGUF weights unless `--cpu-dequantize-weights`, and `--kv-cache-dtype`.
    fn cpu_for(cfg: &super::config::EngineConfig) -> Result<CpuBackend> {
        Ok(CpuBackend::with_packed_weights(cfg.cpu_packed_weights).with_kv_cache_dtype(cfg.kv_cache_dtype_choice()?))
    }

    /// Resolves `--device` (auto: a Level Zero GPU if one is found, else the CPU).
    pub fn select(name: &str) -> Result<Self> {
        Self::open(name).map_err(|e| match e {
            EngineError::Backend(msg) => EngineError::Backend(format!("--device {name}: {msg}")),
            other => other,
        })
    }

    fn open(name: &str) -> Result<Self> {
        match name {
            #[cfg(feature = "level-zero")]
            "auto" => {
                Ok(crate::backend::level_zero::auto().map_or_else(|| Device::Cpu(CpuBackend::new()), Device::LevelZero))
            }
            #[cfg(not(feature = "level-zero"))]
            "auto" => Ok(Device::Cpu(CpuBackend::new())),
            "cpu" => Ok(Device::Cpu(CpuBackend::new())),
            #[cfg(feature = "cuda")]
            "cuda" => Ok(Device::Cuda(crate::backend::cuda::CudaBackend::new(0)?)),
            #[cfg(feature = "cuda")]
            cuda if cuda.starts_with("cuda:") => match cuda[5..].parse::<usize>() {
                Ok(n) => Ok(Device::Cuda(crate::backend::cuda::CudaBackend::new(n)?)),
                Err(_) => Err(EngineError::InvalidArgument(format!("--device {cuda}: expected cuda or cuda:N"))),
            },
            #[cfg(feature = "level-zero")]
            lz if crate::backend::level_zero::parse_device_arg(lz).is_some() => {
                Ok(Device::LevelZero(crate::backend::level_zero::open(lz).map_err(crate::backend::BackendError::from)?))
            }
            other => Err(EngineError::InvalidArgument(format!(
                "--device {other} is not available in this build (supported: {})",
                Self::available()
            ))),
        }
    }

    /// The `--device` values this build accepts (each device backend is a cargo feature).
    pub fn available() -> String {
        let mut v = vec!["auto", "cpu"];
        if cfg!(feature = "level-zero") {
            v.push("level-zero[:N]");
        }
        if cfg!(feature = "opencl") {
            v.push("opencl");
        }
        if cfg!(feature = "cuda") {
            v.push("cuda[:N]");
        }
        v.join(", ")
    }

    /// Memory the device offers for weights + KV cache; None: host memory (the CPU budget rule applies).
    pub fn memory_bytes(&self) -> Option<u64> {
        match self {
            Device::Cpu(_) => None,
            #[cfg(feature = "level-zero")]
            Device::LevelZero(b) => Some(b.memory_bytes()),
            #[cfg(feature = "opencl")]
            Device::OpenCl(b) => b.memory_bytes(),
            #[cfg(feature = "cuda")]
            Device::Cuda(b) => Some(b.memory_bytes()),
        }
    }

    /// The KV cache's element type for a model computing in `compute` (`Backend::kv_cache_dtype`).
    pub fn kv_cache_dtype(&self, compute: crate::backend::WeightDType) -> crate::backend::WeightDType {
        use crate::backend::Backend;
        match self {
            Device::Cpu(b) => b.kv_cache_dtype(compute),
            #[cfg(feature = "level-zero")]
            Device::LevelZero(b) => b.kv_cache_dtype(compute),
            #[cfg(feature = "opencl")]
            Device::OpenCl(b) => b.kv_cache_dtype(compute),
            #[cfg(feature = "cuda")]
            Device::Cuda(b) => b.kv_cache_dtype(compute),
        }
    }

    /// The CPU backend (host memory, f32 compute by default).
    pub fn is_host(&self) -> bool {
        matches!(self, Device::Cpu(_))
    }

    pub fn name(&self) -> String {
        match self {
            Device::Cpu(b) => crate::backend::Backend::device_name(b),
            #[cfg(feature = "level-zero")]
            Device::LevelZero(b) => crate::backend::Backend::device_name(b),
            #[cfg(feature = "opencl")]
            Device::OpenCl(b) => crate::backend::Backend::device_name(b),
            #[cfg(feature = "cuda")]
            Device::Cuda(b) => crate::backend::Backend::device_name(b),
        }
    }

    /// Uploads this MPI rank's shard and allocates `num_blocks` KV blocks for its layers on this device.
    #[cfg(feature = "mpi")]
    pub fn build_rank(
        self,
        params: &ModelParams,
        weights: &Weights,
        comm: crate::dist::mpi_comm::MpiComm,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Box<dyn crate::dist::runner::RankStep>> {
        use crate::dist::runner::RankModel;
        match self {
            Device::Cpu(b) => Ok(Box::new(RankModel::new(b, params, weights, comm, num_blocks, block_size)?)),
            #[cfg(feature = "level-zero")]
            Device::LevelZero(b) => Ok(Box::new(RankModel::new(b, params, weights, comm, num_blocks, block_size)?)),
            #[cfg(feature = "opencl")]
            Device::OpenCl(b) => Ok(Box::new(RankModel::new(b, params, weights, comm, num_blocks, block_size)?)),
            #[cfg(feature = "cuda")]
            Device::Cuda(b) => Ok(Box::new(RankModel::new(b, params, weights, comm, num_blocks, block_size)?)),
        }
    }

    /// Uploads the model and allocates `num_blocks` KV blocks on this device, with the default limits
    /// (`RunnerOptions::default`: on a backend that records, decode steps of up to 256 sequences of up to 4096 tokens
    /// are recorded).
    pub fn build_runner(
        self,
        params: &ModelParams,
        weights: &Weights,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Box<dyn StepRunner>> {
        self.build_runner_with(params, weights, num_blocks, block_size, Default::default())
    }

    /// `build_runner` with the engine's limits (`ModelRunner::with_options`).
    /// An encoder's runner on this device (pooling only): its weights through `take` (Hugging Face names without
    /// the model's prefix), matmul weights in `dtype`.
    pub fn build_encoder_runner(
        self,
        params: &rserve_model_io::config::encoder::EncoderParams,
        take: &dyn Fn(&str) -> Result<candle_core::Tensor>,
        dtype: candle_core::DType,
    ) -> Result<Box<dyn StepRunner>> {
        use crate::model::bert::EncoderModel;
        use crate::runner::EncoderRunner;
        macro_rules! build {
            ($b:expr) => {{
                let b = $b;
                let model = EncoderModel::load(&b, params, take, dtype)?;
                Ok(Box::new(EncoderRunner::new(b, model)))
            }};
        }
        match self {
            Device::Cpu(b) => build!(b),
            #[cfg(feature = "level-zero")]
            Device::LevelZero(b) => build!(b),
            #[cfg(feature = "opencl")]
            Device::OpenCl(b) => build!(b),
            #[cfg(feature = "cuda")]
            Device::Cuda(b) => build!(b),
        }
    }

    pub fn build_runner_with(
        self,
        params: &ModelParams,
        weights: &Weights,
        num_blocks: usize,
        block_size: usize,
        opts: RunnerOptions,
    ) -> Result<Box<dyn StepRunner>> {
        let (p, w, n, bs) = (params, weights, num_blocks, block_size);
        match self {
            Device::Cpu(b) => Ok(Box::new(ModelRunner::with_options(b, p, w, n, bs, opts)?)),
            #[cfg(feature = "level-zero")]
            Device::LevelZero(b) => Ok(Box::new(ModelRunner::with_options(b, p, w, n, bs, opts)?)),
            #[cfg(feature = "opencl")]
            Device::OpenCl(b) => Ok(Box::new(ModelRunner::with_options(b, p, w, n, bs, opts)?)),
            #[cfg(feature = "cuda")]
            Device::Cuda(b) => {
                b.set_op_profile(opts.profile == crate::runner::ProfileMode::Ops);
                Ok(Box::new(ModelRunner::with_options(b, p, w, n, bs, opts)?))
            }
        }
    }
}
