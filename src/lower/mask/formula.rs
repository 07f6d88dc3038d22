//! A mask as a formula over tile coordinates (docs/ir.md §7, "Recognising fully masked
//! tiles"), and the key tiles on which it may hold or surely holds.
//!
//! A mask is a boolean combination (`logical_and`, `logical_or`) of comparisons of *affine*
//! functions of `iota` indices with `i32` constants. Inside a kernel every index is one
//! block dimension of the masked tile: split by the loop axis (key tile `j` covers
//! `j·B … j·B + B − 1`), by a grid axis (the program's tile) or spanning a whole dimension
//! (`0 … P − 1`, P its padded block length). Dimensions are keyed by their position counted
//! from the right, which broadcasting preserves.
//!
//! Comparisons are normalised to `e <= 0` over integers (`a < b` is `a − b + 1 <= 0`, `a == b`
//! is two of them, `a != b` a disjunction of two), and the condition to disjunctive normal
//! form: an element is kept iff every atom of some term holds. Over one tile an affine `e`
//! takes its extremes at the tile's corners, so for each term the key tiles on which it *may*
//! hold (every atom's minimum `<= 0`) and those on which it *surely* holds (every atom's
//! maximum `<= 0`) are intervals of `j`, with bounds that depend on the program's coordinates
//! and the block sizes ([`IExpr`]). The tiles the mask may keep are the union of the terms'
//! intervals (an over-approximation: a tile is left out only when every term is provably false
//! on all of it); a tile in some term's sure interval is fully kept. Bounds are over the whole
//! block, padding included, so a tile left out is one whose select yields its fill everywhere,
//! and a select dropped in a fully kept tile changes no element.
//!
//! Limits: comparisons run in int32 in the generated code (indices are exact below 2^31), a
//! condition that is no such formula is *unknown* (it may hold anywhere, never surely), and a
//! formula of more than [`MAX_TERMS`] terms is not analysed.

use super::bounds::IExpr;
use crate::ir::*;
use crate::lower::walk::{blocks, Block};
use crate::lower::KernelGraph;
use std::collections::{BTreeMap, BTreeSet};

/// Terms past this are not analysed: each is a loop (three, with its fully kept part) in the
/// generated code.
pub const MAX_TERMS: usize = 4;

/// What one index (a block dimension of the masked tile) ranges over.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Var {
    /// Split by the loop axis.
    Loop,
    /// Split by a grid axis.
    Grid(String),
    /// A dimension one block spans.
    Whole(DimBase),
}

/// `Σ coef·index + Σ size_coef·size + constant`, indices keyed by their position from the
/// right. Size terms come from offsets written as reductions over whole dimensions: the last
/// key index `reduce iota[T] @max` is `T − 1`, a window `reduce fill[1] of W @add` is `W`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Affine {
    pub coef: BTreeMap<usize, i64>,
    pub sizes: BTreeMap<DimBase, i64>,
    pub constant: i64,
}

impl Affine {
    fn constant(c: i64) -> Affine {
        Affine {
            constant: c,
            ..Affine::default()
        }
    }

    fn index(pos: usize) -> Affine {
        Affine {
            coef: [(pos, 1)].into(),
            ..Affine::default()
        }
    }

    /// `k` times the size of `d` (a literal dimension folds into the constant).
    fn size(d: &DimBase, k: i64) -> Option<Affine> {
        Some(match d {
            DimBase::Lit(n) => Affine::constant(i64::try_from(*n).ok()?.checked_mul(k)?),
            d => Affine {
                sizes: [(d.clone(), k)].into(),
                ..Affine::default()
            },
        })
    }

    /// True when no index appears: the same value at every element.
    fn is_uniform(&self) -> bool {
        self.coef.is_empty()
    }

    fn scale(mut self, k: i64) -> Option<Affine> {
        for v in self.coef.values_mut().chain(self.sizes.values_mut()) {
            *v = v.checked_mul(k)?;
        }
        self.constant = self.constant.checked_mul(k)?;
        self.coef.retain(|_, v| *v != 0);
        self.sizes.retain(|_, v| *v != 0);
        Some(self)
    }

    fn plus(mut self, other: Affine, sign: i64) -> Option<Affine> {
        for (p, v) in other.coef {
            let e = self.coef.entry(p).or_insert(0);
            *e = e.checked_add(v.checked_mul(sign)?)?;
        }
        for (d, v) in other.sizes {
            let e = self.sizes.entry(d).or_insert(0);
            *e = e.checked_add(v.checked_mul(sign)?)?;
        }
        self.constant = self
            .constant
            .checked_add(other.constant.checked_mul(sign)?)?;
        self.coef.retain(|_, v| *v != 0);
        self.sizes.retain(|_, v| *v != 0);
        Some(self)
    }

    /// Its value at one assignment of the indices and sizes.
    pub fn at(&self, index: &dyn Fn(usize) -> i64, size: &dyn Fn(&DimBase) -> i64) -> i64 {
        let sizes = self
            .sizes
            .iter()
            .fold(self.constant, |s, (d, c)| s + c * size(d));
        self.coef.iter().fold(sizes, |s, (p, c)| s + c * index(*p))
    }

    /// The part without indices as an integer expression.
    fn uniform_part(&self) -> IExpr {
        self.sizes
            .iter()
            .fold(IExpr::c(self.constant), |e, (d, c)| {
                IExpr::plus(e, IExpr::times(IExpr::c(*c), IExpr::Size(d.clone())))
            })
    }
}

/// `e <= 0`, or a condition nothing is known about.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Atom {
    Le(Affine),
    Unknown,
}

/// A condition in disjunctive normal form: it holds iff every atom of some term holds (no
/// terms: never; an empty term: always).
pub type Dnf = Vec<Vec<Atom>>;

/// A mask over a tile: what each index ranges over and when an element is kept.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mask {
    pub vars: BTreeMap<usize, Var>,
    pub terms: Dnf,
}

/// The key tiles one term may keep, `[lo, hi)`, and those it surely keeps entirely,
/// `[full_lo, full_hi)` (`None`: none, whatever the program).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TermBounds {
    pub lo: IExpr,
    pub hi: IExpr,
    pub full: Option<(IExpr, IExpr)>,
}

fn and(a: Dnf, b: Dnf) -> Option<Dnf> {
    let mut out = Vec::new();
    for x in &a {
        for y in &b {
            let mut t = x.clone();
            for atom in y {
                if !t.contains(atom) {
                    t.push(atom.clone());
                }
            }
            out.push(t);
        }
    }
    (out.len() <= MAX_TERMS).then_some(out)
}

fn or(mut a: Dnf, b: Dnf) -> Option<Dnf> {
    for t in b {
        if !a.contains(&t) {
            a.push(t);
        }
    }
    (a.len() <= MAX_TERMS).then_some(a)
}

/// Drops atoms that always hold and terms with an atom that never does.
fn simplify(terms: Dnf) -> Dnf {
    let mut out: Dnf = Vec::new();
    for t in terms {
        let mut kept = Vec::new();
        let mut never = false;
        for a in t {
            match &a {
                Atom::Le(e) if e.coef.is_empty() && e.sizes.is_empty() => never |= e.constant > 0,
                _ => kept.push(a),
            }
        }
        if !never && !out.contains(&kept) {
            out.push(kept);
        }
    }
    out
}

/// Reads masks in one kernel, for a fold loop over `loop_axis`.
pub struct Analyzer<'a> {
    pub body: &'a Body,
    pub g: &'a KernelGraph,
    pub whole: &'a BTreeSet<String>,
    pub grid: &'a [String],
    pub loop_axis: &'a str,
}

/// The index positions met so far and what they range over; `None` once two disagree.
type Vars = Option<BTreeMap<usize, Var>>;

impl Analyzer<'_> {
    /// The mask an element of `select(cond, …)` is kept under: `cond`, or its negation when
    /// the fill is the select's second operand. `None`: not a mask of tile coordinates.
    pub fn mask(&self, cond: NodeId, negate: bool) -> Option<Mask> {
        let mut vars: Vars = Some(BTreeMap::new());
        let terms = self.formula(cond, None, negate, &mut vars)?;
        let vars = vars?;
        let terms = simplify(terms);
        // A term of unknowns only may hold on every tile and surely holds on none: the
        // mask says nothing.
        if terms
            .iter()
            .any(|t| !t.is_empty() && t.iter().all(|a| *a == Atom::Unknown))
        {
            return None;
        }
        Some(Mask { vars, terms })
    }

    fn ty(&self, n: NodeId) -> Option<&TensorType> {
        match self.body.ty(n) {
            Some(Type::Tensor(t)) => Some(t),
            _ => None,
        }
    }

    /// The blocks of a view of a constant expression, or `None` when `n` is no such view.
    fn view_blocks(&self, n: NodeId) -> Option<(NodeId, Vec<Block>)> {
        let base = self.g.load_base[n.index()]?;
        if !self.g.constant[base.index()] {
            return None;
        }
        let t = self.ty(n)?;
        // A dimension split twice has offsets this analysis does not model.
        if t.shape.iter().any(|d| d.splits.len() > 1) {
            return None;
        }
        Some((base, blocks(t, self.whole)))
    }

    fn formula(
        &self,
        n: NodeId,
        view: Option<&[Block]>,
        negate: bool,
        vars: &mut Vars,
    ) -> Option<Dnf> {
        let unknown = || Some(vec![vec![Atom::Unknown]]);
        if view.is_none() {
            if let Some((base, b)) = self.view_blocks(n) {
                return self.formula(base, Some(&b), negate, vars);
            }
        }
        match &self.body.node(n).kind {
            ExprKind::Binary(op @ (BinaryOp::And | BinaryOp::Or), a, b) => {
                let x = self.formula(*a, view, negate, vars)?;
                let y = self.formula(*b, view, negate, vars)?;
                // De Morgan: a negated `and` is an `or` of the negations.
                if (*op == BinaryOp::And) != negate {
                    and(x, y)
                } else {
                    or(x, y)
                }
            }
            ExprKind::Binary(op, a, b) => {
                use BinaryOp::*;
                let op = match (op, negate) {
                    (Less | LessEqual | Greater | GreaterEqual | Equal | NotEqual, false) => *op,
                    (Less, true) => GreaterEqual,
                    (LessEqual, true) => Greater,
                    (Greater, true) => LessEqual,
                    (GreaterEqual, true) => Less,
                    (Equal, true) => NotEqual,
                    (NotEqual, true) => Equal,
                    _ => return unknown(),
                };
                let (Some(x), Some(y)) = (self.affine(*a, view, vars), self.affine(*b, view, vars))
                else {
                    return unknown();
                };
                let Some(e) = x.plus(y, -1) else {
                    return unknown();
                };
                let neg = e.clone().scale(-1)?;
                let one = Affine::constant(1);
                let le = |e: Affine| Atom::Le(e);
                Some(match op {
                    LessEqual => vec![vec![le(e)]],
                    Less => vec![vec![le(e.plus(one, 1)?)]],
                    GreaterEqual => vec![vec![le(neg)]],
                    Greater => vec![vec![le(neg.plus(one, 1)?)]],
                    Equal => vec![vec![le(e), le(neg)]],
                    _ => vec![
                        vec![le(e.plus(one.clone(), 1)?)],
                        vec![le(neg.plus(one, 1)?)],
                    ],
                })
            }
            ExprKind::Constant(v) | ExprKind::Fill(v) => Some(if (*v != 0.0) != negate {
                vec![vec![]]
            } else {
                vec![]
            }),
            _ => unknown(),
        }
    }

    /// What index position `pos` (from the right) of a view with blocks `view` ranges over:
    /// `Ok(None)` for a dimension of one element (its index is 0).
    fn var(&self, view: &[Block], pos: usize, vars: &mut Vars) -> Option<Option<Var>> {
        let block = view.get(view.len().checked_sub(pos + 1)?)?;
        let var = match block {
            Block::One => return Some(None),
            Block::Split(a) if a == self.loop_axis => Var::Loop,
            Block::Split(a) if self.grid.contains(a) => Var::Grid(a.clone()),
            Block::Split(_) => return None,
            Block::Whole(d) => Var::Whole(d.clone()),
        };
        let map = vars.as_mut()?;
        match map.get(&pos) {
            Some(v) if *v != var => {
                *vars = None;
                return None;
            }
            _ => {}
        }
        // The loop axis at two positions: the bounds below read one loop index.
        if var == Var::Loop && map.iter().any(|(p, v)| *p != pos && *v == var) {
            *vars = None;
            return None;
        }
        map.insert(pos, var.clone());
        Some(Some(var))
    }

    fn affine(&self, n: NodeId, view: Option<&[Block]>, vars: &mut Vars) -> Option<Affine> {
        if view.is_none() {
            if let Some((base, b)) = self.view_blocks(n) {
                return self.affine(base, Some(&b), vars);
            }
        }
        match &self.body.node(n).kind {
            ExprKind::Constant(v) | ExprKind::Fill(v) => {
                let exact = v.fract() == 0.0 && v.abs() < (1u64 << 31) as f64;
                exact.then(|| Affine::constant(*v as i64))
            }
            // A replica holds the same values.
            ExprKind::Replicate(_, x) => self.affine(*x, view, vars),
            ExprKind::Reduce {
                input,
                over: ReduceOver::Axis(d),
                reducer: ReducerRef::Builtin(r),
                ..
            } => self.reduced(*input, d, *r),
            ExprKind::Iota(d) => {
                let view = view?;
                let t = self.ty(n)?;
                let i = resolve_dim(&t.shape, d).ok()?;
                let pos = t.shape.len() - 1 - i;
                match self.var(view, pos, vars)? {
                    None => Some(Affine::constant(0)),
                    Some(_) => Some(Affine::index(pos)),
                }
            }
            ExprKind::Binary(BinaryOp::Add, a, b) => self
                .affine(*a, view, vars)?
                .plus(self.affine(*b, view, vars)?, 1),
            ExprKind::Binary(BinaryOp::Subtract, a, b) => self
                .affine(*a, view, vars)?
                .plus(self.affine(*b, view, vars)?, -1),
            ExprKind::Binary(BinaryOp::Multiply, a, b) => {
                let x = self.affine(*a, view, vars)?;
                let y = self.affine(*b, view, vars)?;
                if x.coef.is_empty() {
                    y.scale(x.constant)
                } else if y.coef.is_empty() {
                    x.scale(y.constant)
                } else {
                    None
                }
            }
            ExprKind::Unary(UnaryOp::Neg, x) => self.affine(*x, view, vars)?.scale(-1),
            // Indices and offsets are integers: a cast between i32 and f32 keeps them.
            ExprKind::Cast(DType::I32 | DType::F32, x) => self.affine(*x, view, vars),
            _ => None,
        }
    }
}

impl Analyzer<'_> {
    /// A built-in reduction over a whole dimension of an affine value, when it is uniform
    /// (the same at every remaining index): `@max`/`@min` of `c·i + u` over `i` in
    /// `0 … N − 1` is `u` plus `c·(N − 1)` or 0 by the sign of `c`; `@add` of a uniform `u` is
    /// `N·u` for a constant `u`. Its indices are read apart from the mask's (the reduced index
    /// is no index of the result).
    fn reduced(&self, input: NodeId, d: &DimRef, r: BuiltinReducer) -> Option<Affine> {
        let t = self.ty(input)?;
        let i = resolve_dim(&t.shape, d).ok()?;
        let dim = t.shape.get(i)?;
        if !dim.splits.is_empty() || t.par.partitioner_of(i).is_some() {
            return None;
        }
        // A view splitting the reduced dimension reduces one tile of it, not all of it.
        if let Some((_, b)) = self.view_blocks(input) {
            if !matches!(b.get(i), Some(Block::Whole(_) | Block::One)) {
                return None;
            }
        }
        let mut inner: Vars = Some(BTreeMap::new());
        let x = self.affine(input, None, &mut inner)?;
        let pos = t.shape.len() - 1 - i;
        let c = x.coef.get(&pos).copied().unwrap_or(0);
        let mut rest = x.clone();
        rest.coef.remove(&pos);
        if !rest.is_uniform() {
            return None;
        }
        match r {
            BuiltinReducer::Max | BuiltinReducer::Min => {
                let towards_end = (c > 0) == (r == BuiltinReducer::Max);
                if c == 0 || !towards_end {
                    Some(rest)
                } else {
                    // c·(N − 1)
                    rest.plus(Affine::size(&dim.base, c)?, 1)?
                        .plus(Affine::constant(c), -1)
                }
            }
            BuiltinReducer::Add if c == 0 && rest.sizes.is_empty() => {
                Affine::size(&dim.base, rest.constant)
            }
            _ => None,
        }
    }
}

impl Mask {
    /// The key tiles each term may keep and surely keeps, for a loop over `loop_axis`.
    pub fn bounds(&self, loop_axis: &str) -> Vec<TermBounds> {
        let n = IExpr::Tiles(loop_axis.to_string());
        let block = IExpr::Block(loop_axis.to_string());
        self.terms
            .iter()
            .map(|t| {
                // Each atom bounds the term's ranges; with none, every tile.
                let mut lo: Option<IExpr> = None;
                let mut hi: Option<IExpr> = None;
                let mut full: Option<(Option<IExpr>, Option<IExpr>)> = Some((None, None));
                let tighten = |x: Option<IExpr>, y: IExpr, max: bool| {
                    Some(match x {
                        None => y,
                        Some(x) if max => IExpr::max(x, y),
                        Some(x) => IExpr::min(x, y),
                    })
                };
                for a in t {
                    let Atom::Le(e) = a else {
                        full = None;
                        continue;
                    };
                    let ((may_lo, may_hi), (sure_lo, sure_hi)) = self.atom_bounds(e, &n, &block);
                    if let Some(l) = may_lo {
                        lo = tighten(lo, l, true);
                    }
                    if let Some(h) = may_hi {
                        hi = tighten(hi, h, false);
                    }
                    full = full.map(|(l, h)| {
                        (
                            match sure_lo {
                                Some(s) => tighten(l, s, true),
                                None => l,
                            },
                            match sure_hi {
                                Some(s) => tighten(h, s, false),
                                None => h,
                            },
                        )
                    });
                }
                TermBounds {
                    lo: lo.unwrap_or(IExpr::c(0)),
                    hi: hi.unwrap_or_else(|| n.clone()),
                    full: full
                        .map(|(l, h)| (l.unwrap_or(IExpr::c(0)), h.unwrap_or_else(|| n.clone()))),
                }
            })
            .collect()
    }

    /// The range of an index other than the loop's over one program's tile.
    fn range(&self, v: &Var) -> (IExpr, IExpr) {
        match v {
            Var::Grid(a) => {
                let lo = IExpr::times(IExpr::Coord(a.clone()), IExpr::Block(a.clone()));
                let hi = IExpr::minus(
                    IExpr::plus(lo.clone(), IExpr::Block(a.clone())),
                    IExpr::c(1),
                );
                (lo, hi)
            }
            Var::Whole(d) => (
                IExpr::c(0),
                IExpr::minus(IExpr::Padded(d.clone()), IExpr::c(1)),
            ),
            Var::Loop => (IExpr::c(0), IExpr::c(0)),
        }
    }

    /// `([lo, hi), [full_lo, full_hi))` of `e <= 0` over key tiles; `None` where a side is
    /// not bounded (0, or the number of tiles).
    #[allow(clippy::type_complexity)]
    fn atom_bounds(
        &self,
        e: &Affine,
        n: &IExpr,
        block: &IExpr,
    ) -> (
        (Option<IExpr>, Option<IExpr>),
        (Option<IExpr>, Option<IExpr>),
    ) {
        let loop_pos = self
            .vars
            .iter()
            .find(|(_, v)| **v == Var::Loop)
            .map(|(p, _)| *p);
        let alpha = loop_pos.and_then(|p| e.coef.get(&p).copied()).unwrap_or(0);
        // The rest's extremes over the program's tile: each index at the end its sign picks.
        let mut rmin = e.uniform_part();
        let mut rmax = e.uniform_part();
        for (p, c) in &e.coef {
            if Some(*p) == loop_pos {
                continue;
            }
            let Some(v) = self.vars.get(p) else { continue };
            let (lo, hi) = self.range(v);
            let (at_min, at_max) = if *c > 0 { (lo, hi) } else { (hi, lo) };
            rmin = IExpr::plus(rmin, IExpr::times(IExpr::c(*c), at_min));
            rmax = IExpr::plus(rmax, IExpr::times(IExpr::c(*c), at_max));
        }
        let zero = IExpr::c(0);
        if alpha == 0 {
            let may = IExpr::if_non_positive(rmin, n.clone(), zero.clone());
            let sure = IExpr::if_non_positive(rmax, n.clone(), zero);
            return ((None, Some(may)), (None, Some(sure)));
        }
        let a = alpha.abs();
        let step = IExpr::times(IExpr::c(a), block.clone());
        // a·(B − 1): how far the loop index moves within one tile, scaled.
        let spread = IExpr::times(IExpr::c(a), IExpr::minus(block.clone(), IExpr::c(1)));
        if alpha > 0 {
            // min over tile j: a·j·B + rmin <= 0; max: a·(j·B + B − 1) + rmax <= 0.
            let hi =
                IExpr::floor_div_plus_one_clamped(IExpr::minus(zero.clone(), rmin), step.clone());
            let full_hi = IExpr::floor_div_plus_one_clamped(
                IExpr::minus(IExpr::minus(zero, rmax), spread),
                step,
            );
            (
                (None, Some(IExpr::min(hi, n.clone()))),
                (None, Some(IExpr::min(full_hi, n.clone()))),
            )
        } else {
            // min: −a·(j·B + B − 1) + rmin <= 0; max: −a·j·B + rmax <= 0.
            let lo = IExpr::ceil_div_clamped(IExpr::minus(rmin, spread), step.clone());
            let full_lo = IExpr::ceil_div_clamped(rmax, step);
            ((Some(lo), None), (Some(full_lo), None))
        }
    }

    /// Whether the mask keeps the element at these indices (positions from the right).
    pub fn holds(&self, index: &dyn Fn(usize) -> i64, size: &dyn Fn(&DimBase) -> i64) -> bool {
        self.terms.iter().any(|t| {
            t.iter().all(|a| match a {
                Atom::Le(e) => e.at(index, size) <= 0,
                Atom::Unknown => true,
            })
        })
    }
}
