//! Data-parallel replicas (`--data-parallel-size N`): the `EngineConfig` of each of N engines that one server runs
//! side by side, each with its own device (or share of the cores), scheduler and KV cache. Which device replica `i`
//! takes: `cuda` GPU `i` (`cuda:K`: GPU `K + i`), `level-zero` device `i` in the order `ZE_AFFINITY_MASK` and
//! `ZE_FLAT_DEVICE_HIERARCHY` give (`level-zero:K`: `K + i`), `opencl` the platform's GPU `i` (or one device they
//! share: `backend::opencl::replica_devices`), `cpu` an equal share of the cores (its own rayon pool) and of the host
//! memory budget.

use super::config::EngineConfig;
use crate::error::{EngineError, Result};

/// The most replicas one server runs (the router keeps which replicas hold a prefix block as a 64-bit set).
pub const MAX_REPLICAS: usize = 64;

/// Refuses what `-dp n` cannot combine with, before anything loads (under `mpiexec`, before the ranks part ways):
/// no replicas, more than `MAX_REPLICAS`, or replicas of a model split over MPI ranks (`-tp` / `-pp` > 1).
pub fn check(cfg: &EngineConfig, n: usize) -> Result<()> {
    if !(1..=MAX_REPLICAS).contains(&n) {
        return Err(EngineError::InvalidArgument(format!(
            "--data-parallel-size {n}: must be between 1 and {MAX_REPLICAS}"
        )));
    }
    let ranks = cfg.tensor_parallel_size * cfg.pipeline_parallel_size;
    if n > 1 && ranks > 1 {
        return Err(EngineError::InvalidArgument(format!(
            "--data-parallel-size {n} with --tensor-parallel-size {} / --pipeline-parallel-size {}: data-parallel \
             replicas of a model split over MPI ranks are not supported yet; use -dp with -tp 1 -pp 1 (one \
             replica per device), or -tp / -pp without -dp",
            cfg.tensor_parallel_size, cfg.pipeline_parallel_size
        )));
    }
    Ok(())
}

/// The configuration of each of `n` replicas of `cfg`, with the devices resolved (`--device auto` and `opencl`
/// ask the runtime which devices exist).
pub fn replica_configs(cfg: &EngineConfig, n: usize) -> Result<Vec<EngineConfig>> {
    check(cfg, n)?;
    let device = match cfg.device.as_str() {
        "auto" if n > 1 && crate::backend::level_zero::auto_available() => "level-zero".to_string(),
        "auto" if n > 1 => "cpu".to_string(),
        d => d.to_string(),
    };
    let opencl = if device == "opencl" && n > 1 {
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
        devices
    } else {
        Vec::new()
    };
    let cfg = EngineConfig { device, ..cfg.clone() };
    assign(&cfg, n, rayon::current_num_threads(), &opencl)
}

/// `replica_configs` once the devices are known: `cores` is the CPU threads to split, `opencl` the OpenCL device of
/// each replica (empty unless `--device opencl`).
pub fn assign(cfg: &EngineConfig, n: usize, cores: usize, opencl: &[usize]) -> Result<Vec<EngineConfig>> {
    check(cfg, n)?;
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
    fn data_parallel_over_mpi_ranks_is_refused_naming_both_flags() {
        let mut c = cfg("cpu");
        c.tensor_parallel_size = 3;
        let err = assign(&c, 2, 8, &[]).expect_err("refused").to_string();
        assert!(err.contains("--data-parallel-size 2") && err.contains("--tensor-parallel-size 3"), "{err}");
        assert!(assign(&c, 1, 8, &[]).is_ok());
        assert!(assign(&cfg("cpu"), 0, 8, &[]).is_err());
    }
}
