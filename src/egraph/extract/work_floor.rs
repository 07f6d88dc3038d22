//! The tensor-core floor of rank-bounded extraction's bound (`bound.rs`): a lower bound of
//! the time every completion spends multiplying matrices. A compute-bound program (causal
//! attention prefill) has a DRAM floor far below its estimate; without this floor no partial
//! program of it is ever pruned.
//!
//! The rank model (`crate::rank::model`) counts a product's work at its blocks, padding
//! included, times the loop iterations and programs that compute it, on tensor cores at the
//! bf16 rate (bf16/f16 operands of one dtype) or the tf32 rate (others), or on CUDA cores
//! (a block of one row, column or depth). A kernel's tensor-core time enters its estimate
//! through a maximum over resources, so a program's estimate is at least the sum over its
//! products of work / rate. A product's tile types name each dimension's full extent (a split
//! dimension's base is the whole dimension, and the grid and the folds visit every tile), so
//! its work is at least 2·|out|·depth at full extents whatever its blocks — a tile-level
//! product in a kernel, a tensor-level one, or one in a user reducer's body (typed at the
//! fold's items). A loop that skips the tiles a positional mask hides still visits every
//! position the mask shows: all work is scaled by the smallest fraction of positions the
//! e-graph's masks can leave visible ([`mask_fraction`]).
//!
//! Per class, L(c) = min over its e-nodes n of own(n) + max over n's operands k of L(k): the
//! classes along one path of a program are distinct and each is computed, so every program
//! of `c` does at least L(c), computed as the fixpoint reached from above (Bellman–Ford).
//! A product that may run on CUDA cores (a dimension of one element) counts nothing there.

use super::extract_graph::ExtractGraph;
use super::reach::class_tiled;
use crate::egraph::lang::Op;
use crate::ir::{DType, DimBase, DimRef, ExprKind, ReduceOver, ReducerRef, TensorType, Type};
use crate::lower::walk::{blocks, Block};
use crate::partition::dim_size;
use crate::rank::model::{product_unit, Unit};
use rustc_hash::FxHashMap;
use std::collections::BTreeSet;
use std::rc::Rc;

/// Tensor-core rates (flops per µs) the floor prices products at.
#[derive(Clone, Copy, Debug)]
pub(super) struct TensorRates {
    pub bf16: f64,
    pub tf32: f64,
    /// Rows a tensor-core product multiplies at least (fewer cost as many).
    pub min_rows: f64,
}

/// Most sweeps of the fixpoint (it settles within one per class on a program's longest path).
const MAX_ROUNDS: usize = 4096;
/// The largest mask evaluated (elements); a larger one withholds the floor.
const MAX_MASK_ELEMENTS: usize = 1 << 22;
/// Evaluation depth of a constant class.
const MAX_DEPTH: u32 = 48;

/// The least tensor-core time (µs) of any program computing all of `x`'s results.
pub(super) fn tensor_floor_us(x: &ExtractGraph, rates: TensorRates, masks: &Masks) -> f64 {
    if masks.global <= 0.0 {
        return 0.0;
    }
    let pricing = Pricing { x, rates, masks };
    let own: Vec<Vec<f64>> = x
        .nodes
        .iter()
        .enumerate()
        .map(|(c, ns)| {
            ns.iter()
                .map(|(n, kids)| pricing.own_us(c as u32, &n.op, kids))
                .collect()
        })
        .collect();
    // Bellman–Ford from above: at the fixpoint, L(c) ≤ own(n) + max L(k) for every e-node,
    // so by induction on a program's height L bounds every program; an iterate before it
    // does not, so a run that does not settle gives no floor.
    let mut floor = vec![f64::INFINITY; x.ids.len()];
    let mut settled = false;
    for _ in 0..=x.ids.len().min(MAX_ROUNDS) {
        let mut changed = false;
        for c in 0..floor.len() {
            let best = x.nodes[c]
                .iter()
                .zip(&own[c])
                .map(|((_, kids), o)| {
                    o + kids.iter().map(|k| floor[*k as usize]).fold(0.0, f64::max)
                })
                .fold(f64::INFINITY, f64::min);
            if best < floor[c] {
                floor[c] = best;
                changed = true;
            }
        }
        if !changed {
            settled = true;
            break;
        }
    }
    if !settled {
        return 0.0;
    }
    // A result without a finite program has no candidate anyway; it sets no floor.
    x.roots
        .iter()
        .map(|r| floor[*r as usize])
        .filter(|f| f.is_finite())
        .fold(0.0, f64::max)
}

fn tensor_of<'a>(x: &'a ExtractGraph, c: u32) -> Option<&'a TensorType> {
    match x.g.egraph[x.ids[c as usize]].data.as_ref() {
        Some(Type::Tensor(t)) => Some(t),
        _ => None,
    }
}

/// What prices a product: the rates, the masks that may skip its tiles, the e-graph's types.
struct Pricing<'a, 'x> {
    x: &'a ExtractGraph<'x>,
    rates: TensorRates,
    masks: &'a Masks,
}

impl Pricing<'_, '_> {
    /// Tensor-core time of e-node `op` of class `c` itself: its products at full extents.
    fn own_us(&self, c: u32, op: &Op, kids: &[u32]) -> f64 {
        let x = self.x;
        if x.constant[c as usize] {
            return 0.0;
        }
        match op {
            Op::MatMul(_) | Op::TileMatMul(_) => {
                match (
                    tensor_of(x, kids[0]),
                    tensor_of(x, kids[1]),
                    tensor_of(x, c),
                ) {
                    (Some(a), Some(b), Some(out)) => self.product_us(a, b, out),
                    _ => 0.0,
                }
            }
            Op::ReduceAxis {
                dim,
                reducer: ReducerRef::User(r),
                ..
            } => self.reducer_us(r, kids[0], ReduceOver::Axis(DimRef::Index(*dim))),
            Op::ReduceParallel {
                axis,
                reducer: ReducerRef::User(r),
            } => self.reducer_us(r, kids[0], ReduceOver::Parallel(*axis)),
            _ => 0.0,
        }
    }

    /// The products in one instance of user reducer `r` folding class `input`: each at its
    /// full extents (the fold's items are tiles of the whole folded dimension).
    fn reducer_us(&self, r: &str, input: u32, over: ReduceOver) -> f64 {
        let x = self.x;
        let env = &x.g.egraph.analysis.env;
        let (Some(def), Some(t)) = (
            env.reducer(r),
            x.g.egraph[x.ids[input as usize]].data.as_ref(),
        ) else {
            return 0.0;
        };
        let Ok(types) = crate::verify::typing::reducer_body_types(def, t, &over, env) else {
            return 0.0;
        };
        let tensor = |n: crate::ir::NodeId| match types.get(n.index()) {
            Some(Type::Tensor(t)) => Some(t),
            _ => None,
        };
        def.body
            .ids()
            .map(|n| match &def.body.node(n).kind {
                ExprKind::MatMul { a, b, .. } | ExprKind::TileMatMul { a, b, .. } => {
                    match (tensor(*a), tensor(*b), tensor(n)) {
                        (Some(a), Some(b), Some(out)) => self.product_us(a, b, out),
                        _ => 0.0,
                    }
                }
                _ => 0.0,
            })
            .sum()
    }

    /// 2·|out|·depth at full extents, at the rate of the operands' dtypes, times the least
    /// share of it a masked loop visits; 0 where a block may have one row, column or depth
    /// (CUDA cores).
    fn product_us(&self, a: &TensorType, b: &TensorType, out: &TensorType) -> f64 {
        let (ra, rb) = (a.shape.len(), b.shape.len());
        if ra < 2 || rb < 2 {
            return 0.0;
        }
        let one = |d: &crate::ir::Dim| matches!(d.base, DimBase::Lit(1));
        if one(&a.shape[ra - 2]) || one(&a.shape[ra - 1]) || one(&b.shape[rb - 1]) {
            return 0.0;
        }
        let bindings = &self.x.g.bindings;
        let size = |d: &crate::ir::Dim| dim_size(&d.base, bindings).unwrap_or(1.0).max(1.0);
        let flops = 2.0 * out.shape.iter().map(size).product::<f64>() * size(&a.shape[ra - 1]);
        // The model's own choice of unit (its dtype rule); a dimension of one element was
        // judged above for every set of whole axes, this sees none.
        let none = BTreeSet::new();
        let rate = match product_unit(a, b, &none) {
            Unit::TensorBf16 => self.rates.bf16,
            Unit::TensorTf32 => self.rates.tf32,
            _ => return 0.0,
        };
        let axis = |t: &TensorType, i: usize| blocks(t, &none).swap_remove(i);
        let dims = [axis(a, ra - 2), axis(a, ra - 1), axis(b, rb - 1)];
        flops / rate * self.masks.visited(&dims, self.rates.min_rows)
    }
}

/// The masks of the e-graph: the least fraction of positions any of them leaves visible
/// (`global`), and, for a single two-dimensional mask tiled along the same two axes
/// wherever it is read, the least fraction of a product's work a loop skipping its tiles
/// does at any blocks (`pair`).
pub(super) struct Masks {
    pub global: f64,
    pair: Option<PairMask>,
}

struct PairMask {
    /// The axes splitting the mask's dimensions 0 and 1.
    axes: [String; 2],
    /// The sizes of its dimensions, and each padded to a power of two (a whole block).
    bases: [DimBase; 2],
    tops: [f64; 2],
    /// (block along dimension 0, along dimension 1, fraction of the positions in the tiles
    /// with a visible position, the less of the two sides).
    visited: Vec<(f64, f64, f64)>,
}

impl Masks {
    /// The share of a product's work at least visited: `dims` are the blocks of its rows,
    /// depth and columns. The pair's table applies when each mask dimension is one of them:
    /// split by the axis that splits it in the mask's reads (any block of 16 or more: a
    /// `tl.dot` axis), or whole (one block of the padded size) with the same size symbol.
    fn visited(&self, dims: &[Block; 3], min_rows: f64) -> f64 {
        let Some(p) = &self.pair else {
            return self.global;
        };
        // Per mask dimension, the block each reading gives: (split, padded as rows).
        let readings = |i: usize| -> Vec<(bool, bool)> {
            dims.iter()
                .enumerate()
                .filter_map(|(d, b)| match b {
                    Block::Split(a) if *a == p.axes[i] => Some((true, d == 0)),
                    Block::Whole(base) if *base == p.bases[i] => Some((false, false)),
                    _ => None,
                })
                .collect()
        };
        let (r0, r1) = (readings(0), readings(1));
        if r0.is_empty() || r1.is_empty() {
            return self.global;
        }
        // The least work factor of dimension `i` at block `b` over its readings.
        let factor = |readings: &[(bool, bool)], b: f64, top: f64| {
            readings
                .iter()
                .filter_map(|&(split, row)| match (split, row) {
                    // Tensor cores multiply at least `min_rows` rows (rank::model pads them).
                    (true, true) => Some(b.max(min_rows) / b),
                    (true, false) => Some(1.0),
                    (false, _) => (b == top).then_some(1.0),
                })
                .fold(f64::INFINITY, f64::min)
        };
        p.visited
            .iter()
            .map(|&(b0, b1, f)| f * factor(&r0, b0, p.tops[0]) * factor(&r1, b1, p.tops[1]))
            .fold(f64::INFINITY, f64::min)
            .clamp(self.global, 1.0)
    }
}

impl Masks {
    /// A mask is the condition of a `select` that is a formula of `iota`s (`lower::mask`
    /// skips tiles only on those), traced through its views (`partition`, `replicate`,
    /// `broadcast`: the same fraction) to a tensor-level class, evaluated here. Its visible
    /// side is either side of the condition, so it shows at least min(true, false) of the
    /// positions; several masks together show at least 1 − Σ (1 − fraction) (each hides at
    /// most its share, whatever the alignment). `global` is 0 (no floor) where a mask cannot
    /// be evaluated.
    pub(super) fn of(x: &ExtractGraph) -> Masks {
        let none = Masks {
            global: 0.0,
            pair: None,
        };
        let formula = iota_formulas(x);
        let mut uses: Vec<(u32, Vec<Option<String>>)> = Vec::new();
        for ns in &x.nodes {
            for (n, kids) in ns {
                if matches!(n.op, Op::Select) && formula[kids[0] as usize] {
                    match mask_source(x, kids[0], 0) {
                        Some(u) => uses.push(u),
                        None => return none,
                    }
                }
            }
        }
        let mut sources: Vec<u32> = uses.iter().map(|u| u.0).collect();
        sources.sort_unstable();
        sources.dedup();
        let mut memo = FxHashMap::default();
        let mut hidden = 0.0;
        let mut values = Vec::new();
        for &s in &sources {
            let Some(v) = constant_values(x, s, 0, &mut memo) else {
                return none;
            };
            if v.is_empty() {
                return none;
            }
            let on = v.iter().filter(|e| **e != 0.0).count();
            hidden += 1.0 - on.min(v.len() - on) as f64 / v.len() as f64;
            values.push(v);
        }
        let global = (1.0 - hidden).max(0.0);
        // One mask of two dimensions, tiled along the same two axes by every read that
        // tiles both (a read tiling one splits nothing a skipping loop could pass over in the
        // other, but must name its axis alike).
        let mut axes: Option<[String; 2]> = None;
        for (_, a) in &uses {
            if let [Some(a0), Some(a1)] = a.as_slice() {
                let these = [a0.clone(), a1.clone()];
                if a0 == a1 || axes.as_ref().is_some_and(|seen| *seen != these) {
                    return Masks { global, pair: None };
                }
                axes = Some(these);
            }
        }
        let consistent = uses.iter().all(|(_, a)| {
            a.len() == 2
                && a.iter().enumerate().all(|(i, ai)| {
                    ai.as_ref()
                        .is_none_or(|ai| axes.as_ref().is_some_and(|p| p[i] == *ai))
                })
        });
        if !consistent {
            return Masks { global, pair: None };
        }
        let pair = match (axes, sources.as_slice(), values.as_slice()) {
            (Some(axes), [s], [v]) => match (class_shape(x, *s), tensor_of(x, *s)) {
                (Some(shape), Some(t)) if shape.len() == 2 => {
                    let top = |m: usize| m.max(16).next_power_of_two() as f64;
                    Some(PairMask {
                        axes,
                        bases: [t.shape[0].base.clone(), t.shape[1].base.clone()],
                        tops: [top(shape[0]), top(shape[1])],
                        visited: visited_tiles(v, shape[0], shape[1]),
                    })
                }
                _ => None,
            },
            _ => None,
        };
        Masks { global, pair }
    }
}

/// For each pair of power-of-two blocks of at least 16 (a `tl.dot` axis) up to each
/// dimension's padded size (one block: the dimension whole): the fraction of the positions that lie in tiles holding a
/// position of one side of mask `v` (`m0 × m1`, row-major), the less of the two sides.
fn visited_tiles(v: &[f32], m0: usize, m1: usize) -> Vec<(f64, f64, f64)> {
    let blocks = |m: usize| {
        let top = m.max(16).next_power_of_two();
        std::iter::successors(Some(16usize), move |b| (*b < top).then_some(b * 2))
            .collect::<Vec<_>>()
    };
    let total = (m0 * m1) as f64;
    let mut out = Vec::new();
    for b0 in blocks(m0) {
        // Per band of b0 rows, per column: whether a position of each side lies there.
        let bands = m0.div_ceil(b0);
        let mut any = vec![[false; 2]; bands * m1];
        for i in 0..m0 {
            for j in 0..m1 {
                let side = usize::from(v[i * m1 + j] != 0.0);
                any[(i / b0) * m1 + j][side] = true;
            }
        }
        for b1 in blocks(m1) {
            let mut area = [0.0f64; 2];
            for band in 0..bands {
                let rows = (m0 - band * b0).min(b0) as f64;
                for start in (0..m1).step_by(b1) {
                    let cols = &any[band * m1 + start..band * m1 + (start + b1).min(m1)];
                    for (side, a) in area.iter_mut().enumerate() {
                        if cols.iter().any(|c| c[side]) {
                            *a += rows * cols.len() as f64;
                        }
                    }
                }
            }
            out.push((b0 as f64, b1 as f64, area[0].min(area[1]) / total));
        }
    }
    out
}

/// Classes some e-node of which computes a formula of `iota`s and literals: pointwise
/// operators, views and layout changes of them, at any tiling.
fn iota_formulas(x: &ExtractGraph) -> Vec<bool> {
    let mut formula = vec![false; x.ids.len()];
    loop {
        let mut changed = false;
        for (c, ns) in x.nodes.iter().enumerate() {
            if formula[c] {
                continue;
            }
            let built = ns.iter().any(|(n, kids)| {
                let of_formulas = kids.iter().all(|k| formula[*k as usize]);
                match n.op {
                    Op::Iota(..) | Op::Constant(..) | Op::Fill(..) => true,
                    Op::Unary(_)
                    | Op::Binary(_)
                    | Op::Select
                    | Op::Cast(_)
                    | Op::Partition(..)
                    | Op::Replicate(_)
                    | Op::Broadcast(_)
                    | Op::Transpose(_)
                    | Op::Reshape(_) => of_formulas,
                    _ => false,
                }
            });
            if built {
                formula[c] = true;
                changed = true;
            }
        }
        if !changed {
            return formula;
        }
    }
}

/// The tensor-level class under the views of mask class `c`, and the axis splitting each
/// of its dimensions on the way (none at tensor level).
fn mask_source(x: &ExtractGraph, c: u32, depth: u32) -> Option<(u32, Vec<Option<String>>)> {
    if depth > MAX_DEPTH {
        return None;
    }
    for (n, kids) in &x.nodes[c as usize] {
        let below = match &n.op {
            Op::Partition(..) | Op::Replicate(_) | Op::Broadcast(_) => {
                mask_source(x, kids[0], depth + 1)
            }
            _ => continue,
        };
        let Some((source, mut axes)) = below else {
            continue;
        };
        if let Op::Partition(d, a) = &n.op {
            // The partitioned dimension of the operand, counted from the right (a
            // `broadcast` below adds dimensions on the left).
            // A dimension the broadcast added splits nothing of the mask.
            let rank = tensor_of(x, kids[0]).map_or(0, |t| t.shape.len());
            if let Some(at) = rank
                .checked_sub(*d)
                .and_then(|from_right| axes.len().checked_sub(from_right))
            {
                axes[at] = Some(a.to_string());
            }
        }
        return Some((source, axes));
    }
    if class_tiled(x, c) {
        return None;
    }
    let rank = tensor_of(x, c).map_or(0, |t| t.shape.len());
    Some((c, vec![None; rank]))
}

/// The sizes of tensor-level class `c`, when all are known and it is small enough.
fn class_shape(x: &ExtractGraph, c: u32) -> Option<Vec<usize>> {
    let t = tensor_of(x, c)?;
    if !t.par.is_empty() {
        return None;
    }
    let shape: Vec<usize> = t
        .shape
        .iter()
        .map(|d| match d.base {
            DimBase::Extent(_) => None,
            _ => dim_size(&d.base, &x.g.bindings).map(|s| s as usize),
        })
        .collect::<Option<_>>()?;
    (shape.iter().product::<usize>() <= MAX_MASK_ELEMENTS).then_some(shape)
}

type Values = Option<Rc<Vec<f32>>>;

/// The elements (row-major) of constant tensor-level class `c`, by the first e-node that
/// evaluates: `iota`, literals, pointwise operators, `select`, `cast` and `broadcast`.
fn constant_values(
    x: &ExtractGraph,
    c: u32,
    depth: u32,
    memo: &mut FxHashMap<u32, Values>,
) -> Values {
    if let Some(v) = memo.get(&c) {
        return v.clone();
    }
    // A class on a cycle evaluates through another e-node, or not at all.
    memo.insert(c, None);
    let v = if depth > MAX_DEPTH || class_tiled(x, c) || !x.constant[c as usize] {
        None
    } else {
        class_shape(x, c).and_then(|shape| {
            x.nodes[c as usize]
                .iter()
                .find_map(|(n, kids)| node_values(x, &n.op, kids, &shape, depth, memo))
                .map(Rc::new)
        })
    };
    memo.insert(c, v.clone());
    v
}

fn node_values(
    x: &ExtractGraph,
    op: &Op,
    kids: &[u32],
    shape: &[usize],
    depth: u32,
    memo: &mut FxHashMap<u32, Values>,
) -> Option<Vec<f32>> {
    let numel: usize = shape.iter().product();
    let mut operand = |k: u32| -> Option<Vec<f32>> {
        let v = constant_values(x, k, depth + 1, memo)?;
        broadcast_to(&v, &class_shape(x, k)?, shape)
    };
    match op {
        Op::Constant(bits, _) | Op::Fill(bits, _) => {
            Some(vec![f64::from_bits(*bits) as f32; numel])
        }
        Op::Iota(dim, _) => {
            let inner: usize = shape.get(dim + 1..)?.iter().product();
            let along = *shape.get(*dim)?;
            Some((0..numel).map(|i| ((i / inner) % along) as f32).collect())
        }
        Op::Unary(u) => {
            let f = crate::interp::unary_fn(*u);
            Some(operand(kids[0])?.into_iter().map(f).collect())
        }
        Op::Binary(b) => {
            let f = crate::interp::binary_fn(*b);
            let (l, r) = (operand(kids[0])?, operand(kids[1])?);
            Some(l.into_iter().zip(r).map(|(l, r)| f(l, r)).collect())
        }
        Op::Select => {
            let (c, a, b) = (operand(kids[0])?, operand(kids[1])?, operand(kids[2])?);
            Some(
                c.into_iter()
                    .zip(a.into_iter().zip(b))
                    .map(|(c, (a, b))| if c != 0.0 { a } else { b })
                    .collect(),
            )
        }
        Op::Cast(dt) => {
            let v = operand(kids[0])?;
            Some(match dt {
                DType::I1 => v.into_iter().map(|e| f32::from(e != 0.0)).collect(),
                DType::I32 => v.into_iter().map(f32::trunc).collect(),
                _ => v,
            })
        }
        Op::Broadcast(_) => operand(kids[0]),
        _ => None,
    }
}

/// `v` of shape `from` broadcast (NumPy-style, aligned from the right) to shape `to`.
fn broadcast_to(v: &[f32], from: &[usize], to: &[usize]) -> Option<Vec<f32>> {
    if from == to {
        return Some(v.to_vec());
    }
    if from.len() > to.len() {
        return None;
    }
    let pad = to.len() - from.len();
    // Strides of `from` seen from `to`'s dimensions: 0 where it broadcasts.
    let mut strides = vec![0usize; to.len()];
    let mut s = 1;
    for (i, &f) in from.iter().enumerate().rev() {
        let t = to[pad + i];
        if f == t {
            strides[pad + i] = s;
        } else if f != 1 {
            return None;
        }
        s *= f;
    }
    let numel: usize = to.iter().product();
    let mut out = Vec::with_capacity(numel);
    for i in 0..numel {
        let (mut rest, mut at) = (i, 0);
        for d in (0..to.len()).rev() {
            at += (rest % to[d]) * strides[d];
            rest /= to[d];
        }
        out.push(v[at]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egraph::extract::bound::tests::saturated;

    const RATES: TensorRates = TensorRates {
        bf16: 8.0e8,
        tf32: 4.0e8,
        min_rows: 64.0,
    };

    /// A causal 64 × 64 mask (2,080 positions shown, 2,016 hidden): at 16 × 16 blocks ten of
    /// the sixteen tiles hold a shown position (and ten a hidden one); one band of 64 rows
    /// holds both everywhere; one row per block would be the exact share.
    #[test]
    fn visited_tiles_count_the_tiles_holding_a_position_of_each_side() {
        let v: Vec<f32> = (0..64 * 64)
            .map(|i| f32::from(u8::from(i % 64 <= i / 64)))
            .collect();
        let table = visited_tiles(&v, 64, 64);
        let at = |b0: f64, b1: f64| {
            table
                .iter()
                .find(|e| e.0 == b0 && e.1 == b1)
                .map(|e| e.2)
                .expect("block pair in the table")
        };
        assert_eq!(at(16.0, 16.0), 10.0 / 16.0);
        assert_eq!(at(64.0, 16.0), 1.0);
        assert_eq!(at(64.0, 64.0), 1.0);
        // 32 × 16: per band of 32 rows, the first band holds shown positions in column blocks
        // 0–1 and hidden ones in all four; the second, shown in all four.
        assert_eq!(at(32.0, 16.0), (2.0 + 4.0) / 8.0);
    }

    /// Without masks the floor is a dense product's flops at the bf16 rate (bf16 operands).
    #[test]
    fn a_dense_product_is_floored_at_its_flops() {
        let g = saturated(
            "func f where M = 256, N = 512, K = 128 {
  a: tensor<MxK, bf16> = input
  b: tensor<KxN, bf16> = input
  return matmul(a, b) acc=f32
}
",
        );
        let x = ExtractGraph::new(&g).expect("extractable");
        let want = 2.0 * 256.0 * 512.0 * 128.0 / RATES.bf16;
        let got = tensor_floor_us(&x, RATES, &Masks::of(&x));
        assert!((got - want).abs() < 1e-9 * want, "{got} against {want}");
    }

    /// A causal mask lowers the floor of products in a loop over the keys to what a loop
    /// skipping its hidden tiles visits: at least the shown share of positions, less than
    /// all of them (f32 operands: the tf32 rate). Where the keys are a grid axis (no loop),
    /// nothing is skipped: `masked_scores` keeps its full product.
    #[test]
    fn a_causal_mask_scales_the_floor_by_the_share_a_skipping_loop_visits() {
        let weighted = saturated(
            "func f where Q = 256, K = 256, D = 64 {
  q: tensor<QxD, f32> = input
  k: tensor<KxD, f32> = input
  v: tensor<KxD, f32> = input
  row: tensor<QxK, i32> = iota[Q]
  col: tensor<QxK, i32> = iota[K]
  neg: tensor<f32> = constant -inf
  s = select(less_equal(col, row), matmul(q, transpose[1,0](k)), neg)
  return matmul(exp(s - 8.0), v)
}
",
        );
        let x = ExtractGraph::new(&weighted).expect("extractable");
        let masks = Masks::of(&x);
        let shown = (256.0 * 255.0 / 2.0) / (256.0 * 256.0);
        assert!((masks.global - shown).abs() < 1e-12, "{}", masks.global);
        let full = 2.0 * 2.0 * 256.0 * 256.0 * 64.0 / RATES.tf32;
        let got = tensor_floor_us(&x, RATES, &Masks::of(&x));
        assert!(
            got >= shown * full && got < full,
            "{got} outside [{}, {full})",
            shown * full
        );
        let masked_scores = saturated(
            "func f where Q = 256, K = 256, D = 64 {
  q: tensor<QxD, f32> = input
  k: tensor<KxD, f32> = input
  row: tensor<QxK, i32> = iota[Q]
  col: tensor<QxK, i32> = iota[K]
  neg: tensor<f32> = constant -inf
  return exp(select(less_equal(col, row), matmul(q, transpose[1,0](k)), neg))
}
",
        );
        let x = ExtractGraph::new(&masked_scores).expect("extractable");
        let full = 2.0 * 256.0 * 256.0 * 64.0 / RATES.tf32;
        assert!((tensor_floor_us(&x, RATES, &Masks::of(&x)) - full).abs() < 1e-12 * full);
    }

    /// A mask that cannot be evaluated (larger than the limit) withholds the floor.
    #[test]
    fn an_unevaluated_mask_gives_no_floor() {
        let g = saturated(
            "func f where Q = 4096, K = 4096, D = 64 {
  q: tensor<QxD, bf16> = input
  k: tensor<KxD, bf16> = input
  row: tensor<QxK, i32> = iota[Q]
  col: tensor<QxK, i32> = iota[K]
  neg: tensor<f32> = constant -inf
  return exp(select(less_equal(col, row), matmul(q, transpose[1,0](k)) acc=f32, neg))
}
",
        );
        let x = ExtractGraph::new(&g).expect("extractable");
        assert_eq!(tensor_floor_us(&x, RATES, &Masks::of(&x)), 0.0);
    }
}
