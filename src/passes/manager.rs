//! The pass manager: runs a pipeline of passes over a module, MLIR-style. It verifies the
//! module on load (every pass may assume a verified module) and, under `verify_each`, after
//! every pass; times each pass; dumps the IR before or after the passes asked for; and
//! collects each pass's report lines, diagnostics and `--stats=json` counters.
//!
//! The `efopt` driver is one client (it adds files, `--split-input-file`, `--set` and
//! printing); tests and benches are others:
//!
//! ```no_run
//! use efopt::diag::SourceMap;
//! use efopt::passes::{PassManager, PipelineConfig};
//! let mut sources = SourceMap::default();
//! let text = std::fs::read_to_string("examples/matmul_exp.ef").unwrap();
//! let id = sources.add("matmul_exp.ef", text.clone());
//! let module = efopt::parse::parse_module(&text, id).unwrap();
//! let mut pm = PassManager::parse("saturate,extract{max-candidates=10}", &mut sources).unwrap();
//! let result = pm.run(module, &mut sources);
//! assert!(!result.failed);
//! ```

use super::pipeline::{parse_pipeline, PassSpec};
use super::rank::RankOptions;
use super::{registry, NamedPass, Pass, PassContext};
use crate::diag::{Diagnostic, Severity, SourceMap};
use crate::ir::print::{print_module, PrintOptions};
use crate::ir::Module;
use std::path::PathBuf;
use std::time::Instant;

/// How a pipeline runs: what the driver's debugging options set.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// Verify after every pass (`--verify-each`). By default in debug builds.
    pub verify_each: bool,
    /// Seed of random inputs (`--seed`).
    pub seed: u64,
    /// A progress line on stderr for passes that run longer than a second (`--progress`).
    pub progress: bool,
    /// Directory relative paths in options are looked up in after the working directory
    /// (the input file's).
    pub base_dir: PathBuf,
    /// IR dumps (`--print-ir-*`).
    pub print_ir: IrPrinting,
}

impl Default for PipelineConfig {
    fn default() -> PipelineConfig {
        PipelineConfig {
            verify_each: cfg!(debug_assertions),
            seed: 0,
            progress: false,
            base_dir: PathBuf::from("."),
            print_ir: IrPrinting::default(),
        }
    }
}

/// Which IR dumps a run makes, given to [`Observer::dump`].
#[derive(Clone, Debug, Default)]
pub struct IrPrinting {
    /// Before each run of these passes (`--print-ir-before=NAME`).
    pub before: Vec<String>,
    /// After each run of these passes (`--print-ir-after=NAME`).
    pub after: Vec<String>,
    /// After every pass (`--print-ir-after-all`).
    pub after_all: bool,
    /// Dumps show every statement's type (`--print-types`).
    pub types: bool,
}

/// Sees a run as it goes: the driver writes dumps to stderr and report lines to stdout as
/// they come, so that they interleave with what passes print themselves.
pub trait Observer {
    /// An IR dump, delimited by `// -----// IR Dump … //----- //` so it parses as a module.
    fn dump(&mut self, _text: &str) {}

    /// The report lines of a pass that just ran, as the output writes them (`#` comments
    /// when the pipeline emits code).
    fn report(&mut self, _lines: &[String]) {}
}

/// An observer that ignores everything (the result still holds the report).
pub struct Quiet;

impl Observer for Quiet {}

/// What a run leaves to print.
#[derive(Debug)]
pub enum PipelineOutput {
    /// Nothing: the run failed.
    None,
    Module(Module),
    /// Code a backend pass emitted, which replaces the IR.
    Code(String),
}

/// Where a failed run stopped.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    /// The module did not verify on load: no pass ran.
    OnLoad,
    /// This pass returned errors.
    Pass(String),
    /// The IR this pass produced does not verify (`verify_each`): a bug in the pass.
    VerifyAfter(String),
}

/// One pass's run: its wall time and counters (`--stats=json`).
#[derive(Debug)]
pub struct PassRecord {
    pub pass: String,
    pub wall_ms: f64,
    pub counters: serde_json::Map<String, serde_json::Value>,
}

/// What a run produced.
#[derive(Debug)]
pub struct PipelineResult {
    pub output: PipelineOutput,
    /// Every pass's report lines, in order, as the output writes them.
    pub report: Vec<String>,
    /// Warnings and remarks of the passes that ran, and the errors that stopped the run.
    pub diagnostics: Vec<Diagnostic>,
    /// Any error: a failure, or an error diagnostic a pass added without failing.
    pub failed: bool,
    pub failure: Option<Failure>,
    /// (what, milliseconds): `verify (on load)`, then each pass that ran.
    pub timing: Vec<(String, f64)>,
    /// Each pass that ran, in order.
    pub passes: Vec<PassRecord>,
}

impl PipelineResult {
    /// The module, where the run left one to print.
    pub fn module(&self) -> Option<&Module> {
        match &self.output {
            PipelineOutput::Module(m) => Some(m),
            _ => None,
        }
    }

    /// The counters of the `index`th pass that ran.
    pub fn counters(&self, index: usize) -> Option<&serde_json::Map<String, serde_json::Value>> {
        self.passes.get(index).map(|p| &p.counters)
    }
}

struct Scheduled {
    name: String,
    pass: Box<dyn Pass>,
    emits_code: bool,
}

/// A pipeline of passes, built once and run on any number of modules.
pub struct PassManager {
    passes: Vec<Scheduled>,
    pub config: PipelineConfig,
}

/// `extract` followed by `rank` extracts only what `rank` keeps: an `extract` without `top` (and
/// with the default early compaction) takes the `top` and `device` of the next `rank` before
/// another `extract`, so `saturate,extract,rank{top=10}` finds the best ten without
/// enumerating every class (`rank{top=0}` keeps all, so extraction enumerates all).
fn rank_bounded(specs: &[PassSpec]) -> Vec<PassSpec> {
    let mut out = specs.to_vec();
    let set = |s: &PassSpec, k: &str| s.options.iter().any(|o| o.name == k);
    for i in 0..out.len() {
        if out[i].name != "extract"
            || set(&out[i], "top")
            || out[i]
                .options
                .iter()
                .any(|o| o.name == "compaction" && o.value != "early")
        {
            continue;
        }
        let Some(rank) = specs[i + 1..]
            .iter()
            .take_while(|s| s.name != "extract")
            .find(|s| s.name == "rank")
        else {
            continue;
        };
        let value = |k: &str| {
            rank.options
                .iter()
                .rev()
                .find(|o| o.name == k)
                .map(|o| o.value.clone())
        };
        let top = value("top").unwrap_or_else(|| RankOptions::default().top.to_string());
        out[i] = out[i].clone().with("top", top);
        if let Some(d) = value("device").filter(|_| !set(&specs[i], "device")) {
            out[i] = out[i].clone().with("device", d);
        }
    }
    out
}

/// `extract`'s partitioned fallback saturates the parts with every rule family: after a
/// `saturate` that chose its `families`, the fallback is off (unless `extract` sets it), so
/// the pipeline keeps the rules it asked for.
fn fallback_families(specs: &[PassSpec]) -> Vec<PassSpec> {
    let mut out = specs.to_vec();
    let set = |s: &PassSpec, k: &str| s.options.iter().any(|o| o.name == k);
    for i in 0..out.len() {
        if out[i].name != "extract" || set(&out[i], "partition-fallback") {
            continue;
        }
        let chose = specs[..i]
            .iter()
            .rev()
            .find(|s| s.name == "saturate")
            .is_some_and(|s| set(s, "families"));
        if chose {
            out[i] = out[i]
                .clone()
                .with("partition-fallback", "false".to_string());
        }
    }
    out
}

impl PassManager {
    /// An empty pipeline.
    pub fn new(config: PipelineConfig) -> PassManager {
        PassManager {
            passes: Vec::new(),
            config,
        }
    }

    /// The pipeline `text` (`--passes` syntax), registered in `sources` as `<pipeline>` so
    /// that errors point into it; default configuration.
    pub fn parse(text: &str, sources: &mut SourceMap) -> Result<PassManager, Vec<Diagnostic>> {
        let id = sources.add("<pipeline>", text.to_string());
        PassManager::from_specs(&parse_pipeline(text, id)?, PipelineConfig::default())
    }

    /// The pipeline of `specs`, each created from the registry with its options.
    pub fn from_specs(
        specs: &[PassSpec],
        config: PipelineConfig,
    ) -> Result<PassManager, Vec<Diagnostic>> {
        let reg = registry();
        let mut pm = PassManager::new(config);
        let mut errors = Vec::new();
        let specs = fallback_families(&rank_bounded(specs));
        for spec in &specs {
            let Some(info) = reg.iter().find(|p| p.name == spec.name) else {
                errors.push(Diagnostic::error(
                    spec.span,
                    format!("unknown pass `{}`", spec.name),
                ));
                continue;
            };
            match (info.create)(spec) {
                Ok(pass) => pm.passes.push(Scheduled {
                    name: spec.name.clone(),
                    pass,
                    emits_code: info.emits_code,
                }),
                Err(mut d) => errors.append(&mut d),
            }
        }
        if errors.is_empty() {
            Ok(pm)
        } else {
            Err(errors)
        }
    }

    /// Appends a pass built in code (its options set directly).
    pub fn add<P: NamedPass>(&mut self, pass: P) -> &mut PassManager {
        self.passes.push(Scheduled {
            name: P::NAME.to_string(),
            pass: Box::new(pass),
            emits_code: P::EMITS_CODE,
        });
        self
    }

    /// The passes' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.passes.iter().map(|p| p.name.as_str())
    }

    /// Whether a pass emits code, which then replaces the IR as the output.
    pub fn emits_code(&self) -> bool {
        self.passes.iter().any(|p| p.emits_code)
    }

    /// Runs the pipeline on `module` (parsed, not yet verified).
    pub fn run(&mut self, module: Module, sources: &mut SourceMap) -> PipelineResult {
        self.run_observed(module, sources, &mut Quiet)
    }

    /// `run`, telling `observer` of dumps and report lines as they come.
    pub fn run_observed(
        &mut self,
        mut module: Module,
        sources: &mut SourceMap,
        observer: &mut dyn Observer,
    ) -> PipelineResult {
        let mut result = PipelineResult {
            output: PipelineOutput::None,
            report: Vec::new(),
            diagnostics: Vec::new(),
            failed: true,
            failure: None,
            timing: Vec::new(),
            passes: Vec::new(),
        };
        let t0 = Instant::now();
        if let Err(d) = crate::verify::verify_module(&mut module) {
            result.diagnostics = d;
            result.failure = Some(Failure::OnLoad);
            return result;
        }
        result
            .timing
            .push(("verify (on load)".into(), t0.elapsed().as_secs_f64() * 1e3));
        let original = module.clone();
        let config = &self.config;
        // Code from a backend pass; report lines then become `#` comments on standard output.
        let code_out = self.passes.iter().any(|p| p.emits_code);
        let mut emitted: Option<String> = None;
        let mut parts = std::collections::BTreeMap::new();
        for scheduled in &mut self.passes {
            let name = &scheduled.name;
            if config.print_ir.before.contains(name) {
                observer.dump(&dump(&format!("Before {name}"), &module, config));
            }
            let mut cx = PassContext {
                sources,
                original: &original,
                seed: config.seed,
                base_dir: config.base_dir.clone(),
                report: Vec::new(),
                diagnostics: Vec::new(),
                counters: Default::default(),
                emitted: None,
                progress: config.progress,
                parts: &mut parts,
            };
            let t0 = Instant::now();
            let outcome = scheduled.pass.run(&mut module, &mut cx);
            if let Some(code) = cx.emitted.take() {
                emitted = Some(code);
            }
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            result.timing.push((name.clone(), ms));
            let mut report = std::mem::take(&mut cx.report);
            result.diagnostics.append(&mut cx.diagnostics);
            // The counters are moved in: a copy of `extract`'s list of one entry per output
            // candidate would cost tens of MB past its memory limit on MHA decode.
            let counters = std::mem::take(&mut cx.counters).into_iter().collect();
            result.passes.push(PassRecord {
                pass: name.clone(),
                wall_ms: ms,
                counters,
            });
            if code_out {
                for line in &mut report {
                    *line = format!("#{}", line.trim_start_matches('/'));
                }
            }
            if !report.is_empty() {
                observer.report(&report);
                result.report.append(&mut report);
            }
            if let Err(mut d) = outcome {
                result.diagnostics.append(&mut d);
                result.failure = Some(Failure::Pass(name.clone()));
                return result;
            }
            if config.verify_each {
                if let Err(d) = crate::verify::verify_module(&mut module) {
                    result.diagnostics.push(Diagnostic::global(
                        Severity::Error,
                        format!("pass `{name}` produced IR that does not verify"),
                    ));
                    result.diagnostics.extend(d);
                    result.failure = Some(Failure::VerifyAfter(name.clone()));
                    return result;
                }
            }
            if config.print_ir.after_all || config.print_ir.after.contains(name) {
                observer.dump(&dump(&format!("After {name}"), &module, config));
            }
        }
        result.failed = result.diagnostics.iter().any(|d| d.is_error());
        result.output = match emitted {
            Some(code) => PipelineOutput::Code(code),
            None => PipelineOutput::Module(module),
        };
        result
    }
}

/// An IR dump's text: a delimiter line, then the module.
fn dump(title: &str, m: &Module, config: &PipelineConfig) -> String {
    let body = print_module(
        m,
        PrintOptions {
            types: config.print_ir.types,
        },
    );
    format!("// -----// IR Dump {title} //----- //\n{body}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(sources: &mut SourceMap, name: &str) -> Module {
        let path = format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("example");
        let id = sources.add(name, text.clone());
        crate::parse::parse_module(&text, id).expect("parses")
    }

    struct Seen(Vec<String>);

    impl Observer for Seen {
        fn dump(&mut self, text: &str) {
            self.0
                .push(text.lines().next().unwrap_or_default().to_string());
        }

        fn report(&mut self, lines: &[String]) {
            self.0.extend(lines.iter().cloned());
        }
    }

    #[test]
    fn a_pipeline_runs_through_the_library() {
        let mut sources = SourceMap::default();
        let module = load(&mut sources, "matmul_exp.ef");
        let mut pm = PassManager::parse("saturate,extract{max-candidates=3},check", &mut sources)
            .expect("a good pipeline");
        pm.config.print_ir.after = vec!["extract".into()];
        assert_eq!(
            pm.names().collect::<Vec<_>>(),
            ["saturate", "extract", "check"]
        );
        let mut seen = Seen(Vec::new());
        let result = pm.run_observed(module, &mut sources, &mut seen);
        assert!(!result.failed, "{:?}", result.diagnostics);
        assert_eq!(result.failure, None);
        let m = result.module().expect("a module");
        assert_eq!(m.funcs.len(), 3);
        assert!(result.report.iter().any(|l| l.starts_with("// check @")));
        assert_eq!(
            result.counters(2).map(|c| &c["functions_checked"]),
            Some(&3.into())
        );
        let timed: Vec<&str> = result.timing.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(timed, ["verify (on load)", "saturate", "extract", "check"]);
        // The dump comes after extract's report and before check's.
        let dump = seen
            .0
            .iter()
            .position(|l| l == "// -----// IR Dump After extract //----- //")
            .expect("dumped");
        assert!(seen.0[..dump].iter().any(|l| l.starts_with("// extract @")));
        assert!(seen.0[dump..].iter().any(|l| l.starts_with("// check @")));
    }

    #[test]
    fn a_backend_pass_makes_code_the_output_and_reports_comments() {
        let mut sources = SourceMap::default();
        let module = load(&mut sources, "matmul_exp.ef");
        let mut pm = PassManager::parse("saturate,extract{max-candidates=1},lower", &mut sources)
            .expect("a good pipeline");
        assert!(pm.emits_code());
        let result = pm.run(module, &mut sources);
        assert!(!result.failed, "{:?}", result.diagnostics);
        assert!(matches!(&result.output, PipelineOutput::Code(c) if c.contains("@triton.jit")));
        assert!(
            result.report.iter().all(|l| l.starts_with("# ")),
            "{:?}",
            result.report
        );
    }

    #[test]
    fn a_failing_pass_stops_the_run() {
        let mut sources = SourceMap::default();
        let module = load(&mut sources, "matmul_exp.ef");
        let mut pm = PassManager::parse("verify,check{against=nowhere.ef},verify", &mut sources)
            .expect("a good pipeline");
        let result = pm.run(module, &mut sources);
        assert!(result.failed);
        assert_eq!(result.failure, Some(Failure::Pass("check".into())));
        assert_eq!(result.passes.len(), 2);
        assert!(matches!(result.output, PipelineOutput::None));
    }
}
