//! The pipeline printer is the parser's inverse: for every pipeline written in the lit tests'
//! RUN lines, README.md and docs/, `print(parse(p)) == p`. The pipelines are collected by
//! scanning those files, so a new test or example is covered without being listed here.
//!
//! Only the syntax is parsed (`parse_pipeline_syntax`): error tests name passes and values
//! that do not exist (`verfy`, `tol=abc`), which still round-trip. A pipeline that does not
//! parse at all must come from a RUN line that expects efopt to fail (`not efopt …`).
//!
//! One normalisation, of how the files are written rather than of the pipelines: a pipeline
//! in Markdown prose may be wrapped across lines inside its quotes, and a soft line break
//! there reads as one space, so it is compared with the break (and the next line's
//! indentation) as one space; a RUN line continued with `\` is joined as the lit harness
//! joins it, with one space. No pipeline in these files is in a non-canonical form (spaces
//! before names, two commas, two spaces between options, a bare `KEY` for `KEY=true`); for such
//! a form the test below would assert instead that printing is a fixed point and that the
//! printed form parses to the same passes (see `canonical_forms_are_a_fixed_point`).

use efopt::passes::pipeline::{parse_pipeline_syntax, print_pipeline, PassSpec};
use std::path::{Path, PathBuf};

/// A pipeline as written, where, and whether its command is expected to fail.
struct Found {
    text: String,
    at: String,
    expects_failure: bool,
}

fn files_under(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, ext, out);
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

/// The pipelines `--passes=P` / `--passes P` in `text`: quoted (`--passes='…'`,
/// `'--passes=…'`, either quote) or up to the next space or backtick.
fn pipelines_in(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("--passes").map(|i| i + from) {
        from = i + "--passes".len();
        let rest = &text[from..];
        let Some(sep) = rest.chars().next().filter(|c| *c == '=' || *c == ' ') else {
            continue;
        };
        let value = &rest[sep.len_utf8()..];
        // The quote around the whole word, or around the value.
        let outer = text[..i].chars().last().filter(|c| *c == '\'' || *c == '"');
        let inner = value.chars().next().filter(|c| *c == '\'' || *c == '"');
        let (p, len) = match (outer, inner) {
            (Some(q), _) => match value.find(q) {
                Some(end) => (&value[..end], end + 1),
                None => continue,
            },
            (None, Some(q)) => match value[1..].find(q) {
                Some(end) => (&value[1..1 + end], end + 2),
                None => continue,
            },
            (None, None) => {
                let end = value
                    .find(|c: char| c.is_whitespace() || c == '`')
                    .unwrap_or(value.len());
                (&value[..end], end)
            }
        };
        if !p.is_empty() {
            found.push(p.to_string());
        }
        from += sep.len_utf8() + len;
    }
    found
}

/// The RUN lines of a lit test, continuations joined as `tests/lit.rs` joins them.
fn run_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        let Some(body) = line
            .trim_start()
            .strip_prefix("//")
            .and_then(|l| l.trim_start().strip_prefix("RUN:"))
        else {
            continue;
        };
        let body = body.trim();
        let (body, continues) = match body.strip_suffix('\\') {
            Some(head) => (head.trim_end(), true),
            None => (body, false),
        };
        let run = pending.get_or_insert_with(|| (n + 1, String::new()));
        if !run.1.is_empty() && !body.is_empty() {
            run.1.push(' ');
        }
        run.1.push_str(body);
        if !continues {
            lines.extend(pending.take());
        }
    }
    lines
}

fn collect() -> Vec<Found> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut lit = Vec::new();
    files_under(&root.join("tests/lit"), "ef", &mut lit);
    for path in lit {
        let text = std::fs::read_to_string(&path).expect("a lit test");
        for (line, run) in run_lines(&text) {
            let expects_failure = run
                .split('|')
                .any(|cmd| cmd.trim_start().starts_with("not efopt"));
            for p in pipelines_in(&run) {
                found.push(Found {
                    text: p,
                    at: format!("{}:{line}", path.display()),
                    expects_failure,
                });
            }
        }
    }
    let mut docs = vec![root.join("README.md")];
    files_under(&root.join("docs"), "md", &mut docs);
    for path in docs {
        let text = std::fs::read_to_string(&path).expect("a document");
        // A soft line break inside a quoted pipeline reads as one space.
        let mut joined = String::with_capacity(text.len());
        for line in text.lines() {
            if !joined.is_empty() {
                joined.push(if open_quote(&joined) { ' ' } else { '\n' });
            }
            joined.push_str(if open_quote(&joined) {
                line.trim_start()
            } else {
                line
            });
        }
        for p in pipelines_in(&joined) {
            found.push(Found {
                text: p,
                at: path.display().to_string(),
                expects_failure: false,
            });
        }
    }
    found
}

/// Whether the text ends inside the quotes of a `--passes='…` (a pipeline wrapped in prose).
fn open_quote(text: &str) -> bool {
    let Some(i) = text.rfind("--passes='") else {
        return false;
    };
    let after = &text[i + "--passes='".len()..];
    !after.contains('\'') && !after.contains('\n')
}

/// Name and settings, without spans.
fn shape(specs: &[PassSpec]) -> Vec<(String, Vec<(String, String)>)> {
    specs
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                s.options
                    .iter()
                    .map(|o| (o.name.clone(), o.value.clone()))
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn every_written_pipeline_prints_as_written() {
    let found = collect();
    // Enough to mean the scan works: the lit tests alone write well over a hundred.
    assert!(found.len() > 150, "only {} pipelines found", found.len());
    let mut checked = 0;
    let mut rejected = 0;
    let mut problems = Vec::new();
    for f in &found {
        match parse_pipeline_syntax(&f.text, 0) {
            Ok(specs) => {
                checked += 1;
                let printed = print_pipeline(&specs);
                if printed != f.text {
                    problems.push(format!("{}: `{}` printed as `{printed}`", f.at, f.text));
                }
            }
            Err(d) if f.expects_failure => {
                // An error test of the parser itself (`verify;interpret`, an unclosed `{`).
                eprintln!("{}: `{}`: {}", f.at, f.text, d.message);
                rejected += 1;
            }
            Err(d) => problems.push(format!(
                "{}: `{}` does not parse: {}",
                f.at, f.text, d.message
            )),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    eprintln!(
        "{checked} of {} written pipelines parse and print as written, {rejected} are \
         syntax errors that their tests expect",
        found.len()
    );
    assert!(checked > 150, "only {checked} pipelines parsed");
}

#[test]
fn canonical_forms_are_a_fixed_point() {
    for text in [
        " saturate, extract{max-candidates=2  check-candidates},lower,",
        "verify,,interpret{print=values seed=3}",
    ] {
        let specs = parse_pipeline_syntax(text, 0).expect("parses");
        let printed = print_pipeline(&specs);
        let again = parse_pipeline_syntax(&printed, 0).expect("the printed form parses");
        assert_eq!(shape(&again), shape(&specs), "{text}");
        assert_eq!(print_pipeline(&again), printed, "{text}");
    }
}
