//! Data-parallel replicas (`--data-parallel-size N`): the `EngineConfig` of each of N engines that one server runs
//! side by side, each with its own device (or share of the cores), scheduler and KV cache. Which device replica `i`
//! takes: `cuda` GPU `i` (`cuda:K`: GPU `K + i`), `level-zero` device `i` in the order `ZE_AFFINITY_MASK` and
//! `ZE_FLAT_DEVICE_HIERARCHY` give (`level-zero:K`: `K + i`), `opencl` the platform's GPU `i` (or one device they
//! share: `backend::opencl::replica_devices`), `cpu` an equal share of the cores (its own rayon pool) and of the host
//! memory budget.
//!
//! Under `mpiexec` (`-dp N` with `-tp` / `-pp`, or any `-dp` launched as `dp x tp x pp` ranks) the replicas are
//! groups of MPI ranks instead (`dist::layout::World`): every rank opens `--device` as the launcher placed it, and
//! rank 0 runs every replica's engine thread (`start_over_mpi`): replica 0 on its own ranks as a `-tp`/`-pp` job
//! does, the others as remote runners that send each step to their ranks and take the logits back.

use super::config::EngineConfig;
use crate::error::{EngineError, Result};

/// The most replicas one server runs (the router keeps which replicas hold a prefix block as a 64-bit set).
pub const MAX_REPLICAS: usize = 64;

/// Refuses what `-dp n` cannot be, before anything loads (under `mpiexec`, before the ranks part ways): no replicas,
/// or more than `MAX_REPLICAS`. With `-tp` / `-pp` the replicas are MPI rank groups (`distributed::role` checks the
/// world size against `dp x tp x pp`).
pub fn check(n: usize) -> Result<()> {
    if !(1..=MAX_REPLICAS).contains(&n) {
        return Err(EngineError::InvalidArgument(format!(
            "--data-parallel-size {n}: must be between 1 and {MAX_REPLICAS}"
        )));
    }
    Ok(())
}

/// The configuration of each of `n` replicas over MPI rank groups: replica `i`'s index, everything else as given
/// (each rank opens its own device; the ranks are processes, so no cores or memory are split here).
pub fn mpi_configs(cfg: &EngineConfig, n: usize) -> Result<Vec<EngineConfig>> {
    check(n)?;
    Ok((0..n).map(|i| EngineConfig { data_parallel_rank: i, data_parallel_size: n, ..cfg.clone() }).collect())
}

/// Starts the engines of `n` replicas over MPI on rank 0 (blocking): replica 0 first, on rank 0's own shard; then
/// the others in parallel, each sized as replica 0 (their ranks hold the same shards on the same kind of device, as
/// the ranks of one replica take rank 0's block count) and driving its ranks from rank 0. On an error the engines
/// started so far are stopped.
pub fn start_over_mpi(cfg: &EngineConfig, n: usize) -> Result<Vec<super::EngineHandle>> {
    let configs = mpi_configs(cfg, n)?;
    let mut configs = configs.into_iter();
    let first = configs.next().ok_or(EngineError::EngineStopped)?;
    let (first, sizing) = {
        let _span = tracing::info_span!("dp", engine = 0).entered();
        super::start::start_sized(first, None)?
    };
    let Some(sizing) = sizing else {
        first.shutdown();
        return Err(EngineError::InvalidArgument("an encoder is not served with -dp over MPI".into()));
    };
    let rest: Vec<Result<super::EngineHandle>> = std::thread::scope(|s| {
        let starts: Vec<_> = configs
            .map(|c| {
                let sizing = &sizing;
                s.spawn(move || {
                    let _span = tracing::info_span!("dp", engine = c.data_parallel_rank).entered();
                    super::start::start_sized(c, Some(sizing)).map(|(h, _)| h)
                })
            })
            .collect();
        starts.into_iter().map(|h| h.join().unwrap_or(Err(EngineError::EngineStopped))).collect()
    });
    let mut handles = vec![first];
    let mut failure = None;
    for r in rest {
        match r {
            Ok(h) => handles.push(h),
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    match failure {
        Some(e) => {
            handles.iter().for_each(|h| h.shutdown());
            Err(e)
        }
        None => Ok(handles),
    }
}

/// The configuration of each of `n` replicas of `cfg`, with the devices resolved (`--device auto` and `opencl`
/// ask the runtime which devices exist).
pub fn replica_configs(cfg: &EngineConfig, n: usize) -> Result<Vec<EngineConfig>> {
    check(n)?;
    let device = match cfg.device.as_str() {
        #[cfg(feature = "level-zero")]
        "auto" if n > 1 && crate::backend::level_zero::auto_available() => "level-zero".to_string(),
        "auto" if n > 1 => "cpu".to_string(),
        d => d.to_string(),
    };
    let opencl = if device == "opencl" && n > 1 { opencl_replica_devices(cfg, n)? } else { Vec::new() };
    let cfg = EngineConfig { device, ..cfg.clone() };
    assign(&cfg, n, rayon::current_num_threads(), &opencl)
}

/// The OpenCL device of each of `n` replicas (one they share when the platform has fewer GPUs).
#[cfg(feature = "opencl")]
fn opencl_replica_devices(cfg: &EngineConfig, n: usize) -> Result<Vec<usize>> {
    let opts =
        crate::backend::opencl::OpenClOptions { platform: cfg.opencl_platform.clone(), device: cfg.opencl_device };
    let devices = crate::backend::opencl::replica_devices(&opts, n)?;
    if devices.windows(2).any(|w| w[0] == w[1]) {
        tracing::warn!(
            "--data-parallel-size {n} --device opencl: the platform has fewer than {n} GPUs, so the replicas \
                 share OpenCL device {}",
            devices[0]
        );
    }
    Ok(devices)
}

#[cfg(not(feature = "opencl"))]
fn opencl_replica_devices(_: &EngineConfig, _: usize) -> Result<Vec<usize>> {
    Err(crate::EngineError::InvalidArgument(format!(
        "--device opencl is not available in this build (supported: {})",
        super::device::Device::available()
    )))
}

/// `replica_configs` once the devices are known: `cores` is the CPU threads to split, `opencl` the OpenCL device of
/// each replica (empty unless `--device opencl`).
pub fn assign(cfg: &EngineConfig, n: usize, cores: usize, opencl: &[usize]) -> Result<Vec<EngineConfig>> {
    check(n)?;
    if n == 1 {
        return Ok(vec![cfg.clone()]);
    }
    (0..n)
        .map(|i| {
            let mut c = cfg.clone();
            c.data_parallel_rank = i;
            c.device = match cfg.device.as_str() {
                "cpu" | "opencl" => cfg.device.clone(),
                "cuda" => format!("cuda:{i}"),
                "level-zero" => format!("level-zero:{i}"),
                d => match indexed(d) {
                    Some((name, k)) => format!("{name}:{}", k + i),
                    None => return Err(EngineError::InvalidArgument(format!("--device {d} with -dp {n}"))),
                },
            };
            let shares_host = match cfg.device.as_str() {
                "cpu" => true,
                "opencl" => opencl.iter().filter(|&&d| d == opencl[i]).count() > 1,
                _ => false,
            };
            if cfg.device == "opencl" {
                c.opencl_device = opencl.get(i).copied();
            }
            if cfg.device == "cpu" {
                c.cpu_threads = Some((cfg.cpu_threads.unwrap_or(cores) / n).max(1));
            }
            // Replicas on one host (or one shared device) budget from the same memory: each takes its share.
            if shares_host && cfg.kv_cache_memory_bytes.is_none() {
                c.gpu_memory_utilization = cfg.gpu_memory_utilization / n as f64;
            }
            Ok(c)
        })
        .collect()
}

/// `cuda:3` -> ("cuda", 3), `level-zero:1` -> ("level-zero", 1).
fn indexed(device: &str) -> Option<(&str, usize)> {
    let (name, k) = device.split_once(':')?;
    matches!(name, "cuda" | "level-zero").then_some(())?;
    Some((name, k.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(device: &str) -> EngineConfig {
        let mut c = EngineConfig::new("m");
        c.device = device.into();
        c
    }

    #[test]
    fn gpus_are_taken_in_order_from_the_first_named() {
        let devices = |d: &str| -> Vec<String> {
            assign(&cfg(d), 3, 8, &[]).expect("assigned").into_iter().map(|c| c.device).collect()
        };
        assert_eq!(devices("cuda"), ["cuda:0", "cuda:1", "cuda:2"]);
        assert_eq!(devices("cuda:2"), ["cuda:2", "cuda:3", "cuda:4"]);
        assert_eq!(devices("level-zero"), ["level-zero:0", "level-zero:1", "level-zero:2"]);
        assert_eq!(devices("level-zero:4"), ["level-zero:4", "level-zero:5", "level-zero:6"]);
        let ranks: Vec<usize> =
            assign(&cfg("cuda"), 3, 8, &[]).expect("ok").iter().map(|c| c.data_parallel_rank).collect();
        assert_eq!(ranks, [0, 1, 2]);
    }

    #[test]
    fn the_cpu_is_split_into_thread_pools_and_memory_shares() {
        let mut c = cfg("cpu");
        c.gpu_memory_utilization = 0.8;
        let r = assign(&c, 2, 5, &[]).expect("assigned");
        assert_eq!(r.iter().map(|c| c.cpu_threads).collect::<Vec<_>>(), [Some(2), Some(2)]);
        assert!(r.iter().all(|c| (c.gpu_memory_utilization - 0.4).abs() < 1e-9));
        // More replicas than cores: one thread each; an explicit KV size is each replica's own.
        c.kv_cache_memory_bytes = Some(1 << 20);
        let r = assign(&c, 3, 2, &[]).expect("assigned");
        assert!(r.iter().all(|c| c.cpu_threads == Some(1) && c.gpu_memory_utilization == 0.8));
    }

    #[test]
    fn opencl_replicas_open_their_devices_and_split_a_shared_one() {
        let r = assign(&cfg("opencl"), 2, 4, &[1, 2]).expect("assigned");
        assert_eq!(r.iter().map(|c| c.opencl_device).collect::<Vec<_>>(), [Some(1), Some(2)]);
        assert!(r.iter().all(|c| c.gpu_memory_utilization == 0.9));
        let r = assign(&cfg("opencl"), 2, 4, &[0, 0]).expect("assigned");
        assert!(r.iter().all(|c| c.opencl_device == Some(0) && (c.gpu_memory_utilization - 0.45).abs() < 1e-9));
    }

    #[test]
    fn one_replica_is_the_configuration_as_given() {
        let r = assign(&cfg("cuda"), 1, 8, &[]).expect("assigned");
        assert_eq!((r.len(), r[0].device.as_str(), r[0].cpu_threads), (1, "cuda", None));
    }

    #[test]
    fn replicas_over_mpi_keep_the_device_and_take_their_index() {
        let mut c = cfg("cuda");
        c.tensor_parallel_size = 2;
        c.gpu_memory_utilization = 0.8;
        let r = mpi_configs(&c, 3).expect("configs");
        assert_eq!(r.iter().map(|c| c.data_parallel_rank).collect::<Vec<_>>(), [0, 1, 2]);
        // Each rank opens --device as the launcher placed it; nothing is split between processes.
        assert!(r.iter().all(|c| c.device == "cuda" && c.cpu_threads.is_none() && c.gpu_memory_utilization == 0.8));
        assert!(r.iter().all(|c| c.world() == crate::dist::World { dp: 3, tp: 2, pp: 1 }));
        assert!(mpi_configs(&c, 0).is_err());
        assert!(mpi_configs(&c, MAX_REPLICAS + 1).is_err());
    }
}
