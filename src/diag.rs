//! Diagnostics: source spans, structured diagnostics and their rendering with `ariadne`.
//!
//! Every layer reports problems as [`Diagnostic`]s pointing into a source registered in a
//! [`SourceMap`]; the driver renders them (or, under `--verify-diagnostics`, matches them
//! against `expected-*` annotations).

use std::fmt;
use std::io::Write;

/// A byte range in one source of the [`SourceMap`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    pub source: u32,
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(source: u32, start: usize, end: usize) -> Span {
        Span {
            source,
            start: start as u32,
            end: end.max(start) as u32,
        }
    }

    /// The smallest span covering both (same source assumed).
    pub fn to(self, other: Span) -> Span {
        Span {
            source: self.source,
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Severity {
    Error,
    Warning,
    Note,
    Remark,
}

impl Severity {
    pub fn name(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
            Severity::Remark => "remark",
        }
    }
}

/// A secondary location with its own message, e.g. "while typing @rolling used here".
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub span: Option<Span>,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub message: String,
    pub span: Option<Span>,
    /// Text of the primary label; defaults to the message.
    pub label: Option<String>,
    pub notes: Vec<Note>,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn error(span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            message: message.into(),
            span: Some(span),
            label: None,
            notes: Vec::new(),
            help: None,
        }
    }

    /// An error about the invocation itself rather than a source location.
    pub fn global(severity: Severity, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity,
            message: message.into(),
            span: None,
            label: None,
            notes: Vec::new(),
            help: None,
        }
    }

    pub fn warning(span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(span, message)
        }
    }

    pub fn remark(span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Remark,
            ..Diagnostic::error(span, message)
        }
    }

    pub fn with_label(mut self, label: impl Into<String>) -> Diagnostic {
        self.label = Some(label.into());
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }

    pub fn with_note(mut self, span: Option<Span>, message: impl Into<String>) -> Diagnostic {
        self.notes.push(Note {
            span,
            message: message.into(),
        });
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.severity.name(), self.message)
    }
}

/// A named source text.
#[derive(Clone, Debug)]
pub struct SourceFile {
    pub name: String,
    pub text: String,
}

/// All sources diagnostics may point into: input files, files named by pass options, the
/// pass-pipeline string.
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn add(&mut self, name: impl Into<String>, text: impl Into<String>) -> u32 {
        self.files.push(SourceFile {
            name: name.into(),
            text: text.into(),
        });
        (self.files.len() - 1) as u32
    }

    pub fn get(&self, id: u32) -> Option<&SourceFile> {
        self.files.get(id as usize)
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, source: u32, offset: u32) -> (usize, usize) {
        let Some(file) = self.get(source) else {
            return (0, 0);
        };
        let mut offset = (offset as usize).min(file.text.len());
        while !file.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &file.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
        let col = before[line_start..].chars().count() + 1;
        (line, col)
    }

    /// Renders a diagnostic as an ariadne report (`file:line:col`, labelled span, notes, help).
    pub fn render(&self, diag: &Diagnostic, color: bool, out: &mut dyn Write) {
        use ariadne::{Config, IndexType, Label, Report, ReportKind};
        let kind = match diag.severity {
            Severity::Error => ReportKind::Error,
            Severity::Warning => ReportKind::Warning,
            Severity::Note | Severity::Remark => ReportKind::Advice,
        };
        let Some(span) = diag.span.filter(|s| self.get(s.source).is_some()) else {
            let _ = writeln!(out, "{}: {}", diag.severity.name(), diag.message);
            for n in &diag.notes {
                let _ = writeln!(out, "  note: {}", n.message);
            }
            if let Some(h) = &diag.help {
                let _ = writeln!(out, "  help: {h}");
            }
            return;
        };
        let name = |s: &Span| self.files[s.source as usize].name.clone();
        // Spans snap outward to character boundaries: ariadne indexes bytes and must not
        // split a multi-byte character (or a replacement character in lossy-decoded input).
        let range = |s: &Span| {
            let text = &self.files[s.source as usize].text;
            let mut start = (s.start as usize).min(text.len());
            while !text.is_char_boundary(start) {
                start -= 1;
            }
            let mut end = (s.end as usize).clamp(start, text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            start..end
        };
        let (line, col) = self.line_col(span.source, span.start);
        let mut report = Report::build(kind, (name(&span), range(&span)))
            .with_config(
                Config::default()
                    .with_color(color)
                    .with_index_type(IndexType::Byte),
            )
            .with_message(format!("{}:{line}:{col}: {}", name(&span), diag.message))
            .with_label(
                Label::new((name(&span), range(&span)))
                    .with_message(diag.label.clone().unwrap_or_else(|| diag.message.clone())),
            );
        for n in &diag.notes {
            match n.span.filter(|s| self.get(s.source).is_some()) {
                Some(s) => {
                    report = report
                        .with_label(Label::new((name(&s), range(&s))).with_message(&n.message))
                }
                None => report = report.with_note(&n.message),
            }
        }
        if let Some(h) = &diag.help {
            report = report.with_help(h);
        }
        // Control characters are shown as `?`, one byte for one so the spans stay put: a NUL
        // or an escape sequence in the input must not reach the terminal raw.
        let shown = |text: &str| -> String {
            text.chars()
                .map(|c| match c {
                    '\t' | '\n' | '\r' => c,
                    c if c.is_ascii_control() => '?',
                    c => c,
                })
                .collect()
        };
        let cache = ariadne::sources(self.files.iter().map(|f| (f.name.clone(), shown(&f.text))));
        let _ = report.finish().write(cache, &mut *out);
    }
}
