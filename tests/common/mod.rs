//! Helpers shared by integration tests.

// Run with a filter (`cargo test --test integration fuzz::`), the test binary still builds
// every helper; some of them only one module uses.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub mod gen;

/// Every `.ef` program under `examples/` and `tests/rules/`, sorted.
pub fn example_and_rule_programs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = ["examples", "tests/rules"]
        .iter()
        .flat_map(|d| {
            std::fs::read_dir(root.join(d))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
        })
        .filter(|p| p.extension().is_some_and(|e| e == "ef"))
        .collect();
    files.sort();
    files
}

/// Random choices for the fuzz tests: the library's SplitMix64 started at state `seed`.
pub struct Rng(efopt::interp::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(efopt::interp::Rng::from_state(seed))
    }

    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }

    /// True with probability `num/den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next() % den < num
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}
