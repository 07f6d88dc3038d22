//! The `.ef` lexer: `logos` tokens plus a thin wrapper that lalrpop uses as its external lexer.
//!
//! The wrapper does three things logos cannot do alone:
//! - newlines end statements, but only outside brackets, and runs of them collapse to one;
//! - the text of a shape (`QxK`, `4096x128`, `|p|xQx(K/p)`) is scanned as one token right after
//!   `tensor<`, `reshape[` or `broadcast[`, because `x` separates dimensions there;
//! - bracket nesting is bounded, so no input can overflow the parser's or printer's stack.

use crate::ir::{Dim, DimBase};
use logos::Logos;

/// A token as logos scans it (`Shape` comes from the wrapper); the grammar declares these
/// as its terminals (`extern` in `grammar.lalrpop`).
#[derive(Logos, Clone, Debug, PartialEq)]
#[logos(skip r"[ \t\r\f]+")]
#[logos(skip(r"//[^\n]*", allow_greedy = true))]
pub enum Tok {
    #[token("\n")]
    Newline,
    #[token("func")]
    KwFunc,
    #[token("where")]
    KwWhere,
    #[token("reducer")]
    KwReducer,
    #[token("return")]
    KwReturn,
    #[token("input")]
    KwInput,
    #[token("constant")]
    KwConstant,
    #[token("reduce")]
    KwReduce,
    #[token("tensor")]
    KwTensor,
    #[regex(r"[a-zA-Z_][a-zA-Z0-9_]*(\.[a-zA-Z0-9_]+)*", |lex| lex.slice().to_string())]
    Ident(String),
    #[regex(r"@[a-zA-Z_][a-zA-Z0-9_.]*", |lex| lex.slice()[1..].to_string())]
    ReducerName(String),
    #[regex(r"%[0-9]+", |lex| lex.slice()[1..].to_string())]
    ClassRef(String),
    #[regex(r"[0-9]+", |lex| lex.slice().to_string())]
    Int(String),
    #[regex(r"[0-9]+\.[0-9]*([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+", |lex| lex.slice().to_string())]
    Float(String),
    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
    #[token("<")]
    Lt,
    #[token(">")]
    Gt,
    #[token(",")]
    Comma,
    #[token(":")]
    Colon,
    #[token("=")]
    Eq,
    #[token("+")]
    Plus,
    #[token("-")]
    Minus,
    #[token("*")]
    Star,
    #[token("/")]
    Slash,
    #[token("|")]
    Pipe,
    /// Produced by the lexer wrapper, never by logos directly.
    Shape(Vec<Dim>),
}

/// Bracket nesting deeper than this is rejected before parsing.
pub const MAX_NESTING: usize = 128;

#[derive(Clone, Debug, PartialEq)]
pub struct LexError {
    pub start: usize,
    pub end: usize,
    pub message: String,
    pub help: Option<String>,
}

impl LexError {
    fn new(start: usize, end: usize, message: impl Into<String>) -> LexError {
        LexError {
            start,
            end,
            message: message.into(),
            help: None,
        }
    }
}

pub type Spanned = (usize, Tok, usize);

pub struct Lexer<'a> {
    inner: logos::Lexer<'a, Tok>,
    depth: usize,
    last: Option<Tok>,
    before_last: Option<Tok>,
    failed: bool,
}

impl<'a> Lexer<'a> {
    pub fn new(text: &'a str) -> Lexer<'a> {
        Lexer {
            inner: Tok::lexer(text),
            depth: 0,
            last: None,
            before_last: None,
            failed: false,
        }
    }

    /// Whether the next token is a shape: right after `tensor<`, `reshape[` or `broadcast[`.
    fn shape_expected(&self) -> Option<char> {
        match (&self.before_last, &self.last) {
            (Some(Tok::KwTensor), Some(Tok::Lt)) => Some('>'),
            (Some(Tok::Ident(op)), Some(Tok::LBracket)) if op == "reshape" || op == "broadcast" => {
                Some(']')
            }
            _ => None,
        }
    }

    fn scan_shape(&mut self, close: char) -> Option<Result<Spanned, LexError>> {
        let rest = self.inner.remainder();
        let base = self.inner.span().end;
        let lead = rest.len() - rest.trim_start_matches([' ', '\t']).len();
        let seg_len = shape_segment_len(&rest[lead..], close);
        let seg = rest[lead..lead + seg_len].trim_end();
        if seg.is_empty() || crate::ir::DType::parse(seg).is_some() {
            return None; // rank-0 tensor (`tensor<f32>`) or an empty reshape target
        }
        let start = base + lead;
        let end = start + seg.len();
        self.inner.bump(lead + seg.len());
        Some(match parse_shape(seg, start) {
            Ok(dims) => Ok((start, Tok::Shape(dims), end)),
            Err(e) => Err(e),
        })
    }
}

/// Length of a shape segment: up to the first `,`, newline or closing bracket that is not
/// inside `|…|` or `(…)`.
fn shape_segment_len(s: &str, close: char) -> usize {
    let mut in_extent = false;
    let mut parens = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '|' if parens == 0 => {
                // A `|` that does not open an extent ends the shape (the dtype's state bar).
                if in_extent {
                    in_extent = false;
                } else if s[i + 1..].starts_with(|ch: char| ch.is_ascii_lowercase())
                    && i_is_dim_start(s, i)
                {
                    in_extent = true;
                } else {
                    return i;
                }
            }
            '(' if !in_extent => parens += 1,
            ')' if !in_extent => {
                if parens == 0 {
                    return i;
                }
                parens -= 1;
            }
            ',' | '\n' if !in_extent && parens == 0 => return i,
            c2 if c2 == close && !in_extent && parens == 0 => return i,
            _ => {}
        }
    }
    s.len()
}

/// A `|` opens an axis extent only where a dimension may start: at the beginning or after `x`.
fn i_is_dim_start(s: &str, i: usize) -> bool {
    let before = s[..i].trim_end();
    before.is_empty() || before.ends_with('x') || before.ends_with('(')
}

/// Parses `QxK`, `4096x128`, `|p|xM`, `Qx(K/p)` into dimensions. `offset` is the segment's
/// position in the file, for error spans.
pub fn parse_shape(seg: &str, offset: usize) -> Result<Vec<Dim>, LexError> {
    let bytes = seg.as_bytes();
    let mut i = 0;
    let mut dims = Vec::new();
    let err = |at: usize, msg: &str| {
        let mut e = LexError::new(
            offset + at,
            offset + (at + 1).min(seg.len().max(at + 1)),
            msg.to_string(),
        );
        e.help = Some(
            "a shape is dimensions separated by `x`: `QxK`, `4096x128`, `|p|xM` or `Qx(K/p)`"
                .into(),
        );
        e
    };
    let skip_ws = |i: &mut usize| {
        while *i < bytes.len() && (bytes[*i] == b' ' || bytes[*i] == b'\t') {
            *i += 1;
        }
    };
    let axis = |i: &mut usize| -> Option<String> {
        let s = *i;
        if *i < bytes.len() && bytes[*i].is_ascii_lowercase() {
            while *i < bytes.len()
                && (bytes[*i].is_ascii_lowercase()
                    || bytes[*i].is_ascii_digit()
                    || bytes[*i] == b'_')
            {
                *i += 1;
            }
            Some(seg[s..*i].to_string())
        } else {
            None
        }
    };
    loop {
        skip_ws(&mut i);
        let parenthesized = i < bytes.len() && bytes[i] == b'(';
        if parenthesized {
            i += 1;
            skip_ws(&mut i);
        }
        let start = i;
        let base = if i < bytes.len() && bytes[i].is_ascii_uppercase() {
            while i < bytes.len()
                && (bytes[i].is_ascii_uppercase() || bytes[i].is_ascii_digit() || bytes[i] == b'_')
            {
                i += 1;
            }
            DimBase::Sym(seg[start..i].into())
        } else if i < bytes.len() && bytes[i].is_ascii_digit() {
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            match seg[start..i].parse::<u64>() {
                Ok(0) => return Err(err(start, "a dimension of size 0 is not supported")),
                Ok(n) => DimBase::Lit(n),
                Err(_) => return Err(err(start, "dimension literal is too large")),
            }
        } else if i < bytes.len() && bytes[i] == b'|' {
            i += 1;
            let Some(a) = axis(&mut i) else {
                return Err(err(i, "expected a parallel axis name after `|`"));
            };
            if i >= bytes.len() || bytes[i] != b'|' {
                return Err(err(i, "expected `|` closing the axis extent"));
            }
            i += 1;
            DimBase::Extent(a.into())
        } else {
            return Err(err(
                i,
                "expected a dimension (an upper-case symbol, an integer or `|axis|`)",
            ));
        };
        let mut splits = Vec::new();
        if parenthesized {
            loop {
                skip_ws(&mut i);
                if i < bytes.len() && bytes[i] == b'/' {
                    i += 1;
                    skip_ws(&mut i);
                    match axis(&mut i) {
                        Some(a) => splits.push(a),
                        None => return Err(err(i, "expected a parallel axis name after `/`")),
                    }
                } else {
                    break;
                }
            }
            if i >= bytes.len() || bytes[i] != b')' {
                return Err(err(
                    i,
                    "expected `/axis` or `)` in a tile dimension like `(K/p)`",
                ));
            }
            i += 1;
        }
        dims.push(Dim {
            base,
            splits: splits.into_iter().map(crate::ir::Sym::from).collect(),
        });
        skip_ws(&mut i);
        if i >= bytes.len() {
            return Ok(dims);
        }
        if bytes[i] != b'x' {
            return Err(err(i, "expected `x` between dimensions"));
        }
        i += 1;
    }
}

impl Iterator for Lexer<'_> {
    type Item = Result<Spanned, LexError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        loop {
            if let Some(close) = self.shape_expected() {
                if let Some(res) = self.scan_shape(close) {
                    self.before_last = self.last.take();
                    self.last = Some(Tok::Comma); // any non-trigger token
                    if res.is_err() {
                        self.failed = true;
                    }
                    return Some(res);
                }
            }
            let tok = self.inner.next()?;
            let span = self.inner.span();
            let tok = match tok {
                Ok(t) => t,
                Err(()) => {
                    self.failed = true;
                    let slice = self.inner.slice();
                    let c = slice.chars().next().unwrap_or(' ');
                    let mut e = if c == '\0' {
                        LexError::new(span.start, span.end, "NUL byte in source")
                    } else {
                        LexError::new(span.start, span.end, format!("unexpected character {c:?}"))
                    };
                    e.help = Some(match c {
                        '#' | ';' => "comments start with `//`".to_string(),
                        '"' | '\'' => "the language has no string literals".to_string(),
                        _ => "identifiers are ASCII letters, digits and `_`".to_string(),
                    });
                    return Some(Err(e));
                }
            };
            match tok {
                // Newlines separate statements only at bracket depth zero, once.
                Tok::Newline
                    if self.depth > 0 || matches!(self.last, None | Some(Tok::Newline)) =>
                {
                    continue
                }
                Tok::LParen | Tok::LBracket | Tok::Lt => {
                    self.depth += 1;
                    if self.depth > MAX_NESTING {
                        self.failed = true;
                        let mut e = LexError::new(
                            span.start,
                            span.end,
                            format!("brackets nest deeper than {MAX_NESTING} levels"),
                        );
                        e.help = Some(
                            "name intermediate values with statements instead of nesting".into(),
                        );
                        return Some(Err(e));
                    }
                }
                Tok::RParen | Tok::RBracket | Tok::Gt => self.depth = self.depth.saturating_sub(1),
                Tok::Int(ref s) if s.parse::<u64>().is_err() => {
                    self.failed = true;
                    let mut e = LexError::new(span.start, span.end, "integer literal is too large");
                    e.help = Some("integers must fit in 64 bits".into());
                    return Some(Err(e));
                }
                Tok::Float(ref s) if !s.parse::<f64>().is_ok_and(f64::is_finite) => {
                    self.failed = true;
                    let mut e = LexError::new(
                        span.start,
                        span.end,
                        "floating-point literal is out of range",
                    );
                    e.help = Some("write `inf` or `-inf` for infinities".into());
                    return Some(Err(e));
                }
                _ => {}
            }
            self.before_last = self.last.take();
            self.last = Some(tok.clone());
            return Some(Ok((span.start, tok, span.end)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        Lexer::new(s)
            .map(|r| r.map(|(_, t, _)| t).unwrap_or(Tok::Comma))
            .collect()
    }

    #[test]
    fn shapes_lex_as_one_token() {
        let t = toks("tensor<QxK, f32>");
        assert_eq!(t[2], Tok::Shape(vec![Dim::sym("Q"), Dim::sym("K")]));
        let t = toks("tensor<4096x128,bf16>");
        assert_eq!(t[2], Tok::Shape(vec![Dim::lit(4096), Dim::lit(128)]));
        let t = toks("tensor<|p|xQx(K/p), f32 | partial(q)>");
        assert_eq!(
            t[2],
            Tok::Shape(vec![
                Dim::extent("p"),
                Dim::sym("Q"),
                Dim::sym("K").split_by("p")
            ])
        );
        let t = toks("tensor<f32>");
        assert_eq!(t[2], Tok::Ident("f32".into()));
    }

    #[test]
    fn newlines_collapse_and_vanish_in_brackets() {
        let t = toks("\n\na(\n b\n)\n\n\nc");
        assert_eq!(t.iter().filter(|t| **t == Tok::Newline).count(), 1);
    }

    #[test]
    fn deep_nesting_is_an_error() {
        let src = "(".repeat(MAX_NESTING + 1);
        assert!(Lexer::new(&src).any(|r| r.is_err()));
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(parse_shape("Qx", 0).is_err());
        assert!(parse_shape("(K/)", 0).is_err());
        assert!(parse_shape("99999999999999999999999", 0).is_err());
    }
}
