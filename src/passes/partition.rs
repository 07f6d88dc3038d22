//! `partition`: splits each function of more than `size` compute nodes into connected, convex
//! subgraphs (paper §5.2; [`crate::partition`]): one function per distinct subgraph
//! (`f.p0`, `f.p1`, …) and `f` rewritten as their composition (`call @f.pK(…)`). The output
//! parses, verifies and runs in the interpreter, so `check` proves it equal to the source;
//! `saturate` searches each subgraph on its own and `extract` composes their candidates.

use super::options::{pass_options, OptionKind, OptionSpans};
use super::{NamedPass, Pass, PassContext};
use crate::diag::{Diagnostic, Severity};
use crate::ir::{Function, Module};
use crate::partition::{compute_nodes, has_calls, is_convex, partitions, split, Partition};

#[derive(Clone, Debug)]
pub struct PartitionOptions {
    /// Compute nodes per subgraph, at most.
    pub size: usize,
}

impl Default for PartitionOptions {
    fn default() -> PartitionOptions {
        PartitionOptions { size: 12 }
    }
}

pass_options!(PartitionOptions {
    "size" => size: OptionKind::Count,
        "the most compute nodes a subgraph holds; functions with at most this many are left whole. Cuts are also tried at ¾ and ½ of it and the one moving the fewest bytes across boundaries is kept";
});

pub struct PartitionPass {
    opts: PartitionOptions,
}

impl NamedPass for PartitionPass {
    const NAME: &'static str = "partition";
    type Options = PartitionOptions;

    fn summary() -> String {
        "Split large functions into convex subgraphs (functions f.pK) and a composition of calls, searched part by part".into()
    }

    fn with_options(options: PartitionOptions, _: OptionSpans) -> PartitionPass {
        PartitionPass { opts: options }
    }
}

/// What partitioning one function did: its report line and counters.
#[derive(Clone)]
pub struct Partitioned {
    pub functions: Vec<Function>,
    pub line: String,
    pub stats: serde_json::Value,
}

/// Partitions `f` at `size` (the best of the granularities tried), or `None` when it is small
/// enough, already a composition, or has no cut.
pub fn partition_function(f: &Function, size: usize) -> Result<Option<Partitioned>, Diagnostic> {
    let nodes = compute_nodes(f);
    if nodes <= size || has_calls(f) {
        return Ok(None);
    }
    let tried = partitions(f, size);
    let Some(best) = tried.first() else {
        return Ok(None);
    };
    if best.subgraphs.len() < 2 {
        return Ok(None);
    }
    if let Some(bad) = best.subgraphs.iter().find(|s| !is_convex(f, s)) {
        return Err(Diagnostic::error(
            f.name_span,
            format!(
                "partition @{}: a subgraph of {} nodes is not convex (a bug in partition)",
                f.name,
                bad.len()
            ),
        ));
    }
    let functions = split(f, best);
    let distinct = functions.len() - 1;
    let describe = |p: &Partition| {
        format!(
            "size {}: {} subgraphs, {} boundary bytes",
            p.size,
            p.subgraphs.len(),
            p.boundary_bytes.round() as u64
        )
    };
    let line = format!(
        "// partition @{}: {nodes} compute nodes as {} subgraphs ({distinct} distinct functions), largest {}, {} boundary bytes; tried {}",
        f.name,
        best.subgraphs.len(),
        best.largest,
        best.boundary_bytes.round() as u64,
        tried.iter().map(describe).collect::<Vec<_>>().join("; ")
    );
    let stats = serde_json::json!({
        "function": f.name,
        "compute_nodes": nodes,
        "subgraphs": best.subgraphs.len(),
        "functions": distinct,
        "largest": best.largest,
        "boundary_bytes": best.boundary_bytes.round() as u64,
        "partitions_tried": tried.len(),
    });
    Ok(Some(Partitioned {
        functions,
        line,
        stats,
    }))
}

/// Partitions every function of `module` past `size` compute nodes in place; the report lines
/// and counters go to `cx`. How many were partitioned.
pub fn partition_module(
    module: &mut Module,
    size: usize,
    cx: &mut PassContext,
    remark: Option<&str>,
) -> Result<usize, Vec<Diagnostic>> {
    let mut out = Vec::new();
    let mut rows = Vec::new();
    let mut done = 0;
    for f in std::mem::take(&mut module.funcs) {
        match partition_function(&f, size).map_err(|d| vec![d])? {
            Some(p) => {
                if let Some(why) = remark {
                    cx.diagnostics.push(Diagnostic::global(
                        Severity::Remark,
                        format!(
                            "{why} @{}: {} compute nodes, searched as {} subgraph functions and their composition (partition{{size={size}}})",
                            f.name,
                            compute_nodes(&f),
                            p.functions.len() - 1
                        ),
                    ));
                }
                if cx.progress {
                    let names: Vec<&str> = p.functions[..p.functions.len() - 1]
                        .iter()
                        .map(|g| g.name.as_str())
                        .collect();
                    eprintln!(
                        "// partition @{}: searching its subgraphs as {}",
                        f.name,
                        names.join(", ")
                    );
                }
                cx.report.push(p.line);
                rows.push(p.stats);
                out.extend(p.functions);
                done += 1;
            }
            None => out.push(f),
        }
    }
    module.funcs = out;
    cx.counters
        .insert("partitions".into(), serde_json::Value::Array(rows));
    Ok(done)
}

impl Pass for PartitionPass {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>> {
        if !module.egraphs.is_empty() {
            return Err(vec![Diagnostic::global(
                Severity::Error,
                "partition: the module holds e-graphs; partition functions before `saturate`",
            )]);
        }
        partition_module(module, self.opts.size.max(1), cx, None)?;
        crate::verify::verify_module(module)?;
        Ok(())
    }
}
