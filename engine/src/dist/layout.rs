//! Which rank does what: world rank -> (data-parallel replica, pipeline stage, TP rank), and the start-up checks that
//! turn a wrong launch into an error with the exact `mpiexec` line to use.

use crate::error::{EngineError, Result};

/// The process grid of one replica: `tp x pp` ranks, laid out stage-major (rank = stage * tp + tp_rank), so the TP group of
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
    /// The share of the model world rank `rank` holds.
    pub fn shard(&self, p: &crate::config::ModelParams) -> Result<crate::model::shard::Shard> {
        Ok(crate::model::shard::Shard::with_experts(
            p,
            self.tp,
            self.pp,
            self.tp_rank(),
            self.stage(),
            self.expert_parallel,
        )?)
    }

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

/// The whole job under `mpiexec`: `dp` replicas of `tp x pp` ranks each, replica-major (world rank = replica x
/// (tp x pp) + the rank's place in its replica), so each replica's ranks are contiguous (the tiles of one node when
/// a replica fits on one). World rank 0 runs the server and the scheduler of every replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct World {
    pub dp: usize,
    pub tp: usize,
    pub pp: usize,
}

impl World {
    /// Ranks of one replica.
    pub fn group(&self) -> usize {
        self.tp * self.pp
    }
    pub fn size(&self) -> usize {
        self.dp * self.group()
    }
    /// The replica world rank `rank` belongs to.
    pub fn replica_of(&self, rank: usize) -> usize {
        rank / self.group()
    }
    /// World rank `rank`'s place in its replica (`Layout::rank`).
    pub fn rank_in_replica(&self, rank: usize) -> usize {
        rank % self.group()
    }
    /// The world ranks of replica `r`.
    pub fn ranks_of(&self, r: usize) -> std::ops::Range<usize> {
        r * self.group()..(r + 1) * self.group()
    }
}

/// The command that would start `dp x tp x pp` ranks of this same invocation.
pub fn mpiexec_line(world: World, args: &[String]) -> String {
    format!("mpiexec -n {} {}", world.size(), args.join(" "))
}

/// Checks the requested grid against the launched world.
pub fn check_world(want: World, world: usize, args: &[String]) -> Result<()> {
    let World { dp, tp, pp } = want;
    if tp == 0 || pp == 0 || dp == 0 {
        return Err(EngineError::InvalidArgument(
            "--tensor-parallel-size, --pipeline-parallel-size and --data-parallel-size must be at least 1".into(),
        ));
    }
    if world != want.size() {
        let hint = mpiexec_line(want, args);
        let product = match dp {
            1 => format!("--tensor-parallel-size {tp} x --pipeline-parallel-size {pp}"),
            _ => format!("--data-parallel-size {dp} x --tensor-parallel-size {tp} x --pipeline-parallel-size {pp}"),
        };
        return Err(EngineError::InvalidArgument(if world == 1 {
            format!("{product} needs {} MPI ranks but this is a single process; start it with: {hint}", want.size())
        } else {
            format!("the MPI world has {world} ranks but {product} = {}; start it with: {hint}", want.size())
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
        let e = check_world(World { dp: 1, tp: 3, pp: 1 }, 1, &args).unwrap_err().to_string();
        assert!(e.contains("mpiexec -n 3 rserve m.gguf -tp 3"), "{e}");
        assert!(check_world(World { dp: 1, tp: 3, pp: 2 }, 6, &args).is_ok());
    }

    #[test]
    fn replicas_are_contiguous_groups_of_tp_x_pp_ranks() {
        let w = World { dp: 3, tp: 2, pp: 2 };
        assert_eq!((w.group(), w.size()), (4, 12));
        assert_eq!((0..12).map(|r| w.replica_of(r)).collect::<Vec<_>>(), [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
        assert_eq!(w.ranks_of(1), 4..8);
        // World rank 6 is replica 1's rank 2: stage 1, TP rank 0 of that replica's grid.
        let l = Layout { tp: 2, pp: 2, rank: w.rank_in_replica(6), expert_parallel: false };
        assert_eq!((l.rank, l.stage(), l.tp_rank(), l.logits_rank()), (2, 1, 0, 2));
    }

    #[test]
    fn a_wrong_world_names_dp_tp_pp_and_their_product() {
        let args = vec!["rserve".to_string(), "m".into(), "-dp".into(), "2".into(), "-tp".into(), "2".into()];
        let want = World { dp: 2, tp: 2, pp: 1 };
        let e = check_world(want, 3, &args).unwrap_err().to_string();
        assert!(e.contains("the MPI world has 3 ranks"), "{e}");
        assert!(
            e.contains("--data-parallel-size 2 x --tensor-parallel-size 2 x --pipeline-parallel-size 1 = 4"),
            "{e}"
        );
        assert!(e.contains("mpiexec -n 4 rserve m -dp 2 -tp 2"), "{e}");
        let e = check_world(want, 1, &args).unwrap_err().to_string();
        assert!(e.contains("needs 4 MPI ranks but this is a single process"), "{e}");
        assert!(check_world(want, 4, &args).is_ok());
        assert!(check_world(World { dp: 0, tp: 1, pp: 1 }, 1, &args).is_err());
    }

    #[test]
    fn launcher_size_comes_from_the_environment() {
        let env = |k: &str| (k == "PMI_SIZE").then(|| "4".to_string());
        assert_eq!(launcher_world_size(env), Some(4));
        assert_eq!(launcher_world_size(|_| None), None);
    }
}
