//! A property test of the whole pipeline: every candidate that `extract` finds for a random
//! tensor-level program computes what the program computes.
//!
//! Programs come from the fuzz tests' generator in its tensor-level mode
//! (`tests/common/gen.rs`, [`Mode::TensorLevel`]): `f32` inputs of rank 0 to 3, literals,
//! `fill`/`constant`/`iota` leaves, pointwise unary and binary operations, `select` with masks
//! from `iota` comparisons, reductions with `@add`, `@max`, `@min` and `@mul` (with and without
//! `keep_dims`), `matmul` (with operands transposed by `transpose[1,0]`), `transpose` and
//! `broadcast`, and softmax, RMSNorm and (masked) attention built from them; dimension sizes
//! 1, 2, 4, 8 and 16 and literal `1` dimensions; no parallel state and no user reducers. Each
//! program is built statement by statement with the verifier as the oracle, and runs through
//! the `efopt` binary as
//!
//! ```text
//! efopt PROG.ef --passes='saturate,extract{max-candidates=64 time-limit=5},check{sample=0}'
//! ```
//!
//! A program fails the test when efopt panics (exit 101), dies by a signal, runs past a
//! generous limit, exits with an error other than "no candidate", prints a line containing
//! `wrong candidate` on standard error (extraction dropped a candidate that differs from the
//! source), or prints a `check` report line ending in `FAILED` (a candidate that differs from
//! the source on the same random inputs). An extraction that outputs no candidate is counted
//! and reported, but is no failure. Programs run on two threads. At the end a summary line
//! gives the programs generated, the candidates checked (the `N output` of the `// extract`
//! report lines), the programs without a candidate and the failing programs; the test then
//! fails listing each distinct failure (its kind and first message, numbers blanked) once,
//! with the shortest program that shows it and its first failing lines.
//!
//! Environment:
//! - `EFOPT_PROPERTY_SECS=N`: run for N seconds instead of the default fixed number of
//!   programs (sized for well under a minute in the debug test profile);
//! - `EFOPT_PROPERTY_SEED=S`: the seed (default: fixed, or time-based with
//!   `EFOPT_PROPERTY_SECS`); program `i` of seed `S` is the same on every run;
//! - `EFOPT_PROPERTY_OUT=DIR`: write every failing program to `DIR/fail-S-I.ef` and every
//!   program without a candidate to `DIR/nocand-S-I.ef`, each headed by comments saying why;
//! - `EFOPT_PROPERTY_SHOW=N`: print the first N programs;
//! - `EFOPT_PROPERTY_THREADS=N`: programs run on N threads (default 2).
//!
//! `EFOPT_WRONG_CANDIDATES` is removed from efopt's environment, so that the net's finding
//! stays a warning and `check` still compares the remaining candidates.

use crate::common;

use common::gen::{self, Mode};
use common::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Programs in the default run.
const DEFAULT_PROGRAMS: u64 = 400;
const DEFAULT_SEED: u64 = 0x7e45_0a11;
const MAX_CANDIDATES: u32 = 64;
const TIME_LIMIT_S: u32 = 5;
/// A run of efopt longer than this is killed and counts as a failure (saturation alone may
/// take up to its own 30 s limit, extraction 5 s more, then the checks).
const PROCESS_LIMIT: Duration = Duration::from_secs(120);
const THREADS: usize = 2;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn passes() -> String {
    format!(
        "--passes=saturate,extract{{max-candidates={MAX_CANDIDATES} time-limit={TIME_LIMIT_S}}},check{{sample=0}}"
    )
}

/// Program `index` of `seed`: each program has its own random stream, so it does not depend
/// on which thread generated the others.
fn program(seed: u64, index: u64) -> (String, Vec<gen::Problem>) {
    let mut rng = Rng::new(seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let g = gen::generate(&mut rng, Mode::TensorLevel, index, &mut gen::verify_text);
    (g.text, g.problems)
}

/// What one program's run showed.
#[derive(Default)]
struct Outcome {
    /// Candidates checked: the sum of the `N output` of the `// extract` lines.
    candidates: u64,
    no_candidate: Option<String>,
    /// (signature, the lines that show it)
    failures: Vec<(String, Vec<String>)>,
}

/// Blanks out the file location, numbers and `@names` of a message, so that one bug gives
/// one signature.
fn normalise(message: &str) -> String {
    // `Error: /tmp/…/gen12.ef:1:6: message` → `Error: message`
    let message = match message.split_once(".ef:") {
        Some((head, tail)) => {
            let prefix = head.split_once('/').map_or(head, |(p, _)| p);
            let tail = tail.trim_start_matches(|c: char| c.is_ascii_digit() || c == ':');
            format!("{prefix}{}", tail.trim_start())
        }
        None => message.to_string(),
    };
    let mut out = String::new();
    let mut chars = message.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            out.push('#');
            while chars
                .peek()
                .is_some_and(|c| c.is_ascii_digit() || *c == '.' || *c == 'e' || *c == '-')
            {
                chars.next();
            }
        } else if c == '@' {
            out.push_str("@_");
            while chars
                .peek()
                .is_some_and(|c| c.is_alphanumeric() || *c == '_' || *c == '.')
            {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// How a run of efopt ended: `None` when it ran past [`PROCESS_LIMIT`] and was killed,
/// `Some(None)` when a signal ended it, else its exit code.
struct Run {
    code: Option<Option<i32>>,
    stdout: String,
    stderr: String,
}

fn run_efopt(path: &Path, passes: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_efopt"))
        .arg(path)
        .arg(passes)
        // The net's default: a wrong candidate is a warning, so `check` still runs.
        .env_remove("EFOPT_WRONG_CANDIDATES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("efopt starts");
    // Drain both pipes on their own threads so that a large output cannot block the child.
    let mut stdout_pipe = child.stdout.take().unwrap();
    let mut stderr_pipe = child.stderr.take().unwrap();
    let stdout_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout_pipe.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let stderr_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr_pipe.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait for efopt") {
            break Some(status.code());
        }
        if started.elapsed() > PROCESS_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Run {
        code,
        stdout: stdout_reader.join().unwrap_or_default(),
        stderr: stderr_reader.join().unwrap_or_default(),
    }
}

/// The candidates (`genN.cK`) whose function uses a reducer that repair fusion generated
/// (`@repair_…`): `extract` is run again without `check`, which prints them. `None` when
/// that run fails.
fn repair_candidates(path: &Path) -> Option<BTreeSet<String>> {
    let passes = format!(
        "--passes=saturate,extract{{max-candidates={MAX_CANDIDATES} time-limit={TIME_LIMIT_S}}}"
    );
    let run = run_efopt(path, &passes);
    if run.code != Some(Some(0)) {
        return None;
    }
    let mut found = BTreeSet::new();
    let mut current: Option<String> = None;
    for line in run.stdout.lines() {
        if let Some(rest) = line.strip_prefix("func ") {
            current = rest.split_whitespace().next().map(str::to_string);
        } else if line == "}" {
            current = None;
        } else if let Some(name) = &current {
            if line.contains("@repair_") {
                found.insert(name.clone());
            }
        }
    }
    Some(found)
}

/// The candidate a `check` report line is about: `// check @gen3.c5 against …` → `gen3.c5`.
fn checked_candidate(line: &str) -> &str {
    line.split('@')
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("")
}

/// The results of a `check` line whose error is non-finite (a NaN or infinity where the
/// source has a finite value, or the reverse): `relative L2 result 0: 1e-8, result 1: inf`
/// → `[1]`.
fn non_finite_results(line: &str) -> Vec<usize> {
    let errors = line
        .split_once("relative L2 ")
        .map_or("", |(_, r)| r.split(" (tol").next().unwrap_or(""));
    errors
        .split(", ")
        .filter_map(|f| {
            let (result, value) = f.strip_prefix("result ")?.split_once(": ")?;
            let index = result.split('.').next()?.parse().ok()?;
            let value = value.to_ascii_lowercase();
            (value == "inf" || value == "nan").then_some(index)
        })
        .collect()
}

/// For each input scale of `check` (unit, then large), which results of the source hold a
/// NaN, from `interpret` on the same seeded inputs. `None` when that run fails.
fn source_nans(path: &Path) -> Option<[Vec<bool>; 2]> {
    let run = run_efopt(path, "--passes=interpret,interpret{scale=30}");
    if run.code != Some(Some(0)) {
        return None;
    }
    let lines: Vec<bool> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("// interpret @"))
        .map(|l| l.to_ascii_lowercase().contains("nan"))
        .collect();
    let (unit, large) = lines.split_at(lines.len() / 2);
    Some([unit.to_vec(), large.to_vec()])
}

/// Distinct failures of the `check` lines that end in `FAILED`, grouped by whether the
/// candidate uses a repair-fusion reducer and by the error: non-finite where the source's
/// result holds a NaN (a fully masked row, say), non-finite elsewhere, or finite and over
/// tolerance; a group is "at unit scale" when one of its lines is (not only at the large
/// scale).
fn check_failures(path: &Path, failed: &[&str]) -> Vec<(String, Vec<String>)> {
    let repair = repair_candidates(path);
    let nans = source_nans(path);
    let mut groups: BTreeMap<(String, &str), Vec<String>> = BTreeMap::new();
    for line in failed {
        let uses = match &repair {
            Some(r) if r.contains(checked_candidate(line)) => "uses a repair-fusion reducer",
            Some(_) => "uses no repair-fusion reducer",
            None => "(its text is unknown)",
        };
        let bad = non_finite_results(line);
        let scale = usize::from(line.contains(" at scale "));
        let source_nan = |j: &usize| {
            nans.as_ref()
                .is_some_and(|n| n[scale].get(*j).copied().unwrap_or(false))
        };
        let error = if bad.is_empty() {
            "error over tolerance"
        } else if bad.iter().all(source_nan) {
            "non-finite mismatch where the source's result holds NaN"
        } else {
            "non-finite mismatch"
        };
        groups
            .entry((format!("a candidate that {uses}"), error))
            .or_default()
            .push(line.to_string());
    }
    groups
        .into_iter()
        .map(|((uses, error), lines)| {
            let scale = if lines.iter().any(|l| !l.contains(" at scale ")) {
                "at unit scale"
            } else {
                "only at the large scale"
            };
            (format!("check FAILED {scale}, {error}, in {uses}"), lines)
        })
        .collect()
}

/// Distinct `wrong candidate` warnings: by the repair-fusion rules they name (or none, an
/// equality rule), at unit scale when one of them is.
fn wrong_candidates(wrong: &[&str]) -> Vec<(String, Vec<String>)> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in wrong {
        let cause = if line.contains("no generated reducer") {
            "no generated reducer (an equality rule)".to_string()
        } else {
            match line.split_once("it uses ") {
                Some((_, uses)) => generated_reducers(uses),
                None => normalise(line),
            }
        };
        groups.entry(cause).or_default().push(line.to_string());
    }
    groups
        .into_iter()
        .map(|(cause, lines)| {
            let scale = if lines.iter().any(|l| l.contains("at input scale 1)")) {
                "at unit scale"
            } else {
                "only at the large scale"
            };
            (format!("wrong candidate dropped {scale}: {cause}"), lines)
        })
        .collect()
}

/// The kinds of generated reducers a `wrong candidate` warning names, with the repair rules:
/// `@repair_1 (repair-fusion, c0 by R: …), @product_2 (product-fusion)` →
/// `product-fusion; repair-fusion by R`.
fn generated_reducers(uses: &str) -> String {
    let mut groups = Vec::new();
    let (mut depth, mut current) = (0usize, String::new());
    for c in uses.chars() {
        match c {
            '(' => {
                if depth > 0 {
                    current.push(c);
                }
                depth += 1;
            }
            ')' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    groups.push(std::mem::take(&mut current));
                } else {
                    current.push(c);
                }
            }
            _ if depth > 0 => current.push(c),
            _ => {}
        }
    }
    let kinds: BTreeSet<String> = groups
        .iter()
        .map(|g| {
            let kind = g.split(',').next().unwrap_or("").trim();
            let rules: BTreeSet<&str> = g
                .split(" by ")
                .skip(1)
                .filter_map(|r| r.split(':').next())
                .collect();
            if rules.is_empty() {
                kind.to_string()
            } else {
                let rules: Vec<&str> = rules.into_iter().collect();
                format!("{kind} by {}", rules.join(", "))
            }
        })
        .collect();
    let kinds: Vec<String> = kinds.into_iter().collect();
    kinds.join("; ")
}

/// The lines around a panic message in standard error.
fn panic_lines(stderr: &str) -> Vec<String> {
    let lines: Vec<&str> = stderr.lines().collect();
    match lines.iter().position(|l| l.contains("panicked at")) {
        Some(i) => lines[i..(i + 2).min(lines.len())]
            .iter()
            .map(|l| l.to_string())
            .collect(),
        None => lines.iter().take(3).map(|l| l.to_string()).collect(),
    }
}

fn run_program(path: &Path) -> Outcome {
    let mut out = Outcome::default();
    let Run {
        code,
        stdout,
        stderr,
    } = run_efopt(path, &passes());
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("// extract @") {
            // `..., 3 distinct, 3 output, 0 without launch order, ...`
            let n = rest
                .split(", ")
                .find_map(|f| f.strip_suffix(" output"))
                .and_then(|n| n.trim().replace(',', "").parse::<u64>().ok());
            out.candidates += n.unwrap_or(0);
        }
    }
    let failed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("//") && l.contains("FAILED"))
        .collect();
    let wrong: Vec<&str> = stderr
        .lines()
        // Not the summary line of the rest (`N more wrong candidates dropped: …`).
        .filter(|l| l.contains("wrong candidate") && !l.contains("more wrong candidates"))
        .collect();
    match code {
        None => {
            out.failures.push((
                format!("efopt ran past {} s", PROCESS_LIMIT.as_secs()),
                Vec::new(),
            ));
        }
        Some(Some(0)) => {}
        Some(Some(1)) if !failed.is_empty() => {}
        Some(Some(1)) => {
            let error = stderr
                .lines()
                .find(|l| l.to_lowercase().contains("error"))
                .or_else(|| stderr.lines().next())
                .unwrap_or("")
                .to_string();
            if error.contains("no candidate") {
                // The remarks before it say why (`lower` refused every program, ...).
                let why: Vec<&str> = stderr
                    .lines()
                    .filter(|l| l.starts_with("remark:"))
                    .collect();
                out.no_candidate = Some(if why.is_empty() {
                    error
                } else {
                    why.join("; ")
                });
            } else {
                out.failures.push((
                    format!("efopt failed: {}", normalise(&error)),
                    stderr.lines().take(6).map(|l| l.to_string()).collect(),
                ));
            }
        }
        Some(Some(101)) => {
            let lines = panic_lines(&stderr);
            let message = lines.get(1).cloned().unwrap_or_default();
            let location = lines
                .first()
                .and_then(|l| l.split("panicked at ").nth(1))
                .unwrap_or("")
                .to_string();
            out.failures.push((
                format!("efopt panicked at {location} {}", normalise(&message)),
                lines,
            ));
        }
        Some(Some(c)) => out.failures.push((
            format!("efopt exited with code {c}"),
            stderr.lines().take(6).map(|l| l.to_string()).collect(),
        )),
        Some(None) => out.failures.push((
            "efopt was killed by a signal".to_string(),
            stderr
                .lines()
                .rev()
                .take(6)
                .map(|l| l.to_string())
                .collect(),
        )),
    }
    out.failures.extend(wrong_candidates(&wrong));
    if !failed.is_empty() {
        out.failures.extend(check_failures(path, &failed));
    }
    out
}

/// One distinct failure: how often it was seen, and the shortest program that showed it.
struct Finding {
    count: u64,
    program: String,
    index: u64,
    lines: Vec<String>,
}

#[derive(Default)]
struct Totals {
    programs: u64,
    candidates: u64,
    no_candidate: u64,
    no_candidate_messages: BTreeMap<String, u64>,
    failing_programs: u64,
    findings: BTreeMap<String, Finding>,
}

fn write_out(dir: &Path, name: &str, why: &[String], program: &str) {
    let _ = std::fs::create_dir_all(dir);
    let mut text = String::new();
    for w in why {
        for line in w.lines() {
            text.push_str("// ");
            text.push_str(line.trim_start_matches("// "));
            text.push('\n');
        }
    }
    text.push_str(program);
    let _ = std::fs::write(dir.join(name), text);
}

#[test]
fn candidates_compute_what_the_program_computes() {
    let secs = env_u64("EFOPT_PROPERTY_SECS");
    let seed = env_u64("EFOPT_PROPERTY_SEED").unwrap_or_else(|| match secs {
        Some(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        None => DEFAULT_SEED,
    });
    let show = env_u64("EFOPT_PROPERTY_SHOW").unwrap_or(0);
    let out_dir = std::env::var_os("EFOPT_PROPERTY_OUT").map(PathBuf::from);
    let deadline = secs.map(|s| Instant::now() + Duration::from_secs(s));
    let work = std::env::temp_dir().join(format!("efopt-property-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("create a scratch directory");

    let started = Instant::now();
    let next = Mutex::new(0u64);
    let totals = Mutex::new(Totals::default());
    std::thread::scope(|scope| {
        let threads = env_u64("EFOPT_PROPERTY_THREADS").map_or(THREADS, |n| n.max(1) as usize);
        for _ in 0..threads {
            scope.spawn(|| loop {
                let index = {
                    let mut n = next.lock().unwrap();
                    let done = match deadline {
                        Some(d) => Instant::now() >= d,
                        None => *n >= DEFAULT_PROGRAMS,
                    };
                    if done {
                        return;
                    }
                    *n += 1;
                    *n - 1
                };
                let (text, problems) = program(seed, index);
                if index < show {
                    eprintln!("--- program {index}:\n{text}");
                }
                let path = work.join(format!("gen{index}.ef"));
                std::fs::write(&path, &text).expect("write the program");
                let mut outcome = run_program(&path);
                let _ = std::fs::remove_file(&path);
                for p in problems {
                    outcome.failures.push((
                        format!("generator: {}: {}", p.kind, normalise(&p.detail)),
                        vec![p.detail],
                    ));
                }
                if !outcome.failures.is_empty() {
                    let summary: Vec<String> = outcome
                        .failures
                        .iter()
                        .map(|(sig, lines)| {
                            format!("{sig}: {}", lines.first().map_or("", |l| l.as_str()))
                        })
                        .collect();
                    eprintln!(
                        "candidates_property: program {index} (seed {seed:#x}) fails:\n  {}\n{text}",
                        summary.join("\n  ")
                    );
                }
                if let Some(dir) = &out_dir {
                    let mut why: Vec<String> = vec![format!(
                        "seed {seed:#x}, program {index}: efopt PROG.ef '{}'",
                        passes()
                    )];
                    if !outcome.failures.is_empty() {
                        for (sig, lines) in &outcome.failures {
                            why.push(sig.clone());
                            why.extend(lines.iter().take(4).cloned());
                        }
                        write_out(dir, &format!("fail-{seed:x}-{index}.ef"), &why, &text);
                    } else if let Some(m) = &outcome.no_candidate {
                        why.push(m.clone());
                        write_out(dir, &format!("nocand-{seed:x}-{index}.ef"), &why, &text);
                    }
                }
                let mut t = totals.lock().unwrap();
                t.programs += 1;
                t.candidates += outcome.candidates;
                if let Some(m) = &outcome.no_candidate {
                    t.no_candidate += 1;
                    *t.no_candidate_messages.entry(normalise(m)).or_default() += 1;
                }
                if !outcome.failures.is_empty() {
                    t.failing_programs += 1;
                }
                for (sig, lines) in outcome.failures {
                    let f = t.findings.entry(sig).or_insert_with(|| Finding {
                        count: 0,
                        program: text.clone(),
                        index,
                        lines: lines.clone(),
                    });
                    f.count += 1;
                    if text.len() < f.program.len() {
                        f.program = text.clone();
                        f.index = index;
                        f.lines = lines;
                    }
                }
            });
        }
    });
    let _ = std::fs::remove_dir_all(&work);

    let t = totals.into_inner().unwrap();
    eprintln!(
        "candidates_property: seed {seed:#x}, {:.1} s: {} programs generated, {} candidates checked, {} programs with no candidate, {} failing programs ({} distinct failures)",
        started.elapsed().as_secs_f64(),
        t.programs,
        t.candidates,
        t.no_candidate,
        t.failing_programs,
        t.findings.len()
    );
    for (m, n) in &t.no_candidate_messages {
        eprintln!("  no candidate ({n} programs): {m}");
    }
    if !t.findings.is_empty() {
        let mut report = String::new();
        for (sig, f) in &t.findings {
            report.push_str(&format!(
                "\n\n== {sig} ({} programs; shortest: program {} of seed {seed:#x})\n",
                f.count, f.index
            ));
            for l in f.lines.iter().take(6) {
                report.push_str(&format!("   {l}\n"));
            }
            report.push_str(&f.program);
        }
        panic!(
            "{} of {} programs fail ({} distinct failures; rerun with EFOPT_PROPERTY_SEED={seed}):{report}",
            t.failing_programs,
            t.programs,
            t.findings.len()
        );
    }
}

/// The tensor-level generator: a fixed seed gives the same program; its programs verify, use
/// every input, and have no parallel state and no user reducers.
#[test]
fn tensor_level_generator_is_deterministic_and_valid() {
    for index in 0..40 {
        let (a, problems) = program(DEFAULT_SEED, index);
        let (b, _) = program(DEFAULT_SEED, index);
        assert_eq!(a, b);
        assert!(problems.is_empty(), "{:?}", problems.first());
        let mut m = efopt::parse::parse_module(&a, 0).unwrap_or_else(|_| panic!("parses:\n{a}"));
        efopt::verify::verify_module(&mut m).unwrap_or_else(|_| panic!("verifies:\n{a}"));
        for word in [
            "partition",
            "replicate",
            "combination",
            "collection",
            "reducer @",
        ] {
            assert!(
                !a.contains(word),
                "`{word}` in a tensor-level program:\n{a}"
            );
        }
        for line in a.lines().filter(|l| l.ends_with("= input")) {
            let name = line.trim().split(':').next().unwrap();
            let uses = a
                .lines()
                .filter(|l| !l.ends_with("= input"))
                .flat_map(|l| l.split(|c: char| !(c.is_alphanumeric() || c == '_')))
                .filter(|w| *w == name)
                .count();
            assert!(uses > 0, "input `{name}` is unused:\n{a}");
        }
    }
}
