//! `NewRequest` (what the engine submits) and `Request` (the scheduler's state for one request: its tokens, how many
//! of them have KV computed, its stop conditions and the prefix-cache keys of its full blocks).

use crate::error::SchedulerError;
use crate::ids::{BlockHash, RequestId, TokenId};
use crate::output::FinishStatus;

/// A request as the engine submits it to [`crate::Scheduler::add_request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRequest {
    pub id: RequestId,
    pub prompt_token_ids: Vec<TokenId>,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Stop tokens are ignored until this many tokens were generated.
    pub min_tokens: usize,
    /// Tokens that end the request; already includes EOS unless the user asked to ignore it.
    pub stop_token_ids: Vec<TokenId>,
    /// Never served from the prefix cache (vLLM's rule for a request that wants prompt log-probs: every prompt
    /// position is computed). Its full blocks still become hits for other requests.
    pub skip_prefix_cache: bool,
    /// Never split across steps: admitted only in a step whose token budget holds its whole prompt (a bidirectional
    /// encoder's input, which every token must see whole; vLLM's scheduling without chunked prefill).
    pub whole_prompt: bool,
}

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStatus {
    /// In the waiting queue (new or preempted); owns no blocks.
    Waiting,
    /// Admitted; owns a block table.
    Running,
    /// Done; about to be removed.
    Finished,
}

/// The scheduler's state for one request.
#[derive(Debug, Clone)]
pub struct Request {
    pub(crate) id: RequestId,
    /// Prompt followed by the generated tokens.
    pub(crate) token_ids: Vec<TokenId>,
    pub(crate) prompt_len: usize,
    pub(crate) max_tokens: usize,
    pub(crate) min_tokens: usize,
    pub(crate) stop_token_ids: Vec<TokenId>,
    /// `NewRequest::skip_prefix_cache`.
    pub(crate) skip_prefix_cache: bool,
    /// `NewRequest::whole_prompt`.
    pub(crate) whole_prompt: bool,
    /// Tokens whose KV is computed or being computed by a scheduled step (positions `0..num_computed_tokens`):
    /// advanced when a step is scheduled, as vLLM v1 does, so the next step can be scheduled before this one ends.
    pub(crate) num_computed_tokens: usize,
    /// Tokens scheduled to be sampled whose ids have not come back (`update_from_output`): each is a position
    /// after `token_ids` whose KV a later step may already compute from an id the runner feeds on its device.
    pub(crate) num_output_placeholders: usize,
    /// Prefix-cache key of every full block of `token_ids`.
    pub(crate) block_hashes: Vec<BlockHash>,
    pub(crate) status: RequestStatus,
    /// Prompt tokens served from the prefix cache at the first admission.
    pub(crate) num_cached_tokens: Option<usize>,
    /// Set on (re)admission, cleared once the request was scheduled.
    pub(crate) first_schedule_pending: bool,
    /// Block-table entries (per group) the runner has been sent since the request's last (re)admission.
    pub(crate) blocks_sent: usize,
}

impl Request {
    /// Checks `new` against the model length and builds a waiting request (block hashes are filled in by the KV cache
    /// manager).
    pub fn new(new: NewRequest, max_model_len: usize) -> Result<Self, SchedulerError> {
        let id = new.id;
        if new.prompt_token_ids.is_empty() {
            return Err(SchedulerError::EmptyPrompt { id });
        }
        if new.prompt_token_ids.len() > max_model_len {
            return Err(SchedulerError::PromptTooLong { id, prompt_len: new.prompt_token_ids.len(), max_model_len });
        }
        if new.max_tokens == 0 {
            return Err(SchedulerError::ZeroMaxTokens { id });
        }
        if new.min_tokens > new.max_tokens {
            return Err(SchedulerError::MinTokensAboveMaxTokens {
                id,
                min_tokens: new.min_tokens,
                max_tokens: new.max_tokens,
            });
        }
        let prompt_len = new.prompt_token_ids.len();
        let mut token_ids = new.prompt_token_ids;
        token_ids.reserve(new.max_tokens.min(max_model_len.saturating_sub(prompt_len)).min(4096));
        Ok(Self {
            id,
            token_ids,
            prompt_len,
            max_tokens: new.max_tokens,
            min_tokens: new.min_tokens,
            stop_token_ids: new.stop_token_ids,
            skip_prefix_cache: new.skip_prefix_cache,
            whole_prompt: new.whole_prompt,
            num_computed_tokens: 0,
            num_output_placeholders: 0,
            block_hashes: Vec::new(),
            status: RequestStatus::Waiting,
            num_cached_tokens: None,
            first_schedule_pending: true,
            blocks_sent: 0,
        })
    }

    pub fn id(&self) -> RequestId {
        self.id
    }

    /// Prompt followed by generated tokens.
    pub fn token_ids(&self) -> &[TokenId] {
        &self.token_ids
    }

    /// Prompt plus generated tokens.
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub fn num_prompt_tokens(&self) -> usize {
        self.prompt_len
    }

    pub fn num_output_tokens(&self) -> usize {
        self.token_ids.len() - self.prompt_len
    }

    /// Generated tokens.
    pub fn output_token_ids(&self) -> &[TokenId] {
        &self.token_ids[self.prompt_len..]
    }

    /// Tokens whose KV is computed, or scheduled to be.
    pub fn num_computed_tokens(&self) -> usize {
        self.num_computed_tokens
    }

    /// Sampled tokens scheduled whose ids have not come back yet.
    pub fn num_output_placeholders(&self) -> usize {
        self.num_output_placeholders
    }

    /// Known tokens plus the ones scheduled to be sampled.
    pub(crate) fn num_tokens_with_placeholders(&self) -> usize {
        self.token_ids.len() + self.num_output_placeholders
    }

    /// Whether every token this request may still generate is already scheduled (its length limits are reached
    /// once the placeholders come back), so it must not be scheduled again.
    pub(crate) fn limits_reached_in_flight(&self, max_model_len: usize) -> bool {
        self.num_output_placeholders > 0
            && (self.num_output_tokens() + self.num_output_placeholders >= self.max_tokens
                || self.num_tokens_with_placeholders() >= max_model_len)
    }

    /// Prefix-cache keys of the full blocks of [`Request::token_ids`].
    pub fn block_hashes(&self) -> &[BlockHash] {
        &self.block_hashes
    }

    pub fn status(&self) -> RequestStatus {
        self.status
    }

    /// Prompt tokens that came from the prefix cache at first admission (`None` before it).
    pub fn num_cached_tokens(&self) -> Option<usize> {
        self.num_cached_tokens
    }

    /// Appends one generated token.
    pub(crate) fn append_output(&mut self, token: TokenId) {
        self.token_ids.push(token);
    }

    /// Whether the last appended token ends the request, checked in vLLM's order: length limits first
    /// (`max_tokens`, then the model length), then stop tokens once `min_tokens` were generated.
    pub(crate) fn check_stop(&self, max_model_len: usize) -> Option<FinishStatus> {
        let num_out = self.num_output_tokens();
        if num_out >= self.max_tokens || self.num_tokens() >= max_model_len {
            return Some(FinishStatus::Length);
        }
        if num_out >= self.min_tokens && num_out > 0 {
            let last = self.token_ids[self.token_ids.len() - 1];
            if self.stop_token_ids.contains(&last) {
                return Some(FinishStatus::StopToken(last));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_req(prompt: usize, max_tokens: usize, min_tokens: usize) -> NewRequest {
        NewRequest {
            id: RequestId(1),
            prompt_token_ids: (0..prompt as u32).map(TokenId).collect(),
            max_tokens,
            min_tokens,
            stop_token_ids: vec![TokenId(99)],
            skip_prefix_cache: false,
            whole_prompt: false,
        }
    }

    #[test]
    fn rejects_bad_requests() {
        assert!(matches!(Request::new(new_req(0, 4, 0), 16), Err(SchedulerError::EmptyPrompt { .. })));
        assert!(matches!(Request::new(new_req(17, 4, 0), 16), Err(SchedulerError::PromptTooLong { .. })));
        assert!(matches!(Request::new(new_req(3, 0, 0), 16), Err(SchedulerError::ZeroMaxTokens { .. })));
        assert!(matches!(Request::new(new_req(3, 2, 3), 16), Err(SchedulerError::MinTokensAboveMaxTokens { .. })));
        assert!(Request::new(new_req(16, 1, 0), 16).is_ok(), "a prompt of exactly max_model_len is accepted");
    }

    #[test]
    fn stop_rules() {
        let mut r = Request::new(new_req(3, 4, 2), 100).unwrap();
        r.append_output(TokenId(99));
        assert_eq!(r.check_stop(100), None, "stop token ignored below min_tokens");
        r.append_output(TokenId(99));
        assert_eq!(r.check_stop(100), Some(FinishStatus::StopToken(TokenId(99))));
        let mut r = Request::new(new_req(3, 2, 0), 100).unwrap();
        r.append_output(TokenId(5));
        assert_eq!(r.check_stop(100), None);
        r.append_output(TokenId(99));
        assert_eq!(r.check_stop(100), Some(FinishStatus::Length), "length is checked first, as in vLLM");
        let mut r = Request::new(new_req(3, 10, 0), 5).unwrap();
        r.append_output(TokenId(5));
        assert_eq!(r.check_stop(5), None);
        r.append_output(TokenId(6));
        assert_eq!(r.check_stop(5), Some(FinishStatus::Length), "max_model_len reached");
    }
}
