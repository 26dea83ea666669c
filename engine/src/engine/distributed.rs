//! The engine's side of a multi-process launch: deciding this process's role from `-dp`/`-tp`/`-pp` and the MPI
//! launcher, running a worker rank to completion, and building rank 0's distributed runners (replica 0's, and under
//! `-dp` the remote runner of each other replica).

use super::config::EngineConfig;
use crate::config::ModelParams;
use crate::dist::{launcher_world_size, layout};
use crate::error::{EngineError, Result};
use crate::model::shard::check_tp;
use crate::runner::StepRunner;
use crate::weights::Weights;

/// What this process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// One process holds the whole model.
    Single,
    /// MPI rank 0: server, tokenizer, scheduler, and its own shard.
    Leader,
    /// Any other MPI rank: its shard only, driven by rank 0.
    Worker,
}

/// Decides the role; initialises MPI when the launch is distributed. Errors carry the exact `mpiexec` line. A single
/// process with `-tp 1 -pp 1` is `Single` whatever `-dp` says (its replicas run in this process); under a launcher
/// the world must be `dp x tp x pp` ranks.
pub fn role(cfg: &EngineConfig) -> Result<Role> {
    let world = cfg.world();
    let launched = launcher_world_size(|k| std::env::var(k).ok()).unwrap_or(1);
    if world.group() == 1 && launched == 1 {
        return Ok(Role::Single);
    }
    if launched == 1 {
        layout::check_world(world, 1, &cfg.launch_args)?;
    }
    distributed_role(cfg)
}

/// Whether `-dp` replicas run over MPI ranks (rank 0 drives them all) rather than in this process.
pub fn replicas_over_mpi(cfg: &EngineConfig) -> Result<bool> {
    Ok(cfg.data_parallel_size > 1 && role(cfg)? == Role::Leader)
}

#[cfg(feature = "mpi")]
fn distributed_role(cfg: &EngineConfig) -> Result<Role> {
    let (rank, size) = crate::dist::mpi_comm::init()?.unwrap_or((0, 1));
    layout::check_world(cfg.world(), size, &cfg.launch_args)?;
    // Collective: every rank splits the communicators here, from its main thread, before any replica starts.
    crate::dist::mpi_comm::split_all(cfg.world(), cfg.enable_expert_parallel)?;
    Ok(if rank == 0 { Role::Leader } else { Role::Worker })
}

#[cfg(not(feature = "mpi"))]
fn distributed_role(cfg: &EngineConfig) -> Result<Role> {
    let crate::dist::World { dp, tp, pp } = cfg.world();
    let dp = if dp > 1 { format!("--data-parallel-size {dp} x ") } else { String::new() };
    Err(EngineError::InvalidArgument(format!(
        "{dp}--tensor-parallel-size {tp} x --pipeline-parallel-size {pp} needs MPI support, which this rserve was \
         built without: rebuild with `cargo build --release -p rserve-server --features mpi` and start it with: {}",
        layout::mpiexec_line(cfg.world(), &cfg.launch_args)
    )))
}

/// Checks that the model can be split as asked (TP divides the heads, PP at most the layers, and under expert
/// parallelism every TP rank gets at least one expert).
pub fn check_split(p: &ModelParams, cfg: &EngineConfig) -> Result<()> {
    check_tp(p, cfg.tensor_parallel_size)?;
    if let (true, Some(m)) = (cfg.enable_expert_parallel, &p.moe) {
        if m.num_experts < cfg.tensor_parallel_size {
            return Err(EngineError::InvalidArgument(format!(
                "--enable-expert-parallel shares {} experts over --tensor-parallel-size {} ranks: at most {} ranks",
                m.num_experts, cfg.tensor_parallel_size, m.num_experts
            )));
        }
    }
    let pp = cfg.pipeline_parallel_size;
    if pp == 0 || pp > p.num_layers {
        return Err(EngineError::InvalidArgument(format!(
            "--pipeline-parallel-size {pp} must be between 1 and the number of layers ({})",
            p.num_layers
        )));
    }
    Ok(())
}

/// Rank 0's runner over every rank's shard.
#[cfg(feature = "mpi")]
pub fn leader_runner(
    device: super::Device,
    p: &ModelParams,
    w: &Weights,
    cfg: &EngineConfig,
    num_blocks: usize,
) -> Result<Box<dyn StepRunner>> {
    use crate::dist::leader::MpiRunner;
    use crate::dist::runner::agree_blocks;
    let comm = crate::dist::mpi_comm::take_member(0)?;
    let num_blocks = agree_blocks(&comm, num_blocks);
    let rank = device.build_rank(p, w, comm, num_blocks, cfg.block_size)?;
    Ok(Box::new(MpiRunner::local(rank, p.vocab_size, cfg.async_scheduling)?))
}

#[cfg(not(feature = "mpi"))]
pub fn leader_runner(
    _: super::Device,
    _: &ModelParams,
    _: &Weights,
    _: &EngineConfig,
    _: usize,
) -> Result<Box<dyn StepRunner>> {
    Err(EngineError::InvalidArgument("this rserve was built without MPI support".into()))
}

/// Rank 0's runner of `-dp` replica `cfg.data_parallel_rank` (1..), whose ranks are other processes: it sends them
/// the KV block count and then each step.
#[cfg(feature = "mpi")]
pub fn remote_runner(cfg: &EngineConfig, vocab: usize, num_blocks: usize) -> Result<Box<dyn StepRunner>> {
    use crate::dist::leader::MpiRunner;
    let comm = crate::dist::mpi_comm::take_driver(cfg.data_parallel_rank)?;
    MpiRunner::agree_remote_blocks(&comm, num_blocks);
    Ok(Box::new(MpiRunner::remote(comm, vocab, cfg.async_scheduling)?))
}

#[cfg(not(feature = "mpi"))]
pub fn remote_runner(_: &EngineConfig, _: usize, _: usize) -> Result<Box<dyn StepRunner>> {
    Err(EngineError::InvalidArgument("this rserve was built without MPI support".into()))
}

/// On a worker rank: loads this rank's shard and serves rank 0's steps until it stops; returns true. On rank 0 or a
/// single process: returns false at once (the caller starts the engine).
pub fn run_if_worker(cfg: &EngineConfig) -> Result<bool> {
    if role(cfg)? != Role::Worker {
        return Ok(false);
    }
    #[cfg(feature = "mpi")]
    {
        let mut opts = cfg.resolve_options();
        opts.progress = false;
        let dummy = cfg.load_format == "dummy";
        let resolved = match dummy {
            true => crate::weights::dummy::resolve(&cfg.model)
                .or_else(|_| crate::source::resolve_model(&cfg.model, &opts))?,
            false => crate::source::resolve_model(&cfg.model, &opts)?,
        };
        let params = resolved.load_params()?;
        check_split(&params, cfg)?;
        // Each rank opens its own device (under a launcher, ZE_AFFINITY_MASK / CUDA_VISIBLE_DEVICES per rank pick it),
        // first: `--dtype auto` depends on it, as on rank 0.
        let device = super::Device::select_for(cfg)?;
        let gguf = matches!(resolved, crate::source::ResolvedModel::Gguf(_));
        let dtype = cfg.dtype.resolve(device.is_host(), gguf, params.torch_dtype.as_deref());
        let weights = match dummy {
            true => crate::weights::dummy::dummy(&params, dtype, cfg.seed)?,
            false => {
                let (rank, _) = crate::dist::mpi_comm::current().unwrap_or((0, 1));
                let l = cfg.layout(rank);
                let shard = l.shard(&params)?;
                crate::weights::load_shard(&resolved, &params, dtype, &shard)?
            }
        };
        let (rank, _) = crate::dist::mpi_comm::current().unwrap_or((0, 1));
        let replica = cfg.world().replica_of(rank);
        crate::dist::runner::run_worker(device, &params, &weights, replica, cfg.block_size)?;
    }
    Ok(true)
}

/// After an error on any rank of a multi-rank job: prints it with the rank and aborts the whole job, since the other
/// ranks would otherwise wait for this one forever. Returns (doing nothing) in a single process.
pub fn abort_job_on_error(message: &str) {
    #[cfg(feature = "mpi")]
    if let Some((rank, size)) = crate::dist::mpi_comm::current() {
        if size > 1 {
            crate::dist::mpi_comm::abort(&format!("{message} (on MPI rank {rank} of {size}; aborting the job)"));
        }
    }
    let _ = message;
}

/// Ends MPI on every rank (no-op in a single process). Call last in `main`.
pub fn finalize() {
    #[cfg(feature = "mpi")]
    crate::dist::mpi_comm::finalize();
}
