//! The `rserve` binary: parses the command line and runs `serve` (the OpenAI-compatible server), `run-batch` (a
//! batch file offline, `run_batch/`), `generate` or `convert`. The server's code map: `cli/` (flags: clap's, the vLLM flag table, `--config`, `VLLM_*`), `serve` (life cycle), `app` + `routes/*` (HTTP), `openai/*`
//! (wire types, validation, rendering), `sse`, `fanout`, `state` (admission), `auth`, `json`, `error` (the one
//! place errors become responses), `port` + `live` (the engine seen through one trait), `cors` and `tls` (the HTTP front's flags), `stats_log`,
//! `shutdown`.

mod app;
#[cfg(test)]
mod app_tests;
mod auth;
mod cli;
mod convert;
mod cors;
mod dp;
mod error;
mod fanout;
mod generate;
mod human;
mod json;
mod live;
mod logging;
mod openai;
mod plan;
mod port;
mod routes;
mod run_batch;
mod serve;
mod shutdown;
mod sse;
mod state;
mod stats_log;
#[cfg(test)]
mod testing;
mod tls;

use std::process::ExitCode;

use cli::Command;

fn main() -> ExitCode {
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(e) => {
            // A refused flag or a bad --config file: one line, and exit code 1 (clap's usage errors exit with 2).
            eprintln!("Error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (access_level, log_level) = match &cli.command {
        Command::Serve(a) => (Some(a.frontend.uvicorn_log_level.clone()), a.frontend.log_level.clone()),
        Command::RunBatch(a) => (None, a.log_level.clone()),
        _ => (None, None),
    };
    logging::init(access_level.as_deref(), log_level.as_deref());
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Plan(args) => plan::run(args),
        Command::RunBatch(args) => run_batch::run(args),
        Command::Bench(cmd) => rserve_benches::run(*cmd).map_err(Into::into),
        Command::HelpFlags => {
            print!("{}", cli::flag_docs::markdown());
            Ok(())
        }
    };
    match result {
        Ok(()) => {
            rserve_engine::engine::finalize();
            ExitCode::SUCCESS
        }
        Err(e) => {
            let message = format!("Error: {e:#}");
            // Under mpiexec the other ranks wait for this one: end them all (MPI_Finalize here would hang).
            rserve_engine::engine::abort_job_on_error(&message);
            eprintln!("{message}");
            rserve_engine::engine::finalize();
            ExitCode::FAILURE
        }
    }
}
