//! `verify`: the verifier (`crate::verify`) as a pass, with its counters. (The pass manager
//! also verifies every module on load, and after each pass under `--verify-each`.)

use super::options::{pass_options, OptionSpans};
use super::{NamedPass, Pass, PassContext};
use crate::diag::Diagnostic;
use crate::ir::Module;

/// `verify` takes no options.
#[derive(Clone, Debug, Default)]
pub struct VerifyOptions {}

pass_options!(VerifyOptions {});

pub struct VerifyPass;

impl NamedPass for VerifyPass {
    const NAME: &'static str = "verify";
    type Options = VerifyOptions;

    fn summary() -> String {
        "Infer and check types, shapes, dtypes and parallel state".into()
    }

    fn with_options(_: VerifyOptions, _: OptionSpans) -> VerifyPass {
        VerifyPass
    }
}

impl Pass for VerifyPass {
    fn name(&self) -> &'static str {
        Self::NAME
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
