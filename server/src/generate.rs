//! `rserve generate`: load a model, generate for one prompt (optionally through the chat template) and print the
//! text as it streams, then a short summary on stderr.

use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use rserve_engine::api::RequestEvent;

use crate::cli::GenerateArgs;
use crate::live::LiveEngine;
use crate::openai::types::SamplingFields;
use crate::openai::validate;
use crate::port::{ChatTurn, Engine};

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let model = args.engine.resolve_model(args.model_tag.as_deref())?;
    let config = args.engine.engine_config(&model, args.engine.scheduler.max_num_waiting)?;
    if rserve_engine::engine::run_if_worker(&config)? {
        return Ok(());
    }
    let engine = LiveEngine::start(config).context("starting the engine")?;
    let result = generate(&engine, &args);
    engine.shutdown();
    result
}

fn generate(engine: &LiveEngine, args: &GenerateArgs) -> anyhow::Result<()> {
    let max_tokens = i64::try_from(args.max_tokens).context("--max-tokens is too large")?;
    let fields = SamplingFields {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        seed: Some(args.engine.model.seed as i64),
        max_tokens: Some(max_tokens),
        ignore_eos: Some(args.ignore_eos),
        ..SamplingFields::default()
    };
    let common = validate::common(&fields, engine.info(), &engine.default_sampling())?;
    let prompt = if args.chat {
        let turn = ChatTurn::new("user", args.prompt.clone());
        validate::chat_prompt(engine, &[turn], true)?
    } else {
        engine.encode(&args.prompt, true).context("tokenizing the prompt")?
    };
    let prompt_tokens = prompt.len();
    let request = validate::requests_for_prompt(&common, prompt, engine.info(), "prompt")?
        .into_iter()
        .next()
        .context("no request was built")?;

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting tokio")?;
    runtime.block_on(async {
        let start = Instant::now();
        let mut first_token = None;
        let mut events = engine.submit(request).context("submitting the request")?;
        let mut stdout = std::io::stdout().lock();
        while let Some(event) = events.next().await {
            match event {
                RequestEvent::Delta { text, .. } => {
                    first_token.get_or_insert_with(|| start.elapsed());
                    write!(stdout, "{text}").and_then(|_| stdout.flush()).context("writing to stdout")?;
                }
                RequestEvent::Finished { reason, usage, .. } => {
                    let _ = writeln!(stdout);
                    let total = start.elapsed().as_secs_f64();
                    let ttft = first_token.map(|d| d.as_secs_f64()).unwrap_or(total);
                    let decode = (total - ttft).max(1e-9);
                    eprintln!(
                        "[{} prompt tokens, {} generated, finish_reason={}; first token after {:.3} s, {:.1} tokens/s after it]",
                        prompt_tokens,
                        usage.completion_tokens,
                        reason.as_str(),
                        ttft,
                        usage.completion_tokens.saturating_sub(1) as f64 / decode
                    );
                    return Ok(());
                }
                RequestEvent::Error(message) => anyhow::bail!("the engine failed: {message}"),
                RequestEvent::PromptLogprobs { .. } | RequestEvent::Pooled { .. } => {}
            }
        }
        anyhow::bail!("the engine stopped before the request finished")
    })
}
