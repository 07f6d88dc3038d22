//! Fold loops that skip fully masked key tiles, as the plan's `LoopSkip` describes them
//! (`lower::mask`).
//!
//! Each program computes the bounds of the ranges it visits once, before the loop (from its
//! grid coordinates, the block sizes and the sizes), and writes one `for` loop per range,
//! all carrying the same fold state, in ascending order. The body is written twice: with the
//! masked selects (ranges of tiles that may be partly masked) and, where some range's tiles
//! are surely kept entirely, with each select replaced by the operand it keeps and the values
//! only the mask reads left out.

use super::kernel::{KernelEmitter, Val};
use super::names::p2_name;
use crate::ir::{DimBase, NodeId};
use crate::lower::mask::{IExpr, LoopSkip};
use crate::lower::plan::PlannedKernel;
use crate::lower::walk::Step;

type WResult<T = ()> = Result<T, (NodeId, String)>;

impl KernelEmitter<'_, '_> {
    /// Writes steps `from..to` of the plan, a skipping loop as its ranges.
    pub(super) fn steps(&mut self, pk: &PlannedKernel, from: usize, to: usize) -> WResult {
        let mut i = from;
        while i < to {
            match pk.skips.iter().find(|s| s.open == i) {
                Some(skip) if skip.close < to => {
                    self.skipping_loop(pk, skip)?;
                    i = skip.close + 1;
                }
                _ => {
                    let s = pk
                        .steps
                        .get(i)
                        .ok_or((NodeId(0), "a step past the plan's".to_string()))?;
                    self.step(s)?;
                    i += 1;
                }
            }
        }
        Ok(())
    }

    fn skipping_loop(&mut self, pk: &PlannedKernel, skip: &LoopSkip) -> WResult {
        let Some(Step::CloseLoop { axis, level }) = pk.steps.get(skip.close) else {
            return Err((NodeId(0), "a skipping loop that does not close".into()));
        };
        let level = *level;
        let inits = self.recent_inits.clone();
        let (masked, group) = self.loop_body(pk, skip, false)?;
        let unmasked = if skip.visits.segments.iter().any(|s| !s.masked) {
            self.recent_inits = inits;
            Some(self.loop_body(pk, skip, true)?.0)
        } else {
            None
        };
        self.line_at(
            level,
            format!("# the tiles of `{axis}` the mask may keep, ascending; tiles it keeps entirely unmasked"),
        );
        let mut locals = Vec::new();
        for e in &skip.visits.lets {
            let name = self.tmp(&format!("b_{axis}"));
            let text = self.bound(e, &locals);
            self.line_at(level, format!("{name} = {text}"));
            locals.push(name);
        }
        for s in &skip.visits.segments {
            let (lo, hi) = (self.bound(&s.lo, &locals), self.bound(&s.hi, &locals));
            let (lines, note) = match (&unmasked, s.masked) {
                (Some(u), false) => (u, "fully kept: no mask"),
                _ => (&masked, "masked"),
            };
            self.line_at(
                level,
                format!("for c_{axis} in range({lo}, {hi}):  # {note}"),
            );
            for l in lines.clone() {
                self.line_at(level, format!("    {l}"));
            }
        }
        self.after_loop(axis, level, group)
    }

    /// The loop's body (its `OpenLoop` up to its `CloseLoop`, exclusive), with the masked
    /// selects or, `unmasked`, each as the operand it keeps.
    fn loop_body(
        &mut self,
        pk: &PlannedKernel,
        skip: &LoopSkip,
        unmasked: bool,
    ) -> WResult<(Vec<String>, Vec<NodeId>)> {
        let saved = (self.unmasked.clone(), self.mask_only.clone());
        if unmasked {
            self.unmasked.extend(skip.selects.iter().copied());
            self.mask_only.extend(skip.mask_only.iter().copied());
        }
        let r = match pk.steps.get(skip.open) {
            Some(open) => self
                .step(open)
                .and_then(|()| self.steps(pk, skip.open + 1, skip.close)),
            None => Err((NodeId(0), "a skipping loop that does not open".into())),
        };
        (self.unmasked, self.mask_only) = saved;
        r?;
        let group = self.loop_groups.pop().unwrap_or_default();
        let lines = self
            .inner
            .pop()
            .ok_or((NodeId(0), "loop state lost".to_string()))?
            .lines;
        Ok((lines, group))
    }

    /// A masked select in a fully kept tile: the operand it keeps, on the select's block.
    pub(super) fn kept(&mut self, id: NodeId, kept: NodeId) -> WResult<Val> {
        let v = self.lookup(kept)?;
        let Some(crate::ir::Type::Tensor(t)) = self.ctx.f.body.ty(id).cloned() else {
            return Ok(v);
        };
        let dims = self.dims_of(&t);
        let (x, xd) = v.tile().map_err(|m| (id, m))?;
        if xd.iter().map(|d| &d.len).eq(dims.iter().map(|d| &d.len)) {
            return Ok(v);
        }
        let lens: Vec<String> = dims.iter().map(|d| d.len.clone()).collect();
        Ok(Val::Tile {
            expr: format!("(tl.zeros([{}], tl.float32) + ({x}))", lens.join(", ")),
            dims,
        })
    }

    /// A bound as Python: integer scalars of the program.
    fn bound(&self, e: &IExpr, locals: &[String]) -> String {
        let two = |a: &IExpr, b: &IExpr| (self.bound(a, locals), self.bound(b, locals));
        match e {
            IExpr::Const(v) if *v < 0 => format!("({v})"),
            IExpr::Const(v) => v.to_string(),
            IExpr::Coord(a) => self.grid_coordinate(a),
            IExpr::Block(a) => format!("BLOCK_{a}"),
            IExpr::Padded(d) => p2_name(d),
            IExpr::Tiles(a) => format!("EXT_{a}"),
            // Every `where` binding is a kernel argument under its own name.
            IExpr::Size(DimBase::Sym(d)) => d.to_string(),
            IExpr::Size(DimBase::Lit(n)) => n.to_string(),
            IExpr::Size(DimBase::Extent(a)) => format!("EXT_{a}"),
            IExpr::Local(i) => locals.get(*i).cloned().unwrap_or_else(|| "0".into()),
            IExpr::Add(a, b) => {
                let (a, b) = two(a, b);
                format!("({a} + {b})")
            }
            IExpr::Sub(a, b) => {
                let (a, b) = two(a, b);
                format!("({a} - {b})")
            }
            IExpr::Mul(k, x) if **k == IExpr::Const(-1) => format!("(-{})", self.bound(x, locals)),
            IExpr::Mul(a, b) => {
                let (a, b) = two(a, b);
                format!("({a} * {b})")
            }
            IExpr::Div(a, b) => {
                let (a, b) = two(a, b);
                format!("({a} // {b})")
            }
            IExpr::Min(a, b) => {
                let (a, b) = two(a, b);
                format!("tl.minimum({a}, {b})")
            }
            IExpr::Max(a, b) => {
                let (a, b) = two(a, b);
                format!("tl.maximum({a}, {b})")
            }
            IExpr::IfNonPositive(c, a, b) => {
                let c = self.bound(c, locals);
                let (a, b) = two(a, b);
                format!("tl.where({c} <= 0, {a}, {b})")
            }
        }
    }
}
