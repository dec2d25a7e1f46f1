//! The capturing subscriber these tests install for their thread: the events logged, with
//! their levels and fields (`seen()` the warnings, `at(level)` the others).
#![allow(unused_imports)] // not every test binary that has `support` captures logs

pub use dedup_core::test_util::Capture as Warnings;
