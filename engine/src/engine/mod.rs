//! The engine thread and its handle: one thread owns the scheduler and the model runner; everything else sends it
//! commands and receives per-request events.

pub mod budget;
pub mod config;
pub mod device;
pub mod distributed;
pub mod engine_core;
mod faults;
pub mod handle;
mod masks;
pub mod metrics;
mod output;
mod output_thread;
pub(crate) mod phase;
mod pool_step;
mod pooling_setup;
pub mod replicas;
mod start;
mod start_encoder;
mod thread;
mod warmup;

pub use config::{ConvertChoice, DTypeArg, EngineConfig, RunnerChoice};
pub use device::Device;
pub use distributed::{abort_job_on_error, finalize, run_if_worker};
pub use handle::{EngineHandle, PrefixCacheReset, RequestStream};
pub use metrics::EngineMetrics;
pub use replicas::replica_configs;
pub use start::start;
