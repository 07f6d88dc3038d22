//! Triton emission from a kernel graph.
//!
//! Every tile is a Triton block. A block dimension is either split by a parallel axis (length
//! `BLOCK_<axis>`, offsets `c_<axis> * BLOCK_<axis> + arange`), or whole (length the next power
//! of two of the dimension, at least 16 where a `tl.dot` multiplies along it), or 1. Blocks that
//! overhang a dimension are masked: loads read 0 there, stores skip it, and reductions and
//! matrix products replace the overhang by the reduction's identity (0 for products) first,
//! so values computed on padding never reach a result. Grid axes become one flattened
//! program id; loop axes become `for` loops whose fold state is loop-carried (nested when a
//! fold sits inside another fold's loop; an axis both on the grid and folded keeps its grid
//! coordinate as `g_<axis>`, and its offsets are restored after each loop over it), and an
//! axis combined inside the kernel is computed
//! as one block spanning its dimension. A user reducer with no combine of built-ins folds a
//! block dimension element by element, in a loop (over a stored stack of tiles split by
//! `k`, a loop over `k` that loads each tile at its offsets). Arithmetic runs
//! in f32 (a cast to bf16/f16 rounds); matrix-product operands go to the dot in their
//! program dtype, or in f32 under the interpreter option (the Triton interpreter's bf16 dot
//! is wrong).

use crate::ir::print::Namer;
use crate::ir::*;
use crate::lower::{kernel_graph, store_axes, stored_after_fold, tiled, Kernel, KernelGraph};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;

#[derive(Clone, Copy, Debug, Default)]
pub struct TritonOptions {
    /// f32 matrix-product operands (for `TRITON_INTERPRET=1`).
    pub interpret: bool,
    /// bf16 matrix-product operands whatever their program dtype (FlashAttention feeds its f32
    /// probabilities to the second product this way): twice the tensor-core rate of tf32, at
    /// bf16 rounding of the operands. `interpret` wins over it.
    pub dot_bf16: bool,
}

const PY_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "tl", "triton", "torch", "np", "range", "min", "max", "float", "int", "len",
    "empty", "schedule",
];

/// The `@triton.jit` combine function of a product reduction over a block: Triton has `tl.sum`,
/// `tl.max` and `tl.min` but no product, so `tl.reduce` takes this one. A module defines it
/// once, before its kernels, when some kernel uses it.
const PRODUCT_COMBINE: &str = "efopt_product";

fn namer() -> Namer {
    let mut n = Namer::default();
    for k in PY_KEYWORDS {
        n.reserve(k);
    }
    n.reserve(PRODUCT_COMBINE);
    n
}

/// A Python identifier from IR text.
fn ident(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, 'v');
    }
    out
}

/// One block dimension.
#[derive(Clone, Debug, PartialEq)]
struct BlockDim {
    /// Length expression (a constexpr name or a literal).
    len: String,
    /// 1-D offsets into the tensor dimension.
    offs: String,
    /// 1-D in-bounds mask, when the block can overhang.
    mask: Option<String>,
    /// The dimension's name, to resolve `axis=NAME` in reducer bodies.
    name: Option<String>,
}

#[derive(Clone, Debug)]
enum Val {
    Tile { expr: String, dims: Vec<BlockDim> },
    Tuple(Vec<Val>),
}

impl Val {
    fn tile(&self) -> Result<(&str, &[BlockDim]), String> {
        match self {
            Val::Tile { expr, dims } => Ok((expr, dims)),
            Val::Tuple(_) => Err("a tuple where a tile is needed".into()),
        }
    }
}

fn index_for(rank: usize, d: usize) -> String {
    if rank <= 1 {
        return String::new();
    }
    let parts: Vec<&str> = (0..rank)
        .map(|j| if j == d { ":" } else { "None" })
        .collect();
    format!("[{}]", parts.join(", "))
}

fn broadcast(vals: &[&[BlockDim]]) -> Vec<BlockDim> {
    let rank = vals.iter().map(|d| d.len()).max().unwrap_or(0);
    (0..rank)
        .map(|i| {
            let mut best: Option<BlockDim> = None;
            for dims in vals {
                let off = rank - dims.len();
                if i >= off {
                    let d = &dims[i - off];
                    if best.as_ref().is_none_or(|b| b.len == "1") {
                        best = Some(d.clone());
                    }
                }
            }
            best.unwrap_or(BlockDim {
                len: "1".into(),
                offs: "tl.arange(0, 1)".into(),
                mask: None,
                name: None,
            })
        })
        .collect()
}

fn mask_all(dims: &[BlockDim]) -> Option<String> {
    let rank = dims.len();
    let parts: Vec<String> = dims
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            d.mask
                .as_ref()
                .map(|m| format!("{m}{}", index_for(rank, i)))
        })
        .collect();
    if parts.is_empty() {
        None
    } else {
        Some(parts.join(" & "))
    }
}

fn dtype_tl(d: DType) -> &'static str {
    match d {
        DType::BF16 => "tl.bfloat16",
        DType::F16 => "tl.float16",
        DType::F32 => "tl.float32",
        DType::I32 => "tl.int32",
        DType::I1 => "tl.int1",
    }
}

/// The dtype's name in torch and in the numpy wrapper.
pub fn dtype_host(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        DType::F32 => "float32",
        DType::I32 => "int32",
        DType::I1 => "bool",
    }
}

fn float_lit(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 {
            "float('inf')".into()
        } else {
            "float('-inf')".into()
        }
    } else if v.is_nan() {
        "float('nan')".into()
    } else {
        format!("{v:?}")
    }
}

fn builtin_identity(r: BuiltinReducer) -> f64 {
    match r {
        BuiltinReducer::Add => 0.0,
        BuiltinReducer::Mul => 1.0,
        BuiltinReducer::Max => f64::NEG_INFINITY,
        BuiltinReducer::Min => f64::INFINITY,
    }
}

/// The Triton program of one candidate.
pub struct Emitted {
    /// The host function's name.
    pub name: String,
    pub source: String,
    pub host: String,
    /// Whether a kernel calls `PRODUCT_COMBINE`, which the module must then define.
    pub uses_product: bool,
}

struct Ctx<'a> {
    module: &'a Module,
    f: &'a Function,
    g: &'a KernelGraph,
    opts: TritonOptions,
    /// Size of the dimension each axis splits.
    axis_dim: BTreeMap<String, DimBase>,
    /// Whole-dimension block lengths (`P_<name>`) that some `tl.dot` uses as rows, columns
    /// or depth: only these are padded to 16. Padding the others (batch dimensions, say)
    /// would multiply the work, and the compile time, by up to 16 for nothing.
    dot_padded: std::cell::RefCell<BTreeSet<String>>,
    /// Every parallel axis the function names (`all_axes`), computed once: each kernel's
    /// signature lists them all.
    axes: BTreeSet<String>,
    /// Set when a kernel reduces a block with `PRODUCT_COMBINE`.
    uses_product: std::cell::Cell<bool>,
}

/// Emits a module for the candidates: one kernel per region, one host function per candidate.
pub fn emit_module(
    module: &Module,
    funcs: &[&Function],
    opts: TritonOptions,
) -> Result<(String, Vec<String>), (NodeId, String, String)> {
    let mut out = String::new();
    let mut host_names = Vec::new();
    out.push_str("# Generated by efopt. Kernels take block sizes as constexprs; each host\n");
    out.push_str(
        "# function takes torch-style tensors, allocates outputs and launches in order.\n",
    );
    out.push_str("import triton\nimport triton.language as tl\n\n");
    let mut names = namer();
    let mut hosts = Vec::new();
    let mut kernels = String::new();
    let mut product_defined = false;
    for f in funcs {
        let e =
            emit_function(module, f, opts, &mut names).map_err(|(n, m)| (n, m, f.name.clone()))?;
        // Defined once, before every kernel, whichever function needs it first.
        if e.uses_product && !product_defined {
            product_defined = true;
            let _ = write!(
                out,
                "@triton.jit\ndef {PRODUCT_COMBINE}(a, b):\n    return a * b\n\n\n"
            );
        }
        kernels.push_str(&e.source);
        hosts.push(e.host);
        host_names.push(e.name);
    }
    out.push_str(&kernels);
    for h in hosts {
        out.push_str(&h);
    }
    Ok((out, host_names))
}

/// Every parallel axis the function names (views, stores, folds, collection extents).
fn all_axes(f: &Function) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for n in &f.body.nodes {
        let mut stack: Vec<&Type> = n.ty.iter().collect();
        while let Some(t) = stack.pop() {
            match t {
                Type::Tensor(t) => {
                    out.extend(t.par.axes().map(|a| a.to_string()));
                    for d in &t.shape {
                        if let DimBase::Extent(a) = &d.base {
                            out.insert(a.to_string());
                        }
                    }
                }
                Type::Tuple(ts) => stack.extend(ts),
            }
        }
        if let ExprKind::Reduce {
            over: ReduceOver::Parallel(a),
            ..
        } = &n.kind
        {
            out.insert(a.to_string());
        }
    }
    out
}

/// Axes with a block size in the schedule (those that split a dimension).
pub fn block_axes(f: &Function) -> Vec<String> {
    axis_dims(f).into_keys().collect()
}

fn axis_dims(f: &Function) -> BTreeMap<String, DimBase> {
    let mut m = BTreeMap::new();
    for n in &f.body.nodes {
        if let ExprKind::Partition(d, a, x) = &n.kind {
            if let Some(Type::Tensor(t)) = f.body.ty(*x) {
                if let Ok(i) = crate::ir::resolve_dim(&t.shape, d) {
                    m.entry(a.to_string()).or_insert(t.shape[i].base.clone());
                }
            }
        }
    }
    m
}

fn base_text(b: &DimBase) -> String {
    match b {
        DimBase::Sym(s) => s.to_string(),
        DimBase::Lit(n) => n.to_string(),
        DimBase::Extent(a) => format!("EXT_{a}"),
    }
}

fn p2_name(b: &DimBase) -> String {
    match b {
        DimBase::Sym(s) => format!("P_{s}"),
        DimBase::Lit(n) => (n.max(&16).next_power_of_two()).to_string(),
        DimBase::Extent(a) => format!("P_EXT_{a}"),
    }
}

/// Whether `f` lowers to Triton: `Err(reason)` names the construct that does not.
pub fn lowerable(module: &Module, f: &Function) -> Result<(), String> {
    emit_function(module, f, TritonOptions::default(), &mut namer())
        .map(|_| ())
        .map_err(|(_, reason)| reason)
}

pub fn emit_function(
    module: &Module,
    f: &Function,
    opts: TritonOptions,
    names: &mut Namer,
) -> Result<Emitted, (NodeId, String)> {
    // Triton indexes blocks with 32-bit integers; a literal dimension past that is refused
    // here, before any block length is derived from it.
    for (i, node) in f.body.nodes.iter().enumerate() {
        let mut stack: Vec<&Type> = node.ty.iter().collect();
        while let Some(t) = stack.pop() {
            match t {
                Type::Tensor(t) => {
                    if let Some(n) = t.shape.iter().find_map(|d| match d.base {
                        DimBase::Lit(n) if n > i32::MAX as u64 => Some(n),
                        _ => None,
                    }) {
                        return Err((
                            NodeId(i as u32),
                            format!("a literal dimension of {n}, past Triton's 32-bit indices"),
                        ));
                    }
                }
                Type::Tuple(ts) => stack.extend(ts),
            }
        }
    }
    let g = kernel_graph(f);
    if !g.launch_order {
        return Err((
            f.body.results.first().copied().unwrap_or(NodeId(0)),
            "no launch order: a kernel reads a value it writes itself".into(),
        ));
    }
    let ctx = Ctx {
        module,
        f,
        g: &g,
        opts,
        axis_dim: axis_dims(f),
        dot_padded: Default::default(),
        uses_product: Default::default(),
        axes: all_axes(f),
    };
    let fname = names.fresh(&ident(&f.name));
    // Buffers: inputs by position, intermediates and results.
    let body = &f.body;
    // One buffer per stored tensor: (node, 0) for a tensor, (node, i) for field i of a tuple.
    let mut buffer: HashMap<BufKey, String> = HashMap::new();
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
    for (ki, k) in g.kernels.iter().enumerate() {
        for o in &k.outputs {
            if buffer.contains_key(&(*o, 0)) {
                continue;
            }
            // A stored tuple (partial results of a product fold, say) is one buffer per field.
            let (fields, _) =
                field_types(body.ty(*o)).map_err(|m| (*o, format!("a stored value: {m}")))?;
            let pos = body.results.iter().position(|r| r == o);
            for (i, t) in fields.into_iter().enumerate() {
                let n = host_names.fresh(&match pos {
                    Some(p) => format!("out{p}"),
                    None => "tmp".to_string(),
                });
                let shape: Vec<String> = t.shape.iter().map(|d| base_text(&d.base)).collect();
                // A Python tuple: `()` for a scalar, `(a,)` or `(a, b,)` otherwise.
                let shape: String = shape.iter().map(|d| format!("{d}, ")).collect();
                allocs.push(format!(
                    "    {n} = empty(({}), \"{}\", {})\n",
                    shape.trim_end(),
                    dtype_host(t.dtype),
                    params.first().cloned().unwrap_or_else(|| "None".into())
                ));
                buffer.insert((*o, i), n);
            }
        }
        let kname = names.fresh(&format!("{fname}_k{ki}"));
        let (src, args, grid) = emit_kernel(&ctx, k, &kname, &buffer)?;

        source.push_str(&src);
        launches.push(format!(
            "    {kname}[({grid},)]({}, num_warps=sched[\"num_warps\"], num_stages=sched[\"num_stages\"])\n",
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
        "    \"\"\"Candidate `{}`: {} kernel(s). `schedule` overrides block sizes\n    (BLOCK_<axis>), num_warps and num_stages; `empty(shape, dtype_name, like)` allocates\n    (torch.empty by default).\"\"\"",
        f.name,
        g.kernels.len()
    );
    host.push_str("    if empty is None:\n        import torch\n\n        def empty(shape, dtype, like):\n            return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device if like is not None else \"cuda\")\n\n");
    let mut sched: Vec<String> = ctx
        .axes
        .iter()
        .filter(|a| ctx.axis_dim.contains_key(*a))
        .map(|a| format!("\"BLOCK_{a}\": 16"))
        .collect();
    sched.push("\"num_warps\": 4".into());
    sched.push("\"num_stages\": 2".into());
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
        if !bound.contains(&b.name) {
            let _ = writeln!(host, "    {} = {}", b.name, b.value);
        }
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
    let results: Vec<String> = body
        .results
        .iter()
        .map(|r| {
            buffer
                .get(&(*r, 0))
                .cloned()
                .unwrap_or_else(|| "None".to_string())
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

/// Fold state variables and their blocks.
type FoldStates = Vec<(String, Vec<BlockDim>)>;

/// The tensor types of a value's fields (one for a tensor) and whether it is a tuple.
fn field_types(ty: Option<&Type>) -> Result<(Vec<TensorType>, bool), &'static str> {
    match ty {
        Some(Type::Tensor(t)) => Ok((vec![t.clone()], false)),
        Some(Type::Tuple(ts)) => ts
            .iter()
            .map(|t| t.as_tensor().cloned().ok_or("a tuple of tuples"))
            .collect::<Result<_, _>>()
            .map(|fs| (fs, true)),
        None => Err("an untyped value"),
    }
}

/// The fold state variables as values (a reducer's first arguments).
fn state_vals(states: &FoldStates) -> Vec<Val> {
    states
        .iter()
        .map(|(n, d)| Val::Tile {
            expr: n.clone(),
            dims: d.clone(),
        })
        .collect()
}

/// A fold's result: its state, a tuple when the fold's type is one.
fn fold_result(ty: Option<&Type>, states: FoldStates) -> Val {
    let mut vals: Vec<Val> = states
        .into_iter()
        .map(|(n, d)| Val::Tile { expr: n, dims: d })
        .collect();
    match ty {
        Some(Type::Tuple(_)) => Val::Tuple(vals),
        _ => vals.pop().unwrap_or(Val::Tuple(vec![])),
    }
}

/// The host expression for `P_<name>`, the block length of a whole dimension `name`.
fn padded_len(ctx: &Ctx, name: &str) -> String {
    if ctx.dot_padded.borrow().contains(name) {
        format!("max(16, triton.next_power_of_2({name}))")
    } else {
        format!("triton.next_power_of_2({name})")
    }
}

/// `r` over dimension `i` of tile `x`: the overhang replaced by the identity first.
fn reduce_tile(
    x: &str,
    dims: &[BlockDim],
    i: usize,
    r: BuiltinReducer,
    keep_dims: bool,
) -> Result<Val, String> {
    let dim = dims
        .get(i)
        .ok_or("reduction dimension out of range")?
        .clone();
    let x = match &dim.mask {
        Some(m) => format!(
            "tl.where({m}{}, {x}, {})",
            index_for(dims.len(), i),
            float_lit(builtin_identity(r))
        ),
        None => x.to_string(),
    };
    let f = match r {
        BuiltinReducer::Add => "tl.sum",
        BuiltinReducer::Max => "tl.max",
        BuiltinReducer::Min => "tl.min",
        BuiltinReducer::Mul => "tl.reduce",
    };
    let combine = match r {
        BuiltinReducer::Mul => format!(", combine_fn={PRODUCT_COMBINE}"),
        _ => String::new(),
    };
    let mut out = dims.to_vec();
    if keep_dims {
        out[i] = BlockDim {
            len: "1".into(),
            offs: "tl.arange(0, 1)".into(),
            mask: None,
            name: None,
        };
    } else {
        out.remove(i);
    }
    let kd = if keep_dims { "True" } else { "False" };
    Ok(if dims.len() == 1 && !keep_dims {
        Val::Tile {
            expr: format!("{f}({x}, axis=0{combine})"),
            dims: out,
        }
    } else {
        Val::Tile {
            expr: format!("{f}({x}, axis={i}{combine}, keep_dims={kd})"),
            dims: out,
        }
    })
}

/// A stored tensor: a node and, for a tuple-valued node, the field (0 for a tensor).
type BufKey = (NodeId, usize);

struct Loop {
    axis: String,
    lines: Vec<String>,
    memo: HashMap<NodeId, Val>,
}

struct KernelEmitter<'c, 'a> {
    ctx: &'c Ctx<'a>,
    kernel: &'c Kernel,
    names: Namer,
    outer: Vec<String>,
    /// Open fold loops, outermost first: each collects its body and memoizes the values that
    /// vary along its axis.
    inner: Vec<Loop>,
    memo: HashMap<NodeId, Val>,
    ptr: BTreeMap<BufKey, String>,
    buffer: &'c HashMap<BufKey, String>,
    in_kernel: BTreeSet<NodeId>,
    folds_done: BTreeSet<NodeId>,
    /// Outputs already stored (a store along a loop axis is written inside that loop).
    stored: BTreeSet<NodeId>,
    /// Collection folds done, by node: their result is computed before any loop over their
    /// axis, so it is valid inside loops whose memo does not have it.
    collection_folds: HashMap<NodeId, Val>,
    /// Axes the kernel combines inside itself: one block spans their whole dimension.
    whole: BTreeSet<String>,
    /// Operand dtypes of the matrix product being emitted (unknown in reducer bodies: f32).
    dot_dtypes: Option<(DType, DType)>,
    /// Values being computed: a value asked for again while it is (a fold whose operands
    /// outside its loop read the fold) is refused instead of recursing without end.
    computing: BTreeSet<NodeId>,
    /// Axes whose tile offsets (`o_<axis>`) a block of this kernel used: each must be one
    /// the kernel defines (a grid or loop axis), else the code reads an undefined name.
    tile_axes_used: std::cell::RefCell<BTreeSet<String>>,
}

fn emit_kernel(
    ctx: &Ctx,
    k: &Kernel,
    kname: &str,
    buffer: &HashMap<BufKey, String>,
) -> Result<(String, Vec<String>, String), (NodeId, String)> {
    let mut e = KernelEmitter {
        ctx,
        kernel: k,
        names: namer(),
        outer: Vec::new(),
        inner: Vec::new(),
        memo: HashMap::new(),
        ptr: BTreeMap::new(),
        buffer,
        in_kernel: k.nodes.iter().copied().collect(),
        folds_done: BTreeSet::new(),
        stored: BTreeSet::new(),
        collection_folds: HashMap::new(),
        whole: whole_axes(ctx.f, k)?,
        dot_dtypes: None,
        computing: BTreeSet::new(),
        tile_axes_used: Default::default(),
    };
    for b in &ctx.f.bindings {
        e.names.reserve(&b.name);
        e.names.reserve(&format!("P_{}", b.name));
    }
    // Every axis's names, not only the grid's and loops': a fold over a stored stack of tiles
    // loops over its axis too (`stack_fold`).
    for a in &ctx.axes {
        for p in ["BLOCK_", "EXT_", "P_EXT_", "c_", "g_", "o_", "m_"] {
            e.names.reserve(&format!("{p}{a}"));
        }
    }
    // Grid coordinates from one flattened program id.
    e.outer.push("pid = tl.program_id(0)".into());
    e.names.reserve("pid");
    let grid_axes: Vec<&String> = k
        .grid_axes
        .iter()
        .filter(|a| !e.whole.contains(*a))
        .collect();
    for a in &grid_axes {
        // An axis the kernel also folds over keeps its grid coordinate apart from the loop's.
        let coord = e.grid_coordinate(a);
        e.outer.push(format!("{coord} = pid % EXT_{a}"));
        e.outer.push(format!("pid = pid // EXT_{a}"));
        e.axis_offsets_from(a, &coord, None);
    }
    // Stores along a loop axis happen inside that loop, when it closes; the others first,
    // as they open the loops.
    let (along_loop, plain): (Vec<NodeId>, Vec<NodeId>) = k.outputs.iter().partition(|o| {
        store_axes(&ctx.f.body, **o)
            .iter()
            .any(|a| k.loop_axes.contains(a) && !e.after_fold(**o, a))
    });
    for o in plain {
        e.store(o)?;
    }
    if let Some(o) = along_loop.into_iter().find(|o| !e.stored.contains(o)) {
        return Err((o, "a store along a loop axis that no fold opens".into()));
    }
    // A stored stack of tiles read back where its tiles' axis is neither on the grid nor
    // looped over (a tensor-level fold of `collection[k](…)` tiles): where each tile's
    // elements lie is not known here.
    let unplaced = e
        .tile_axes_used
        .borrow()
        .iter()
        .find(|a| !k.grid_axes.contains(a) && !k.loop_axes.contains(a))
        .cloned();
    if let (Some(a), Some(n)) = (unplaced, k.nodes.first()) {
        return Err((
            *n,
            format!("a tile dimension over axis `{a}` read by a kernel that neither runs nor loops over `{a}`"),
        ));
    }
    // Signature.
    let mut sig = Vec::new();
    let mut args = Vec::new();
    for (key, p) in &e.ptr {
        sig.push(p.clone());
        args.push(buffer.get(key).cloned().unwrap_or_else(|| "None".into()));
    }
    for b in &ctx.f.bindings {
        sig.push(b.name.clone());
        args.push(b.name.clone());
    }
    let axes: Vec<&String> = ctx.axes.iter().collect();
    for a in &axes {
        sig.push(format!("EXT_{a}"));
        args.push(format!("EXT_{a}"));
    }
    for b in &ctx.f.bindings {
        sig.push(format!("P_{}: tl.constexpr", b.name));
        args.push(format!("P_{0}=P_{0}", b.name));
    }
    for a in &axes {
        sig.push(format!("P_EXT_{a}: tl.constexpr"));
        args.push(format!("P_EXT_{a}=P_EXT_{a}"));
        if ctx.axis_dim.contains_key(*a) {
            sig.push(format!("BLOCK_{a}: tl.constexpr"));
            args.push(format!("BLOCK_{a}=sched[\"BLOCK_{a}\"]"));
        } else {
            sig.push(format!("BLOCK_{a}: tl.constexpr"));
            args.push(format!("BLOCK_{a}=1"));
        }
    }
    let mut src = String::new();
    let what = if k.default_tiled {
        "default tiling of a tensor-level operator"
    } else {
        "tiled region"
    };
    let whole = if e.whole.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = e.whole.iter().map(String::as_str).collect();
        format!("; whole axes: [{}]", names.join(", "))
    };
    let grid_names: Vec<&str> = grid_axes.iter().map(|a| a.as_str()).collect();
    let _ = writeln!(
        src,
        "@triton.jit\ndef {kname}({}):\n    # {what}; grid axes: [{}]; loop axes: [{}]{whole}",
        sig.join(", "),
        grid_names.join(", "),
        k.loop_axes.join(", ")
    );
    for l in &e.outer {
        let _ = writeln!(src, "    {l}");
    }
    src.push('\n');
    let grid = if grid_axes.is_empty() {
        "1".to_string()
    } else {
        grid_axes
            .iter()
            .map(|a| format!("EXT_{a}"))
            .collect::<Vec<_>>()
            .join(" * ")
    };
    Ok((src, args, grid))
}

impl KernelEmitter<'_, '_> {
    /// A line in the innermost open loop (`inner`) or before every loop.
    fn line(&mut self, inner: bool, l: String) {
        let level = if inner {
            self.inner.len().checked_sub(1)
        } else {
            None
        };
        self.line_at(level, l);
    }

    fn line_at(&mut self, level: Option<usize>, l: String) {
        match level.and_then(|i| self.inner.get_mut(i)) {
            Some(lp) => lp.lines.push(l),
            None => self.outer.push(l),
        }
    }

    /// The loop a value lives in: the innermost open loop whose axis it varies along (`None`:
    /// before every loop). A value replicated along a loop's axis is computed before it.
    fn level_of(&self, id: NodeId) -> Option<usize> {
        let t = self.ctx.f.body.ty(id);
        (0..self.inner.len())
            .rev()
            .find(|i| varies_along(t, &self.inner[*i].axis))
    }

    fn memo_at(&mut self, level: Option<usize>) -> &mut HashMap<NodeId, Val> {
        match level {
            Some(i) if i < self.inner.len() => &mut self.inner[i].memo,
            _ => &mut self.memo,
        }
    }

    fn tmp(&mut self, base: &str) -> String {
        self.names.fresh(base)
    }

    /// Defines `o_<axis>`/`m_<axis>` for the coordinate `c_<axis>`.
    fn axis_offsets(&mut self, a: &str, inner: bool) {
        let level = if inner {
            self.inner.len().checked_sub(1)
        } else {
            None
        };
        self.axis_offsets_from(a, &format!("c_{a}"), level);
    }

    /// Defines `o_<axis>`/`m_<axis>` for coordinate `coord`, at `level`.
    fn axis_offsets_from(&mut self, a: &str, coord: &str, level: Option<usize>) {
        match self.ctx.axis_dim.get(a) {
            Some(d) => {
                let size = base_text(d);
                self.line_at(
                    level,
                    format!("o_{a} = {coord} * BLOCK_{a} + tl.arange(0, BLOCK_{a})"),
                );
                self.line_at(level, format!("m_{a} = o_{a} < {size}"));
            }
            None => {
                self.line_at(level, format!("o_{a} = tl.arange(0, 1)"));
                self.line_at(level, format!("m_{a} = o_{a} < 1"));
            }
        }
    }

    /// The grid coordinate of axis `a`: `c_<axis>`, or `g_<axis>` when the kernel also folds
    /// over `a` in a loop, whose coordinate is `c_<axis>`.
    fn grid_coordinate(&self, a: &str) -> String {
        if self.kernel.loop_axes.iter().any(|l| l == a) {
            format!("g_{a}")
        } else {
            format!("c_{a}")
        }
    }

    /// Whether output `o` is stored along `a` after the fold over `a` whose result it reads
    /// (`a` is then a grid axis as well as a loop axis).
    fn after_fold(&self, o: NodeId, a: &str) -> bool {
        let kernel: BTreeSet<NodeId> = self.kernel.nodes.iter().copied().collect();
        stored_after_fold(&self.ctx.f.body, o, a, &kernel)
    }

    fn dims_of(&self, t: &TensorType) -> Vec<BlockDim> {
        t.shape
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let split = t
                    .par
                    .0
                    .iter()
                    .find(|(_, k)| **k == ParKind::Partition(i))
                    .map(|(a, _)| a.to_string())
                    .or_else(|| d.splits.last().map(|a| a.to_string()));
                let name = match &d.base {
                    DimBase::Sym(s) => Some(s.to_string()),
                    _ => None,
                };
                let split = split.filter(|a| !self.whole.contains(a));
                match (split, &d.base) {
                    (Some(a), _) => {
                        self.tile_axes_used.borrow_mut().insert(a.clone());
                        BlockDim {
                            len: format!("BLOCK_{a}"),
                            offs: format!("o_{a}"),
                            mask: Some(format!("m_{a}")),
                            name,
                        }
                    }
                    (None, DimBase::Lit(1)) => BlockDim {
                        len: "1".into(),
                        offs: "tl.arange(0, 1)".into(),
                        mask: None,
                        name,
                    },
                    (None, b) => {
                        let p = p2_name(b);
                        BlockDim {
                            len: p.clone(),
                            offs: format!("tl.arange(0, {p})"),
                            mask: Some(format!("(tl.arange(0, {p}) < {})", base_text(b))),
                            name,
                        }
                    }
                }
            })
            .collect()
    }

    fn ptr_of(&mut self, key: BufKey) -> Result<String, (NodeId, String)> {
        if let Some(p) = self.ptr.get(&key) {
            return Ok(p.clone());
        }
        let node = key.0;
        let Some(host) = self.buffer.get(&key) else {
            return Err((
                node,
                "a kernel reads a value no earlier kernel stores".into(),
            ));
        };
        let p = self.names.fresh(&format!("{}_ptr", ident(host)));
        self.ptr.insert(key, p.clone());
        Ok(p)
    }

    /// Row-major strides of a tensor-level shape, as expressions.
    fn strides(shape: &[Dim]) -> Vec<String> {
        let mut s = vec!["1".to_string(); shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            s[i] = format!("{} * {}", s[i + 1], base_text(&shape[i + 1].base));
        }
        s
    }

    fn address(
        &mut self,
        base: BufKey,
        shape: &[Dim],
        dims: &[BlockDim],
        leading: Option<String>,
    ) -> Result<String, (NodeId, String)> {
        let p = self.ptr_of(base)?;
        let strides = Self::strides(shape);
        let rank = dims.len();
        let mut terms = vec![p];
        let skip = usize::from(leading.is_some());
        if let Some(l) = leading {
            terms.push(format!("({l}) * ({})", strides[0]));
        }
        for (i, d) in dims.iter().enumerate() {
            let s = strides.get(i + skip).cloned().unwrap_or_else(|| "1".into());
            terms.push(format!("({}){} * ({s})", d.offs, index_for(rank, i)));
        }
        Ok(terms.join(" + "))
    }

    /// A value: loads, constants, operators; folds open loops.
    fn value(&mut self, id: NodeId) -> Result<Val, (NodeId, String)> {
        let level = self.level_of(id);
        if let Some(v) = self.memo_at(level).get(&id) {
            return Ok(v.clone());
        }
        if !self.computing.insert(id) {
            return Err((
                id,
                "a value its own computation reads (a fold whose operands outside its loop read the fold)".into(),
            ));
        }
        let v = self.compute(id);
        self.computing.remove(&id);
        let v = v?;
        // Computing may open and close loops, never the ones this value lives in.
        let level = self.level_of(id);
        let v = match v {
            Val::Tile { expr, dims } if !is_simple(&expr) => {
                let name = self.f_name(id);
                self.line_at(level, format!("{name} = {expr}"));
                Val::Tile { expr: name, dims }
            }
            other => other,
        };
        self.memo_at(level).insert(id, v.clone());
        Ok(v)
    }

    fn f_name(&mut self, id: NodeId) -> String {
        let base = self.ctx.f.body.nodes[id.index()]
            .name
            .clone()
            .unwrap_or_else(|| "t".into());
        self.tmp(&ident(&base))
    }

    fn compute(&mut self, id: NodeId) -> Result<Val, (NodeId, String)> {
        let body = &self.ctx.f.body;
        let node = &body.nodes[id.index()];
        let err = |m: &str| (id, m.to_string());
        // Loads: views of a tensor-level value.
        if let Some(base) = self.ctx.g.load_base[id.index()] {
            let Some(Type::Tensor(t)) = node.ty.as_ref() else {
                return Err(err("a view of a tuple"));
            };
            let dims = self.dims_of(t);
            return self.load(base, dims, id);
        }
        // Tensor-level values other kernels compute (or inputs) are read from memory;
        // constant expressions and tuple plumbing are computed here.
        let tensor_level_read = !self.in_kernel.contains(&id)
            && !tiled(node.ty.as_ref())
            && !self.ctx.g.constant[id.index()]
            && !self.ctx.g.plumbing[id.index()];
        if tensor_level_read {
            // A stored value read whole; a stored tuple field by field.
            let (types, is_tuple) =
                field_types(node.ty.as_ref()).map_err(|m| err(&format!("a stored value: {m}")))?;
            if !is_tuple {
                let dims = self.dims_of(&types[0]);
                return self.load(id, dims, id);
            }
            let mut fields = Vec::new();
            for (i, t) in types.iter().enumerate() {
                let dims = self.dims_of(t);
                fields.push(self.load_field((id, i), t, dims, id)?);
            }
            return Ok(Val::Tuple(fields));
        }
        let ops: Vec<NodeId> = node.kind.operands();
        // Over a whole axis, a view or a combination of a block computed here is the block.
        if let ExprKind::Partition(_, a, x) | ExprKind::Combination(_, a, x) = &node.kind {
            if self.whole.contains(a.as_str()) {
                let Some(Type::Tensor(t)) = node.ty.as_ref() else {
                    return Err(err("a view of a tuple"));
                };
                let dims = self.dims_of(t);
                let v = self.value(*x)?;
                let (expr, _) = v.tile().map_err(|m| (id, m))?;
                return Ok(Val::Tile {
                    expr: expr.to_string(),
                    dims,
                });
            }
        }
        // A replicated tile computed in the kernel is the same block at every coordinate.
        if let ExprKind::Replicate(_, x) = &node.kind {
            return self.value(*x);
        }
        if let ExprKind::Reduce {
            over: ReduceOver::Parallel(a),
            ..
        } = &node.kind
        {
            if self.inner.iter().any(|l| &l.axis == a) {
                return Err(err("a fold over an axis whose loop is open"));
            }
            if !self.kernel.loop_axes.contains(&a.to_string()) {
                return Err(err("a fold over an axis that is not a loop axis"));
            }
            return self.fold_group(id, a.to_string());
        }
        if let Some(a) = crate::lower::collection_fold_axis(body, id) {
            return self.collection_fold(id, a.to_string());
        }
        if let ExprKind::Reduce {
            over: ReduceOver::Axis(_),
            reducer: ReducerRef::User(r),
            ..
        } = &node.kind
        {
            let def = self.ctx.module.reducer(r);
            if def.is_some_and(|d| d.as_product().is_none()) {
                return self.sequential_fold(id);
            }
        }
        let mut vals = Vec::new();
        for o in &ops {
            vals.push(self.value(*o)?);
        }
        let ty = node.ty.clone();
        let annot = node.annot.clone();
        let mut kind = node.kind.clone();
        // `get[name]` of a fold: the field's position in the reducer's state.
        if let ExprKind::Get(FieldRef::Name(n), x) = &kind {
            if let ExprKind::Reduce {
                reducer: ReducerRef::User(r),
                ..
            } = &body.nodes[x.index()].kind
            {
                if let Some(i) = self
                    .ctx
                    .module
                    .reducer(r)
                    .and_then(|d| d.state.iter().position(|s| s == n))
                {
                    kind = ExprKind::Get(FieldRef::Index(i), *x);
                }
            }
        }
        self.dot_dtypes = match &kind {
            ExprKind::TileMatMul { a, b, .. } | ExprKind::MatMul { a, b, .. } => {
                match (body.ty(*a), body.ty(*b)) {
                    (Some(Type::Tensor(x)), Some(Type::Tensor(y))) => Some((x.dtype, y.dtype)),
                    _ => None,
                }
            }
            _ => None,
        };
        self.op(&kind, vals, ty.as_ref().or(annot.as_ref()), &dim_position)
            .map_err(|m| (id, m))
    }

    /// A view of an elementwise constant expression (a causal mask from `iota`s): each operand
    /// viewed on the same block (trailing dimensions for lower ranks), then the operator.
    fn constant_view(
        &mut self,
        base: NodeId,
        dims: Vec<BlockDim>,
        at: NodeId,
    ) -> Result<Val, (NodeId, String)> {
        let body = &self.ctx.f.body;
        let node = &body.nodes[base.index()];
        let mut vals = Vec::new();
        for o in node.kind.operands() {
            let rank = match body.ty(o) {
                Some(Type::Tensor(t)) => t.shape.len(),
                _ => return Err((at, "a view of a tuple constant".into())),
            };
            let Some(start) = dims.len().checked_sub(rank) else {
                return Err((at, "a constant operand of higher rank than its view".into()));
            };
            vals.push(self.load(o, dims[start..].to_vec(), at)?);
        }
        let kind = node.kind.clone();
        let ty = node.ty.clone();
        self.op(&kind, vals, ty.as_ref(), &dim_position)
            .map_err(|m| (at, m))
    }

    fn load(
        &mut self,
        base: NodeId,
        dims: Vec<BlockDim>,
        at: NodeId,
    ) -> Result<Val, (NodeId, String)> {
        let body = &self.ctx.f.body;
        let bnode = &body.nodes[base.index()];
        if self.ctx.g.constant[base.index()] {
            // A view of a constant expression: the constant on the tile.
            return match &bnode.kind {
                ExprKind::Constant(v) => Ok(Val::Tile {
                    expr: float_lit(*v),
                    dims: vec![],
                }),
                ExprKind::Fill(v) => Ok(Val::Tile {
                    expr: format!(
                        "tl.full([{}], {}, tl.float32)",
                        dims.iter()
                            .map(|d| d.len.clone())
                            .collect::<Vec<_>>()
                            .join(", "),
                        float_lit(*v)
                    ),
                    dims,
                }),
                ExprKind::Iota(d) => {
                    let i = match d {
                        DimRef::Index(i) => *i,
                        DimRef::Name(n) => dims
                            .iter()
                            .position(|b| b.name.as_deref() == Some(n))
                            .unwrap_or(0),
                    };
                    let rank = dims.len();
                    Ok(Val::Tile {
                        expr: format!(
                            "({}){}.to(tl.float32)",
                            dims.get(i).map(|d| d.offs.clone()).unwrap_or_default(),
                            index_for(rank, i)
                        ),
                        dims,
                    })
                }
                ExprKind::Unary(..)
                | ExprKind::Binary(..)
                | ExprKind::Select(..)
                | ExprKind::Cast(..) => self.constant_view(base, dims, at),
                _ => Err((
                    at,
                    "a view of a constant expression other than elementwise operators".into(),
                )),
            };
        }
        let Some(Type::Tensor(bt)) = bnode.ty.as_ref() else {
            return Err((at, "a load of a tuple".into()));
        };
        self.load_field((base, 0), &bt.clone(), dims, at)
    }

    /// Loads a tile of the stored tensor `key` of type `bt`.
    fn load_field(
        &mut self,
        key: BufKey,
        bt: &TensorType,
        dims: Vec<BlockDim>,
        at: NodeId,
    ) -> Result<Val, (NodeId, String)> {
        if bt.shape.len() != dims.len() {
            return Err((
                at,
                "a load whose tile rank differs from the tensor's".into(),
            ));
        }
        let addr = self.address(key, &bt.shape, &dims, None)?;
        let mut mask = mask_all(&dims);
        let rank = dims.len();
        // Triton's software pipeliner handles loads in loops of rank 2 only (rank 4 aborts the
        // sm_90 compiler in the async copy, rank 3 when the tile does not feed a dot): a tile
        // of higher rank is loaded with its leading dimensions merged, then reshaped back.
        let merged = (rank > 2).then(|| {
            let lens: Vec<&str> = dims.iter().map(|d| d.len.as_str()).collect();
            let flat = format!("({}, {})", lens[..rank - 1].join(" * "), lens[rank - 1]);
            (flat, format!("({})", lens.join(", ")), lens.join(", "))
        });
        let addr = match &merged {
            Some((flat, _, full)) => {
                mask = mask.map(|m| format!("tl.reshape(tl.broadcast_to({m}, [{full}]), {flat})"));
                format!("tl.reshape({addr}, {flat})")
            }
            None => addr,
        };
        let load = match mask {
            Some(m) => format!("tl.load({addr}, mask={m}, other=0.0)"),
            None => format!("tl.load({addr})"),
        };
        let expr = match &merged {
            Some((_, shape, _)) => format!("tl.reshape({load}, {shape}).to(tl.float32)"),
            None => format!("{load}.to(tl.float32)"),
        };
        Ok(Val::Tile { expr, dims })
    }

    /// Folds over loop axis `a`: `id` and every other pending fold over `a` that neither
    /// depends on a pending fold nor is needed by one, in one loop with loop-carried state.
    fn fold_group(&mut self, id: NodeId, a: String) -> Result<Val, (NodeId, String)> {
        let body = &self.ctx.f.body;
        let pending: Vec<NodeId> = self
            .kernel
            .nodes
            .iter()
            .copied()
            .filter(|n| {
                !self.folds_done.contains(n)
                    && matches!(&body.nodes[n.index()].kind,
                        ExprKind::Reduce { over: ReduceOver::Parallel(b), .. } if *b == a)
            })
            .collect();
        let deps = |n: NodeId| fold_deps(body, n, &pending);
        let id_deps = deps(id);
        // The loop goes where the fold's result lives (inside the loops of its other axes);
        // independent folds over the same axis living there share it.
        let level = self.level_of(id);
        // Folds share a loop only where they would live in the same loops: those open now
        // (`level_of`) and those not open yet, whose axes their results vary along too (a
        // fold inside another fold's loop, and one hoisted out of it, do not share).
        let loops_of = |n: NodeId| -> Vec<bool> {
            self.kernel
                .loop_axes
                .iter()
                .filter(|l| **l != a)
                .map(|l| varies_along(body.ty(n), l))
                .collect()
        };
        let id_loops = loops_of(id);
        let mut group = vec![id];
        for m in &pending {
            if *m != id
                && deps(*m).is_empty()
                && !id_deps.contains(m)
                && self.level_of(*m) == level
                && loops_of(*m) == id_loops
            {
                group.push(*m);
            }
        }
        // Values the loop body reads from outside the loop come first (they may need
        // earlier loops).
        for m in &group {
            if let ExprKind::Reduce { input, .. } = &body.nodes[m.index()].kind {
                self.outside_operands(*input, &a)?;
            }
        }
        // Operands outside the loop first (they may open earlier loops).
        let mut inits: Vec<Vec<(String, Vec<BlockDim>)>> = Vec::new();
        for m in &group {
            let node = &body.nodes[m.index()];
            let ExprKind::Reduce { reducer, .. } = &node.kind else {
                continue;
            };
            inits.push(self.fold_states(level, *m, reducer)?);
        }
        self.open_loop(&a);
        for (m, states) in group.iter().zip(&inits) {
            let node = &body.nodes[m.index()];
            let ExprKind::Reduce { input, reducer, .. } = node.kind.clone() else {
                continue;
            };
            let item = self.value(input)?;
            let exprs: Vec<String> = match &reducer {
                ReducerRef::Builtin(r) => {
                    let s = &states[0].0;
                    let (x, _) = item.tile().map_err(|e| (*m, e))?;
                    vec![match r {
                        BuiltinReducer::Add => format!("{s} + {x}"),
                        BuiltinReducer::Mul => format!("{s} * {x}"),
                        BuiltinReducer::Max => format!("tl.maximum({s}, {x})"),
                        BuiltinReducer::Min => format!("tl.minimum({s}, {x})"),
                    }]
                }
                ReducerRef::User(n) => {
                    let Some(def) = self.ctx.module.reducer(n) else {
                        return Err((*m, format!("unknown reducer @{n}")));
                    };
                    let mut args = state_vals(states);
                    match item {
                        Val::Tuple(v) => args.extend(v),
                        t => args.push(t),
                    }
                    self.next_states(*m, def, args)?
                }
            };
            self.assign_states(states, exprs);
        }
        self.close_loop(level, &a, id)?;
        let mut result = None;
        for (m, states) in group.iter().zip(inits) {
            self.folds_done.insert(*m);
            let v = fold_result(body.nodes[m.index()].ty.as_ref(), states);
            if *m == id {
                result = Some(v.clone());
            } else {
                self.memo_at(level).insert(*m, v);
            }
        }
        result.ok_or((id, "fold lost".into()))
    }

    /// The state variables of fold `id`, initialised at `level` (where its result lives).
    fn fold_states(
        &mut self,
        level: Option<usize>,
        id: NodeId,
        reducer: &ReducerRef,
    ) -> Result<FoldStates, (NodeId, String)> {
        let types: Vec<TensorType> = match self.ctx.f.body.ty(id) {
            Some(Type::Tensor(t)) => vec![t.clone()],
            Some(Type::Tuple(ts)) => ts.iter().filter_map(|t| t.as_tensor().cloned()).collect(),
            None => return Err((id, "an untyped fold".into())),
        };
        let init: Vec<f64> = match reducer {
            ReducerRef::Builtin(r) => vec![builtin_identity(*r)],
            ReducerRef::User(n) => match self.ctx.module.reducer(n) {
                Some(def) => def.init.clone(),
                None => return Err((id, format!("unknown reducer @{n}"))),
            },
        };
        let mut states = Vec::new();
        for (i, t) in types.iter().enumerate() {
            let dims = self.dims_of(t);
            let name = self.tmp(&format!("acc{i}"));
            let lens: Vec<String> = dims.iter().map(|d| d.len.clone()).collect();
            self.line_at(
                level,
                format!(
                    "{name} = tl.full([{}], {}, tl.float32)",
                    lens.join(", "),
                    float_lit(init.get(i).copied().unwrap_or(0.0))
                ),
            );
            states.push((name, dims));
        }
        Ok(states)
    }

    fn open_loop(&mut self, a: &str) {
        self.inner.push(Loop {
            axis: a.to_string(),
            lines: Vec::new(),
            memo: HashMap::new(),
        });
        self.axis_offsets(a, true);
    }

    /// Closes the innermost loop (over `a`), writing it at `level`.
    fn close_loop(
        &mut self,
        level: Option<usize>,
        a: &str,
        id: NodeId,
    ) -> Result<(), (NodeId, String)> {
        // Outputs combined along `a` are stored tile by tile, inside the loop.
        let along: Vec<NodeId> = self
            .kernel
            .outputs
            .iter()
            .copied()
            .filter(|o| {
                !self.stored.contains(o)
                    && store_axes(&self.ctx.f.body, *o).iter().any(|x| x == a)
                    && !self.after_fold(*o, a)
            })
            .collect();
        for o in along {
            self.store(o)?;
        }
        let Some(Loop { lines, .. }) = self.inner.pop() else {
            return Err((id, "loop state lost".into()));
        };
        self.line_at(level, format!("for c_{a} in range(0, EXT_{a}):"));
        for l in lines {
            self.line_at(level, format!("    {l}"));
        }
        // The loop left the offsets of its last tile: a grid axis gets its own back.
        if self.kernel.grid_axes.iter().any(|g| g == a) && !self.whole.contains(a) {
            let coord = self.grid_coordinate(a);
            self.axis_offsets_from(a, &coord, level);
        }
        Ok(())
    }

    /// New fold states, all evaluated before any is assigned (they read the old ones).
    fn assign_states(&mut self, states: &[(String, Vec<BlockDim>)], next: Vec<String>) {
        let mut fresh = Vec::new();
        for e in next {
            let t = self.tmp("nxt");
            self.line(true, format!("{t} = {e}"));
            fresh.push(t);
        }
        for ((s, _), t) in states.iter().zip(fresh) {
            self.line(true, format!("{s} = {t}"));
        }
    }

    /// `reduce (collection[a](x)) axis=0`: a loop over `a` folding each tile's `x` into one
    /// accumulator with the built-in reducer, instead of a stored stack of partial values.
    fn collection_fold(&mut self, id: NodeId, a: String) -> Result<Val, (NodeId, String)> {
        if let Some(v) = self.collection_folds.get(&id) {
            return Ok(v.clone());
        }
        let body = &self.ctx.f.body;
        let node = &body.nodes[id.index()];
        let ExprKind::Reduce {
            input,
            reducer,
            keep_dims,
            ..
        } = &node.kind
        else {
            return Err((id, "a malformed collection fold".into()));
        };
        let stack = crate::lower::stack_of(body, *input);
        let ExprKind::Collection(_, x) = body.nodes[stack.index()].kind else {
            return Err((id, "a malformed collection fold".into()));
        };
        let (reducer, keep_dims) = (reducer.clone(), *keep_dims);
        if keep_dims && matches!(reducer, ReducerRef::User(_)) {
            return Err((id, "keep_dims on a user-reducer collection fold".into()));
        }
        // The fold lives outside every loop over `a`: its result does not vary along `a`
        // (replicated, it is the whole stack's fold in every tile), so it is computed before
        // an open loop over `a`, not inside it; a loop over `a` enclosing its own level would
        // nest one loop over `a` in another.
        let t = body.ty(id);
        let level = (0..self.inner.len())
            .rev()
            .find(|i| self.inner[*i].axis != a && varies_along(t, &self.inner[*i].axis));
        let enclosing = level.map_or(0, |l| l + 1);
        if self.inner[..enclosing].iter().any(|l| l.axis == a) {
            return Err((id, "a fold over an axis whose loop is open".into()));
        }
        self.outside_operands(x, &a)?;
        let states = self.fold_states(level, id, &reducer)?;
        self.open_loop(&a);
        let item = self.value(x)?;
        let next: Vec<String> = match &reducer {
            ReducerRef::Builtin(r) => {
                let (item, item_dims) = item.tile().map_err(|e| (id, e))?;
                let item = if keep_dims {
                    format!("({item})[None{}]", ", :".repeat(item_dims.len()))
                } else {
                    item.to_string()
                };
                let acc = &states[0].0;
                vec![match r {
                    BuiltinReducer::Add => format!("{acc} + {item}"),
                    BuiltinReducer::Max => format!("tl.maximum({acc}, {item})"),
                    BuiltinReducer::Min => format!("tl.minimum({acc}, {item})"),
                    BuiltinReducer::Mul => format!("{acc} * {item}"),
                }]
            }
            ReducerRef::User(n) => {
                let Some(def) = self.ctx.module.reducer(n) else {
                    return Err((id, format!("unknown reducer @{n}")));
                };
                let mut args = state_vals(&states);
                match item {
                    Val::Tuple(v) => args.extend(v),
                    t => args.push(t),
                }
                self.next_states(id, def, args)?
            }
        };
        self.assign_states(&states, next);
        self.close_loop(level, &a, id)?;
        let v = fold_result(node.ty.as_ref(), states);
        self.collection_folds.insert(id, v.clone());
        Ok(v)
    }

    /// `reduce x axis=d reducer=@r` with a user reducer that is no product of built-ins.
    /// Its fold need not be associative (a repair's running maximum), so there is no
    /// `tl.reduce` combine: the block's elements along `d` are folded one at a time, in
    /// order, each picked out of the block by a one-hot sum (exact: the other terms are
    /// zeros). Elements past the tensor's end (a padded block) leave the state as it was.
    fn sequential_fold(&mut self, id: NodeId) -> Result<Val, (NodeId, String)> {
        let body = &self.ctx.f.body;
        let node = &body.nodes[id.index()];
        let err = |m: &str| (id, m.to_string());
        let ExprKind::Reduce {
            input,
            over: ReduceOver::Axis(d),
            reducer,
            keep_dims,
        } = node.kind.clone()
        else {
            return Err(err("a malformed fold"));
        };
        if keep_dims {
            return Err(err("keep_dims on a user reducer over a tile dimension"));
        }
        let ReducerRef::User(name) = &reducer else {
            return Err(err("a built-in reducer folded element by element"));
        };
        let Some(def) = self.ctx.module.reducer(name) else {
            return Err(err(&format!("unknown reducer @{name}")));
        };
        if let Some(a) = self.stored_stack_axis(input, &d) {
            return self.stack_fold(id, input, a, def);
        }
        let fields = match self.value(input)? {
            Val::Tuple(v) => v,
            t => vec![t],
        };
        // Every item field runs along the folded dimension with the same block.
        let mut along: Option<BlockDim> = None;
        let mut picked = Vec::new();
        for f in &fields {
            let (x, dims) = f.tile().map_err(|m| (id, m))?;
            let i = dim_position(&d, dims).ok_or(err("a fold over an unknown dimension"))?;
            let dim = dims.get(i).ok_or(err("a fold over an unknown dimension"))?;
            match &along {
                Some(a) if a.len != dim.len => {
                    return Err(err("item fields with different blocks along the fold"))
                }
                Some(_) => {}
                None => along = Some(dim.clone()),
            }
            let mut rest = dims.to_vec();
            rest.remove(i);
            picked.push((x.to_string(), dims.len(), i, rest));
        }
        let along = along.ok_or(err("a fold of no items"))?;
        let level = self.level_of(id);
        // Items are read once, before the loop, not once per element.
        for (x, ..) in picked.iter_mut() {
            if !is_simple(x) {
                let name = self.tmp("items");
                self.line_at(level, format!("{name} = {x}"));
                *x = name;
            }
        }
        let states = self.fold_states(level, id, &reducer)?;
        let j = self.tmp("j");
        self.open_element_loop();
        let one_hot = format!("(tl.arange(0, {}) == {j})", along.len);
        let mut args = state_vals(&states);
        for (x, rank, i, rest) in picked {
            let item = self.tmp("item");
            let sel = format!("{one_hot}{}", index_for(rank, i));
            self.line(
                true,
                format!("{item} = tl.sum(tl.where({sel}, {x}, 0.0), axis={i})"),
            );
            args.push(Val::Tile {
                expr: item,
                dims: rest,
            });
        }
        let mut exprs = self.next_states(id, def, args)?;
        if let Some(m) = &along.mask {
            let inside = self.tmp("inside");
            self.line(
                true,
                format!("{inside} = tl.sum(({one_hot} & {m}).to(tl.int32), axis=0) > 0"),
            );
            for (e, (s, _)) in exprs.iter_mut().zip(&states) {
                *e = format!("tl.where({inside}, {e}, {s})");
            }
        }
        self.assign_states(&states, exprs);
        let header = format!("for {j} in range(0, {}):", along.len);
        self.close_element_loop(id, level, header)?;
        Ok(fold_result(node.ty.as_ref(), states))
    }

    /// The axis `a` of `stack = collection[a](…)` when the fold over its dimension `d` reads
    /// a stack another kernel stored whose tiles keep a dimension split by `a` (where each
    /// tile's elements lie depends on its coordinate along `a`), and this kernel has no
    /// coordinate along `a` of its own.
    fn stored_stack_axis(&self, stack: NodeId, d: &DimRef) -> Option<String> {
        let body = &self.ctx.f.body;
        let ExprKind::Collection(a, _) = &body.nodes[stack.index()].kind else {
            return None;
        };
        let a = a.to_string();
        let types: Vec<&TensorType> = match body.ty(stack)? {
            Type::Tensor(t) => vec![t],
            Type::Tuple(ts) => ts.iter().filter_map(|t| t.as_tensor()).collect(),
        };
        let first = types.first()?;
        let stacked = crate::ir::resolve_dim(&first.shape, d).ok() == Some(0);
        let split_by_a = types.iter().any(|t| {
            t.shape
                .iter()
                .any(|x| x.splits.iter().any(|s| s.as_str() == a))
        });
        let own = self.kernel.grid_axes.contains(&a)
            || self.kernel.loop_axes.contains(&a)
            || self.whole.contains(&a);
        (stacked && split_by_a && !own && !self.in_kernel.contains(&stack)).then_some(a)
    }

    /// A user-reducer fold over the stack dimension of a stored `collection[a](…)` of tiles:
    /// a loop over `a`, each step loading the stack's entry `c_a` with that tile's offsets
    /// along `a` (the layout the storing kernel wrote) and folding it into the state.
    fn stack_fold(
        &mut self,
        id: NodeId,
        stack: NodeId,
        a: String,
        def: &ReducerDef,
    ) -> Result<Val, (NodeId, String)> {
        let body = &self.ctx.f.body;
        let node = &body.nodes[id.index()];
        let ExprKind::Reduce { reducer, .. } = &node.kind else {
            return Err((id, "a malformed fold".into()));
        };
        let (types, is_tuple) = field_types(body.ty(stack)).map_err(|m| (id, m.to_string()))?;
        let level = self.level_of(id);
        let states = self.fold_states(level, id, reducer)?;
        // Offsets along `a` are defined inside this loop only: uses there are not the
        // undefined reads `tile_axes_used` looks for.
        let a_read_before = self.tile_axes_used.borrow().contains(&a);
        self.open_element_loop();
        let coord = format!("c_{a}");
        let here = self.inner.len().checked_sub(1);
        self.axis_offsets_from(&a, &coord, here);
        let mut args = state_vals(&states);
        for (i, t) in types.iter().enumerate() {
            let mut dims = self.dims_of(t);
            if dims.is_empty() {
                return Err((id, "a stack of rank 0".into()));
            }
            dims[0] = BlockDim {
                len: "1".into(),
                offs: format!("({coord} + tl.arange(0, 1))"),
                mask: None,
                name: None,
            };
            let entry = if is_tuple {
                self.load_field((stack, i), t, dims.clone(), id)?
            } else {
                self.load(stack, dims.clone(), id)?
            };
            let (x, _) = entry.tile().map_err(|m| (id, m))?;
            let item = self.tmp("item");
            self.line(true, format!("{item} = tl.sum({x}, axis=0)"));
            args.push(Val::Tile {
                expr: item,
                dims: dims[1..].to_vec(),
            });
        }
        let exprs = self.next_states(id, def, args)?;
        self.assign_states(&states, exprs);
        // Other axes read in the loop stay recorded; `a` only if read outside it before.
        if !a_read_before {
            self.tile_axes_used.borrow_mut().remove(&a);
        }
        self.close_element_loop(id, level, format!("for {coord} in range(0, EXT_{a}):"))?;
        Ok(fold_result(node.ty.as_ref(), states))
    }

    /// Opens a loop whose body is collected as if in a loop of its own (no axis: no value
    /// lives in it by `level_of`) and written by `close_element_loop`.
    fn open_element_loop(&mut self) {
        self.inner.push(Loop {
            axis: String::new(),
            lines: Vec::new(),
            memo: HashMap::new(),
        });
    }

    /// Writes the loop `open_element_loop` opened at `level`, under `header`.
    fn close_element_loop(
        &mut self,
        id: NodeId,
        level: Option<usize>,
        header: String,
    ) -> Result<(), (NodeId, String)> {
        let Some(Loop { lines, .. }) = self.inner.pop() else {
            return Err((id, "loop state lost".into()));
        };
        self.line_at(level, header);
        for l in lines {
            self.line_at(level, format!("    {l}"));
        }
        Ok(())
    }

    /// The next fold state: reducer `def` inlined on the state and item values `args`.
    fn next_states(
        &mut self,
        id: NodeId,
        def: &ReducerDef,
        args: Vec<Val>,
    ) -> Result<Vec<String>, (NodeId, String)> {
        let next = match self.inline_reducer(def, args).map_err(|m| (id, m))? {
            Val::Tuple(v) => v,
            t => vec![t],
        };
        next.iter()
            .map(|v| v.tile().map(|(e, _)| e.to_string()).map_err(|m| (id, m)))
            .collect()
    }

    /// Emits, outside the loop over `a`, every value below `n` that does not vary along `a`.
    fn outside_operands(&mut self, n: NodeId, a: &str) -> Result<(), (NodeId, String)> {
        let body = &self.ctx.f.body;
        let mut seen = BTreeSet::new();
        let mut stack = vec![n];
        let mut outside = Vec::new();
        while let Some(c) = stack.pop() {
            if !seen.insert(c) {
                continue;
            }
            // Values along `a`, or along the axis of a loop not open yet (a nested fold's
            // operands), are computed inside; their operands may still be hoisted.
            let unopened =
                self.kernel.loop_axes.iter().any(|l| {
                    varies_along(body.ty(c), l) && !self.inner.iter().any(|o| &o.axis == l)
                });
            // A collection fold over `a` (replicated along it) goes before the loop whole.
            let folds_a = crate::lower::collection_fold_axis(body, c).is_some_and(|x| x == a);
            if (varies_along(body.ty(c), a) || unopened) && !folds_a {
                if self.ctx.g.load_base[c.index()].is_none() {
                    stack.extend(body.nodes[c.index()].kind.operands());
                }
            } else {
                outside.push(c);
            }
        }
        outside.sort();
        for c in outside {
            self.value(c)?;
        }
        Ok(())
    }

    /// A reducer body on tiles, inline.
    fn inline_reducer(&mut self, def: &ReducerDef, args: Vec<Val>) -> Result<Val, String> {
        let b = &def.body;
        let mut vals: Vec<Option<Val>> = vec![None; b.nodes.len()];
        for (p, a) in b.params.iter().zip(args) {
            vals[p.index()] = Some(a);
        }
        for (i, node) in b.nodes.iter().enumerate() {
            if vals[i].is_some() {
                continue;
            }
            let ops: Vec<Val> = node
                .kind
                .operands()
                .iter()
                .map(|o| vals[o.index()].clone().ok_or("reducer operand missing"))
                .collect::<Result<_, _>>()?;
            let v = self.op(&node.kind, ops, node.annot.as_ref(), &dim_position)?;
            let v = match v {
                Val::Tile { expr, dims } if !is_simple(&expr) => {
                    let name =
                        self.tmp(&node.name.clone().map(|n| ident(&n)).unwrap_or("r".into()));
                    self.line(true, format!("{name} = {expr}"));
                    Val::Tile { expr: name, dims }
                }
                v => v,
            };
            vals[i] = Some(v);
        }
        let results: Vec<Val> = b
            .results
            .iter()
            .map(|r| vals[r.index()].clone().ok_or("reducer result missing"))
            .collect::<Result<_, _>>()?;
        Ok(if results.len() == 1 {
            results.into_iter().next().unwrap_or(Val::Tuple(vec![]))
        } else {
            Val::Tuple(results)
        })
    }

    fn op(
        &mut self,
        kind: &ExprKind,
        vals: Vec<Val>,
        ty: Option<&Type>,
        resolve: &dyn Fn(&DimRef, &[BlockDim]) -> Option<usize>,
    ) -> Result<Val, String> {
        let tile = |i: usize| -> Result<(String, Vec<BlockDim>), String> {
            let (e, d) = vals.get(i).ok_or("missing operand")?.tile()?;
            Ok((e.to_string(), d.to_vec()))
        };
        Ok(match kind {
            // A scalar where it is one (a literal, a rank-0 constant), broadcast by its readers;
            // a block of its shape otherwise, which a reduction can reduce.
            ExprKind::Constant(v) if !matches!(ty, Some(Type::Tensor(t)) if !t.shape.is_empty()) => {
                Val::Tile {
                    expr: float_lit(*v),
                    dims: vec![],
                }
            }
            ExprKind::Constant(v) | ExprKind::Fill(v) => {
                let Some(Type::Tensor(t)) = ty else {
                    return Err("fill without a type".into());
                };
                let dims = self.dims_of(t);
                let lens: Vec<String> = dims.iter().map(|d| d.len.clone()).collect();
                Val::Tile {
                    expr: format!(
                        "tl.full([{}], {}, tl.float32)",
                        lens.join(", "),
                        float_lit(*v)
                    ),
                    dims,
                }
            }
            ExprKind::Iota(d) => {
                // Read whole in the kernel (no view): each element's index along `d`, from
                // the offsets of that block dimension, broadcast over the others.
                let Some(Type::Tensor(t)) = ty else {
                    return Err("iota without a type".into());
                };
                let dims = self.dims_of(t);
                let i = resolve(d, &dims).ok_or("iota of an unknown dimension")?;
                let lens: Vec<String> = dims.iter().map(|d| d.len.clone()).collect();
                Val::Tile {
                    expr: format!(
                        "tl.broadcast_to(({}){}.to(tl.float32), [{}])",
                        dims[i].offs,
                        index_for(dims.len(), i),
                        lens.join(", ")
                    ),
                    dims,
                }
            }
            ExprKind::Broadcast(..) => {
                let Some(Type::Tensor(t)) = ty else {
                    return Err("broadcast without a type".into());
                };
                let (x, xd) = tile(0)?;
                let dims = self.dims_of(t);
                let lens: Vec<String> = dims.iter().map(|d| d.len.clone()).collect();
                // Right-aligned: the operand's dimensions are the result's last ones (a size-1
                // one is a block of 1 that `broadcast_to` stretches); new leading ones are
                // `None` indices. A scalar (perhaps a Python literal) is added to zeros.
                let extra = dims
                    .len()
                    .checked_sub(xd.len())
                    .ok_or("a broadcast to a lower rank")?;
                let expr = if xd.is_empty() {
                    format!("(tl.zeros([{}], tl.float32) + ({x}))", lens.join(", "))
                } else {
                    let x = if extra == 0 {
                        x
                    } else {
                        let kept = vec![":"; xd.len()].join(", ");
                        format!("({x})[{}{kept}]", "None, ".repeat(extra))
                    };
                    format!("tl.broadcast_to({x}, [{}])", lens.join(", "))
                };
                Val::Tile { expr, dims }
            }
            ExprKind::Tuple(_) => Val::Tuple(vals),
            ExprKind::Get(field, _) => {
                let i = match field {
                    FieldRef::Index(i) => *i,
                    FieldRef::Name(_) => return Err("a named field outside a reducer".into()),
                };
                match vals.into_iter().next() {
                    Some(Val::Tuple(v)) => v.get(i).cloned().ok_or("field out of range")?,
                    _ => return Err("get on a tile".into()),
                }
            }
            ExprKind::Unary(u, _) => {
                let (x, dims) = tile(0)?;
                let expr = match u {
                    UnaryOp::Exp => format!("tl.exp({x})"),
                    UnaryOp::Log => format!("tl.log({x})"),
                    UnaryOp::Sqrt => format!("tl.sqrt({x})"),
                    UnaryOp::Rsqrt => format!("tl.rsqrt({x})"),
                    UnaryOp::Reciprocal => format!("(1.0 / {x})"),
                    UnaryOp::Neg => format!("(-{x})"),
                    UnaryOp::Abs => format!("tl.abs({x})"),
                    UnaryOp::Tanh => format!("(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)"),
                    UnaryOp::Sigmoid => format!("tl.sigmoid({x})"),
                    UnaryOp::Silu => format!("({x} * tl.sigmoid({x}))"),
                    UnaryOp::Gelu => {
                        format!("(0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476)))")
                    }
                    UnaryOp::Square => format!("({x} * {x})"),
                };
                Val::Tile { expr, dims }
            }
            ExprKind::Binary(b, _, _) => {
                let ((x, dx), (y, dy)) = (tile(0)?, tile(1)?);
                let dims = broadcast(&[&dx, &dy]);
                let expr = match b {
                    BinaryOp::Add => format!("({x} + {y})"),
                    BinaryOp::Subtract => format!("({x} - {y})"),
                    BinaryOp::Multiply => format!("({x} * {y})"),
                    BinaryOp::Divide => format!("({x} / {y})"),
                    BinaryOp::Maximum => format!("tl.maximum({x}, {y})"),
                    BinaryOp::Minimum => format!("tl.minimum({x}, {y})"),
                    BinaryOp::Pow => format!("tl.exp({y} * tl.log({x}))"),
                    BinaryOp::Less => format!("({x} < {y})"),
                    BinaryOp::LessEqual => format!("({x} <= {y})"),
                    BinaryOp::Greater => format!("({x} > {y})"),
                    BinaryOp::GreaterEqual => format!("({x} >= {y})"),
                    BinaryOp::Equal => format!("({x} == {y})"),
                    BinaryOp::NotEqual => format!("({x} != {y})"),
                    BinaryOp::And => format!("({x} & {y})"),
                    BinaryOp::Or => format!("({x} | {y})"),
                };
                Val::Tile { expr, dims }
            }
            ExprKind::Select(..) => {
                let ((c, dc), (x, dx), (y, dy)) = (tile(0)?, tile(1)?, tile(2)?);
                Val::Tile {
                    expr: format!("tl.where({c}, {x}, {y})"),
                    dims: broadcast(&[&dc, &dx, &dy]),
                }
            }
            ExprKind::Cast(d, _) => {
                let (x, dims) = tile(0)?;
                let expr = match d {
                    DType::BF16 | DType::F16 => {
                        format!("{x}.to({}).to(tl.float32)", dtype_tl(*d))
                    }
                    DType::F32 => format!("{x}.to(tl.float32)"),
                    DType::I32 => format!("{x}.to(tl.int32)"),
                    DType::I1 => format!("({x} != 0)"),
                };
                Val::Tile { expr, dims }
            }
            ExprKind::Transpose(perm, _) => {
                let (x, dims) = tile(0)?;
                let new: Vec<BlockDim> = perm
                    .iter()
                    .map(|p| dims.get(*p).cloned().ok_or("bad permutation"))
                    .collect::<Result<_, _>>()?;
                let expr = if perm.as_slice() == [1, 0] {
                    format!("tl.trans({x})")
                } else {
                    format!(
                        "tl.permute({x}, ({}))",
                        perm.iter().map(|p| format!("{p},")).collect::<String>()
                    )
                };
                Val::Tile { expr, dims: new }
            }
            ExprKind::TileMatMul { .. } | ExprKind::MatMul { .. } => {
                let ((a, da), (b, db)) = (tile(0)?, tile(1)?);
                let r = da.len();
                if r < 2 || db.len() != r {
                    return Err("a matrix product of operands with different ranks".into());
                }
                let a = match &da[r - 1].mask {
                    Some(m) => format!("tl.where({m}{}, {a}, 0.0)", index_for(r, r - 1)),
                    None => a,
                };
                let b = match &db[r - 2].mask {
                    Some(m) => format!("tl.where({m}{}, {b}, 0.0)", index_for(r, r - 2)),
                    None => b,
                };
                let mut dims: Vec<BlockDim> = da[..r - 1].to_vec();
                dims.push(db[r - 1].clone());
                let (m, k, n) = (&da[r - 2].len, &da[r - 1].len, &db[r - 1].len);
                if [m, k, n].iter().any(|l| l.as_str() == "1") {
                    // `tl.dot` needs 16 rows, columns and depth (a decode step has one query
                    // row, batched or not): multiply broadcast operands and sum over the
                    // depth instead.
                    let expand_a = format!("[{}None]", ":, ".repeat(r));
                    let expand_b = format!("[{}None, :, :]", ":, ".repeat(r - 2));
                    return Ok(Val::Tile {
                        expr: format!("tl.sum(({a}){expand_a} * ({b}){expand_b}, axis={})", r - 1),
                        dims,
                    });
                }
                // Operands in the program's dtype (bf16 feeds tensor cores); f32 under the
                // interpreter, whose bf16 dot is wrong.
                let opts = self.ctx.opts;
                let (a, b) = match self.dot_dtypes.take() {
                    _ if opts.interpret => (a, b),
                    _ if opts.dot_bf16 => (
                        format!("{a}.to(tl.bfloat16)"),
                        format!("{b}.to(tl.bfloat16)"),
                    ),
                    Some((x, y)) if x == y && x != DType::F32 => (
                        format!("{a}.to({})", dtype_tl(x)),
                        format!("{b}.to({})", dtype_tl(y)),
                    ),
                    _ => (a, b),
                };
                for len in [m, k, n] {
                    if let Some(name) = len.strip_prefix("P_") {
                        self.ctx.dot_padded.borrow_mut().insert(name.to_string());
                    }
                }
                let expr = if r == 2 {
                    format!("tl.dot({a}, {b}, out_dtype=tl.float32)")
                } else {
                    // Leading dimensions batch: one 3-d `tl.dot` over their product.
                    let batch: Vec<&str> = da[..r - 2].iter().map(|d| d.len.as_str()).collect();
                    let batch_len = batch.join(" * ");
                    let out_shape: Vec<&str> = batch
                        .iter()
                        .copied()
                        .chain([m.as_str(), n.as_str()])
                        .collect();
                    format!(
                        "tl.reshape(tl.dot(tl.reshape({a}, ({batch_len}, {m}, {k})), tl.reshape({b}, ({batch_len}, {k}, {n})), out_dtype=tl.float32), ({}))",
                        out_shape.join(", ")
                    )
                };
                Val::Tile { expr, dims }
            }
            ExprKind::Reduce {
                over: ReduceOver::Axis(d),
                reducer,
                keep_dims,
                ..
            } => {
                let parts = match reducer {
                    ReducerRef::Builtin(r) => vec![*r],
                    ReducerRef::User(n) => self
                        .ctx
                        .module
                        .reducer(n)
                        .and_then(ReducerDef::as_product)
                        .ok_or("a reducer body folding a tile dimension with another user reducer is not lowered yet")?,
                };
                // A product of built-in reducers reduces each field of its tuple on its own.
                let fields: Vec<&Val> = match vals.first() {
                    Some(Val::Tuple(fs)) => fs.iter().collect(),
                    Some(v) => vec![v],
                    None => return Err("missing operand".into()),
                };
                if fields.len() != parts.len() {
                    return Err("a reducer whose arity differs from its operand's".into());
                }
                let mut out = Vec::new();
                for (v, r) in fields.into_iter().zip(parts) {
                    let (x, dims) = v.tile()?;
                    let i = resolve(d, dims).ok_or("a reduction over an unknown dimension")?;
                    if r == BuiltinReducer::Mul {
                        self.ctx.uses_product.set(true);
                    }
                    out.push(reduce_tile(x, dims, i, r, *keep_dims)?);
                }
                if matches!(ty, Some(Type::Tuple(_))) {
                    Val::Tuple(out)
                } else {
                    out.pop().ok_or("missing operand")?
                }
            }
            ExprKind::Partition(..) | ExprKind::Replicate(..) => {
                return Err("a view of a value computed in the kernel".into())
            }
            ExprKind::Combination(..) | ExprKind::Collection(..) => {
                return Err("a store read inside its own kernel".into())
            }
            other => return Err(format!("`{}` is not lowered yet", other.op_name())),
        })
    }

    /// Stores an output of the kernel: a tensor, or each field of a tuple to its own buffer.
    fn store(&mut self, o: NodeId) -> Result<(), (NodeId, String)> {
        self.stored.insert(o);
        let body = &self.ctx.f.body;
        let node = &body.nodes[o.index()];
        let axes = store_axes(body, o);
        let level = (0..self.inner.len())
            .rev()
            .find(|i| axes.contains(&self.inner[*i].axis));
        let (fields, is_tuple) =
            field_types(node.ty.as_ref()).map_err(|m| (o, format!("a stored value: {m}")))?;
        // Peel stores: combination chains and a collection.
        let mut cur = o;
        let mut leading = None;
        loop {
            match &body.nodes[cur.index()].kind {
                ExprKind::Combination(_, _, x) => cur = *x,
                ExprKind::Collection(a, x) if leading.is_none() && cur == o => {
                    leading = Some(*a);
                    cur = *x;
                }
                _ => break,
            }
        }
        let v = self.value(cur)?;
        let vals = match v {
            Val::Tuple(vs) if is_tuple => vs,
            Val::Tile { .. } if !is_tuple => vec![v],
            _ => return Err((o, "a stored value whose shape differs from its type".into())),
        };
        if vals.len() != fields.len() {
            return Err((o, "a stored tuple with a different number of fields".into()));
        }
        for (i, (v, t)) in vals.iter().zip(&fields).enumerate() {
            let (expr, dims) = v.tile().map_err(|e| (o, e))?;
            let (expr, dims) = (expr.to_string(), dims.to_vec());
            let want = t.shape.len() - usize::from(leading.is_some());
            let mut dims = dims;
            while dims.len() < want {
                dims.insert(
                    0,
                    BlockDim {
                        len: "1".into(),
                        offs: "tl.arange(0, 1)".into(),
                        mask: None,
                        name: None,
                    },
                );
            }
            if dims.len() != want {
                return Err((
                    o,
                    "a stored tile whose rank differs from the tensor's".into(),
                ));
            }
            let lens: Vec<String> = dims.iter().map(|d| d.len.clone()).collect();
            let addr = self.address(
                (o, i),
                &t.shape,
                &dims,
                leading.as_ref().map(|a| format!("c_{a}")),
            )?;
            // Triton has no 0-d blocks: a scalar is stored as the scalar.
            let value = if lens.is_empty() {
                format!("({expr}).to({})", dtype_tl(t.dtype))
            } else {
                format!(
                    "tl.broadcast_to({expr}, [{}]).to({})",
                    lens.join(", "),
                    dtype_tl(t.dtype)
                )
            };
            match mask_all(&dims) {
                Some(m) => self.line_at(level, format!("tl.store({addr}, {value}, mask={m})")),
                None => self.line_at(level, format!("tl.store({addr}, {value})")),
            }
        }
        Ok(())
    }
}

/// Axes combined inside kernel `k` (a `combination` whose result is still tiled). The kernel
/// computes all their tiles at once, as one block spanning the dimension: the same value as
/// long as nothing between the views and the combination depends on the tiling. Reductions
/// and product contractions across the split dimension cannot occur there (the verifier
/// types their results partial, which no combination accepts); a fold or collection over the
/// axis, a reshape or broadcast of its tiles, or a dimension split twice is refused.
fn whole_axes(f: &Function, k: &Kernel) -> Result<BTreeSet<String>, (NodeId, String)> {
    let body = &f.body;
    let mut whole = BTreeSet::new();
    for id in &k.nodes {
        if let ExprKind::Combination(_, a, _) = &body.node(*id).kind {
            if tiled(body.ty(*id)) {
                whole.insert(a.to_string());
            }
        }
    }
    for id in &k.nodes {
        let node = body.node(*id);
        for a in &whole {
            let over_axis = match &node.kind {
                ExprKind::Reduce {
                    over: ReduceOver::Parallel(p),
                    ..
                }
                | ExprKind::Collection(p, _) => p == a,
                ExprKind::Reshape(..) | ExprKind::Broadcast(..) => has_axis(node.ty.as_ref(), a),
                _ => false,
            };
            let split_twice = match node.ty.as_ref() {
                Some(Type::Tensor(t)) => t
                    .shape
                    .iter()
                    .any(|d| d.splits.len() > 1 && d.splits.iter().any(|s| s == a)),
                _ => false,
            };
            if over_axis || split_twice {
                return Err((
                    *id,
                    format!(
                        "work across the tiles of axis `{a}`, which the kernel combines inside itself, is not lowered yet"
                    ),
                ));
            }
        }
    }
    Ok(whole)
}

/// The position of a dimension among a tile's blocks (names are the program's dimension names).
fn dim_position(d: &DimRef, dims: &[BlockDim]) -> Option<usize> {
    match d {
        DimRef::Index(i) => Some(*i),
        DimRef::Name(n) => dims.iter().position(|b| b.name.as_deref() == Some(n)),
    }
}

fn is_simple(e: &str) -> bool {
    e.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        || e.starts_with("float(")
}

/// Whether a value of type `t` differs between coordinates of axis `a`: partitioned or
/// partial along it. A value replicated along `a` is the same at every coordinate, so a
/// kernel computes (and loads) it once, outside a loop over `a`.
fn varies_along(t: Option<&Type>, a: &str) -> bool {
    match t {
        Some(Type::Tensor(t)) => t.par.0.get(a).is_some_and(|k| *k != ParKind::Replicate),
        Some(Type::Tuple(ts)) => ts.iter().any(|t| varies_along(Some(t), a)),
        None => false,
    }
}

fn has_axis(t: Option<&Type>, a: &str) -> bool {
    match t {
        Some(Type::Tensor(t)) => t.par.0.contains_key(a),
        Some(Type::Tuple(ts)) => ts.iter().any(|t| has_axis(Some(t), a)),
        None => false,
    }
}

/// The folds among `pending` that `n`'s operands depend on, transitively.
fn fold_deps(body: &Body, n: NodeId, pending: &[NodeId]) -> Vec<NodeId> {
    let mut seen = vec![false; body.nodes.len()];
    let mut stack: Vec<NodeId> = body.nodes[n.index()].kind.operands();
    let mut out = Vec::new();
    while let Some(c) = stack.pop() {
        if std::mem::replace(&mut seen[c.index()], true) {
            continue;
        }
        if pending.contains(&c) {
            out.push(c);
        }
        stack.extend(body.nodes[c.index()].kind.operands());
    }
    out
}
