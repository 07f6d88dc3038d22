//! `--verify-diagnostics`: matches produced diagnostics against `expected-*` annotations in the
//! source, MLIR-style: `// expected-error@+1 {{substring}}` (also `-warning`, `-note`,
//! `-remark`; the line is `@+N`, `@-N`, `@N` or, with no `@`, the annotation's own line).

use crate::diag::{Diagnostic, Severity, SourceMap, Span};

struct Expectation {
    severity: Severity,
    line: usize,
    text: String,
    span: Span,
    matched: bool,
}

fn parse_expectations(text: &str, source: u32) -> (Vec<Expectation>, Vec<Diagnostic>) {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    let mut offset = 0;
    for (lineno, line) in text.split_inclusive('\n').enumerate() {
        let line_no = lineno + 1;
        let mut search = 0;
        while let Some(pos) = line[search..].find("expected-") {
            let at = search + pos;
            let rest = &line[at + "expected-".len()..];
            search = at + 1;
            let (severity, rest) = if let Some(r) = rest.strip_prefix("error") {
                (Severity::Error, r)
            } else if let Some(r) = rest.strip_prefix("warning") {
                (Severity::Warning, r)
            } else if let Some(r) = rest.strip_prefix("note") {
                (Severity::Note, r)
            } else if let Some(r) = rest.strip_prefix("remark") {
                (Severity::Remark, r)
            } else {
                continue;
            };
            let span = Span::new(source, offset + at, offset + line.trim_end().len());
            let (target, rest) = if let Some(r) = rest.strip_prefix('@') {
                let end = r
                    .find(|c: char| c.is_whitespace() || c == '{')
                    .unwrap_or(r.len());
                let spec = &r[..end];
                let target = if let Some(n) = spec.strip_prefix('+') {
                    n.parse::<usize>().ok().and_then(|n| line_no.checked_add(n))
                } else if let Some(n) = spec.strip_prefix('-') {
                    n.parse::<usize>().ok().and_then(|n| line_no.checked_sub(n))
                } else {
                    spec.parse::<usize>().ok()
                };
                match target {
                    Some(t) => (t, &r[end..]),
                    None => {
                        errors.push(Diagnostic::error(
                            span,
                            format!("bad line offset `@{spec}` in expectation"),
                        ));
                        continue;
                    }
                }
            } else {
                (line_no, rest)
            };
            let rest = rest.trim_start();
            let Some(body) = rest.strip_prefix("{{") else {
                errors.push(Diagnostic::error(
                    span,
                    "expectation without a `{{message}}`",
                ));
                continue;
            };
            let Some(end) = body.find("}}") else {
                errors.push(Diagnostic::error(
                    span,
                    "expectation `{{` is not closed by `}}`",
                ));
                continue;
            };
            out.push(Expectation {
                severity,
                line: target,
                text: body[..end].to_string(),
                span,
                matched: false,
            });
        }
        offset += line.len();
    }
    (out, errors)
}

/// Returns the problems found: expected diagnostics that did not occur and diagnostics that
/// were not expected. Empty means the check passed.
pub fn verify_diagnostics(
    text: &str,
    source: u32,
    produced: &[Diagnostic],
    sources: &SourceMap,
) -> Vec<Diagnostic> {
    let (mut expected, mut problems) = parse_expectations(text, source);
    // Every produced diagnostic and every located note, with its severity and line.
    let mut actual: Vec<(Severity, Option<usize>, String, Option<Span>)> = Vec::new();
    for d in produced {
        let line = d
            .span
            .filter(|s| s.source == source)
            .map(|s| sources.line_col(s.source, s.start).0);
        actual.push((d.severity, line, d.message.clone(), d.span));
        for n in &d.notes {
            if let Some(s) = n.span.filter(|s| s.source == source) {
                actual.push((
                    Severity::Note,
                    Some(sources.line_col(s.source, s.start).0),
                    n.message.clone(),
                    Some(s),
                ));
            }
        }
    }
    for (severity, line, message, span) in actual {
        let hit = expected.iter_mut().find(|e| {
            !e.matched
                && e.severity == severity
                && Some(e.line) == line
                && message.contains(&e.text)
        });
        match hit {
            Some(e) => e.matched = true,
            // Notes are only checked when some note is expected on their line.
            None if severity == Severity::Note => {}
            None => {
                let mut d = Diagnostic::error(
                    span.unwrap_or(Span::new(source, 0, 0)),
                    format!("unexpected {}: {message}", severity.name()),
                );
                if span.is_none() {
                    d.span = None;
                }
                problems.push(
                    d.with_help("add a matching `// expected-…` annotation or fix the input"),
                );
            }
        }
    }
    for e in expected.iter().filter(|e| !e.matched) {
        problems.push(Diagnostic::error(
            e.span,
            format!(
                "expected {} \"{}\" on line {} was not produced",
                e.severity.name(),
                e.text,
                e.line
            ),
        ));
    }
    problems
}
