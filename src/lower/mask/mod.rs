//! Tile skipping for masked folds: a fold loop over key tiles visits only the tiles its mask
//! may keep, and masks only those it does not keep entirely (docs/lower.md, "Masked folds").
//!
//! - [`formula`]: a select's condition as a formula of tile coordinates, and for each of its
//!   terms the key tiles it may keep and those it surely keeps entirely ([`TermBounds`]);
//! - [`identity`]: whether a fully masked tile leaves the fold's state unchanged (the
//!   condition under which leaving it out is correct);
//! - [`bounds`]: the integer expressions of those bounds;
//! - this module: which loops of a kernel skip ([`LoopSkip`], planned once per kernel with
//!   its steps), the ranges each program iterates over ([`Visits`]), and the traffic and work
//!   of a plan counted over the visited tiles ([`plan_cost`]).

pub mod bounds;
pub mod cost;
pub mod formula;
pub mod identity;

pub use bounds::{Env, IExpr};
pub use cost::plan_cost;
pub use formula::{Mask, TermBounds};

use super::plan::{Fold, FoldKind};
use super::walk::Step;
use super::KernelGraph;
use crate::ir::*;
use crate::verify::ModuleInfo;
use std::collections::{BTreeMap, BTreeSet};

/// A fold loop that visits only the key tiles its mask may keep.
#[derive(Clone, Debug)]
pub struct LoopSkip {
    /// The loop axis.
    pub axis: String,
    /// The loop's `OpenLoop` and `CloseLoop` steps (indices into the kernel's steps).
    pub open: usize,
    pub close: usize,
    /// The mask of the selects below, over the loop's tiles.
    pub mask: Mask,
    /// The key tiles each of its terms may keep and surely keeps.
    pub terms: Vec<TermBounds>,
    /// The ranges a program iterates over, in order.
    pub visits: Visits,
    /// The masked selects, each with the operand it equals in a fully kept tile.
    pub selects: Vec<(NodeId, NodeId)>,
    /// Values only those selects' conditions read: not computed in fully kept tiles.
    pub mask_only: BTreeSet<NodeId>,
}

/// The ranges of the loop index one program iterates over, computed at the start of the
/// program: `lets` are evaluated in order (`IExpr::Local(i)` is the i-th), then the loop body
/// runs for `lo ≤ j < hi` of each segment in turn, with the masked selects or without.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Visits {
    pub lets: Vec<IExpr>,
    pub segments: Vec<Segment>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub lo: IExpr,
    pub hi: IExpr,
    /// Whether the tiles may be partly masked (the selects are written), or are surely kept
    /// entirely (each select is its kept operand).
    pub masked: bool,
}

impl Visits {
    /// The segments of one program, evaluated: `(lo, hi, masked)`.
    pub fn eval(&self, env: &dyn Env) -> Vec<(i64, i64, bool)> {
        let mut locals = Vec::with_capacity(self.lets.len());
        for e in &self.lets {
            let v = e.eval(env, &locals);
            locals.push(v);
        }
        self.segments
            .iter()
            .map(|s| (s.lo.eval(env, &locals), s.hi.eval(env, &locals), s.masked))
            .collect()
    }

    /// How many tiles one program visits.
    pub fn count(&self, env: &dyn Env) -> u64 {
        self.eval(env)
            .iter()
            .map(|(lo, hi, _)| (hi - lo).max(0) as u64)
            .sum()
    }

    /// How many of those tiles are in masked ranges (the selects are written there).
    pub fn masked_count(&self, env: &dyn Env) -> u64 {
        self.eval(env)
            .iter()
            .filter(|(.., masked)| *masked)
            .map(|(lo, hi, _)| (hi - lo).max(0) as u64)
            .sum()
    }

    /// The grid axes whose coordinates the ranges depend on.
    pub fn coords(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for e in &self.lets {
            e.coords(&mut out);
        }
        for s in &self.segments {
            s.lo.coords(&mut out);
            s.hi.coords(&mut out);
        }
        out
    }
}

/// The visiting order of the terms' ranges: every tile some term may keep once, in ascending
/// order (the fold's order), each term's surely kept tiles without the selects.
///
/// Terms whose range starts at 0 go first; the others are sorted at run time (compare and
/// exchange on their starts). A cursor past the tiles visited so far starts each range, so
/// overlapping ranges visit a tile once, under the first term that has it (with the selects
/// unless that term keeps it entirely).
pub fn visits(terms: &[TermBounds]) -> Visits {
    let mut v = Visits::default();
    let local = |v: &mut Visits, e: IExpr| -> IExpr {
        match e {
            IExpr::Const(_)
            | IExpr::Tiles(_)
            | IExpr::Block(_)
            | IExpr::Coord(_)
            | IExpr::Local(_) => e,
            e => {
                v.lets.push(e);
                IExpr::Local(v.lets.len() - 1)
            }
        }
    };
    let any_full = terms.iter().any(|t| t.full.is_some());
    let (first, rest): (Vec<&TermBounds>, Vec<&TermBounds>) =
        terms.iter().partition(|t| t.lo == IExpr::c(0));
    let sorted_from = first.len();
    let mut slots: Vec<[IExpr; 4]> = Vec::new();
    for t in first.into_iter().chain(rest) {
        let (fl, fh) = t.full.clone().unwrap_or((IExpr::c(0), IExpr::c(0)));
        slots.push([
            local(&mut v, t.lo.clone()),
            local(&mut v, t.hi.clone()),
            local(&mut v, fl),
            local(&mut v, fh),
        ]);
    }
    // A bubble sort network on the starts of the ranges that need not start at 0.
    let n = slots.len();
    for pass in sorted_from..n {
        for j in sorted_from..n.saturating_sub(1 + pass - sorted_from) {
            // lo[j+1] < lo[j]  ⇔  lo[j+1] + 1 − lo[j] <= 0: exchange.
            let c = local(
                &mut v,
                IExpr::minus(
                    IExpr::plus(slots[j + 1][0].clone(), IExpr::c(1)),
                    slots[j][0].clone(),
                ),
            );
            let (left, right) = slots.split_at_mut(j + 1);
            for (x, y) in left[j].iter_mut().zip(right[0].iter_mut()) {
                let (a, b) = (x.clone(), y.clone());
                *x = local(
                    &mut v,
                    IExpr::if_non_positive(c.clone(), b.clone(), a.clone()),
                );
                *y = local(&mut v, IExpr::if_non_positive(c.clone(), a, b));
            }
        }
    }
    let mut cursor: Option<IExpr> = None;
    let count = slots.len();
    for (i, [lo, hi, fl, fh]) in slots.into_iter().enumerate() {
        let lo_term = lo.clone();
        let start = match &cursor {
            None => lo,
            Some(c) => local(&mut v, IExpr::max(lo, c.clone())),
        };
        if any_full {
            // Where the sure range starts (ends) with the term's, its masked part before
            // (after) it is empty: said here so that no loop is written for it.
            let a = if fl == lo_term && cursor.is_none() {
                start.clone()
            } else {
                local(
                    &mut v,
                    IExpr::min(IExpr::max(fl, start.clone()), hi.clone()),
                )
            };
            let b = if fh == hi {
                hi.clone()
            } else {
                local(&mut v, IExpr::min(IExpr::max(fh, a.clone()), hi.clone()))
            };
            for (lo, hi, masked) in [
                (start, a.clone(), true),
                (a, b.clone(), false),
                (b, hi.clone(), true),
            ] {
                push_segment(&mut v, lo, hi, masked);
            }
        } else {
            push_segment(&mut v, start, hi.clone(), true);
        }
        if i + 1 < count {
            cursor = Some(match cursor {
                None => hi,
                Some(c) => local(&mut v, IExpr::max(c, hi)),
            });
        }
    }
    v
}

fn push_segment(v: &mut Visits, lo: IExpr, hi: IExpr, masked: bool) {
    if let (IExpr::Const(a), IExpr::Const(b)) = (&lo, &hi) {
        if a >= b {
            return;
        }
    }
    if lo == hi {
        return;
    }
    v.segments.push(Segment { lo, hi, masked });
}

/// What a kernel's skip planning reads.
pub(crate) struct KernelCx<'a> {
    pub f: &'a Function,
    pub info: &'a ModuleInfo,
    pub g: &'a KernelGraph,
    pub whole: &'a BTreeSet<String>,
    pub grid: &'a [String],
    pub outputs: &'a [NodeId],
    pub steps: &'a [Step],
    pub folds: &'a [Fold],
}

/// The loops of a kernel that skip fully masked tiles.
pub(crate) fn plan_skips(cx: &KernelCx) -> Vec<LoopSkip> {
    let mut out = Vec::new();
    let mut recent: Vec<NodeId> = Vec::new();
    let mut depth = 0usize;
    for (i, s) in cx.steps.iter().enumerate() {
        match s {
            Step::FoldInit { fold, .. } => recent.push(*fold),
            Step::OpenLoop { axis } => {
                let group = std::mem::take(&mut recent);
                if let Some(skip) = plan_loop(cx, i, depth, axis, &group) {
                    out.push(skip);
                }
                depth += 1;
            }
            Step::OpenElementLoop => {
                recent.clear();
                depth += 1;
            }
            Step::CloseLoop { .. } | Step::CloseElementLoop { .. } => {
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
    }
    out
}

/// The `CloseLoop` of the loop opened at step `open`.
fn matching_close(steps: &[Step], open: usize) -> Option<usize> {
    let mut d = 0usize;
    for (j, s) in steps.iter().enumerate().skip(open + 1) {
        match s {
            Step::OpenLoop { .. } | Step::OpenElementLoop => d += 1,
            Step::CloseLoop { .. } | Step::CloseElementLoop { .. } => {
                if d == 0 {
                    return matches!(s, Step::CloseLoop { .. }).then_some(j);
                }
                d -= 1;
            }
            _ => {}
        }
    }
    None
}

fn plan_loop(
    cx: &KernelCx,
    open: usize,
    depth: usize,
    axis: &str,
    group: &[NodeId],
) -> Option<LoopSkip> {
    let body = &cx.f.body;
    if group.is_empty() {
        return None;
    }
    let mut kinds = Vec::new();
    for fold in group {
        let kind = cx.folds.iter().find(|x| x.node == *fold)?.kind;
        if !matches!(kind, FoldKind::Loop | FoldKind::Collection) {
            return None;
        }
        kinds.push((*fold, kind));
    }
    let close = matching_close(cx.steps, open)?;
    // The body computes values in this loop (or deeper) and stores nothing: a store along
    // the axis would leave the skipped tiles unwritten.
    let mut in_loop = BTreeSet::new();
    for s in &cx.steps[open + 1..close] {
        let level = match s {
            Step::Store { .. } => return None,
            Step::Value { node, level } => {
                in_loop.insert(*node);
                *level
            }
            Step::FoldInit { level, .. }
            | Step::CloseLoop { level, .. }
            | Step::CloseElementLoop { level } => *level,
            _ => continue,
        };
        if level.is_none_or(|l| l < depth) {
            return None;
        }
    }
    let an = formula::Analyzer {
        body,
        g: cx.g,
        whole: cx.whole,
        grid: cx.grid,
        loop_axis: axis,
    };
    // Selects with a constant fill whose condition is a mask of tile coordinates.
    let mut candidates: Vec<(NodeId, NodeId, f64, Mask)> = Vec::new();
    for n in &in_loop {
        let ExprKind::Select(c, x, y) = body.node(*n).kind else {
            continue;
        };
        let (kept, fill, negate) = match (
            identity::constant_value(body, cx.g, y),
            identity::constant_value(body, cx.g, x),
        ) {
            (Some(fill), _) => (x, fill, false),
            (None, Some(fill)) => (y, fill, true),
            _ => continue,
        };
        if let Some(mask) = an.mask(c, negate) {
            candidates.push((*n, kept, fill, mask));
        }
    }
    let mut masks: Vec<&Mask> = Vec::new();
    for (.., m) in &candidates {
        if !masks.contains(&m) {
            masks.push(m);
        }
    }
    for mask in masks {
        let chosen: Vec<&(NodeId, NodeId, f64, Mask)> =
            candidates.iter().filter(|c| c.3 == *mask).collect();
        let masked: BTreeMap<NodeId, f64> = chosen.iter().map(|c| (c.0, c.2)).collect();
        let identity = kinds.iter().all(|(fold, kind)| {
            identity::Problem {
                f: cx.f,
                info: cx.info,
                g: cx.g,
                in_loop: &in_loop,
                masked: &masked,
                fold: *fold,
                kind: *kind,
            }
            .holds()
        });
        if !identity {
            continue;
        }
        let terms = mask.bounds(axis);
        let selects: Vec<(NodeId, NodeId)> = chosen.iter().map(|c| (c.0, c.1)).collect();
        return Some(LoopSkip {
            axis: axis.to_string(),
            open,
            close,
            mask: mask.clone(),
            visits: visits(&terms),
            terms,
            mask_only: mask_only(cx, &in_loop, &selects),
            selects,
        });
    }
    None
}

/// Values computed in the loop that only the selects' conditions read (directly or through
/// other such values).
fn mask_only(
    cx: &KernelCx,
    in_loop: &BTreeSet<NodeId>,
    selects: &[(NodeId, NodeId)],
) -> BTreeSet<NodeId> {
    let body = &cx.f.body;
    let mut users: BTreeMap<NodeId, Vec<(NodeId, usize)>> = BTreeMap::new();
    for (i, node) in body.nodes.iter().enumerate() {
        for (k, o) in node.kind.operands().into_iter().enumerate() {
            users.entry(o).or_default().push((NodeId(i as u32), k));
        }
    }
    let select_ids: BTreeSet<NodeId> = selects.iter().map(|s| s.0).collect();
    let mut only: BTreeSet<NodeId> = BTreeSet::new();
    loop {
        let before = only.len();
        for n in in_loop {
            if only.contains(n)
                || select_ids.contains(n)
                || cx.outputs.contains(n)
                || body.results.contains(n)
            {
                continue;
            }
            let us = users.get(n).map(Vec::as_slice).unwrap_or(&[]);
            let read_by_masks = !us.is_empty()
                && us
                    .iter()
                    .all(|(u, k)| (select_ids.contains(u) && *k == 0) || only.contains(u));
            if read_by_masks {
                only.insert(*n);
            }
        }
        if only.len() == before {
            return only;
        }
    }
}

#[cfg(test)]
mod tests;
