//! Engine log-probs (`TokenLogprob`) in OpenAI's two wire formats: chat (`{"content": [{token, logprob, bytes,
//! top_logprobs}]}`) and legacy completions (parallel `tokens` / `token_logprobs` / `top_logprobs` / `text_offset`).

use rserve_engine::api::TokenLogprob;

use crate::openai::types::{
    ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, OrderedLogprobs, PromptLogprobsOut, TopLogprobOut,
};

/// The floor for log-probs: JSON has no -infinity (vLLM uses the same floor).
pub const LOGPROB_FLOOR: f32 = -9999.0;

fn finite(lp: f32) -> f32 {
    if lp.is_nan() {
        LOGPROB_FLOOR
    } else {
        lp.max(LOGPROB_FLOOR)
    }
}

/// Chat log-probs of some tokens.
pub fn chat(tokens: &[TokenLogprob]) -> ChatLogprobs {
    ChatLogprobs {
        content: tokens
            .iter()
            .map(|t| ChatTokenLogprob {
                token: t.token.clone(),
                logprob: finite(t.logprob),
                bytes: t.token.as_bytes().to_vec(),
                top_logprobs: t
                    .top
                    .iter()
                    .map(|(_, text, lp)| TopLogprobOut {
                        token: text.clone(),
                        logprob: finite(*lp),
                        bytes: text.as_bytes().to_vec(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Completions log-probs of some tokens whose text starts at character `offset` of the choice's text. Each
/// `top_logprobs` entry holds the alternatives and the sampled token (as vLLM does). Returns the offset after them.
pub fn completion(tokens: &[TokenLogprob], mut offset: usize, out: &mut CompletionLogprobs) -> usize {
    for t in tokens {
        out.tokens.push(t.token.clone());
        out.token_logprobs.push(Some(finite(t.logprob)));
        let mut top: Vec<(String, f32)> = t.top.iter().map(|(_, text, lp)| (text.clone(), finite(*lp))).collect();
        if !t.top.iter().any(|(id, _, _)| *id == t.token_id) {
            top.push((t.token.clone(), finite(t.logprob)));
        }
        out.top_logprobs.push(Some(OrderedLogprobs(top)));
        out.text_offset.push(offset);
        offset += t.token.chars().count();
    }
    offset
}

/// Legacy completions log-probs of an echoed prompt: its first token has none (null), every later one its own
/// (`completion`'s form). Returns the character offset after them.
pub fn completion_prompt(first: &str, scored: &[TokenLogprob], out: &mut CompletionLogprobs) -> usize {
    out.tokens.push(first.to_owned());
    out.token_logprobs.push(None);
    out.top_logprobs.push(None);
    out.text_offset.push(0);
    completion(scored, first.chars().count(), out)
}

/// vLLM's `prompt_logprobs` of a prompt: null for its first token, then per token a map from token id to
/// `{"logprob", "rank", "decoded_token"}`, the prompt token first, then its top alternatives. An alternative's rank is
/// its place among them; the prompt token's is its place there too, and null when it is not among them (the device
/// reports log-probs, not the place of every token).
pub fn prompt(scored: &[TokenLogprob]) -> PromptLogprobsOut {
    let entry = |lp: f32, rank: Option<usize>, text: &str| serde_json::json!({"logprob": finite(lp), "rank": rank, "decoded_token": text});
    let mut out: PromptLogprobsOut = vec![None];
    for t in scored {
        let mut map = serde_json::Map::new();
        let rank = t.top.iter().position(|(id, _, _)| *id == t.token_id).map(|i| i + 1);
        map.insert(t.token_id.0.to_string(), entry(t.logprob, rank, &t.token));
        for (i, (id, text, lp)) in t.top.iter().enumerate() {
            map.entry(id.0.to_string()).or_insert_with(|| entry(*lp, Some(i + 1), text));
        }
        out.push(Some(map));
    }
    out
}

#[cfg(test)]
mod tests {
    use rserve_engine::TokenId;

    use super::*;

    fn tl(id: u32, token: &str, lp: f32, top: &[(u32, &str, f32)]) -> TokenLogprob {
        TokenLogprob {
            token_id: TokenId(id),
            token: token.into(),
            logprob: lp,
            top: top.iter().map(|(i, s, l)| (TokenId(*i), s.to_string(), *l)).collect(),
        }
    }

    #[test]
    fn chat_shape_and_floor() {
        let lp = chat(&[tl(5, "hé", -0.25, &[(5, "hé", -0.25), (7, "x", f32::NEG_INFINITY)])]);
        let v = serde_json::to_value(&lp).expect("json");
        assert_eq!(v["content"][0]["token"], "hé");
        assert_eq!(v["content"][0]["logprob"], -0.25);
        assert_eq!(v["content"][0]["bytes"], serde_json::json!([104, 195, 169]));
        assert_eq!(v["content"][0]["top_logprobs"][1]["logprob"], -9999.0);
        assert_eq!(v["content"][0]["top_logprobs"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn completion_offsets_and_sampled_token_in_top() {
        let mut out = CompletionLogprobs::default();
        let end =
            completion(&[tl(1, "ab", -1.0, &[(2, "c", -0.5)]), tl(3, "é", -0.125, &[(3, "é", -0.125)])], 4, &mut out);
        assert_eq!(end, 7);
        assert_eq!(out.text_offset, vec![4, 6]);
        let v = serde_json::to_value(&out).expect("json");
        assert_eq!(v["top_logprobs"][0], serde_json::json!({"c": -0.5, "ab": -1.0}));
        assert_eq!(v["top_logprobs"][1], serde_json::json!({"é": -0.125}));
        assert_eq!(v["tokens"], serde_json::json!(["ab", "é"]));
    }

    #[test]
    fn prompt_scores_in_both_forms() {
        let scored = [tl(7, "b", -1.5, &[(3, "c", -0.5), (7, "b", -1.5)]), tl(9, "dd", -4.0, &[(3, "c", -0.1)])];
        let mut lp = CompletionLogprobs::default();
        assert_eq!(completion_prompt("a", &scored, &mut lp), 4);
        assert_eq!(lp.tokens, ["a", "b", "dd"]);
        assert_eq!(lp.token_logprobs, [None, Some(-1.5), Some(-4.0)]);
        assert_eq!(lp.text_offset, [0, 1, 2]);
        assert!(lp.top_logprobs[0].is_none());
        let v = serde_json::to_value(prompt(&scored)).expect("json");
        assert_eq!(v[0], serde_json::Value::Null);
        assert_eq!(v[1]["7"], serde_json::json!({"logprob": -1.5, "rank": 2, "decoded_token": "b"}));
        assert_eq!(v[1]["3"]["rank"], 1);
        assert_eq!(v[2]["9"]["rank"], serde_json::Value::Null);
        assert_eq!(v[2].as_object().map(|m| m.len()), Some(2));
    }
}
