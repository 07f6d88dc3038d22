//! Text → IR: the logos lexer, the lalrpop grammar, and the builder that resolves names and
//! checks operator arity and attributes while turning the syntax tree into the arena IR.

pub mod ast;
mod build;
pub mod lexer;

#[allow(
    clippy::all,
    clippy::pedantic,
    unused_parens,
    unused_variables,
    dead_code
)]
mod grammar {
    include!(concat!(env!("OUT_DIR"), "/parse/grammar.rs"));
}

use crate::diag::{Diagnostic, Span};
use crate::ir::Module;
use lalrpop_util::ParseError;

/// Parses and builds a module from `text`, registered as `source` in the caller's source map.
/// All diagnostics are returned; the module is only returned when there are no errors.
pub fn parse_module(text: &str, source: u32) -> Result<Module, Vec<Diagnostic>> {
    let lexer = lexer::Lexer::new(text);
    let items = grammar::ModuleParser::new()
        .parse(lexer)
        .map_err(|e| vec![syntax_error(e, text, source)])?;
    if items.is_empty() {
        // Nothing but whitespace and comments: almost always a wrong file or a bad split.
        let at = text.len() - text.trim_start().len();
        return Err(vec![Diagnostic::error(
            Span::new(source, at, at),
            "empty input: expected a `func` or `reducer` definition",
        )
        .with_label("nothing to parse here")
        .with_help(
            "a module holds definitions such as `func f where N = 4 { … }`",
        )]);
    }
    build::build_module(&items, source)
}

fn token_text(tok: &lexer::Tok) -> String {
    use lexer::Tok;
    match tok {
        Tok::Newline => "end of line".into(),
        Tok::Ident(s) => format!("identifier `{s}`"),
        Tok::ReducerName(s) => format!("reducer `@{s}`"),
        Tok::ClassRef(s) => format!("`%{s}`"),
        Tok::Int(s) | Tok::Float(s) => format!("number `{s}`"),
        Tok::Shape(d) => format!("shape `{}`", crate::ir::shape_to_string(d)),
        other => format!("`{}`", punct_text(other)),
    }
}

fn punct_text(tok: &lexer::Tok) -> &'static str {
    use lexer::Tok::*;
    match tok {
        KwFunc => "func",
        KwWhere => "where",
        KwReducer => "reducer",
        KwReturn => "return",
        KwInput => "input",
        KwConstant => "constant",
        KwReduce => "reduce",
        KwTensor => "tensor",
        LParen => "(",
        RParen => ")",
        LBracket => "[",
        RBracket => "]",
        LBrace => "{",
        RBrace => "}",
        Lt => "<",
        Gt => ">",
        Comma => ",",
        Colon => ":",
        Eq => "=",
        Plus => "+",
        Minus => "-",
        Star => "*",
        Slash => "/",
        Pipe => "|",
        _ => "?",
    }
}

/// Turns lalrpop's terminal names (`"\"identifier\""`, `"\"(\""`) into readable ones.
fn expected_list(expected: &[String]) -> String {
    let mut names: Vec<String> = expected
        .iter()
        .map(|e| {
            let t = e.trim_matches('"');
            match t {
                "newline" => "end of line".to_string(),
                "identifier" | "integer" | "float" | "shape" | "@reducer" | "%class" => {
                    t.replace('@', "").to_string()
                }
                _ => format!("`{t}`"),
            }
        })
        .collect();
    names.sort();
    names.dedup();
    if names.len() > 12 {
        names.truncate(12);
        names.push("…".into());
    }
    names.join(", ")
}

fn syntax_error(
    err: ParseError<usize, lexer::Tok, lexer::LexError>,
    text: &str,
    source: u32,
) -> Diagnostic {
    match err {
        ParseError::InvalidToken { location } => {
            Diagnostic::error(Span::new(source, location, location + 1), "invalid token")
        }
        ParseError::UnrecognizedEof { location, expected } => {
            let at = location.min(text.len());
            Diagnostic::error(Span::new(source, at, at), "unexpected end of input")
                .with_label(format!("expected one of {}", expected_list(&expected)))
                .with_help("is a closing `}` or `)` missing?")
        }
        ParseError::UnrecognizedToken {
            token: (l, tok, r),
            expected,
        } => {
            let mut d = Diagnostic::error(
                Span::new(source, l, r),
                format!("unexpected {}", token_text(&tok)),
            )
            .with_label(format!("expected one of {}", expected_list(&expected)));
            d.help = syntax_hint(&tok, &expected);
            d
        }
        ParseError::ExtraToken { token: (l, tok, r) } => Diagnostic::error(
            Span::new(source, l, r),
            format!(
                "unexpected {} after the end of the module",
                token_text(&tok)
            ),
        ),
        ParseError::User { error } => {
            let mut d = Diagnostic::error(
                Span::new(source, error.start, error.end),
                error.message.clone(),
            );
            d.help = error.help;
            d
        }
    }
}

fn syntax_hint(tok: &lexer::Tok, expected: &[String]) -> Option<String> {
    use lexer::Tok;
    let expects = |s: &str| expected.iter().any(|e| e.trim_matches('"') == s);
    match tok {
        Tok::Newline if expects(")") || expects("]") => {
            Some("a bracket is not closed on this line".into())
        }
        Tok::Newline if expects("=") => {
            Some("a statement is `name = expression` or `name: type = expression`".into())
        }
        Tok::Ident(s) if s == "x" || s.starts_with('x') => Some(
            "shapes are written inside `tensor<…>` as `QxK`; dimension symbols are upper case"
                .into(),
        ),
        Tok::Lt | Tok::Gt => {
            Some("comparisons are written as functions: `less(a, b)`, `greater_equal(a, b)`".into())
        }
        _ if expects("newline") => Some("each statement goes on its own line".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paper_example() {
        let src = "func f where M = 4, K = 8 {\n  a: tensor<MxK, bf16> = input\n  b = exp(a) * 2.0\n  return b\n}\n";
        let m = parse_module(src, 0).expect("parses");
        assert_eq!(m.funcs.len(), 1);
        assert_eq!(m.funcs[0].body.results.len(), 1);
    }

    #[test]
    fn syntax_error_lists_expected_tokens() {
        let errs = parse_module("func f {\n  a = exp(\n}\n", 0).unwrap_err();
        let label = errs[0].label.clone().unwrap_or_default();
        assert!(label.starts_with("expected one of"), "{label}");
    }
}
