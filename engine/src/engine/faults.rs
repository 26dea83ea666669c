//! Faults inside an engine step: the testing hooks that cause them on purpose (`--testing-panic-in-step-after N`,
//! `--testing-error-in-step-after N`, hidden flags) and the text of a caught panic.
//!
//! What the loop does with them (`thread.rs`): a step that returns an error (a backend error, the device out of
//! memory) fails the requests of that step and the engine keeps serving the others; a panic marks the engine dead,
//! because the scheduler and the model runner may be half-updated and nothing proves another step on them safe.

use std::any::Any;

use crate::error::{EngineError, Result};

/// The step-fault testing hooks, counting the steps that run a batch.
#[derive(Debug, Clone, Default)]
pub(crate) struct StepHooks {
    /// Steps after the first `panic_after` panic.
    pub(crate) panic_after: Option<usize>,
    /// Step `error_after + 1` fails once with a backend error.
    pub(crate) error_after: Option<usize>,
    steps: usize,
}

impl StepHooks {
    pub(crate) fn new(panic_after: Option<usize>, error_after: Option<usize>) -> Self {
        Self { panic_after, error_after, steps: 0 }
    }

    /// Counts a step that is about to run its batch; panics, or returns the injected error, when a hook says so.
    pub(crate) fn before_step(&mut self) -> Result<()> {
        if self.panic_after.is_none() && self.error_after.is_none() {
            return Ok(());
        }
        self.steps += 1;
        if self.panic_after.is_some_and(|n| self.steps > n) {
            panic!("--testing-panic-in-step-after: engine step {} panics on purpose", self.steps);
        }
        if self.error_after.is_some_and(|n| self.steps == n + 1) {
            return Err(EngineError::Backend(format!(
                "out of device memory (--testing-error-in-step-after: engine step {} fails on purpose)",
                self.steps
            )));
        }
        Ok(())
    }
}

/// The message of a panic caught by `catch_unwind` (`panic!` payloads are `&str` or `String`).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_hooks_never_fail() {
        let mut h = StepHooks::default();
        for _ in 0..100 {
            h.before_step().expect("no hook");
        }
    }

    #[test]
    fn the_error_hook_fails_one_step_only() {
        let mut h = StepHooks::new(None, Some(2));
        assert!(h.before_step().is_ok());
        assert!(h.before_step().is_ok());
        let e = h.before_step().unwrap_err();
        assert!(e.to_string().contains("out of device memory"), "{e}");
        assert!(h.before_step().is_ok(), "the engine keeps serving after a failed step");
    }

    #[test]
    fn the_panic_hook_panics_after_n_steps_with_a_readable_message() {
        let mut h = StepHooks::new(Some(1), None);
        assert!(h.before_step().is_ok());
        let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.before_step())).unwrap_err();
        assert!(panic_message(&*payload).contains("step 2 panics on purpose"));
        let formatted = std::panic::catch_unwind(|| panic!("{} apples", 3)).unwrap_err();
        assert_eq!(panic_message(&*formatted), "3 apples");
    }
}
