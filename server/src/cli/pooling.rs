//! The pooling flags: `--runner`, `--convert`, the legacy `--task` (vLLM's older spelling of both) and
//! `--pooler-config`, checked into the engine's `RunnerChoice`, `ConvertChoice` and `PoolerOverride`.

use rserve_engine::config::pooling::PoolerOverride;
use rserve_engine::engine::{ConvertChoice, RunnerChoice};

use super::CliError;

/// `--runner` and `--convert`, then `--task` for whichever of the two is left at `auto`.
pub fn runner_and_convert(
    runner: &str,
    convert: &str,
    task: Option<&str>,
) -> Result<(RunnerChoice, ConvertChoice), CliError> {
    let mut runner = match runner {
        "auto" => RunnerChoice::Auto,
        "generate" => RunnerChoice::Generate,
        "pooling" => RunnerChoice::Pooling,
        other => return Err(CliError::Runner(other.to_owned())),
    };
    let mut convert = match convert {
        "auto" => ConvertChoice::Auto,
        "none" => ConvertChoice::None,
        "embed" => ConvertChoice::Embed,
        "classify" => ConvertChoice::Classify,
        other => return Err(CliError::Convert(other.to_owned())),
    };
    let (task_runner, task_convert) = match task {
        None | Some("auto") => (RunnerChoice::Auto, ConvertChoice::Auto),
        Some("generate") => (RunnerChoice::Generate, ConvertChoice::Auto),
        Some("embed" | "embedding") => (RunnerChoice::Pooling, ConvertChoice::Embed),
        Some("classify") => (RunnerChoice::Pooling, ConvertChoice::Classify),
        // A cross-encoder scores through its classifier; what the model is decides the rest.
        Some("score") => (RunnerChoice::Pooling, ConvertChoice::Auto),
        Some(other) => return Err(CliError::Task(other.to_owned())),
    };
    if runner == RunnerChoice::Auto {
        runner = task_runner;
    }
    if convert == ConvertChoice::Auto {
        convert = task_convert;
    }
    Ok((runner, convert))
}

/// `--pooler-config JSON` (absent: the model's own pooler).
pub fn pooler_config(json: Option<&str>) -> Result<PoolerOverride, CliError> {
    json.map_or(Ok(PoolerOverride::default()), |j| PoolerOverride::parse(j).map_err(CliError::PoolerConfig))
}
