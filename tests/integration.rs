//! The integration tests, one module per file beside this one, in one test binary: one link
//! instead of twenty (most of a clean `cargo test` build was linking), and the long tests of
//! different files share the two threads instead of each file waiting for its slowest test.
//! `lit` (its own harness) and `memory` (it reads the process's resident size, which other
//! tests' threads would move) are binaries of their own. Run one file's tests with
//! `cargo test --test integration FILE::`.

mod common;

mod candidates_property;
mod case_study_search;
mod cli;
mod corpus;
mod determinism;
mod extract_compaction;
mod extract_fuzz;
mod fuzz;
mod incremental_search;
mod kernel_plan;
mod output_errors;
mod partition;
mod pipeline_roundtrip;
mod rank_bounded;
mod rank_lp;
mod rank_model;
mod roundtrip;
mod rule_soundness;
mod triton_check;
mod tune;
