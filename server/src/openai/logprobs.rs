//! Engine log-probs (`TokenLogprob`) in OpenAI's two wire formats: chat (`{"content": [{token, logprob, bytes,
//! top_logprobs}]}`) and legacy completions (parallel `tokens` / `token_logprobs` / `top_logprobs` / `text_offset`).

use rserve_engine::api::TokenLogprob;

use crate::openai::types::{ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, OrderedLogprobs, TopLogprobOut};

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
}
