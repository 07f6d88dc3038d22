//! The host function of a candidate: its buffers, sizes, default schedule and launches, and
//! the kernels it launches.

use super::kernel::emit_kernel;
use super::names::{base_text, dtype_host, ident, namer, padded_len};
use super::{Ctx, Emitted, TritonOptions};
use crate::ir::print::Namer;
use crate::ir::*;
use crate::lower::plan::{BufferKey, BufferRole, KernelPlan, Schedule};
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

/// Writes one planned candidate under `schedule` (the host function's default; callers may
/// override it per launch).
pub fn emit_function(
    plan: &KernelPlan,
    schedule: &Schedule,
    opts: TritonOptions,
    names: &mut Namer,
) -> Result<Emitted, (NodeId, String)> {
    let f = plan.function;
    let g = &plan.graph;
    let ctx = Ctx {
        info: plan.info,
        f,
        g,
        opts,
        axis_dim: plan.axis_dims(),
        dot_padded: Default::default(),
        uses_product: Default::default(),
        axes: plan.axes.iter().map(|a| a.name.clone()).collect(),
    };
    let fname = names.fresh(&ident(&f.name));
    // Buffers: inputs by position, intermediates and results.
    let body = &f.body;
    // One buffer per stored tensor: (node, 0) for a tensor, (node, i) for field i of a tuple.
    let mut buffer: HashMap<BufferKey, String> = HashMap::new();
    let mut host_names = namer();
    let mut params = Vec::new();
    for (i, p) in body.params.iter().enumerate() {
        let base = body.nodes[p.index()]
            .name
            .clone()
            .unwrap_or_else(|| format!("in{i}"));
        let n = host_names.fresh(&ident(&base));
        buffer.insert((*p, 0), n.clone());
        params.push(n);
    }
    let mut source = String::new();
    let mut host = String::new();
    let mut launches = Vec::new();
    let mut allocs = Vec::new();
    for (ki, pk) in plan.kernels.iter().enumerate() {
        for b in plan.buffers.iter().filter(|b| b.writer == Some(ki)) {
            let n = host_names.fresh(&match b.role {
                BufferRole::Result(p) => format!("out{p}"),
                _ => "tmp".to_string(),
            });
            let shape: Vec<String> = b.shape.iter().map(base_text).collect();
            // A Python tuple: `()` for a scalar, `(a,)` or `(a, b,)` otherwise.
            let shape: String = shape.iter().map(|d| format!("{d}, ")).collect();
            allocs.push(format!(
                "    {n} = empty(({}), \"{}\", {})\n",
                shape.trim_end(),
                dtype_host(b.dtype),
                params.first().cloned().unwrap_or_else(|| "None".into())
            ));
            buffer.insert(b.key, n);
        }
        let kname = names.fresh(&format!("{fname}_k{ki}"));
        let (src, args, grid) = emit_kernel(&ctx, pk, &kname, &buffer)?;
        source.push_str(&src);
        // `schedule["k<i>"]` may give kernel i its own warps and stages (`tune`).
        launches.push(format!(
            "    {kname}[({grid},)]({}, num_warps=sched.get(\"k{ki}\", {{}}).get(\"num_warps\", sched[\"num_warps\"]), num_stages=sched.get(\"k{ki}\", {{}}).get(\"num_stages\", sched[\"num_stages\"]))\n",
            args.join(", ")
        ));
    }
    // Host function.
    let _ = writeln!(
        host,
        "def {fname}({}*, schedule=None, empty=None):",
        params.iter().map(|p| format!("{p}, ")).collect::<String>()
    );
    let _ = writeln!(
        host,
        "    \"\"\"Candidate `{}`: {} kernel(s). `schedule` overrides block sizes\n    (BLOCK_<axis>), num_warps and num_stages (`\"k<i>\": {{\"num_warps\": …, \"num_stages\": …}}` for kernel i alone);\n    `empty(shape, dtype_name, like)` allocates (torch.empty by default).\"\"\"",
        f.name,
        g.kernels.len()
    );
    host.push_str("    if empty is None:\n        import torch\n\n        def empty(shape, dtype, like):\n            return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device if like is not None else \"cuda\")\n\n");
    let mut sched: Vec<String> = ctx
        .axes
        .iter()
        .filter_map(|a| {
            let size = schedule.block.get(a)?;
            Some(format!("\"BLOCK_{a}\": {size}"))
        })
        .collect();
    sched.push(format!("\"num_warps\": {}", schedule.num_warps));
    sched.push(format!("\"num_stages\": {}", schedule.num_stages));
    for (k, (w, st)) in &schedule.kernels {
        sched.push(format!(
            "\"k{k}\": {{\"num_warps\": {w}, \"num_stages\": {st}}}"
        ));
    }
    let _ = writeln!(host, "    sched = {{{}}}", sched.join(", "));
    host.push_str("    sched.update(schedule or {})\n");
    // Sizes from the inputs' shapes; the `where` values otherwise.
    let mut bound: BTreeSet<String> = BTreeSet::new();
    for (p, name) in body.params.iter().zip(&params) {
        if let Some(Type::Tensor(t)) = body.ty(*p) {
            for (i, d) in t.shape.iter().enumerate() {
                if let DimBase::Sym(s) = &d.base {
                    if bound.insert(s.to_string()) {
                        let _ = writeln!(host, "    {s} = {name}.shape[{i}]");
                    } else {
                        let _ = writeln!(
                            host,
                            "    assert {name}.shape[{i}] == {s}, \"{name}: dimension {i} must be {s}\""
                        );
                    }
                }
            }
        }
    }
    for b in &f.bindings {
        if !bound.contains(&b.name) && b.def.is_none() {
            let _ = writeln!(host, "    {} = {}", b.name, b.value);
        }
    }
    host.push_str(&derived_sizes(&f.bindings, &bound));
    for b in &f.bindings {
        let _ = writeln!(host, "    P_{0} = {1}", b.name, padded_len(&ctx, &b.name));
    }
    for a in &ctx.axes {
        if let Some(d) = ctx.axis_dim.get(a) {
            let _ = writeln!(
                host,
                "    EXT_{a} = triton.cdiv({}, sched[\"BLOCK_{a}\"])",
                base_text(d)
            );
        } else {
            let _ = writeln!(host, "    EXT_{a} = 1");
        }
        let _ = writeln!(
            host,
            "    P_EXT_{a} = {}",
            padded_len(&ctx, &format!("EXT_{a}"))
        );
    }
    for a in allocs {
        host.push_str(&a);
    }
    for l in launches {
        host.push_str(&l);
    }
    // A result that is a reshape view (`lower::reshape_views`) is the buffer it views,
    // reshaped: the same bytes in row-major order, no copy.
    let results: Vec<String> = body
        .results
        .iter()
        .map(|r| {
            let base = plan.graph.storage(*r);
            let Some(name) = buffer.get(&(base, 0)) else {
                return "None".to_string();
            };
            match body.ty(*r) {
                Some(Type::Tensor(t)) if base != *r => {
                    let shape: String = t
                        .shape
                        .iter()
                        .map(|d| format!("{}, ", base_text(&d.base)))
                        .collect();
                    format!("{name}.reshape(({}))", shape.trim_end())
                }
                _ => name.clone(),
            }
        })
        .collect();
    let _ = writeln!(host, "    return ({},)\n\n", results.join(", "));
    Ok(Emitted {
        name: fname,
        source,
        host,
        uses_product: ctx.uses_product.get(),
    })
}

/// Host lines for the derived sizes (`HD = NH*D`), factors first: one an input's shape gives
/// is checked against its factors, another is computed from them.
fn derived_sizes(bindings: &[Binding], from_shapes: &BTreeSet<String>) -> String {
    let mut out = String::new();
    let mut known: BTreeSet<&str> = bindings
        .iter()
        .filter(|b| b.def.is_none())
        .map(|b| b.name.as_str())
        .collect();
    let mut pending: Vec<&Binding> = bindings.iter().filter(|b| b.def.is_some()).collect();
    while !pending.is_empty() {
        let before = pending.len();
        pending.retain(|b| {
            let Some(def) = &b.def else { return false };
            if !def.symbols().iter().all(|s| known.contains(s.as_str())) {
                return true;
            }
            if from_shapes.contains(&b.name) {
                let _ = writeln!(
                    out,
                    "    assert {0} == {def}, \"{0} must be {def}\"",
                    b.name
                );
            } else {
                let _ = writeln!(out, "    {} = {def}", b.name);
            }
            known.insert(b.name.as_str());
            false
        });
        // The verifier rejects cycles; a leftover would be a bug, written as its value.
        if pending.len() == before {
            for b in pending.drain(..) {
                let _ = writeln!(out, "    {} = {}", b.name, b.value);
            }
        }
    }
    out
}
