//! Tokenizer and parser for RUN lines: a deliberately tiny subset of POSIX sh,
//! so the suite does not depend on a system shell.
//!
//! Supported: words with `'…'`, `"…"` and `\x` quoting; pipelines (`|`);
//! `&&` between pipelines; redirections `< F`, `> F`, `>> F`, `2> F`, `2>> F`,
//! `2>&1`; command prefixes `not` and `env VAR=VAL…`. No variable expansion,
//! globbing, `;`, `||` or subshells: those are rejected or taken literally.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    Word(String),
    Pipe,
    AndAnd,
    Redirect(Redirect),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redirect {
    Stdin,
    Stdout { append: bool },
    Stderr { append: bool },
    StderrToStdout,
}

impl fmt::Display for Redirect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Stdin => "<",
            Self::Stdout { append: false } => ">",
            Self::Stdout { append: true } => ">>",
            Self::Stderr { append: false } => "2>",
            Self::Stderr { append: true } => "2>>",
            Self::StderrToStdout => "2>&1",
        })
    }
}

/// Where a command's output goes, besides being captured for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileTarget {
    pub path: String,
    pub append: bool,
}

/// One command of a pipeline, with its prefixes and redirections resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Command {
    /// `not`: the command must fail (an odd number of `not`s).
    pub negate: bool,
    pub env: Vec<(String, String)>,
    pub argv: Vec<String>,
    pub stdin: Option<String>,
    pub stdout: Option<FileTarget>,
    pub stderr: Option<FileTarget>,
    /// `2>&1`: stderr follows stdout wherever it goes, whatever the order of
    /// the redirections on the line (a simplification of sh).
    pub merge_stderr: bool,
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut words = Vec::new();
        if self.negate {
            words.push("not".to_owned());
        }
        if !self.env.is_empty() {
            words.push("env".to_owned());
            words.extend(self.env.iter().map(|(k, v)| quote(&format!("{k}={v}"))));
        }
        words.extend(self.argv.iter().map(|w| quote(w)));
        if let Some(path) = &self.stdin {
            words.push(format!("< {}", quote(path)));
        }
        if let Some(t) = &self.stdout {
            words.push(format!(
                "{} {}",
                if t.append { ">>" } else { ">" },
                quote(&t.path)
            ));
        }
        if let Some(t) = &self.stderr {
            words.push(format!(
                "{} {}",
                if t.append { "2>>" } else { "2>" },
                quote(&t.path)
            ));
        }
        if self.merge_stderr {
            words.push("2>&1".to_owned());
        }
        f.write_str(&words.join(" "))
    }
}

/// Quotes a word for display only when it would not survive re-tokenizing.
fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=,:+%@".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

pub fn tokenize(line: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    // `in_word` tells an empty quoted word (`''`) from no word at all;
    // `quoted` keeps `"2">f` or `\2>f` from being read as a stderr redirect.
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = line.chars().peekable();

    let flush =
        |tokens: &mut Vec<Token>, word: &mut String, in_word: &mut bool, quoted: &mut bool| {
            if *in_word {
                tokens.push(Token::Word(std::mem::take(word)));
            }
            *in_word = false;
            *quoted = false;
        };

    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                quoted = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("unterminated single quote".to_owned()),
                    }
                }
            }
            '"' => {
                in_word = true;
                quoted = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        // As in sh, only these characters are escapable inside "…".
                        Some('\\') => {
                            match chars.next_if(|n| matches!(n, '"' | '\\' | '$' | '`')) {
                                Some(n) => word.push(n),
                                None => word.push('\\'),
                            }
                        }
                        Some(c) => word.push(c),
                        None => return Err("unterminated double quote".to_owned()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                quoted = true;
                match chars.next() {
                    Some(n) => word.push(n),
                    None => return Err("dangling backslash at end of RUN line".to_owned()),
                }
            }
            c if c.is_whitespace() => flush(&mut tokens, &mut word, &mut in_word, &mut quoted),
            '|' => {
                flush(&mut tokens, &mut word, &mut in_word, &mut quoted);
                if chars.next_if_eq(&'|').is_some() {
                    return Err("`||` is not supported".to_owned());
                }
                tokens.push(Token::Pipe);
            }
            '&' => {
                flush(&mut tokens, &mut word, &mut in_word, &mut quoted);
                if chars.next_if_eq(&'&').is_none() {
                    return Err("background jobs (`&`) are not supported".to_owned());
                }
                tokens.push(Token::AndAnd);
            }
            ';' => {
                return Err("`;` is not supported; use `&&` or another RUN line".to_owned());
            }
            '<' => {
                flush(&mut tokens, &mut word, &mut in_word, &mut quoted);
                tokens.push(Token::Redirect(Redirect::Stdin));
            }
            '>' => {
                // A file descriptor number only counts when it is the whole,
                // unquoted word right before `>`, as in sh.
                let fd = if in_word && !quoted && (word == "1" || word == "2") {
                    let fd = if word == "2" { 2 } else { 1 };
                    word.clear();
                    in_word = false;
                    fd
                } else {
                    flush(&mut tokens, &mut word, &mut in_word, &mut quoted);
                    1
                };
                let append = chars.next_if_eq(&'>').is_some();
                let redirect = if !append && chars.next_if_eq(&'&').is_some() {
                    match (fd, chars.next()) {
                        (2, Some('1')) => Redirect::StderrToStdout,
                        _ => return Err("only the `2>&1` form of `>&` is supported".to_owned()),
                    }
                } else if fd == 2 {
                    Redirect::Stderr { append }
                } else {
                    Redirect::Stdout { append }
                };
                tokens.push(Token::Redirect(redirect));
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    flush(&mut tokens, &mut word, &mut in_word, &mut quoted);
    Ok(tokens)
}

/// Parses tokens into `&&`-separated pipelines. `subst` is applied to every
/// word after quote removal, so substituted paths never get split or
/// re-interpreted as operators.
pub fn parse(
    tokens: Vec<Token>,
    subst: &dyn Fn(&str) -> Result<String, String>,
) -> Result<Vec<Vec<Command>>, String> {
    let mut pipelines = Vec::new();
    let mut pipeline = Vec::new();
    let mut words = Vec::new();
    let mut cmd = Command::default();
    let mut tokens = tokens.into_iter();

    while let Some(token) = tokens.next() {
        match token {
            Token::Word(w) => words.push(subst(&w)?),
            Token::Redirect(Redirect::StderrToStdout) => cmd.merge_stderr = true,
            Token::Redirect(op) => {
                let path = match tokens.next() {
                    Some(Token::Word(w)) => subst(&w)?,
                    _ => return Err(format!("missing file name after `{op}`")),
                };
                match op {
                    Redirect::Stdin => cmd.stdin = Some(path),
                    Redirect::Stdout { append } => cmd.stdout = Some(FileTarget { path, append }),
                    Redirect::Stderr { append } => cmd.stderr = Some(FileTarget { path, append }),
                    Redirect::StderrToStdout => {}
                }
            }
            Token::Pipe => pipeline.push(finish(std::mem::take(&mut cmd), &mut words)?),
            Token::AndAnd => {
                pipeline.push(finish(std::mem::take(&mut cmd), &mut words)?);
                pipelines.push(std::mem::take(&mut pipeline));
            }
        }
    }
    pipeline.push(finish(cmd, &mut words)?);
    pipelines.push(pipeline);
    Ok(pipelines)
}

/// Peels the `not` / `env VAR=VAL` prefixes off a command's words.
fn finish(mut cmd: Command, words: &mut Vec<String>) -> Result<Command, String> {
    let mut words = std::mem::take(words).into_iter().peekable();
    loop {
        match words.peek().map(String::as_str) {
            Some("not") => {
                cmd.negate = !cmd.negate;
                words.next();
            }
            Some("env") => {
                words.next();
                while let Some(assignment) = words.next_if(|w| is_assignment(w)) {
                    if let Some((k, v)) = assignment.split_once('=') {
                        cmd.env.push((k.to_owned(), v.to_owned()));
                    }
                }
            }
            _ => break,
        }
    }
    cmd.argv = words.collect();
    if cmd.argv.is_empty() {
        return Err("empty command".to_owned());
    }
    Ok(cmd)
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}
