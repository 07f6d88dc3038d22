//! The corpus of programs the examples do not cover (`tests/corpus/*.ef`): one-row and
//! one-column shapes, literal `1` dimensions, single-head, grouped-query and batched decode,
//! causal, sliding-window and sink masks, square weights, transposed operands, programs with
//! two softmaxes, normalisations and small whole layers. Each is saturated, up to 200
//! candidates are extracted, and **every** candidate is checked against the source in the
//! reference interpreter at the program's sizes, on unit and on large (scale 30) inputs:
//!
//! ```text
//! efopt FILE --passes='saturate,extract{max-candidates=200},check{sample=0}'
//! ```
//!
//! with `EFOPT_WRONG_CANDIDATES=error`, so a candidate extract's own net drops fails too. A
//! program must yield at least one candidate unless its file says `// EXPECT: no candidate`
//! with the reason (a known gap of a later issue, shown here so that the day it is closed the
//! test asks for the line to go).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

const PASSES: &str = "saturate,extract{max-candidates=200},check{sample=0}";
/// A program that got no candidate runs again with these: a subgraph's search stops at its
/// `part-time-limit` (5 s), and in the test build on a loaded machine (CI, with the other
/// tests beside it) the tiny transformer layer's attention part found none in its 5 s, where
/// the release build finds its first in under a second.
const PASSES_LONGER: &str =
    "saturate,extract{max-candidates=200 part-time-limit=20},check{sample=0}";

struct Outcome {
    file: String,
    candidates: u64,
    problems: Vec<String>,
}

fn corpus_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/corpus exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ef"))
        .collect();
    files.sort();
    files
}

/// The `N output` of the `// extract @…:` summary line.
fn output_count(stdout: &str) -> Option<u64> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("// extract @") && l.contains(" distinct, "))?;
    let (head, _) = line.split_once(" output,")?;
    head.rsplit(' ').next()?.parse().ok()
}

fn run(file: &Path) -> Outcome {
    let first = run_with(file, PASSES);
    if first.problems == ["no candidate"] {
        let mut again = run_with(file, PASSES_LONGER);
        again.file.push_str(" (part-time-limit=20)");
        return again;
    }
    first
}

fn run_with(file: &Path, passes: &str) -> Outcome {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let expect_none = text
        .lines()
        .any(|l| l.starts_with("// EXPECT: no candidate"));
    let out = Command::new(env!("CARGO_BIN_EXE_efopt"))
        .arg(file)
        .arg(format!("--passes={passes}"))
        .env("EFOPT_WRONG_CANDIDATES", "error")
        .env("NO_COLOR", "1")
        .output()
        .expect("efopt runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let candidates = output_count(&stdout).unwrap_or(0);
    let mut problems = Vec::new();
    for l in stdout.lines().filter(|l| l.ends_with("FAILED")) {
        problems.push(l.to_string());
    }
    for l in stderr.lines().filter(|l| l.contains("wrong candidate")) {
        problems.push(l.to_string());
    }
    let no_candidate = stderr.contains("no candidate");
    match (expect_none, no_candidate) {
        (true, true) => {}
        (true, false) => problems.push(format!(
            "{candidates} candidates where the file expects none: remove its `// EXPECT: no candidate` line"
        )),
        (false, true) => problems.push("no candidate".into()),
        (false, false) => {
            if out.status.code() != Some(0) {
                problems.push(format!("exit {:?}: {}", out.status.code(), stderr.trim()));
            }
            if candidates == 0 {
                problems.push("no `// extract` summary with candidates".into());
            }
        }
    }
    Outcome {
        file: name,
        candidates,
        problems,
    }
}

#[test]
fn every_candidate_of_every_corpus_program_checks_equal() {
    let files = corpus_files();
    assert!(files.len() >= 20, "the corpus has {} programs", files.len());
    let next = Mutex::new(0usize);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().expect("lock");
                    *n += 1;
                    *n - 1
                };
                let Some(file) = files.get(i) else { break };
                let outcome = run(file);
                results.lock().expect("lock").push(outcome);
            });
        }
    });
    let mut results = results.into_inner().expect("lock");
    results.sort_by(|a, b| a.file.cmp(&b.file));
    let checked: u64 = results.iter().map(|r| r.candidates).sum();
    let failing: Vec<&Outcome> = results.iter().filter(|r| !r.problems.is_empty()).collect();
    for r in &results {
        eprintln!("{:<36} {:>4} candidates checked", r.file, r.candidates);
    }
    eprintln!(
        "corpus: {} programs, {checked} candidates checked (unit and large inputs), {} failing",
        results.len(),
        failing.len()
    );
    let report: Vec<String> = failing
        .iter()
        .map(|r| {
            let shown: Vec<&str> = r.problems.iter().take(4).map(String::as_str).collect();
            format!("{}:\n  {}", r.file, shown.join("\n  "))
        })
        .collect();
    assert!(failing.is_empty(), "{}", report.join("\n"));
}
