//! Shared helpers for the end-to-end tests: where the test model lives.
