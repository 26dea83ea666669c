//! Helpers shared by the engine's integration tests beyond locating the test models and fixtures (that is
//! `rserve_tests`): `teacher` compares two paths' logits teacher-forced; `smollm2` loads the test model.
#![allow(dead_code)]

pub mod smollm2;
pub mod teacher;
