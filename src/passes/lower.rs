//! `lower`: every function of the module (the extracted candidates) to one Python module of
//! Triton kernels and host functions. Also what `triton-check` shares with it: which functions
//! lower, and the error that says why one does not.

use super::options::{pass_options, OptionKind, OptionSpans};
use super::{NamedPass, Pass, PassContext};
use crate::backend::triton::{emit_module, TritonOptions};
use crate::diag::Diagnostic;
use crate::ir::{Function, Module, NodeId};
use crate::lower::mask::plan_cost;
use crate::lower::{plan, KernelPlan};
use crate::verify::ModuleInfo;

#[derive(Clone, Debug, Default)]
pub struct LowerOptions {
    /// `interpret`: f32 matrix-product operands, for the Triton CPU interpreter.
    pub interpret: bool,
    /// `dot-bf16`: bf16 matrix-product operands even where the program has f32 ones.
    pub dot_bf16: bool,
}

pass_options!(LowerOptions {
    "interpret" => interpret: OptionKind::Bool,
        "f32 matrix-product operands, for the Triton CPU interpreter (its bf16 dot is wrong)";
    "dot-bf16" => dot_bf16: OptionKind::Bool,
        "bf16 matrix-product operands even where the program has f32 ones (faster tensor cores, bf16 rounding)";
});

pub(crate) fn lowering_error(f: &Function, node: NodeId, message: String) -> Diagnostic {
    let span = f
        .body
        .nodes
        .get(node.index())
        .map(|n| n.span)
        .unwrap_or(f.name_span);
    // Extracted candidates have no source text to point into: name the expression too.
    let mut expr = crate::ir::print::print_expr(&f.body, node);
    if expr.chars().count() > 100 {
        expr = expr.chars().take(97).collect::<String>() + "...";
    }
    let at = if expr.is_empty() {
        String::new()
    } else {
        format!(" (at `{expr}`)")
    };
    Diagnostic::error(span, format!("cannot lower `{}`: {message}{at}", f.name))
        .with_label("this value")
        .with_help("extract{max-kernels=…} or another candidate may avoid the construct; see docs/cli.md (lower)")
}

/// The plans of the functions that lower; each other one gets a warning naming the construct
/// it cannot lower yet. Returns them and how many were skipped.
pub(crate) fn planned<'m>(
    info: &'m ModuleInfo,
    funcs: Vec<&'m Function>,
    cx: &mut PassContext,
) -> (Vec<KernelPlan<'m>>, usize) {
    let mut ok = Vec::new();
    let mut skipped = 0;
    for f in funcs {
        match plan(info, f) {
            Ok(p) => ok.push(p),
            Err(refusal) => {
                let mut d = lowering_error(f, refusal.node, refusal.reason);
                d.severity = crate::diag::Severity::Warning;
                cx.diagnostics.push(d);
                skipped += 1;
            }
        }
    }
    (ok, skipped)
}

/// A plan the backend could not write: a bug in the plan, reported at the node.
pub(crate) fn unwritten(
    module: &Module,
    node: NodeId,
    message: String,
    name: String,
) -> Vec<Diagnostic> {
    let f = module.funcs.iter().find(|f| f.name == name);
    vec![match f {
        Some(f) => lowering_error(f, node, message),
        None => Diagnostic::global(crate::diag::Severity::Error, message),
    }]
}

pub struct LowerPass {
    opts: TritonOptions,
}

impl NamedPass for LowerPass {
    const NAME: &'static str = "lower";
    const EMITS_CODE: bool = true;
    type Options = LowerOptions;

    fn summary() -> String {
        "Emit Triton kernels and a host function per function (the output becomes Python)".into()
    }

    fn with_options(options: LowerOptions, _: OptionSpans) -> LowerPass {
        LowerPass {
            opts: TritonOptions {
                interpret: options.interpret,
                dot_bf16: options.dot_bf16,
            },
        }
    }
}

impl Pass for LowerPass {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>> {
        let opts = self.opts;
        // Lowering takes verified functions only: the verifier's info is its ticket.
        let info = crate::verify::verify_module(module)?;
        let module: &Module = module;
        let (plans, _) = planned(&info, module.funcs.iter().collect(), cx);
        if plans.is_empty() {
            return Err(vec![Diagnostic::global(
                crate::diag::Severity::Error,
                "lower: no function could be lowered",
            )]);
        }
        let (source, _) = emit_module(&plans, opts)
            .map_err(|(node, message, name)| unwritten(module, node, message, name))?;
        let mut per = Vec::new();
        for p in &plans {
            let f = p.function;
            {
                let c = plan_cost(p);
                cx.report.push(format!(
                    "// lower @{}: {} kernel(s), {} bytes read, {} bytes written, {} flops",
                    f.name, c.kernels, c.bytes_read, c.bytes_written, c.flops
                ));
                per.push(serde_json::json!({ "function": f.name, "cost": c }));
            }
        }
        cx.counters.insert("candidates".into(), per.into());
        cx.emitted = Some(source);
        Ok(())
    }
}
