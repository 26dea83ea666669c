//! The rserve benchmark crate: criterion benches live in `benches/` (they find the test models through the
//! `rserve-tests` dev-dependency); this library is the serving load generator behind `rserve bench serve` ([`serve`]).

pub mod serve;

use clap::Subcommand;

/// `rserve bench ...` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum BenchCommand {
    /// Load-test an OpenAI-compatible server (like `vllm bench serve`): TTFT, TPOT, ITL, E2E latency, throughput,
    /// goodput.
    Serve(serve::ServeBenchArgs),
}

/// Runs a `bench` subcommand.
pub fn run(cmd: BenchCommand) -> Result<(), serve::BenchError> {
    match cmd {
        BenchCommand::Serve(args) => serve::run(args),
    }
}
