//! Extraction on e-graph dumps a user edited by hand: saturated dumps of small examples, with
//! e-nodes deleted, e-nodes copied into another class of the same type (which makes cycles
//! and shares subterms the rules never built), operands swapped, and the root moved to
//! another class of its type. Whatever the edit, `extract` must end with exit code 0 or 1
//! (never a panic or a hang); a failure must be a diagnostic that points into the dump; and
//! the candidate module of a success must parse and verify again.
//!
//! `EFOPT_EXTRACT_FUZZ_CASES=N` runs N cases instead of the default; `EFOPT_EXTRACT_FUZZ_SEED=S`
//! sets the seed.

use crate::common;

use common::Rng;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const EXAMPLES: [&str; 9] = [
    "rowsum",
    "matmul_exp",
    "gated_mlp",
    "rmsnorm_gemm",
    "lora",
    "ngpt",
    "layernorm_gemm",
    "rmsnorm_mlp",
    "attention_m0",
];

/// Bounded runs: a mutated e-graph may hold no finite program, or very many.
const PIPELINES: [&str; 8] = [
    "extract{max-candidates=20 time-limit=5}",
    "extract{compaction=none max-candidates=20 time-limit=5}",
    "extract{compaction=after max-candidates=20 time-limit=5}",
    "extract{max-kernels=1 max-candidates=20 time-limit=5}",
    "extract{max-kernels=2 max-candidates=20 time-limit=5}",
    "extract{pointwise-kernels=drop max-candidates=20 time-limit=5}",
    "extract{hole-order=scattered hole-seed=7 max-candidates=20 time-limit=5}",
    "extract{max-candidates=3 time-limit=5},lower",
];

/// The number of cases (`EFOPT_EXTRACT_FUZZ_CASES`, else `default`) and the seed
/// (`EFOPT_EXTRACT_FUZZ_SEED`, else fixed).
fn cases_and_seed(default: usize) -> (usize, u64) {
    let var = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    let cases = var("EFOPT_EXTRACT_FUZZ_CASES").map_or(default, |n| n as usize);
    (cases, var("EFOPT_EXTRACT_FUZZ_SEED").unwrap_or(0x5eed))
}

fn efopt() -> Command {
    Command::new(env!("CARGO_BIN_EXE_efopt"))
}

/// Runs `cmd` to its end or for `limit` at most (then kills it and returns None).
fn run_bounded(mut cmd: Command, limit: Duration) -> Option<Output> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("efopt starts");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return Some(child.wait_with_output().expect("output"));
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `examples/NAME.ef` at small sizes (so that `check` runs fast), written into `dir`.
fn small_source(name: &str, dir: &Path) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("examples/{name}.ef"));
    let mut cmd = efopt();
    cmd.arg(&path);
    for set in ["B=4", "H=64", "F=32", "N=32"] {
        cmd.arg("--set").arg(set);
    }
    let out = cmd.output().expect("efopt runs");
    assert!(out.status.success(), "printing {name}");
    let small = dir.join(format!("{name}.ef"));
    std::fs::write(&small, out.stdout).expect("write source");
    small
}

/// The saturated e-graph dump of `source`, as lines.
fn saturated_dump(source: &Path) -> Vec<String> {
    let out = efopt()
        .arg(source)
        .arg("--passes=saturate")
        .output()
        .expect("efopt runs");
    assert!(out.status.success(), "saturate {}", source.display());
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_string)
        .collect()
}

/// Index and type text of every `eclass %N : TYPE {` line.
fn class_heads(lines: &[String]) -> Vec<(usize, String)> {
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let rest = l.trim_start().strip_prefix("eclass %")?;
            let (_, ty) = rest.split_once(" : ")?;
            Some((i, ty.strip_suffix(" {")?.to_string()))
        })
        .collect()
}

/// E-node lines (inside an e-class block).
fn node_lines(lines: &[String]) -> Vec<usize> {
    (0..lines.len())
        .filter(|&i| lines[i].starts_with("    ") && !lines[i].trim().is_empty())
        .collect()
}

fn ids(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find('%') {
        let digits: String = rest[at + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if !digits.is_empty() {
            out.push(format!("%{digits}"));
        }
        rest = &rest[at + 1 + digits.len()..];
    }
    out
}

/// One random edit of the dump; a short description of it.
fn mutate(lines: &mut Vec<String>, rng: &mut Rng) -> String {
    let nodes = node_lines(lines);
    let heads = class_heads(lines);
    match rng.below(4) {
        0 if !nodes.is_empty() => {
            let i = nodes[rng.below(nodes.len())];
            lines[i] = format!("    // deleted: {}", lines[i].trim());
            format!("deleted line {}", i + 1)
        }
        1 if !heads.is_empty() => {
            // An e-node of one class copied into another of the same type.
            let (to, ty) = &heads[rng.below(heads.len())];
            let same: Vec<&(usize, String)> =
                heads.iter().filter(|(at, t)| t == ty && at != to).collect();
            if same.is_empty() {
                return "none".into();
            }
            let (from, _) = same[rng.below(same.len())];
            let node = lines[from + 1].clone();
            if !node.starts_with("    ") {
                return "none".into();
            }
            lines.insert(to + 1, node);
            format!("copied line {} into the class of line {}", from + 2, to + 1)
        }
        2 if !nodes.is_empty() => {
            let i = nodes[rng.below(nodes.len())];
            let operands = ids(&lines[i]);
            if operands.len() < 2 || operands[0] == operands[1] {
                return "none".into();
            }
            let (a, b) = (&operands[0], &operands[1]);
            lines[i] = lines[i]
                .replacen(a.as_str(), "\u{1}", 1)
                .replacen(b.as_str(), a.as_str(), 1)
                .replacen('\u{1}', b.as_str(), 1);
            format!("swapped {a} and {b} on line {}", i + 1)
        }
        _ => {
            // The root moved to another class of its type.
            let Some(r) = lines
                .iter()
                .position(|l| l.trim_start().starts_with("root %"))
            else {
                return "none".into();
            };
            let root = ids(&lines[r]).pop().unwrap_or_default();
            let Some((_, ty)) = heads
                .iter()
                .find(|(at, _)| lines[*at].contains(&format!("eclass {root} ")))
            else {
                return "none".into();
            };
            let same: Vec<&(usize, String)> = heads.iter().filter(|(_, t)| t == ty).collect();
            let (at, _) = same[rng.below(same.len())];
            let to = ids(&lines[*at]).first().cloned().unwrap_or_default();
            lines[r] = lines[r].replacen(root.as_str(), to.as_str(), 1);
            format!("root {root} → {to}")
        }
    }
}

#[test]
fn extraction_on_edited_dumps_ends_with_candidates_that_verify_or_a_diagnostic() {
    let (cases, seed) = cases_and_seed(300);
    let dir = std::env::temp_dir().join(format!("efopt-extract-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let dumps: Vec<Vec<String>> = EXAMPLES
        .iter()
        .map(|n| saturated_dump(&small_source(n, &dir)))
        .collect();
    let mut rng = Rng::new(seed);
    let (mut failures, mut succeeded, mut refused) = (Vec::new(), 0usize, 0usize);
    for case in 0..cases {
        let which = rng.below(dumps.len());
        let mut lines = dumps[which].clone();
        let edits: Vec<String> = (0..1 + rng.below(4))
            .map(|_| mutate(&mut lines, &mut rng))
            .collect();
        let pipeline = PIPELINES[case % PIPELINES.len()];
        let input: PathBuf = dir.join(format!("case{case}.ef"));
        let output = dir.join(format!("case{case}.out"));
        std::fs::write(&input, lines.join("\n") + "\n").expect("write case");
        let what = format!(
            "case {case} ({}; {}; --passes='{pipeline}'; input kept at {})",
            EXAMPLES[which],
            edits.join(", "),
            input.display()
        );
        let mut cmd = efopt();
        cmd.arg(&input)
            .arg(format!("--passes={pipeline}"))
            .arg("--color=never")
            .arg("-o")
            .arg(&output);
        let Some(out) = run_bounded(cmd, Duration::from_secs(120)) else {
            failures.push(format!("{what}: did not end within 120 s"));
            continue;
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => {
                succeeded += 1;
                if pipeline.ends_with(",lower") {
                    continue;
                }
                let mut again = efopt();
                again
                    .arg(&output)
                    .arg("--passes=verify")
                    .arg("--color=never");
                match run_bounded(again, Duration::from_secs(60)) {
                    Some(v) if v.status.success() => {}
                    Some(v) => failures.push(format!(
                        "{what}: the candidates do not verify again:\n{}",
                        String::from_utf8_lossy(&v.stderr)
                    )),
                    None => failures.push(format!("{what}: verifying the candidates hung")),
                }
            }
            Some(1) => {
                refused += 1;
                // A diagnostic that points into the dump (ariadne's `[ FILE:LINE:COL ]`).
                let located = format!("{}:", input.display());
                if !stderr.to_lowercase().contains("error") || !stderr.contains(&located) {
                    failures.push(format!(
                        "{what}: exit 1 without an error located in the input:\n{stderr}"
                    ));
                }
            }
            code => failures.push(format!("{what}: exit {code:?}:\n{stderr}")),
        }
        if stderr.contains("panicked") {
            failures.push(format!("{what}: panicked:\n{stderr}"));
        }
    }
    eprintln!("{succeeded} cases extracted, {refused} refused, of {cases}");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // The edits must leave enough dumps that verify for extraction to run on them, and must
    // break some: otherwise this test exercises only one side.
    assert!(
        succeeded >= cases / 5 && refused >= cases / 20,
        "{succeeded} cases extracted, {refused} refused, of {cases}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Removes e-nodes from the dump, each class keeping at least one: every e-node left still
/// computes its class's value, so the e-graph still represents the source program, only
/// through fewer alternatives (or none that is finite or lowerable, which is a diagnostic).
fn delete_alternatives(lines: &mut [String], rng: &mut Rng) {
    let percent = [10, 30, 60, 90][rng.below(4)];
    let mut class: Vec<usize> = Vec::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.trim_start().starts_with("eclass ") {
            groups.push(std::mem::take(&mut class));
        } else if l.starts_with("    ") && !l.trim().is_empty() {
            class.push(i);
        }
    }
    groups.push(class);
    for group in groups.iter().filter(|g| g.len() >= 2) {
        let keep = group[rng.below(group.len())];
        for &i in group {
            if i != keep && rng.below(100) < percent {
                lines[i] = format!("    // deleted: {}", lines[i].trim());
            }
        }
    }
}

/// How one run of `extract,check{against=SOURCE}` on a dump ended.
#[derive(Debug, PartialEq)]
enum Checked {
    /// Candidates output, each equal to the source.
    Equal,
    /// A candidate differs from the source.
    Differs,
    /// A located diagnostic: no finite, lowerable or complete program.
    NoProgram,
    Other(String),
}

fn extract_and_check(input: &Path, source: &Path) -> Checked {
    let mut cmd = efopt();
    cmd.arg(input)
        .arg(format!(
            "--passes=extract{{max-candidates=10 time-limit=5}},check{{against={}}}",
            source.display()
        ))
        .arg("--color=never")
        .arg("-o")
        .arg(if cfg!(windows) { "NUL" } else { "/dev/null" });
    let Some(out) = run_bounded(cmd, Duration::from_secs(120)) else {
        return Checked::Other("did not end within 120 s".into());
    };
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let located = stderr.contains(&format!("{}:", input.display()));
    match out.status.code() {
        _ if stderr.contains("panicked") => Checked::Other(stderr),
        Some(0) => Checked::Equal,
        Some(1) if stderr.contains("differs from reference") => Checked::Differs,
        Some(1) if located && stderr.contains("Error") => Checked::NoProgram,
        code => Checked::Other(format!("exit {code:?}:\n{stderr}")),
    }
}

/// Extraction picks one e-node per class, so on any sub-e-graph of a sound one every candidate
/// must still compute the source program: each run checks equal to the source in the reference
/// interpreter, or says that the e-graph left has no program to extract.
#[test]
fn candidates_of_a_sub_e_graph_still_compute_the_source() {
    let (cases, seed) = cases_and_seed(300);
    let (cases, mut rng) = (cases / 3, Rng::new(seed ^ 0xde1e7e));
    let dir = std::env::temp_dir().join(format!("efopt-extract-sub-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sources: Vec<PathBuf> = EXAMPLES.iter().map(|n| small_source(n, &dir)).collect();
    let dumps: Vec<Vec<String>> = sources.iter().map(|s| saturated_dump(s)).collect();

    // The oracle can fail: an e-graph whose `exp` became `tanh` yields candidates that differ.
    let wrong: Vec<String> = dumps[1]
        .iter()
        .map(|l| l.replace("    exp(", "    tanh("))
        .collect();
    assert_ne!(wrong, dumps[1], "matmul_exp's dump has an exp e-node");
    let wrong_path = dir.join("wrong.ef");
    std::fs::write(&wrong_path, wrong.join("\n") + "\n").expect("write");
    assert_eq!(
        extract_and_check(&wrong_path, &sources[1]),
        Checked::Differs
    );

    let (mut equal, mut failures) = (0usize, Vec::new());
    for case in 0..cases {
        let which = rng.below(dumps.len());
        let mut lines = dumps[which].clone();
        delete_alternatives(&mut lines, &mut rng);
        let input = dir.join(format!("case{case}.ef"));
        std::fs::write(&input, lines.join("\n") + "\n").expect("write case");
        match extract_and_check(&input, &sources[which]) {
            Checked::Equal => equal += 1,
            Checked::NoProgram => {}
            other => failures.push(format!(
                "case {case} ({}, input kept at {}): {other:?}",
                EXAMPLES[which],
                input.display()
            )),
        }
    }
    eprintln!("{equal} of {cases} sub-e-graphs extracted and checked equal");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        equal >= cases / 2,
        "only {equal} of {cases} runs had candidates"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
