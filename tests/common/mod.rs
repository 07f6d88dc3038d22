//! Helpers shared by integration tests.

use std::path::{Path, PathBuf};

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
