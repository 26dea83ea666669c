//! vLLM's request fields beyond OpenAI's that change the output, read and checked here (each error names its field):
//! `include_stop_str_in_output`, `allowed_token_ids`, `bad_words`, `truncate_prompt_tokens`, `prompt_logprobs` (both
//! routes) and the chat
//! options `echo`, `continue_final_message`, `chat_template_kwargs`, `documents`, `reasoning_effort`.

use rserve_engine::TokenId;
use serde_json::{Map, Value};

use super::types::{ChatCompletionRequest, ChatMessageIn, MessageContent, SamplingFields};
use super::validate::{Common, ValidationError};
use crate::port::Engine;

type Result<T> = std::result::Result<T, ValidationError>;

fn invalid(field: &str, message: impl Into<String>) -> ValidationError {
    ValidationError::InvalidField { field: field.to_owned(), message: message.into() }
}

fn flag(field: &str, v: &Option<Value>) -> Result<bool> {
    match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid(field, "must be a boolean")),
    }
}

/// Applies the shared fields to the checked settings: stop strings in the output, the allowed ids, the banned
/// words (tokenized as vLLM does: as given and after a space), and the prompt truncation.
pub fn apply_sampling_extras(f: &SamplingFields, engine: &dyn Engine, c: &mut Common) -> Result<()> {
    c.stop.include_stop_str_in_output = flag("include_stop_str_in_output", &f.include_stop_str_in_output)?;
    let vocab = engine.info().vocab_size;
    if let Some(v) = f.allowed_token_ids.as_ref().filter(|v| !v.is_null()) {
        let items = v.as_array().ok_or_else(|| invalid("allowed_token_ids", "must be a list of token ids"))?;
        if items.is_empty() {
            return Err(invalid("allowed_token_ids", "must not be empty"));
        }
        let mut ids = items
            .iter()
            .map(|i| {
                i.as_u64().filter(|&id| (id as usize) < vocab).map(|id| TokenId(id as u32)).ok_or_else(|| {
                    invalid("allowed_token_ids", format!("must hold token ids between 0 and {}, got {i}", vocab - 1))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        ids.sort();
        ids.dedup();
        c.sampling.allowed_token_ids = Some(ids);
    }
    if let Some(v) = f.bad_words.as_ref().filter(|v| !v.is_null()) {
        let words = v.as_array().ok_or_else(|| invalid("bad_words", "must be a list of strings"))?;
        let mut seqs: Vec<Vec<TokenId>> = Vec::new();
        for w in words {
            let w = w.as_str().ok_or_else(|| invalid("bad_words", "must be a list of strings"))?;
            if w.is_empty() {
                return Err(invalid("bad_words", "must not contain an empty string"));
            }
            let encode =
                |text: &str| engine.encode(text, false).map_err(|e| ValidationError::Tokenization(e.to_string()));
            let plain = encode(w.trim_start())?;
            if plain.is_empty() {
                return Err(invalid("bad_words", format!("'{w}' tokenizes to no token")));
            }
            // The word after a space, when that is a different token sequence of the same length (vLLM's rule).
            let spaced = encode(&format!(" {}", w.trim_start()))?;
            let add_spaced = !spaced.is_empty() && spaced.len() == plain.len() && spaced[0] != plain[0];
            seqs.push(plain);
            if add_spaced {
                seqs.push(spaced);
            }
        }
        c.sampling.bad_words = seqs;
    }
    c.truncate_prompt_tokens = match f.truncate_prompt_tokens.as_ref().filter(|v| !v.is_null()) {
        None => None,
        Some(v) => match v.as_i64() {
            Some(-1) => Some(engine.info().max_model_len),
            Some(k) if k >= 1 => {
                let k = k as usize;
                if k > engine.info().max_model_len {
                    return Err(invalid(
                        "truncate_prompt_tokens",
                        format!("{k} is greater than the model's context length {}", engine.info().max_model_len),
                    ));
                }
                Some(k)
            }
            _ => {
                return Err(invalid("truncate_prompt_tokens", "must be -1 (the context length) or a positive integer"))
            }
        },
    };
    c.sampling.prompt_logprobs = prompt_logprobs(f.prompt_logprobs.as_ref(), c.stream, engine)?;
    Ok(())
}

/// vLLM's `prompt_logprobs`: the alternatives each prompt token reports (-1: the whole vocabulary), at most
/// `--max-logprobs`.
fn prompt_logprobs(v: Option<&Value>, stream: bool, engine: &dyn Engine) -> Result<Option<usize>> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    if stream && v.as_i64().is_some_and(|k| k != 0) {
        // vLLM's rule: the scores come with the whole response only.
        return Err(invalid("prompt_logprobs", "prompt log-probs are not available when stream is true"));
    }
    let info = engine.info();
    let k = match v.as_i64() {
        Some(-1) => info.vocab_size,
        Some(k) if k >= 0 => usize::try_from(k).unwrap_or(usize::MAX),
        _ => return Err(invalid("prompt_logprobs", "must be -1 (the whole vocabulary) or a non-negative integer")),
    };
    if k > info.max_logprobs {
        return Err(invalid(
            "prompt_logprobs",
            format!(
                "requested {k} prompt log-probs, more than the most allowed ({}, --max-logprobs)",
                info.max_logprobs
            ),
        ));
    }
    Ok(Some(k))
}

/// The chat-only options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatExtras {
    /// `echo`: the last message's content, put in front of each choice's content.
    pub echo: Option<String>,
    /// `continue_final_message`: the prompt ends inside the last message, which the model continues.
    pub continue_final_message: bool,
    /// Template variables: `documents` and `chat_template_kwargs`.
    pub variables: Map<String, Value>,
}

/// Reads `echo`, `continue_final_message`, `documents` and `chat_template_kwargs`; `add_generation_prompt` is the
/// request's (default true).
pub fn chat_extras(req: &ChatCompletionRequest, add_generation_prompt: bool) -> Result<ChatExtras> {
    let continue_final_message = flag("continue_final_message", &req.continue_final_message)?;
    if continue_final_message && add_generation_prompt {
        return Err(invalid(
            "continue_final_message",
            "cannot be used with add_generation_prompt (set add_generation_prompt to false to continue the last message)",
        ));
    }
    let mut variables = Map::new();
    if let Some(d) = req.documents.as_ref().filter(|v| !v.is_null()) {
        if !d.is_array() {
            return Err(invalid("documents", "must be a list of objects"));
        }
        variables.insert("documents".into(), d.clone());
    }
    match req.chat_template_kwargs.as_ref().filter(|v| !v.is_null()) {
        None => {}
        Some(Value::Object(kw)) => variables.extend(kw.clone()),
        Some(_) => return Err(invalid("chat_template_kwargs", "must be an object")),
    }
    // vLLM: the response's role is the last message's when no generation prompt is added; the last message is
    // echoed when it has that role.
    let echo = if flag("echo", &req.echo)? {
        let last = req.messages.last();
        let same_role = add_generation_prompt.then_some("assistant").or(last.map(|m| m.role.as_str()));
        Some(last.filter(|m| Some(m.role.as_str()) == same_role).map(message_text).unwrap_or_default())
    } else {
        None
    };
    Ok(ChatExtras { echo, continue_final_message, variables })
}

/// `reasoning_effort` as vLLM accepts it.
const REASONING_EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// Checks `reasoning_effort` and hands it to the chat template as vLLM does: as the `reasoning_effort` variable (over
/// one of the same name in `chat_template_kwargs`), and as `enable_thinking` (false for "none") unless the request
/// set that itself.
pub fn reasoning_effort(req: &ChatCompletionRequest, variables: &mut Map<String, Value>) -> Result<()> {
    let effort = match req.reasoning_effort.as_ref().filter(|v| !v.is_null()) {
        None => return Ok(()),
        Some(Value::String(e)) if REASONING_EFFORTS.contains(&e.as_str()) => e.clone(),
        Some(v) => {
            return Err(invalid(
                "reasoning_effort",
                format!("must be one of {}, got {v}", REASONING_EFFORTS.join(", ")),
            ))
        }
    };
    let user_set_thinking =
        req.chat_template_kwargs.as_ref().and_then(Value::as_object).is_some_and(|k| k.contains_key("enable_thinking"));
    if !user_set_thinking {
        variables.insert("enable_thinking".into(), Value::Bool(effort != "none"));
    }
    variables.insert("reasoning_effort".into(), Value::String(effort));
    Ok(())
}

fn message_text(m: &ChatMessageIn) -> String {
    match &m.content {
        Some(MessageContent::Text(t)) => t.clone(),
        Some(MessageContent::Parts(parts)) => {
            parts.iter().filter_map(|p| p.text.clone()).collect::<Vec<_>>().join("\n")
        }
        None => String::new(),
    }
}

/// `continue_final_message`: the rendered conversation cut right after the last message's content (as transformers
/// does), so that generation continues that message.
pub fn cut_after_final_message(rendered: &str, final_content: &str) -> Result<String> {
    let needle = final_content.trim();
    match rendered.rfind(needle) {
        Some(at) if !needle.is_empty() => Ok(rendered[..at + needle.len()].to_owned()),
        _ => Err(invalid(
            "continue_final_message",
            "the final message does not appear in the chat after applying the chat template",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_is_cut_after_the_final_message() {
        let r = "<s>user: hi\nassistant: The answer is\n</s>";
        assert_eq!(cut_after_final_message(r, "The answer is ").unwrap(), "<s>user: hi\nassistant: The answer is");
        assert!(cut_after_final_message(r, "missing").is_err());
    }
}
