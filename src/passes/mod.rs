//! Named passes over a module, MLIR-style: each pass has a name, a one-line summary and typed
//! options (`check{against=m0.ef tol=0.01}`), and reports counters for `--stats=json`.

pub mod check;
pub mod contains;
pub mod extract;
pub mod lower;
pub mod net;
pub mod saturate;

use crate::diag::{Diagnostic, SourceMap};
use crate::ir::Module;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Everything a pass may use besides the module it transforms.
pub struct PassContext<'a> {
    pub sources: &'a mut SourceMap,
    /// The verified module the pipeline started from (what `check` compares against).
    pub original: &'a Module,
    /// Seed for random inputs (`--seed`).
    pub seed: u64,
    /// Directory of the input file, for resolving relative paths in options.
    pub base_dir: PathBuf,
    /// Report lines for standard output; each must be a `//` comment so output stays parseable.
    pub report: Vec<String>,
    /// Warnings and remarks (errors are returned instead).
    pub diagnostics: Vec<Diagnostic>,
    /// Counters for `--stats=json`.
    pub counters: BTreeMap<String, serde_json::Value>,
    /// Code a backend pass emitted: the pipeline's output instead of the IR.
    pub emitted: Option<String>,
    /// Whether passes that run longer than a second write a progress line to stderr
    /// (`--progress`; by default when stderr is a terminal).
    pub progress: bool,
}

pub trait Pass {
    fn name(&self) -> &'static str;
    /// Runs the pass; an error return carries at least one error diagnostic.
    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>>;
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptionKind {
    Float,
    Int,
    /// An integer of at least 1.
    Count,
    /// Comma-separated powers of two (Triton block sizes).
    PowersOfTwo,
    Path,
    Bool,
    /// Comma-separated `name:value` pairs.
    Extents,
    Choice(&'static [&'static str]),
    /// Comma-separated subset of the given words.
    List(&'static [&'static str]),
}

#[derive(Clone, Copy, Debug)]
pub struct OptionInfo {
    pub name: &'static str,
    pub kind: OptionKind,
    pub default: &'static str,
    pub help: &'static str,
}

/// Parsed, type-checked pass options (raw strings; accessors convert).
#[derive(Clone, Debug, Default)]
pub struct PassOptions {
    pub values: BTreeMap<String, String>,
    /// Where each option was written (`name=value` in the `<pipeline>` source).
    pub spans: BTreeMap<String, crate::diag::Span>,
}

/// Where a file an option names is read from: the path as written when it exists (or is
/// absolute), else beside the input file.
pub fn option_input_path(path: &str, base_dir: &std::path::Path) -> std::path::PathBuf {
    let written = std::path::Path::new(path);
    if written.is_absolute() || written.exists() {
        written.to_path_buf()
    } else {
        base_dir.join(written)
    }
}

/// The help of an error about a file `option_input_path` could not read.
pub const OPTION_PATH_HELP: &str =
    "a relative path is looked up in the working directory, then beside the input file";

/// An error about a value an option named (a file that cannot be read or written): it points
/// at the option in the pipeline when the option was written there.
pub fn option_error(span: Option<crate::diag::Span>, message: String, help: &str) -> Diagnostic {
    match span {
        Some(s) => Diagnostic::error(s, message),
        None => Diagnostic::global(crate::diag::Severity::Error, message),
    }
    .with_help(help.to_string())
}

impl PassOptions {
    pub fn span(&self, name: &str) -> Option<crate::diag::Span> {
        self.spans.get(name).copied()
    }

    pub fn get<'a>(&'a self, info: &'a PassInfo, name: &str) -> &'a str {
        self.values
            .get(name)
            .map(|s| s.as_str())
            .or_else(|| {
                info.options
                    .iter()
                    .find(|o| o.name == name)
                    .map(|o| o.default)
            })
            .unwrap_or("")
    }
}

pub struct PassInfo {
    pub name: &'static str,
    /// The pass emits code (`PassContext::emitted`) that becomes the pipeline's output in
    /// place of the IR; report lines are then written as `#` comments.
    pub emits_code: bool,
    pub summary: &'static str,
    pub options: &'static [OptionInfo],
    pub create: fn(&PassInfo, &PassOptions) -> Box<dyn Pass>,
}

/// A `time-limit` option's value as a duration: one too long to represent means no limit.
pub fn seconds(value: f64) -> std::time::Duration {
    std::time::Duration::try_from_secs_f64(value.max(0.0)).unwrap_or(std::time::Duration::MAX)
}

/// Validates one option value against its declared kind.
pub fn check_option(kind: OptionKind, value: &str) -> Result<(), String> {
    match kind {
        OptionKind::Float => value
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map(|_| ())
            .ok_or_else(|| format!("expected a non-negative number, found `{value}`")),
        OptionKind::Int => value
            .parse::<u64>()
            .map(|_| ())
            .map_err(|_| format!("expected an integer, found `{value}`")),
        OptionKind::Count => value
            .parse::<u64>()
            .ok()
            .filter(|n| *n >= 1)
            .map(|_| ())
            .ok_or_else(|| format!("expected a positive integer, found `{value}`")),
        OptionKind::PowersOfTwo => match value
            .split(',')
            .find(|w| !w.parse::<u64>().is_ok_and(|n| n.is_power_of_two()))
        {
            Some(bad) => Err(format!(
                "expected comma-separated powers of two, found `{bad}`"
            )),
            None => Ok(()),
        },
        OptionKind::Path => {
            if value.is_empty() {
                Err("expected a file path".into())
            } else {
                Ok(())
            }
        }
        OptionKind::Bool => match value {
            "true" | "false" => Ok(()),
            _ => Err(format!("expected `true` or `false`, found `{value}`")),
        },
        OptionKind::Extents => parse_extents(value).map(|_| ()),
        OptionKind::List(words) => match value.split(',').find(|w| !words.contains(w)) {
            Some(bad) => Err(format!("`{bad}` is not one of {}", words.join(", "))),
            None => Ok(()),
        },
        OptionKind::Choice(choices) => {
            if choices.contains(&value) {
                Ok(())
            } else {
                Err(format!(
                    "expected one of {}, found `{value}`",
                    choices.join(", ")
                ))
            }
        }
    }
}

/// `p:4,m:2` → [("p", 4), ("m", 2)].
pub fn parse_extents(value: &str) -> Result<Vec<(String, u64)>, String> {
    value
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let (a, e) = pair
                .split_once(':')
                .ok_or_else(|| format!("expected `axis:extent`, found `{pair}`"))?;
            let e: u64 = e
                .parse()
                .map_err(|_| format!("extent `{e}` is not an integer"))?;
            if e == 0 || !crate::ir::is_axis_name(a) && !crate::ir::is_dim_symbol(a) {
                return Err(format!("bad size binding `{pair}`"));
            }
            Ok((a.to_string(), e))
        })
        .collect()
}

pub fn registry() -> Vec<PassInfo> {
    vec![
        PassInfo {
            name: "verify",
            emits_code: false,
            summary: "Infer and check types, shapes, dtypes and parallel state",
            options: &[],
            create: |_, _| Box::new(VerifyPass),
        },
        check::interpret_info(),
        check::check_info(),
        saturate::saturate_info(),
        extract::extract_info(),
        contains::info(),
        lower::lower_info(),
        lower::triton_check_info(),
    ]
}

struct VerifyPass;

impl Pass for VerifyPass {
    fn name(&self) -> &'static str {
        "verify"
    }

    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>> {
        crate::verify::verify_module(module)?;
        let nodes: usize = module.funcs.iter().map(|f| f.body.nodes.len()).sum();
        cx.counters
            .insert("functions".into(), module.funcs.len().into());
        cx.counters.insert("nodes".into(), nodes.into());
        Ok(())
    }
}
