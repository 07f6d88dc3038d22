//! Named passes over a module, MLIR-style: each pass has a name, a one-line summary and typed
//! options (`check{against=m0.ef tol=0.01}`), and reports counters for `--stats=json`.
//!
//! One file per pass, named after it: [`verify`], [`interpret`], [`check`], [`saturate`],
//! [`extract`], [`expect_contains`], [`rank`], [`lower`], [`triton_check`]. Besides them:
//! [`options`] (typed options: the `PassOptions` trait, option kinds and values),
//! [`pipeline`] (pipeline text: parser and printer), [`manager`] (the pass manager that runs a
//! pipeline on a module: verification between passes, timing, IR dumps, statistics) and
//! [`net`] (not a pass: the check `extract` runs on every candidate it outputs).

pub mod check;
pub mod expect_contains;
pub mod extract;
pub mod interpret;
pub mod lower;
pub mod manager;
pub mod net;
pub mod options;
pub mod partition;
pub mod pipeline;
pub mod rank;
pub mod saturate;
pub mod triton_check;
pub mod tune;
pub mod verify;

use crate::diag::{Diagnostic, SourceMap};
use crate::ir::Module;
use options::{OptionInfo, OptionSpans, PassOptions};
use pipeline::PassSpec;
use std::collections::BTreeMap;
use std::path::PathBuf;

pub use manager::{PassManager, PipelineConfig, PipelineResult};
pub use pipeline::{parse_pipeline, print_pipeline};

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
    /// The subgraph functions `saturate` partitioned large functions into, by name, for the
    /// passes after it (`extract` searches a subgraph partitioned again when its own search
    /// ranks nothing). Empty when the e-graphs came from a dump.
    pub parts: &'a mut std::collections::BTreeMap<String, crate::ir::Function>,
}

pub trait Pass {
    fn name(&self) -> &'static str;
    /// Runs the pass; an error return carries at least one error diagnostic.
    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>>;
}

/// A pass the registry creates from pipeline text: its name, summary and options struct.
pub trait NamedPass: Pass + Sized + 'static {
    const NAME: &'static str;
    /// The pass emits code (`PassContext::emitted`) that becomes the pipeline's output in
    /// place of the IR; report lines are then written as `#` comments.
    const EMITS_CODE: bool = false;
    type Options: PassOptions;

    /// The one-line summary `--list-passes` shows.
    fn summary() -> String;

    /// The pass with these options; `spans` says where they were written, if anywhere.
    fn with_options(options: Self::Options, spans: OptionSpans) -> Self;
}

/// A registered pass, type-erased: what the pipeline parser, the pass manager and
/// `--list-passes` need.
pub struct PassInfo {
    pub name: &'static str,
    pub emits_code: bool,
    pub summary: String,
    pub options: &'static [OptionInfo],
    /// Each option's default as `--list-passes` writes it ("" for none), read from the
    /// options struct's `Default`.
    pub defaults: fn() -> Vec<String>,
    /// The pass with a spec's options, each checked against its kind (every bad one reported).
    pub create: CreatePass,
}

/// Creates a pass from a spec, or says what is wrong with its options.
pub type CreatePass = fn(&PassSpec) -> Result<Box<dyn Pass>, Vec<Diagnostic>>;

impl PassInfo {
    pub fn of<P: NamedPass>() -> PassInfo {
        PassInfo {
            name: P::NAME,
            emits_code: P::EMITS_CODE,
            summary: P::summary(),
            options: P::Options::OPTIONS,
            defaults: options::defaults::<P::Options>,
            create: create::<P>,
        }
    }
}

fn create<P: NamedPass>(spec: &PassSpec) -> Result<Box<dyn Pass>, Vec<Diagnostic>> {
    let (options, spans) = options::configure::<P::Options>(spec)?;
    Ok(Box::new(P::with_options(options, spans)))
}

/// Every pass, in the order `--list-passes` shows them.
pub fn registry() -> Vec<PassInfo> {
    vec![
        PassInfo::of::<verify::VerifyPass>(),
        PassInfo::of::<interpret::InterpretPass>(),
        PassInfo::of::<check::CheckPass>(),
        PassInfo::of::<partition::PartitionPass>(),
        PassInfo::of::<saturate::SaturatePass>(),
        PassInfo::of::<extract::ExtractPass>(),
        PassInfo::of::<expect_contains::ContainsPass>(),
        PassInfo::of::<rank::RankPass>(),
        PassInfo::of::<tune::TunePass>(),
        PassInfo::of::<lower::LowerPass>(),
        PassInfo::of::<triton_check::TritonCheckPass>(),
    ]
}

/// The text of `efopt --list-passes`: every pass with its summary, and its options with their
/// help and default.
pub fn list_passes() -> String {
    let mut s = String::from("Available passes:\n");
    for p in registry() {
        s.push_str(&format!("  {:<12} {}\n", p.name, p.summary));
        for (o, default) in p.options.iter().zip((p.defaults)()) {
            let help = o.help_with(&default);
            let default = if default.is_empty() {
                String::new()
            } else {
                format!(" (default {default})")
            };
            s.push_str(&format!("      {:<12} {help}{default}\n", o.name));
        }
    }
    s
}
