//! LLVM-lit-style test driver. Every `tests/lit/**/*.ef` file is one test:
//! its `// RUN:` lines are run in order, and the test fails at the first line
//! that fails.
//!
//! ```text
//! // RUN: efopt %s | FileCheck %s
//! // RUN: not efopt --bad-flag %s 2>&1 \
//! // RUN:   | FileCheck %s --check-prefix=ERR
//! // REQUIRES: python-venv        (skipped unless EFOPT_PYTHON is set)
//! ```
//!
//! A RUN line ending in `\` continues on the next RUN line. Substitutions:
//! `%s` test file, `%S` its directory, `%t` a per-test scratch path (removed
//! before the test runs; its directory is the commands' working directory),
//! `%efopt` (or a command named `efopt`) the built binary, `%python` the
//! value of `EFOPT_PYTHON`, `%%` a literal `%`. The shell subset is described
//! in `lit_support/shell.rs`; builtins and FileCheck in `lit_support/exec.rs`.

#[path = "lit_support/exec.rs"]
mod exec;
#[path = "lit_support/shell.rs"]
mod shell;

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

datatest_stable::harness! {
    { test = run_test_file, root = LIT_ROOT, pattern = r"\.ef$" },
}

/// Relative to the crate root, which is where cargo runs test binaries.
const LIT_ROOT: &str = "tests/lit";

/// Caps on the captured output quoted in a failure report, per stream.
const OUTPUT_LIMIT: usize = 4096;
const DIAGNOSTIC_LIMIT: usize = 64 * 1024;

/// datatest-stable prints test errors with `{:?}`; this keeps the report's
/// newlines instead of printing an escaped string literal.
struct Failure(String);

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

fn run_test_file(path: &Path, contents: String) -> datatest_stable::Result<()> {
    let crate_root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = crate_root.join(path);
    let relative = file
        .strip_prefix(crate_root.join(LIT_ROOT))
        .unwrap_or(path)
        .to_path_buf();
    match run_test(&file, &relative, &contents) {
        Ok(Some(skip_reason)) => {
            eprintln!("note: {}: skipped: {skip_reason}", relative.display());
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(report) => Err(Box::new(Failure(format!("{}: {report}", file.display())))),
    }
}

struct RunLine {
    line_no: usize,
    text: String,
}

struct Directives {
    run_lines: Vec<RunLine>,
    requires: Vec<String>,
}

/// Returns the text after `// KEY:` when `line` is such a directive.
fn directive<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.trim_start()
        .strip_prefix("//")?
        .trim_start()
        .strip_prefix(key)
}

fn parse_directives(contents: &str) -> Result<Directives, String> {
    let mut run_lines = Vec::new();
    let mut requires = Vec::new();
    let mut pending: Option<RunLine> = None;
    for (index, line) in contents.lines().enumerate() {
        let line_no = index + 1;
        if let Some(features) = directive(line, "REQUIRES:") {
            requires.extend(
                features
                    .split(',')
                    .map(str::trim)
                    .filter(|f| !f.is_empty())
                    .map(str::to_owned),
            );
        }
        let Some(body) = directive(line, "RUN:") else {
            if let Some(open) = &pending {
                return Err(format!(
                    "line {}: RUN line ends in `\\` but line {line_no} does not continue it",
                    open.line_no
                ));
            }
            continue;
        };
        let body = body.trim();
        let (body, continues) = match body.strip_suffix('\\') {
            Some(head) => (head.trim_end(), true),
            None => (body, false),
        };
        let run = pending.get_or_insert_with(|| RunLine {
            line_no,
            text: String::new(),
        });
        if !run.text.is_empty() && !body.is_empty() {
            run.text.push(' ');
        }
        run.text.push_str(body);
        if !continues {
            run_lines.extend(pending.take());
        }
    }
    if let Some(open) = pending {
        return Err(format!(
            "line {}: RUN line ends in `\\` at the end of the file",
            open.line_no
        ));
    }
    Ok(Directives {
        run_lines,
        requires,
    })
}

/// `%` substitutions, applied in one pass so that substituted text (say a
/// path containing `%s`) is never substituted again.
struct Substitutions {
    /// Longest keys first, so `%s` does not shadow a longer key.
    table: Vec<(&'static str, Option<String>)>,
}

impl Substitutions {
    fn apply(&self, text: &str) -> Result<String, String> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find('%') {
            out.push_str(&rest[..at]);
            rest = &rest[at..];
            match self.table.iter().find(|(key, _)| rest.starts_with(key)) {
                Some((key, Some(value))) => {
                    out.push_str(value);
                    rest = &rest[key.len()..];
                }
                Some((key, None)) => {
                    return Err(format!(
                        "`{key}` is used, but `// REQUIRES: python-venv` is missing \
                         or EFOPT_PYTHON is not set"
                    ));
                }
                // Unknown `%x` stays literal, as in lit.
                None => {
                    out.push('%');
                    rest = &rest[1..];
                }
            }
        }
        out.push_str(rest);
        Ok(out)
    }
}

/// Runs one test file: `Ok(Some(reason))` when skipped, `Err(report)` on failure.
fn run_test(file: &Path, relative: &Path, contents: &str) -> Result<Option<String>, String> {
    let directives = parse_directives(contents)?;

    let mut python = None;
    for feature in &directives.requires {
        match feature.as_str() {
            "python-venv" => match std::env::var("EFOPT_PYTHON") {
                Ok(value) if !value.is_empty() => python = Some(value),
                _ => {
                    return Ok(Some(
                        "REQUIRES: python-venv, but EFOPT_PYTHON is not set".into(),
                    ))
                }
            },
            other => return Err(format!("unknown REQUIRES feature `{other}`")),
        }
    }
    if directives.run_lines.is_empty() {
        return Err("no RUN lines".to_owned());
    }

    let scratch = scratch_path(relative)?;
    let cwd = scratch
        .parent()
        .ok_or("scratch path has no parent directory")?;
    let efopt = Path::new(env!("CARGO_BIN_EXE_efopt"));
    let display = |p: &Path| p.display().to_string();
    let subst = Substitutions {
        table: vec![
            ("%efopt", Some(display(efopt))),
            ("%python", python),
            ("%s", Some(display(file))),
            ("%S", Some(display(file.parent().unwrap_or(Path::new("."))))),
            ("%t", Some(display(&scratch))),
            ("%%", Some("%".to_owned())),
        ],
    };
    let ctx = exec::Context {
        cwd,
        efopt,
        merge_file: scratch.with_extension("tmp.merged"),
    };

    for run in &directives.run_lines {
        let shown = subst
            .apply(&run.text)
            .map_err(|e| format!("RUN line {}: {e}", run.line_no))?;
        let pipelines = shell::tokenize(&run.text)
            .and_then(|tokens| shell::parse(tokens, &|word| subst.apply(word)))
            .map_err(|e| format!("RUN line {}: {e}\n  RUN: {shown}", run.line_no))?;
        for pipeline in &pipelines {
            let results = exec::run_pipeline(pipeline, &ctx);
            if results.iter().any(|r| r.verdict.is_err()) {
                return Err(failure_report(run, &shown, &results));
            }
        }
    }
    Ok(None)
}

/// `<temp>/efopt-lit/<path under tests/lit>.tmp`, unique per test file, with
/// its directory created and any leftover from an earlier run removed.
fn scratch_path(relative: &Path) -> Result<PathBuf, String> {
    let mut scratch = std::env::temp_dir().join("efopt-lit").join(relative);
    scratch.as_mut_os_string().push(".tmp");
    if let Some(dir) = scratch.parent() {
        fs::create_dir_all(dir).map_err(|e| format!("creating `{}`: {e}", dir.display()))?;
    }
    let stale = match fs::symlink_metadata(&scratch) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(&scratch),
        Ok(_) => fs::remove_file(&scratch),
        Err(_) => Ok(()),
    };
    stale.map_err(|e| format!("removing stale `{}`: {e}", scratch.display()))?;
    Ok(scratch)
}

fn failure_report(run: &RunLine, shown: &str, results: &[exec::CommandResult<'_>]) -> String {
    use std::fmt::Write as _;

    let mut out = format!("RUN line {} failed\n  RUN: {shown}\n", run.line_no);
    let total = results.len();
    for (index, result) in results.iter().enumerate() {
        let outcome = &result.outcome;
        let header = format!("command {}/{total}: {}", index + 1, result.command);
        let Err(reason) = &result.verdict else {
            // Passing commands matter only for what they said on stderr.
            if !outcome.stderr.is_empty() {
                let _ = write!(out, "\n---- {header} (ok) -- stderr:\n");
                out.push_str(&excerpt(&outcome.stderr, OUTPUT_LIMIT));
            }
            continue;
        };
        let _ = write!(out, "\n---- {header}\nFAILED: {reason}\n");
        if let Some((input, diagnostic)) = &outcome.filecheck {
            out.push_str("-- FileCheck input:\n");
            out.push_str(&excerpt(input, OUTPUT_LIMIT));
            if let Some(diagnostic) = diagnostic {
                out.push_str("-- FileCheck diagnostic:\n");
                out.push_str(&excerpt(diagnostic.as_bytes(), DIAGNOSTIC_LIMIT));
            }
        } else if !matches!(outcome.status, exec::Status::Error(_)) {
            out.push_str("-- stdout:\n");
            out.push_str(&excerpt(&outcome.stdout, OUTPUT_LIMIT));
            out.push_str("-- stderr:\n");
            out.push_str(&excerpt(&outcome.stderr, OUTPUT_LIMIT));
        }
    }
    out
}

/// Lossy text of `bytes`, cut to about `limit` bytes, always newline-terminated.
fn excerpt(bytes: &[u8], limit: usize) -> String {
    if bytes.is_empty() {
        return "(empty)\n".to_owned();
    }
    let text = String::from_utf8_lossy(bytes);
    let mut cut = limit.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = text[..cut].to_owned();
    if !out.ends_with('\n') {
        out.push('\n');
    }
    if cut < text.len() {
        out.push_str(&format!("... ({} more bytes cut)\n", text.len() - cut));
    }
    out
}
