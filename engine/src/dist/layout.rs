//! Which rank does what: world rank -> (pipeline stage, TP rank), and the start-up checks that turn a wrong launch
//! into an error with the exact `mpiexec` line to use.

use crate::error::{EngineError, Result};

/// The process grid: `world = tp x pp`, ranks laid out stage-major (rank = stage * tp + tp_rank), so the TP group of
/// a stage is contiguous (on Aurora: the tiles of one node). With `expert_parallel`, the TP group of a stage also
/// shares out its routed experts (each rank whole experts) instead of slicing every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub tp: usize,
    pub pp: usize,
    pub rank: usize,
    pub expert_parallel: bool,
}

impl Layout {
    pub fn world(&self) -> usize {
        self.tp * self.pp
    }
    pub fn stage(&self) -> usize {
        self.rank / self.tp
    }
    pub fn tp_rank(&self) -> usize {
        self.rank % self.tp
    }
    /// World rank of TP rank `t` in stage `s`.
    pub fn rank_of(&self, stage: usize, t: usize) -> usize {
        stage * self.tp + t
    }
    /// World rank that sends the logits back to rank 0 (TP rank 0 of the last stage).
    pub fn logits_rank(&self) -> usize {
        self.rank_of(self.pp - 1, 0)
    }
}

/// The world size an MPI launcher announced through the environment (Open MPI, MPICH/PMI, Slurm), if any.
pub fn launcher_world_size(var: impl Fn(&str) -> Option<String>) -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"]
        .iter()
        .find_map(|k| var(k).and_then(|v| v.trim().parse().ok()))
}

/// The command that would start `tp x pp` ranks of this same invocation.
pub fn mpiexec_line(tp: usize, pp: usize, args: &[String]) -> String {
    format!("mpiexec -n {} {}", tp * pp, args.join(" "))
}

/// Checks the requested grid against the launched world.
pub fn check_world(tp: usize, pp: usize, world: usize, args: &[String]) -> Result<()> {
    if tp == 0 || pp == 0 {
        return Err(EngineError::InvalidArgument(
            "--tensor-parallel-size and --pipeline-parallel-size must be at least 1".into(),
        ));
    }
    if world != tp * pp {
        let hint = mpiexec_line(tp, pp, args);
        return Err(EngineError::InvalidArgument(if world == 1 {
            format!(
                "--tensor-parallel-size {tp} x --pipeline-parallel-size {pp} needs {} MPI ranks but this is a single \
                 process; start it with: {hint}",
                tp * pp
            )
        } else {
            format!("the MPI world has {world} ranks but tp x pp = {tp} x {pp} = {}; start it with: {hint}", tp * pp)
        }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_stage_major() {
        let l = Layout { tp: 3, pp: 2, rank: 4, expert_parallel: false };
        assert_eq!((l.stage(), l.tp_rank(), l.world(), l.logits_rank()), (1, 1, 6, 3));
    }

    #[test]
    fn single_process_error_prints_the_mpiexec_line() {
        let args = vec!["rserve".to_string(), "m.gguf".into(), "-tp".into(), "3".into()];
        let e = check_world(3, 1, 1, &args).unwrap_err().to_string();
        assert!(e.contains("mpiexec -n 3 rserve m.gguf -tp 3"), "{e}");
        assert!(check_world(3, 2, 6, &args).is_ok());
    }

    #[test]
    fn launcher_size_comes_from_the_environment() {
        let env = |k: &str| (k == "PMI_SIZE").then(|| "4".to_string());
        assert_eq!(launcher_world_size(env), Some(4));
        assert_eq!(launcher_world_size(|_| None), None);
    }
}
