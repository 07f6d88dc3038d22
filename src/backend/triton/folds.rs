//! Folds: loops over the tiles of an axis with loop-carried state, loops over the elements
//! of a block or the entries of a stored stack, and the values hoisted out of them.

use super::kernel::{dim_position, index_for, is_simple, BlockDim, KernelEmitter, Loop, Val};
use super::names::{builtin_identity, float_lit};
use crate::ir::*;
use crate::lower::store_axes;
use crate::lower::walk::{field_types, fold_deps, stored_stack_axis, varies_along, Step};
use std::collections::{BTreeSet, HashMap};

/// Fold state variables and their blocks.
pub(super) type FoldStates = Vec<(String, Vec<BlockDim>)>;

/// The fold state variables as values (a reducer's first arguments).
pub(super) fn state_vals(states: &FoldStates) -> Vec<Val> {
    states
        .iter()
        .map(|(n, d)| Val::Tile {
            expr: n.clone(),
            dims: d.clone(),
        })
        .collect()
}

/// A fold's result: its state, a tuple when the fold's type is one.
pub(super) fn fold_result(ty: Option<&Type>, states: FoldStates) -> Val {
    let mut vals: Vec<Val> = states
        .into_iter()
        .map(|(n, d)| Val::Tile { expr: n, dims: d })
        .collect();
    match ty {
        Some(Type::Tuple(_)) => Val::Tuple(vals),
        _ => vals.pop().unwrap_or(Val::Tuple(vec![])),
    }
}

impl KernelEmitter<'_, '_> {
    /// Folds over loop axis `a`: `id` and every other pending fold over `a` that neither
    /// depends on a pending fold nor is needed by one, in one loop with loop-carried state.
    pub(super) fn fold_group(&mut self, id: NodeId, a: String) -> Result<Val, (NodeId, String)> {
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
                    let Some(def) = self.ctx.info.reducer(n) else {
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
            self.assign_states(*m, states, exprs);
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
    pub(super) fn fold_states(
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
            ReducerRef::User(n) => match self.ctx.info.reducer(n) {
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
        self.steps.push(Step::FoldInit { fold: id, level });
        Ok(states)
    }

    pub(super) fn open_loop(&mut self, a: &str) {
        self.inner.push(Loop {
            axis: a.to_string(),
            lines: Vec::new(),
            memo: HashMap::new(),
        });
        self.steps.push(Step::OpenLoop {
            axis: a.to_string(),
        });
        self.axis_offsets(a, true);
    }

    /// Closes the innermost loop (over `a`), writing it at `level`.
    pub(super) fn close_loop(
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
        self.steps.push(Step::CloseLoop {
            axis: a.to_string(),
            level,
        });
        Ok(())
    }

    /// New fold states, all evaluated before any is assigned (they read the old ones).
    pub(super) fn assign_states(
        &mut self,
        fold: NodeId,
        states: &[(String, Vec<BlockDim>)],
        next: Vec<String>,
    ) {
        self.steps.push(Step::FoldUpdate { fold });
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
    pub(super) fn collection_fold(
        &mut self,
        id: NodeId,
        a: String,
    ) -> Result<Val, (NodeId, String)> {
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
                let Some(def) = self.ctx.info.reducer(n) else {
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
        self.assign_states(id, &states, next);
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
    pub(super) fn sequential_fold(&mut self, id: NodeId) -> Result<Val, (NodeId, String)> {
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
        let Some(def) = self.ctx.info.reducer(name) else {
            return Err(err(&format!("unknown reducer @{name}")));
        };
        if let Some(a) = stored_stack_axis(
            self.ctx.f,
            self.kernel,
            &self.whole,
            &self.in_kernel,
            input,
            &d,
        ) {
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
        self.assign_states(id, &states, exprs);
        let header = format!("for {j} in range(0, {}):", along.len);
        self.close_element_loop(id, level, header)?;
        Ok(fold_result(node.ty.as_ref(), states))
    }

    /// A user-reducer fold over the stack dimension of a stored `collection[a](…)` of tiles:
    /// a loop over `a`, each step loading the stack's entry `c_a` with that tile's offsets
    /// along `a` (the layout the storing kernel wrote) and folding it into the state.
    pub(super) fn stack_fold(
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
        self.assign_states(id, &states, exprs);
        // Other axes read in the loop stay recorded; `a` only if read outside it before.
        if !a_read_before {
            self.tile_axes_used.borrow_mut().remove(&a);
        }
        self.close_element_loop(id, level, format!("for {coord} in range(0, EXT_{a}):"))?;
        Ok(fold_result(node.ty.as_ref(), states))
    }

    /// Opens a loop whose body is collected as if in a loop of its own (no axis: no value
    /// lives in it by `level_of`) and written by `close_element_loop`.
    pub(super) fn open_element_loop(&mut self) {
        self.inner.push(Loop {
            axis: String::new(),
            lines: Vec::new(),
            memo: HashMap::new(),
        });
        self.steps.push(Step::OpenElementLoop);
    }

    /// Writes the loop `open_element_loop` opened at `level`, under `header`.
    pub(super) fn close_element_loop(
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
        self.steps.push(Step::CloseElementLoop { level });
        Ok(())
    }

    /// The next fold state: reducer `def` inlined on the state and item values `args`.
    pub(super) fn next_states(
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
    pub(super) fn outside_operands(&mut self, n: NodeId, a: &str) -> Result<(), (NodeId, String)> {
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
}
