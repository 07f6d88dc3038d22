//! Parsing of `--passes=a,b{opt=val opt2=val}`. Errors are diagnostics that point into the
//! pipeline string (registered as the `<pipeline>` source).

use crate::diag::{Diagnostic, Span};
use crate::passes::{check_option, registry, PassOptions};

#[derive(Clone, Debug)]
pub struct PassSpec {
    pub name: String,
    pub options: PassOptions,
}

pub fn parse_pipeline(text: &str, source: u32) -> Result<Vec<PassSpec>, Vec<Diagnostic>> {
    let span = |a: usize, b: usize| Span::new(source, a, b);
    let mut specs = Vec::new();
    let mut errors = Vec::new();
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
            errors.push(
                Diagnostic::error(span(i, i + width), "expected a pass name")
                    .with_help("a pipeline is `pass1,pass2{option=value}`"),
            );
            break;
        }
        let mut options = Vec::new();
        if i < bytes.len() && bytes[i] == b'{' {
            let open = i;
            let Some(close) = text[i..].find('}').map(|c| c + i) else {
                errors.push(
                    Diagnostic::error(span(open, open + 1), "unclosed `{` in pass options")
                        .with_help("close the options with `}`"),
                );
                break;
            };
            let mut j = open + 1;
            for word in text[open + 1..close].split(' ') {
                let ws = j;
                j += word.len() + 1;
                if word.is_empty() {
                    continue;
                }
                match word.split_once('=') {
                    Some((k, v)) => {
                        options.push((k.to_string(), v.to_string(), span(ws, ws + word.len())))
                    }
                    None => options.push((
                        word.to_string(),
                        "true".to_string(),
                        span(ws, ws + word.len()),
                    )),
                }
            }
            i = close + 1;
        }
        if let Some(c) = text[i..].chars().next().filter(|c| *c != ',') {
            errors.push(
                Diagnostic::error(
                    span(i, i + c.len_utf8()),
                    format!("unexpected `{c}` in the pipeline"),
                )
                .with_help("separate passes with `,` and put options in `{…}` separated by spaces"),
            );
            break;
        }
        let reg = registry();
        let Some(info) = reg.iter().find(|p| p.name == name) else {
            let names: Vec<&str> = reg.iter().map(|p| p.name).collect();
            errors.push(
                Diagnostic::error(
                    span(start, start + name.len()),
                    format!("unknown pass `{name}`"),
                )
                .with_help(format!(
                    "available passes: {} (see --list-passes)",
                    names.join(", ")
                )),
            );
            continue;
        };
        let mut parsed = PassOptions::default();
        for (k, v, s) in options {
            let Some(opt) = info.options.iter().find(|o| o.name == k) else {
                let known: Vec<&str> = info.options.iter().map(|o| o.name).collect();
                errors.push(
                    Diagnostic::error(s, format!("pass `{name}` has no option `{k}`")).with_help(
                        if known.is_empty() {
                            format!("`{name}` takes no options")
                        } else {
                            format!("its options are: {}", known.join(", "))
                        },
                    ),
                );
                continue;
            };
            if let Err(e) = check_option(opt.kind, &v) {
                errors.push(
                    Diagnostic::error(s, format!("bad value for `{name}{{{k}}}`: {e}"))
                        .with_help(opt.help.to_string()),
                );
                continue;
            }
            parsed.spans.insert(k.clone(), s);
            parsed.values.insert(k, v);
        }
        specs.push(PassSpec {
            name: name.to_string(),
            options: parsed,
        });
    }
    if errors.is_empty() {
        Ok(specs)
    } else {
        Err(errors)
    }
}
