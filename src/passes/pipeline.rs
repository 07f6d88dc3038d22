//! Pipeline text: `--passes=a,b{opt=val opt2=val}` parsed into [`PassSpec`]s, and printed back
//! ([`print_pipeline`] is the parser's inverse: `print(parse(p)) == p` for a pipeline in
//! canonical form, which every pipeline in the tests and docs is; see
//! `tests/pipeline_roundtrip.rs`). Errors are diagnostics that point into the pipeline string
//! (registered as the `<pipeline>` source).
//!
//! ```text
//! PIPELINE := PASS ("," PASS)*
//! PASS     := NAME [ "{" OPTION (" " OPTION)* "}" ]
//! OPTION   := KEY "=" VALUE | KEY            (a bare KEY means KEY=true)
//! ```
//!
//! Canonical form: passes separated by one comma, options by one space, every option written
//! `KEY=VALUE`, no empty braces. The parser also accepts spaces and repeated or trailing commas
//! before a pass name, repeated spaces between options, empty braces and a bare `KEY`; those
//! print in canonical form.

use super::registry;
use crate::diag::{Diagnostic, Span};
use std::fmt;

/// One pass of a pipeline, as written: its name and its `{key=value}` settings in order.
#[derive(Clone, Debug)]
pub struct PassSpec {
    pub name: String,
    /// Where the name was written.
    pub span: Span,
    pub options: Vec<OptionSetting>,
}

/// One `key=value` of a pass's braces.
#[derive(Clone, Debug)]
pub struct OptionSetting {
    pub name: String,
    /// `true` for a bare `key`.
    pub value: String,
    /// Where `key=value` was written.
    pub span: Span,
}

impl PassSpec {
    /// A pass with no options.
    pub fn new(name: impl Into<String>) -> PassSpec {
        PassSpec {
            name: name.into(),
            span: Span::default(),
            options: Vec::new(),
        }
    }

    /// Adds `key=value` (for specs built in code: no span).
    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> PassSpec {
        self.options.push(OptionSetting {
            name: key.into(),
            value: value.into(),
            span: Span::default(),
        });
        self
    }
}

impl fmt::Display for PassSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if self.options.is_empty() {
            return Ok(());
        }
        f.write_str("{")?;
        for (i, o) in self.options.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{}={}", o.name, o.value)?;
        }
        f.write_str("}")
    }
}

/// The pipeline text of `specs`, in canonical form.
pub fn print_pipeline(specs: &[PassSpec]) -> String {
    specs
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses and checks a pipeline: every pass must be registered and every option one of its
/// options with a value of the option's kind. All errors are reported, in text order.
pub fn parse_pipeline(text: &str, source: u32) -> Result<Vec<PassSpec>, Vec<Diagnostic>> {
    let (specs, syntax_error) = split(text, source);
    let reg = registry();
    let mut errors = Vec::new();
    let mut checked = Vec::new();
    for spec in specs {
        let Some(info) = reg.iter().find(|p| p.name == spec.name) else {
            let names: Vec<&str> = reg.iter().map(|p| p.name).collect();
            errors.push(
                Diagnostic::error(spec.span, format!("unknown pass `{}`", spec.name)).with_help(
                    format!("available passes: {} (see --list-passes)", names.join(", ")),
                ),
            );
            continue;
        };
        // Creating the pass is what checks its options.
        if let Err(mut d) = (info.create)(&spec) {
            errors.append(&mut d);
            continue;
        }
        checked.push(spec);
    }
    // The text after a syntax error is not read: it comes last.
    errors.extend(syntax_error);
    if errors.is_empty() {
        Ok(checked)
    } else {
        Err(errors)
    }
}

/// Parses a pipeline's syntax only (names and options are not checked against the registry).
pub fn parse_pipeline_syntax(text: &str, source: u32) -> Result<Vec<PassSpec>, Diagnostic> {
    match split(text, source) {
        (specs, None) => Ok(specs),
        (_, Some(d)) => Err(d),
    }
}

/// The specs before the first syntax error, and that error.
fn split(text: &str, source: u32) -> (Vec<PassSpec>, Option<Diagnostic>) {
    let span = |a: usize, b: usize| Span::new(source, a, b);
    let mut specs = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b',') {
            i += 1;
        }
        if i >= bytes.len() {
            break;
        }
        let start = i;
        while i < bytes.len()
            && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'-' || bytes[i] == b'_')
        {
            i += 1;
        }
        let name = &text[start..i];
        if name.is_empty() {
            let width = text[i..].chars().next().map_or(1, char::len_utf8);
            let d = Diagnostic::error(span(i, i + width), "expected a pass name")
                .with_help("a pipeline is `pass1,pass2{option=value}`");
            return (specs, Some(d));
        }
        let mut options = Vec::new();
        if i < bytes.len() && bytes[i] == b'{' {
            let open = i;
            let Some(close) = text[i..].find('}').map(|c| c + i) else {
                let d = Diagnostic::error(span(open, open + 1), "unclosed `{` in pass options")
                    .with_help("close the options with `}`");
                return (specs, Some(d));
            };
            let mut j = open + 1;
            for word in text[open + 1..close].split(' ') {
                let ws = j;
                j += word.len() + 1;
                if word.is_empty() {
                    continue;
                }
                let (k, v) = word.split_once('=').unwrap_or((word, "true"));
                options.push(OptionSetting {
                    name: k.to_string(),
                    value: v.to_string(),
                    span: span(ws, ws + word.len()),
                });
            }
            i = close + 1;
        }
        if let Some(c) = text[i..].chars().next().filter(|c| *c != ',') {
            let d = Diagnostic::error(
                span(i, i + c.len_utf8()),
                format!("unexpected `{c}` in the pipeline"),
            )
            .with_help("separate passes with `,` and put options in `{…}` separated by spaces");
            return (specs, Some(d));
        }
        specs.push(PassSpec {
            name: name.to_string(),
            span: span(start, start + name.len()),
            options,
        });
    }
    (specs, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printing_inverts_parsing() {
        for p in [
            "verify",
            "saturate,extract{max-candidates=200},lower",
            "check{against=m0.ef tol=0.001 seed=7}",
            "interpret{extents=p:4,m:2}",
            "",
        ] {
            let specs = parse_pipeline(p, 0).expect("parses");
            assert_eq!(print_pipeline(&specs), p);
        }
        // Not canonical: printed in canonical form.
        let specs =
            parse_pipeline_syntax(" verify,, lower{interpret  dot-bf16=true}", 0).expect("parses");
        assert_eq!(
            print_pipeline(&specs),
            "verify,lower{interpret=true dot-bf16=true}"
        );
    }

    #[test]
    fn an_unknown_pass_points_at_its_name() {
        let errors = parse_pipeline("verify, bogus{x=1},lower", 0).expect_err("unknown");
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].message, "unknown pass `bogus`");
    }
}
