//! Whether folding a fully masked tile leaves a fold's state unchanged, so that the loop may
//! skip the tile.
//!
//! The fold's item is computed in the loop body from the masked selects and from values the
//! mask does not touch (loads, values computed before the loop, other tiles' data). In a tile
//! the mask removes entirely every masked select is its fill; the item is then what the body
//! computes from those fills, with the other values *free*. The rule:
//!
//! - a built-in reducer (or a product of built-ins) skips the tile when the masked item is the
//!   reducer's identity in every element (`-inf` for `@max`, `0` for `@add`, …): then
//!   `state ∘ item = state` for every state;
//! - another user reducer skips it when its update on the masked item returns the state it was
//!   given, for every *reachable* state: states obtained by folding, from `init`, random items
//!   the body computes from random data under random masks (all kept, all removed, row by row,
//!   element by element). The rolling reducers repair fusion generates pass: a state whose
//!   running maximum is `-inf` has folded only masked elements, so its sums are 0, and
//!   `exp(-inf − shift) = 0` adds nothing.
//!
//! Both are checked by evaluating the body and the reducer in the reference interpreter, at
//! small sizes (every dimension symbol at most 4, every axis extent 1), on free values drawn at
//! three scales: a sampled check, as repair fusion's. What it assumes: that free values are
//! finite (inputs are; a running maximum read from an earlier fold is `-inf` only on a row
//! every key of which is masked, whose softmax is NaN in the source). A fold that fails keeps
//! visiting every tile: slower, still correct.

use crate::interp::{Interpreter, Rng, Sizes, Tensor, TiledTensor, Value};
use crate::ir::*;
use crate::lower::plan::FoldKind;
use crate::lower::{stack_of, KernelGraph};
use crate::verify::typing::{reducer_body_types, TypeEnv};
use crate::verify::ModuleInfo;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

/// Sequences of random items folded from `init`; each state they pass through is checked.
const SEQUENCES: u64 = 18;
/// Masked items drawn for a built-in reducer.
const BUILTIN_SAMPLES: u64 = 12;
/// Free values are drawn at these scales (large ones make `exp` underflow).
const SCALES: [f32; 3] = [1.0, 30.0, 1000.0];
/// A tensor past this many elements at the small sizes is not sampled: no skipping.
const MAX_ELEMENTS: usize = 1 << 14;

/// The scalar a constant expression is everywhere, if it is one: a literal, a fill, a view of
/// one, a negated one.
pub fn constant_value(body: &Body, g: &KernelGraph, n: NodeId) -> Option<f64> {
    match &body.node(n).kind {
        ExprKind::Constant(v) | ExprKind::Fill(v) => Some(*v),
        ExprKind::Unary(UnaryOp::Neg, x) => constant_value(body, g, *x).map(|v| -v),
        ExprKind::Partition(..) | ExprKind::Replicate(..) => {
            constant_value(body, g, g.load_base[n.index()]?)
        }
        _ => None,
    }
}

/// What the loop body is, for one fold.
pub struct Problem<'a> {
    pub f: &'a Function,
    pub info: &'a ModuleInfo,
    pub g: &'a KernelGraph,
    /// Values computed inside the loop.
    pub in_loop: &'a BTreeSet<NodeId>,
    /// The masked selects and their fills.
    pub masked: &'a BTreeMap<NodeId, f64>,
    pub fold: NodeId,
    pub kind: FoldKind,
}

/// An input of the item's program.
#[derive(Clone, Debug)]
enum Leaf {
    Masked(f64),
    Free,
}

/// The item as a program of the masked selects and the free values.
struct ItemProgram {
    func: Function,
    leaves: Vec<(Leaf, Type)>,
}

fn cache() -> &'static Mutex<HashMap<u64, bool>> {
    static CACHE: OnceLock<Mutex<HashMap<u64, bool>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

fn function(name: &str, body: Body) -> Function {
    Function {
        name: name.into(),
        name_span: Default::default(),
        bindings: Vec::new(),
        body,
        comment: None,
        schedule: None,
    }
}

impl Problem<'_> {
    /// Whether a fully masked tile leaves the fold's state unchanged (see the module doc).
    pub fn holds(&self) -> bool {
        let Some((item, input, over, reducer)) = self.fold_parts() else {
            return false;
        };
        let Some(program) = self.item_program(item) else {
            return false;
        };
        let mut key = std::collections::hash_map::DefaultHasher::new();
        for n in &program.func.body.nodes {
            format!("{:?}{:?}", n.kind, n.ty).hash(&mut key);
        }
        format!("{:?}{:?}{:?}", program.leaves, self.kind, reducer).hash(&mut key);
        if let ReducerRef::User(r) = &reducer {
            if let Some(def) = self.info.reducer(r) {
                for n in &def.body.nodes {
                    format!("{:?}", n.kind).hash(&mut key);
                }
                format!("{:?}", def.init).hash(&mut key);
            }
        }
        format!(
            "{:?}{:?}",
            self.body().ty(self.fold),
            self.sizes().0.iter().collect::<BTreeMap<_, _>>()
        )
        .hash(&mut key);
        let key = key.finish();
        if let Some(v) = cache().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return *v;
        }
        let verdict = self
            .check(&program, input, &over, &reducer)
            .unwrap_or(false);
        cache()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, verdict);
        verdict
    }

    fn body(&self) -> &Body {
        &self.f.body
    }

    /// The item folded each iteration, the fold's input and what it folds over.
    fn fold_parts(&self) -> Option<(NodeId, NodeId, ReduceOver, ReducerRef)> {
        let body = self.body();
        let ExprKind::Reduce {
            input,
            over,
            reducer,
            ..
        } = &body.node(self.fold).kind
        else {
            return None;
        };
        let item = match self.kind {
            FoldKind::Loop => *input,
            FoldKind::Collection => match &body.node(stack_of(body, *input)).kind {
                ExprKind::Collection(_, x) => *x,
                _ => return None,
            },
            _ => return None,
        };
        Some((item, *input, over.clone(), reducer.clone()))
    }

    fn depends(&self, n: NodeId, memo: &mut HashMap<NodeId, bool>) -> bool {
        if let Some(v) = memo.get(&n) {
            return *v;
        }
        let v = self.masked.contains_key(&n)
            || (self.in_loop.contains(&n)
                && self
                    .body()
                    .node(n)
                    .kind
                    .operands()
                    .into_iter()
                    .any(|o| self.depends(o, memo)));
        memo.insert(n, v);
        v
    }

    /// The item's computation from the masked selects (inputs), constants and free values
    /// (inputs); `None` when it does not depend on a masked select.
    fn item_program(&self, item: NodeId) -> Option<ItemProgram> {
        let body = self.body();
        let mut memo = HashMap::new();
        if !self.depends(item, &mut memo) {
            return None;
        }
        let mut nb = Body::default();
        let mut map: HashMap<NodeId, NodeId> = HashMap::new();
        let mut leaves = Vec::new();
        // Post-order over the item's operands.
        let mut stack = vec![(item, false)];
        while let Some((n, expanded)) = stack.pop() {
            if map.contains_key(&n) {
                continue;
            }
            let node = body.node(n);
            let ty = node.ty.clone()?;
            let inner = !self.masked.contains_key(&n) && self.depends(n, &mut memo);
            if inner && !expanded {
                stack.push((n, true));
                for o in node.kind.operands() {
                    stack.push((o, false));
                }
                continue;
            }
            let new = if inner {
                let ops: Vec<NodeId> = node
                    .kind
                    .operands()
                    .iter()
                    .map(|o| map.get(o).copied())
                    .collect::<Option<_>>()?;
                nb.push(Node {
                    kind: node.kind.with_operands(&ops),
                    name: None,
                    annot: node.annot.clone(),
                    span: Default::default(),
                    ty: Some(ty),
                })
            } else if let (false, Some(v)) = (
                self.masked.contains_key(&n),
                constant_value(body, self.g, n),
            ) {
                let scalar = Type::Tensor(TensorType::new(DType::F32, vec![]));
                nb.push(Node {
                    kind: ExprKind::Constant(v),
                    name: None,
                    annot: Some(scalar.clone()),
                    span: Default::default(),
                    ty: Some(scalar),
                })
            } else {
                let leaf = match self.masked.get(&n) {
                    Some(fill) => Leaf::Masked(*fill),
                    None => Leaf::Free,
                };
                leaves.push((leaf, ty.clone()));
                let id = nb.push(Node {
                    kind: ExprKind::Input,
                    name: None,
                    annot: Some(ty.clone()),
                    span: Default::default(),
                    ty: Some(ty),
                });
                nb.params.push(id);
                id
            };
            map.insert(n, new);
        }
        nb.results = vec![*map.get(&item)?];
        Some(ItemProgram {
            func: function("item", nb),
            leaves,
        })
    }

    /// Small sizes: every dimension symbol at most 4, every axis extent 1.
    fn sizes(&self) -> Sizes {
        let mut sizes: HashMap<String, u64> = HashMap::new();
        for n in &self.body().nodes {
            let mut stack: Vec<&Type> = n.ty.iter().collect();
            while let Some(t) = stack.pop() {
                match t {
                    Type::Tensor(t) => {
                        for a in t.par.axes() {
                            sizes.insert(a.to_string(), 1);
                        }
                        for d in &t.shape {
                            for a in &d.splits {
                                sizes.insert(a.to_string(), 1);
                            }
                            if let DimBase::Extent(a) = &d.base {
                                sizes.insert(a.to_string(), 1);
                            }
                        }
                    }
                    Type::Tuple(ts) => stack.extend(ts),
                }
            }
        }
        for b in &self.f.bindings {
            sizes.insert(b.name.clone(), b.value.clamp(1, 4));
        }
        Sizes(sizes)
    }

    fn check(
        &self,
        program: &ItemProgram,
        input: NodeId,
        over: &ReduceOver,
        reducer: &ReducerRef,
    ) -> Option<bool> {
        let sizes = self.sizes();
        let module = Module {
            reducers: self.info.reducers().to_vec(),
            ..Module::default()
        };
        let interp = Interpreter::new(&module, sizes.clone());
        let sampler = Sampler {
            interp: &interp,
            sizes: &sizes,
            program,
        };
        let builtins: Option<Vec<BuiltinReducer>> = match reducer {
            ReducerRef::Builtin(r) => Some(vec![*r]),
            ReducerRef::User(n) => self.info.reducer(n)?.as_product(),
        };
        if let Some(parts) = builtins {
            for s in 0..BUILTIN_SAMPLES {
                let item =
                    sampler.item(0xb1_0000 + s, Pattern::AllMasked, SCALES[s as usize % 3])?;
                let fields = fields(item);
                if fields.len() != parts.len() {
                    return Some(false);
                }
                for (v, r) in fields.iter().zip(&parts) {
                    let t = v.dense()?;
                    let id = r.identity() as f32;
                    if !t.data.iter().all(|x| *x == id) {
                        return Some(false);
                    }
                }
            }
            return Some(true);
        }
        let ReducerRef::User(name) = reducer else {
            return None;
        };
        let def = self.info.reducer(name)?;
        let env = TypeEnv::new(self.info.reducers());
        let types = reducer_body_types(def, self.body().ty(input)?, over, &env).ok()?;
        let mut rb = def.body.clone();
        for (n, t) in rb.nodes.iter_mut().zip(types) {
            n.ty = Some(t);
        }
        let step_fn = function("step", rb);
        let (state_types, _) = crate::lower::walk::field_types(self.body().ty(self.fold)).ok()?;
        let init: Vec<Value> = state_types
            .iter()
            .zip(&def.init)
            .map(|(t, v)| {
                let shape = sizes.eval_shape(&t.shape).ok()?;
                Some(dense(DType::F32, Tensor::filled(shape, *v as f32).ok()?))
            })
            .collect::<Option<_>>()?;
        let step = |state: &[Value], item: Value| -> Option<Vec<Value>> {
            let mut params = state.to_vec();
            match item {
                Value::Tuple(fs) => params.extend(fs),
                t => params.push(t),
            }
            let out = interp.run(&step_fn, &params).ok()?.into_iter().next()?;
            Some(match out {
                Value::Tuple(fs) if def.state.len() > 1 || fs.len() == 1 => fs,
                v if def.state.len() == 1 => vec![v],
                _ => return None,
            })
        };
        let mut rng = Rng::new(0x6d61_736b);
        for seq in 0..SEQUENCES {
            let scale = SCALES[seq as usize % 3];
            let mut state = init.clone();
            for i in 0..=(1 + seq % 4) {
                // The masked item leaves this reachable state as it is …
                let masked = sampler.item(rng.next_u64(), Pattern::AllMasked, scale)?;
                let next = step(&state, masked)?;
                if next.len() != state.len()
                    || !next
                        .iter()
                        .zip(&state)
                        .all(|(a, b)| a.dense().zip(b.dense()).is_some_and(|(a, b)| same(a, b)))
                {
                    return Some(false);
                }
                // … and a random item leads to the next one.
                if i <= seq % 4 {
                    let pattern = Pattern::pick(&mut rng);
                    let item = sampler.item(rng.next_u64(), pattern, scale)?;
                    state = step(&state, item)?;
                }
            }
        }
        Some(true)
    }
}

fn fields(v: Value) -> Vec<Value> {
    match v {
        Value::Tuple(fs) => fs,
        t => vec![t],
    }
}

fn dense(dtype: DType, t: Tensor) -> Value {
    Value::Tensor(TiledTensor {
        dtype,
        axes: vec![],
        tiles: vec![Arc::new(t)],
    })
}

/// Equal up to rounding: NaN where the other is NaN, equal infinities.
fn same(a: &Tensor, b: &Tensor) -> bool {
    a.data.len() == b.data.len()
        && a.data.iter().zip(&b.data).all(|(x, y)| {
            (x.is_nan() && y.is_nan())
                || x == y
                || (x.is_finite()
                    && y.is_finite()
                    && (x - y).abs() <= 1e-5 * x.abs().max(y.abs()).max(1.0))
        })
}

/// Which elements of the masked selects an item has removed.
#[derive(Clone, Copy, Debug)]
enum Pattern {
    AllKept,
    AllMasked,
    /// Each row (all but the last dimension) all removed or all kept.
    Rows,
    /// Each row all removed, all kept, or element by element.
    MixedRows,
    Elements,
}

impl Pattern {
    fn pick(rng: &mut Rng) -> Pattern {
        [
            Pattern::AllKept,
            Pattern::AllMasked,
            Pattern::Rows,
            Pattern::MixedRows,
            Pattern::Elements,
        ][rng.below(5) as usize]
    }
}

struct Sampler<'a> {
    interp: &'a Interpreter<'a>,
    sizes: &'a Sizes,
    program: &'a ItemProgram,
}

impl Sampler<'_> {
    /// One item: the program on masked selects under `pattern` and random free values.
    fn item(&self, seed: u64, pattern: Pattern, scale: f32) -> Option<Value> {
        let mut inputs = Vec::new();
        for (i, (leaf, ty)) in self.program.leaves.iter().enumerate() {
            // Masked selects share one seed: selects of one shape get one pattern and values.
            let s = match leaf {
                Leaf::Masked(_) => seed,
                Leaf::Free => seed.wrapping_add(7919 * (i as u64 + 1)),
            };
            inputs.push(self.value(ty, leaf, &mut Rng::new(s), pattern, scale)?);
        }
        self.interp
            .run(&self.program.func, &inputs)
            .ok()?
            .into_iter()
            .next()
    }

    fn value(
        &self,
        ty: &Type,
        leaf: &Leaf,
        rng: &mut Rng,
        pattern: Pattern,
        scale: f32,
    ) -> Option<Value> {
        let t = match ty {
            Type::Tuple(ts) => {
                return ts
                    .iter()
                    .map(|t| self.value(t, leaf, rng, pattern, scale))
                    .collect::<Option<Vec<_>>>()
                    .map(Value::Tuple)
            }
            Type::Tensor(t) => t,
        };
        let shape = self.sizes.eval_shape(&t.shape).ok()?;
        let count: usize = shape.iter().product();
        if count > MAX_ELEMENTS {
            return None;
        }
        let row_len = shape.last().copied().unwrap_or(1).max(1);
        let mut row_mode = 0;
        let mut data = Vec::with_capacity(count);
        for i in 0..count {
            if i % row_len == 0 {
                row_mode = rng.below(3);
            }
            let x = match t.dtype {
                DType::I1 => rng.below(2) as f32,
                DType::I32 => rng.below(16) as f32,
                _ => rng.normal() as f32 * scale,
            };
            let removed = match (leaf, pattern) {
                (Leaf::Free, _) | (_, Pattern::AllKept) => false,
                (_, Pattern::AllMasked) => true,
                (_, Pattern::Rows) => row_mode == 0,
                (_, Pattern::MixedRows) => row_mode == 0 || (row_mode == 2 && rng.below(2) == 0),
                (_, Pattern::Elements) => rng.below(2) == 0,
            };
            data.push(match leaf {
                Leaf::Masked(fill) if removed => *fill as f32,
                _ => x,
            });
        }
        let mut tensor = Tensor { shape, data };
        tensor.round(t.dtype);
        Some(dense(t.dtype, tensor))
    }
}
