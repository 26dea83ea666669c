//! The rserve benchmark crate: criterion benches live in `benches/`; this library holds what they share
//! ([`models`]: locating the test models) and the serving load generator behind `rserve bench serve` ([`serve`]).

pub mod models;
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
