//! `interpret` runs every function in the reference interpreter on seeded random inputs and
//! prints its results. Also the sizes options (`seed`, `max-extent`, `extents`) it shares with
//! `check`.

use super::options::{choice, pass_options, OptionKind, OptionSpans};
use super::{NamedPass, Pass, PassContext};
use crate::diag::Diagnostic;
use crate::interp::{random_inputs, Interpreter, Sizes, Value};
use crate::ir::{Function, Module};
use std::time::Instant;

pub(crate) const SEED_HELP: &str = "seed of the random inputs (default: --seed)";
pub(crate) const MAX_EXTENT_HELP: &str = "default extent of an unbound parallel axis: the largest divisor up to this of the sizes it partitions";
pub(crate) const EXTENTS_HELP: &str =
    "explicit parallel-axis extents, e.g. `p:4,m:2` (overrides `where`)";

/// The sizes a function runs at and the seed of its inputs: options of `interpret` and
/// `check`.
#[derive(Clone, Debug)]
pub struct SizeOptions {
    /// `seed`: unset, the pipeline's (`--seed`).
    pub seed: Option<u64>,
    /// `max-extent`: an unbound parallel axis's extent is the largest divisor up to this of
    /// the sizes it partitions.
    pub max_extent: u64,
    /// `extents`: explicit parallel-axis extents (override `where`).
    pub extents: Vec<(String, u64)>,
}

impl Default for SizeOptions {
    fn default() -> SizeOptions {
        SizeOptions {
            seed: None,
            max_extent: 4,
            extents: Vec::new(),
        }
    }
}

impl SizeOptions {
    pub fn sizes(&self, f: &Function) -> Sizes {
        let mut f = f.clone();
        for (name, v) in &self.extents {
            f.bindings.retain(|b| &b.name != name);
            f.bindings.push(crate::ir::Binding {
                name: name.clone(),
                value: *v,
                def: None,
                span: f.name_span,
            });
        }
        Sizes::for_function(&f, self.max_extent.max(1))
    }
}

choice! {
    /// `interpret{print=…}`.
    pub enum Print {
        /// Shape, min, max, mean and L2 of each result.
        Summary = "summary",
        /// Every value, up to 256 per result.
        Values = "values",
    }
}

#[derive(Clone, Debug)]
pub struct InterpretOptions {
    pub sizes: SizeOptions,
    pub print: Print,
    /// Standard deviation of the random float inputs.
    pub scale: f32,
}

impl Default for InterpretOptions {
    fn default() -> InterpretOptions {
        InterpretOptions {
            sizes: SizeOptions::default(),
            print: Print::Summary,
            scale: 1.0,
        }
    }
}

pass_options!(InterpretOptions {
    "seed" => sizes.seed: OptionKind::Int, SEED_HELP;
    "max-extent" => sizes.max_extent: OptionKind::Int, MAX_EXTENT_HELP;
    "extents" => sizes.extents: OptionKind::Extents, EXTENTS_HELP;
    "print" => print: OptionKind::Choice(Print::WORDS),
        "print a summary (shape, min, max, mean, L2) or every value (up to 256 per result)";
    "scale" => scale: OptionKind::Float, "standard deviation of the random float inputs";
});

pub(crate) fn run_function(
    module: &Module,
    f: &Function,
    sizes: Sizes,
    inputs: &[Value],
) -> Result<Vec<Value>, Vec<Diagnostic>> {
    Interpreter::new(module, sizes)
        .run(f, inputs)
        .map_err(|e| vec![e.into_diagnostic()])
}

fn fmt_f32(v: f32) -> String {
    format!("{v}")
}

pub struct InterpretPass {
    options: InterpretOptions,
}

impl NamedPass for InterpretPass {
    const NAME: &'static str = "interpret";
    type Options = InterpretOptions;

    fn summary() -> String {
        "Run every function in the reference interpreter on seeded random inputs and print the results".into()
    }

    fn with_options(options: InterpretOptions, _: OptionSpans) -> InterpretPass {
        InterpretPass { options }
    }
}

impl Pass for InterpretPass {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>> {
        let seed = self.options.sizes.seed.unwrap_or(cx.seed);
        let start = Instant::now();
        for f in &module.funcs {
            let sizes = self.options.sizes.sizes(f);
            let inputs = random_inputs(f, &sizes, seed, self.options.scale)
                .map_err(|e| vec![e.into_diagnostic()])?;
            let results = run_function(module, f, sizes, &inputs)?;
            for (i, r) in results.iter().enumerate() {
                for (j, (dtype, t)) in r.leaves().into_iter().enumerate() {
                    let field = if matches!(r, Value::Tuple(_)) {
                        format!(".{j}")
                    } else {
                        String::new()
                    };
                    let head = format!(
                        "// interpret @{} result {i}{field}: {dtype} {:?}",
                        f.name, t.shape
                    );
                    if self.options.print == Print::Values {
                        let shown: Vec<String> =
                            t.data.iter().take(256).map(|v| fmt_f32(*v)).collect();
                        let more = if t.data.len() > 256 { ", …" } else { "" };
                        cx.report
                            .push(format!("{head} = [{}{more}]", shown.join(", ")));
                    } else {
                        let n = t.data.len().max(1) as f64;
                        let min = t.data.iter().copied().fold(f32::INFINITY, f32::min);
                        let max = t.data.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let mean = t.data.iter().map(|v| *v as f64).sum::<f64>() / n;
                        let l2 = t
                            .data
                            .iter()
                            .map(|v| (*v as f64).powi(2))
                            .sum::<f64>()
                            .sqrt();
                        cx.report.push(format!(
                            "{head} min={min:.6e} max={max:.6e} mean={mean:.6e} l2={l2:.6e}"
                        ));
                    }
                }
            }
        }
        cx.counters
            .insert("functions".into(), module.funcs.len().into());
        cx.counters.insert(
            "interp_ms".into(),
            (start.elapsed().as_secs_f64() * 1e3).into(),
        );
        Ok(())
    }
}
