//! `PrefillLimits`: how prompt work is spread over steps so that running decodes keep getting steps while long prompts
//! prefill (vLLM's `max_num_partial_prefills`, `max_long_partial_prefills` and `long_prefill_token_threshold`), and
//! `PrefillSlots`, one step's count of them.
//!
//! A request is *in prefill* in a step when it has more than one token left to compute (a prompt, or a preempted
//! request's recomputation); a request with one token left is a decode and is never limited. It is *long* when its
//! prompt has more than `long_prefill_token_threshold` tokens. Per step: at most `max_num_partial_prefills` requests
//! in prefill, at most `max_long_partial_prefills` of them long, and no prefill chunk longer than the threshold.

use crate::error::SchedulerError;

/// The partial-prefill limits of a [`crate::SchedulerConfig`]. The default, [`PrefillLimits::NONE`], limits nothing
/// but the step's token budget (vLLM v1's behaviour: its engine applies none of the partial-prefill counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefillLimits {
    /// Most requests in prefill in one step; None: no limit.
    pub max_num_partial_prefills: Option<usize>,
    /// Most long requests (prompt above the threshold) in prefill in one step; None: no limit.
    pub max_long_partial_prefills: Option<usize>,
    /// Prompts longer than this are long, and no prefill chunk is longer than this; 0: no request is long and chunks
    /// are bounded by the step budget alone.
    pub long_prefill_token_threshold: usize,
}

impl PrefillLimits {
    /// No limits beyond the step budget.
    pub const NONE: Self =
        Self { max_num_partial_prefills: None, max_long_partial_prefills: None, long_prefill_token_threshold: 0 };

    /// The limits from the three flags, as vLLM resolves them: with more than one partial prefill allowed, an unset
    /// (or 0) threshold becomes 4 % of `max_model_len`, and an unset long limit becomes 1 (vLLM's default). Checked
    /// with [`PrefillLimits::validate`].
    pub fn resolve(
        max_num_partial_prefills: Option<usize>,
        max_long_partial_prefills: Option<usize>,
        long_prefill_token_threshold: Option<usize>,
        max_model_len: usize,
    ) -> Result<Self, SchedulerError> {
        let mut threshold = long_prefill_token_threshold.unwrap_or(0);
        if threshold == 0 && max_num_partial_prefills.is_some_and(|n| n > 1) {
            threshold = max_model_len * 4 / 100;
        }
        let max_long = max_long_partial_prefills.or(max_num_partial_prefills.map(|_| 1));
        let limits = Self {
            max_num_partial_prefills,
            max_long_partial_prefills: max_long,
            long_prefill_token_threshold: threshold,
        };
        limits.validate(max_model_len)?;
        Ok(limits)
    }

    /// vLLM's rules: both counts at least 1, the long count at most the total, the threshold at most `max_model_len`.
    pub fn validate(&self, max_model_len: usize) -> Result<(), SchedulerError> {
        if self.max_num_partial_prefills == Some(0) {
            return Err(SchedulerError::ZeroConfigValue { field: "max_num_partial_prefills" });
        }
        if self.max_long_partial_prefills == Some(0) {
            return Err(SchedulerError::ZeroConfigValue { field: "max_long_partial_prefills" });
        }
        if let (Some(long), Some(all)) = (self.max_long_partial_prefills, self.max_num_partial_prefills) {
            if long > all {
                return Err(SchedulerError::LongPrefillsAbovePartialPrefills {
                    max_long_partial_prefills: long,
                    max_num_partial_prefills: all,
                });
            }
        }
        if self.long_prefill_token_threshold > max_model_len {
            return Err(SchedulerError::LongPrefillThresholdAboveModelLen {
                long_prefill_token_threshold: self.long_prefill_token_threshold,
                max_model_len,
            });
        }
        Ok(())
    }

    /// True when a prompt of `prompt_len` tokens is long.
    pub fn is_long(&self, prompt_len: usize) -> bool {
        self.long_prefill_token_threshold > 0 && prompt_len > self.long_prefill_token_threshold
    }

    /// The most tokens one prefill chunk may have.
    pub fn max_chunk(&self) -> usize {
        if self.long_prefill_token_threshold == 0 {
            usize::MAX
        } else {
            self.long_prefill_token_threshold
        }
    }
}

/// Why a request gets no prefill tokens in this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrefillBlocked {
    /// `max_num_partial_prefills` requests already prefill in this step: no other prefill can.
    Full,
    /// `max_long_partial_prefills` long requests already prefill: a short one still can.
    LongFull,
}

/// One step's use of the limits.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PrefillSlots {
    prefills: usize,
    long: usize,
}

impl PrefillSlots {
    /// The most tokens a request with `remaining` tokens left to compute and a prompt of `prompt_len` may compute in
    /// this step (before the token budget), or why it may compute none. Counts nothing: call
    /// [`PrefillSlots::take`] once it is scheduled.
    pub(crate) fn allowed(
        &self,
        limits: &PrefillLimits,
        remaining: usize,
        prompt_len: usize,
    ) -> Result<usize, PrefillBlocked> {
        if remaining <= 1 {
            return Ok(remaining);
        }
        if limits.max_num_partial_prefills.is_some_and(|max| self.prefills >= max) {
            return Err(PrefillBlocked::Full);
        }
        if limits.is_long(prompt_len) && limits.max_long_partial_prefills.is_some_and(|max| self.long >= max) {
            return Err(PrefillBlocked::LongFull);
        }
        Ok(remaining.min(limits.max_chunk()))
    }

    /// Counts a scheduled request that had `remaining` tokens left to compute.
    pub(crate) fn take(&mut self, limits: &PrefillLimits, remaining: usize, prompt_len: usize) {
        if remaining > 1 {
            self.prefills += 1;
            self.long += usize::from(limits.is_long(prompt_len));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_as_vllm() {
        // Nothing set: nothing limited.
        assert_eq!(PrefillLimits::resolve(None, None, None, 8192), Ok(PrefillLimits::NONE));
        // More than one partial prefill: the threshold defaults to 4 % of the context, the long count to 1.
        let l = PrefillLimits::resolve(Some(4), None, None, 8192).unwrap();
        assert_eq!(l.long_prefill_token_threshold, 327);
        assert_eq!(l.max_long_partial_prefills, Some(1));
        // One partial prefill: no default threshold.
        assert_eq!(PrefillLimits::resolve(Some(1), None, None, 8192).unwrap().long_prefill_token_threshold, 0);
        // A threshold alone caps chunks.
        let l = PrefillLimits::resolve(None, None, Some(64), 8192).unwrap();
        assert_eq!((l.max_chunk(), l.is_long(65), l.is_long(64)), (64, true, false));
    }

    #[test]
    fn each_rule_is_reported() {
        assert_eq!(
            PrefillLimits::resolve(Some(0), None, None, 100),
            Err(SchedulerError::ZeroConfigValue { field: "max_num_partial_prefills" })
        );
        assert_eq!(
            PrefillLimits::resolve(Some(2), Some(3), None, 100),
            Err(SchedulerError::LongPrefillsAbovePartialPrefills {
                max_long_partial_prefills: 3,
                max_num_partial_prefills: 2
            })
        );
        let err = PrefillLimits::resolve(None, None, Some(101), 100).unwrap_err();
        assert!(err.to_string().contains("long_prefill_token_threshold"), "{err}");
    }

    #[test]
    fn slots_count_prefills_and_long_ones() {
        let limits = PrefillLimits::resolve(Some(2), Some(1), Some(10), 100).unwrap();
        let mut slots = PrefillSlots::default();
        assert_eq!(slots.allowed(&limits, 50, 50), Ok(10));
        slots.take(&limits, 50, 50);
        // A second long one waits; a short one and a decode do not.
        assert_eq!(slots.allowed(&limits, 30, 30), Err(PrefillBlocked::LongFull));
        assert_eq!(slots.allowed(&limits, 1, 30), Ok(1));
        assert_eq!(slots.allowed(&limits, 5, 5), Ok(5));
        slots.take(&limits, 5, 5);
        assert_eq!(slots.allowed(&limits, 5, 5), Err(PrefillBlocked::Full));
        assert_eq!(slots.allowed(&limits, 1, 5), Ok(1));
    }
}
