//! `saturate` builds the e-graph of every function and runs equality saturation; the module
//! then holds e-graph dumps. Also what the other e-graph passes share: the module's e-graphs,
//! and their Graphviz form.

use super::options::{choice, pass_options, OptionKind, OptionSpans, Seconds};
use super::{NamedPass, Pass, PassContext};
use crate::diag::{Diagnostic, Severity};
use crate::egraph::rules::{all_rules, Family};
use crate::egraph::runner::Runner;
use crate::egraph::TypedEGraph;
use crate::ir::{EGraphDump, Module};

choice! {
    /// `saturate{scheduler=…}`.
    pub enum SchedulerChoice {
        /// Every rule every iteration.
        Simple = "simple",
        /// egg's BackoffScheduler: rules that propose too many new terms are banned a while.
        Backoff = "backoff",
    }
}

choice! {
    /// `saturate{search=…}`.
    pub enum Search {
        /// Search again only e-nodes near a change (same result, faster).
        Incremental = "incremental",
        /// Search every e-node every iteration.
        Full = "full",
    }
}

#[derive(Clone, Debug)]
pub struct SaturateOptions {
    /// `node-limit`: stop when the e-graph has this many e-nodes.
    pub node_limit: usize,
    /// `iter-limit`: stop after this many iterations.
    pub iter_limit: usize,
    /// `time-limit`: stop after this many seconds.
    pub time_limit: Seconds,
    pub scheduler: SchedulerChoice,
    pub search: Search,
    /// `dot`: also write the saturated e-graph to this Graphviz file.
    pub dot: Option<String>,
    /// `families`: the rule families to use.
    pub families: Vec<Family>,
    /// `partition-above`: functions with more matrix products are partitioned first (0: never).
    pub partition_above: usize,
    /// `partition-size`: the subgraph size they are partitioned at.
    pub partition_size: usize,
}

impl Default for SaturateOptions {
    fn default() -> SaturateOptions {
        SaturateOptions {
            node_limit: 20_000,
            iter_limit: 30,
            time_limit: Seconds(30.0),
            scheduler: SchedulerChoice::Simple,
            search: Search::Incremental,
            dot: None,
            families: Family::ALL.to_vec(),
            partition_above: PARTITION_ABOVE,
            partition_size: crate::passes::partition::PartitionOptions::default().size,
        }
    }
}

pass_options!(SaturateOptions {
    "node-limit" => node_limit: OptionKind::Int, "stop when the e-graph has this many e-nodes";
    "iter-limit" => iter_limit: OptionKind::Int, "stop after this many iterations";
    "time-limit" => time_limit: OptionKind::Float, "stop after this many seconds";
    "scheduler" => scheduler: OptionKind::Choice(SchedulerChoice::WORDS),
        "`simple` runs every rule every iteration; `backoff` bans rules that propose too many new terms (egg's BackoffScheduler)";
    "search" => search: OptionKind::Choice(Search::WORDS),
        "`incremental` searches again only e-nodes near a change (same result, faster); `full` searches every e-node every iteration";
    "dot" => dot: OptionKind::Path, "also write the saturated e-graph as a Graphviz file";
    "families" => families: OptionKind::List(&[
            "algebraic",
            "refinement",
            "propagation",
            "fusion",
            "structural",
            "storage",
        ]),
        "rule families to use (comma-separated)";
    "partition-above" => partition_above: OptionKind::Int,
        "a function with more matrix products than this is partitioned first (as `partition{size=…}` does) and each subgraph saturated on its own, where whole-graph search would not finish; 0: never";
    "partition-size" => partition_size: OptionKind::Count,
        "the most compute nodes a subgraph holds when a function is partitioned";
});

/// Matrix products past which `saturate` partitions a function by default. Each product
/// multiplies the tilings extraction combines: the workloads and the five case studies (at
/// most 4 products) are searched whole, so that fusions across all of them stay in reach; a
/// whole decoder layer (9) searched whole gives its first candidates only after tens of
/// seconds.
pub const PARTITION_ABOVE: usize = 4;

pub struct SaturatePass {
    scheduler: crate::egraph::runner::Scheduler,
    dot: Option<String>,
    dot_span: Option<crate::diag::Span>,
    incremental: bool,
    node_limit: usize,
    iter_limit: usize,
    time_limit: Seconds,
    families: Vec<Family>,
    partition_above: usize,
    partition_size: usize,
}

impl NamedPass for SaturatePass {
    const NAME: &'static str = "saturate";
    type Options = SaturateOptions;

    fn summary() -> String {
        "Build each function's e-graph and saturate it with the equality rules; the module then holds e-graph dumps".into()
    }

    fn with_options(options: SaturateOptions, spans: OptionSpans) -> SaturatePass {
        SaturatePass {
            scheduler: match options.scheduler {
                // The backoff scheduler's fixed parameters, not options.
                SchedulerChoice::Backoff => crate::egraph::runner::Scheduler::Backoff {
                    match_limit: 1000,
                    ban_length: 2,
                },
                SchedulerChoice::Simple => crate::egraph::runner::Scheduler::Simple,
            },
            incremental: options.search == Search::Incremental,
            dot: options.dot,
            dot_span: spans.get("dot"),
            node_limit: options.node_limit,
            iter_limit: options.iter_limit,
            time_limit: options.time_limit,
            families: options.families,
            partition_above: options.partition_above,
            partition_size: options.partition_size,
        }
    }
}

impl Pass for SaturatePass {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn run(&mut self, module: &mut Module, cx: &mut PassContext) -> Result<(), Vec<Diagnostic>> {
        if self.partition_above > 0
            && module
                .funcs
                .iter()
                .any(|f| crate::partition::products(f) > self.partition_above)
        {
            // Only the large functions: the others are searched whole.
            let (large, small): (Vec<_>, Vec<_>) = std::mem::take(&mut module.funcs)
                .into_iter()
                .partition(|f| crate::partition::products(f) > self.partition_above);
            let mut part = Module {
                funcs: large,
                ..Module::default()
            };
            super::partition::partition_module(
                &mut part,
                self.partition_size.max(1),
                cx,
                Some("saturate"),
            )?;
            module.funcs = small;
            // Subgraph functions before the compositions that call them.
            let (comps, subs): (Vec<_>, Vec<_>) = part
                .funcs
                .into_iter()
                .partition(crate::partition::has_calls);
            let sub_names: Vec<String> = subs.iter().map(|f| f.name.clone()).collect();
            module.funcs.extend(subs);
            module.funcs.extend(comps);
            crate::verify::verify_module(module)?;
            // Typed, as `extract`'s partitioned fallback needs them.
            for f in module.funcs.iter().filter(|f| sub_names.contains(&f.name)) {
                cx.parts.insert(f.name.clone(), f.clone());
            }
        }
        let graphs = module_egraphs(module, true)?;
        let rules = all_rules();
        let mut dumps: Vec<EGraphDump> = Vec::new();
        let mut per_graph = Vec::new();
        let mut errors = Vec::new();
        let show_progress = cx.progress;
        for mut g in graphs {
            let name = g.name.clone();
            let mut runner = Runner::default()
                .with_node_limit(self.node_limit)
                .with_iter_limit(self.iter_limit)
                .with_time_limit(self.time_limit.duration())
                .with_families(self.families.clone())
                .with_scheduler(self.scheduler)
                .with_incremental_search(self.incremental);
            if show_progress {
                runner.progress = Some(Box::new(move |it, classes, nodes, secs| {
                    if secs > 1.0 {
                        eprint!("\r// saturate @{name}: iteration {it}, {classes} e-classes, {nodes} e-nodes, {secs:.1} s   ");
                    }
                }));
            }
            let report = runner.run(&mut g, &rules);
            if show_progress && report.seconds > 1.0 {
                eprintln!();
            }
            for bug in &report.bugs {
                errors.push(
                    Diagnostic::error(g.name_span, format!("rule `{}` {}", bug.rule, bug.message))
                        .with_help("a rule proposed a term that is not equal in type to its e-class; this is a bug in the rule"),
                );
            }
            if report.stop != crate::egraph::runner::StopReason::Saturated {
                cx.diagnostics.push(Diagnostic::global(
                    Severity::Remark,
                    format!("saturate @{}: stopped: {}", g.name, report.stop),
                ));
            }
            cx.report.push(format!(
                "// saturate @{}: {} e-classes, {} e-nodes, {} iterations, {}, {:.3} s",
                g.name,
                report.classes,
                report.nodes,
                report.iterations,
                report.stop,
                report.seconds
            ));
            let applied: serde_json::Map<String, serde_json::Value> = report
                .applications
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(r, n)| (r.to_string(), (*n).into()))
                .collect();
            per_graph.push(serde_json::json!({
                "egraph": g.name,
                "eclasses": report.classes,
                "enodes": report.nodes,
                "iterations": report.iterations,
                "stop_reason": report.stop.to_string(),
                "seconds": report.seconds,
                "rule_applications": applied,
            }));
            let made: Vec<_> = g.made_reducers(&module.reducers).cloned().collect();
            module.reducers.extend(made);
            dumps.push(g.to_dump());
        }
        cx.counters
            .insert("egraphs".into(), serde_json::Value::Array(per_graph));
        if let Some(path) = &self.dot {
            let text: String = dumps.iter().map(to_dot).collect();
            if let Err(e) = std::fs::write(path, text) {
                errors.push(super::options::option_error(
                    self.dot_span,
                    format!("saturate: cannot write `{path}`: {e}"),
                    "name a file in a directory that exists and is writable",
                ));
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        // Compositions stay functions: their callees are now e-graphs.
        module.funcs.retain(crate::partition::has_calls);
        module.egraphs = dumps;
        Ok(())
    }
}

/// The e-graphs of a module: its dumps, and (with `functions`) its functions' unsaturated
/// e-graphs, functions first. Shared by the passes that work on e-graphs.
pub fn module_egraphs(
    module: &Module,
    functions: bool,
) -> Result<Vec<TypedEGraph>, Vec<Diagnostic>> {
    let mut graphs = Vec::new();
    if functions {
        for f in module
            .funcs
            .iter()
            .filter(|f| !crate::partition::has_calls(f))
        {
            let g = TypedEGraph::from_function(f, &module.reducers).map_err(|e| {
                vec![Diagnostic::error(
                    f.name_span,
                    format!("cannot build the e-graph: {e}"),
                )]
            })?;
            graphs.push(g);
        }
    }
    for d in &module.egraphs {
        let g = TypedEGraph::from_dump(d, &module.reducers).map_err(|e| {
            vec![Diagnostic::error(
                d.name_span,
                format!("cannot rebuild the e-graph: {e}"),
            )]
        })?;
        graphs.push(g);
    }
    Ok(graphs)
}

/// Graphviz: one dotted cluster per e-class holding its e-nodes; edges go from an e-node to
/// the cluster of each operand class.
pub fn to_dot(g: &EGraphDump) -> String {
    let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let mut out = format!(
        "digraph \"{}\" {{\n  compound=true;\n  clusterrank=local;\n",
        esc(&g.name)
    );
    for c in &g.classes {
        out.push_str(&format!(
            "  subgraph cluster_{} {{\n    style=dotted;\n    label=\"%{} : {}\";\n",
            c.id,
            c.id,
            esc(&c.ty.to_string())
        ));
        for (i, n) in c.nodes.iter().enumerate() {
            let text = crate::ir::print::dump_node_text(n);
            out.push_str(&format!(
                "    \"{}.{}\" [label=\"{}\", shape=box];\n",
                c.id,
                i,
                esc(&text)
            ));
        }
        out.push_str("  }\n");
    }
    for c in &g.classes {
        for (i, n) in c.nodes.iter().enumerate() {
            for child in &n.children {
                out.push_str(&format!(
                    "  \"{}.{}\" -> \"{}.0\" [lhead=cluster_{}];\n",
                    c.id, i, child, child
                ));
            }
        }
    }
    out.push_str("}\n");
    out
}
