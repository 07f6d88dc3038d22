//! Folds, written step by step as the plan orders them: loops over the tiles of an axis with
//! loop-carried state (`Loop`, `Collection`), loops over the elements of a block
//! (`Sequential`) or over the entries of a stored stack (`Stack`).
//!
//! A fold's state is declared at its `FoldInit` step, in the loop its result lives in; the
//! loop opens at the next `OpenLoop`/`OpenElementLoop` (with every fold initialised just
//! before it: folds sharing the loop); each `FoldUpdate` writes the next state from the item;
//! the loop is written around its body when it closes, and the folds' results become values.

use super::kernel::{dim_position, index_for, is_simple, BlockDim, KernelEmitter, Loop, Val};
use super::names::{builtin_identity, compute_tl, lit};
use crate::ir::*;
use crate::lower::plan::FoldKind;
use crate::lower::walk::field_types;
use crate::lower::{collection_fold_axis, stack_of};
use std::collections::HashMap;

/// Fold state variables and their blocks.
pub(super) type FoldStates = Vec<(String, Vec<BlockDim>)>;

type WResult<T = ()> = Result<T, (NodeId, String)>;

/// A fold being written.
pub(super) struct FoldRun {
    kind: FoldKind,
    states: FoldStates,
    /// Where its result lives.
    level: Option<usize>,
    /// `Sequential`: the items, each as (block, rank, folded position, other blocks), the
    /// block folded along, and the element counter.
    items: Vec<(String, usize, usize, Vec<BlockDim>)>,
    along: Option<BlockDim>,
    counter: String,
    /// `Stack`: the stack's axis, and whether its offsets were read before the loop.
    axis: String,
    axis_read_before: bool,
}

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
    fn run_of(&self, fold: NodeId) -> WResult<&FoldRun> {
        self.folds
            .get(&fold)
            .ok_or((fold, "a fold the plan did not initialise".into()))
    }

    /// `FoldInit`: the fold's state, declared at `level`.
    pub(super) fn fold_init(&mut self, id: NodeId, level: Option<usize>) -> WResult {
        let body = &self.ctx.f.body;
        let ExprKind::Reduce {
            input,
            over,
            reducer,
            ..
        } = body.node(id).kind.clone()
        else {
            return Err((id, "a malformed fold".into()));
        };
        let kind = self
            .fold_kind
            .get(&id)
            .copied()
            .ok_or((id, "a fold the plan did not classify".into()))?;
        let mut run = FoldRun {
            kind,
            states: Vec::new(),
            level,
            items: Vec::new(),
            along: None,
            counter: String::new(),
            axis: String::new(),
            axis_read_before: false,
        };
        if kind == FoldKind::Sequential {
            self.sequential_items(id, input, &over, &mut run, level)?;
        }
        run.states = self.fold_states(level, id, &reducer)?;
        match kind {
            FoldKind::Sequential => run.counter = self.tmp("j"),
            FoldKind::Stack => {
                let ExprKind::Collection(a, _) = &body.node(input).kind else {
                    return Err((id, "a malformed fold".into()));
                };
                run.axis = a.to_string();
                run.axis_read_before = self.tile_axes_used.borrow().contains(&run.axis);
            }
            _ => {}
        }
        self.folds.insert(id, run);
        self.recent_inits.push(id);
        Ok(())
    }

    /// The items of an element-by-element fold, each read once, before the loop.
    fn sequential_items(
        &mut self,
        id: NodeId,
        input: NodeId,
        over: &ReduceOver,
        run: &mut FoldRun,
        level: Option<usize>,
    ) -> WResult {
        let err = |m: &str| (id, m.to_string());
        let ReduceOver::Axis(d) = over else {
            return Err(err("a malformed fold"));
        };
        let fields = match self.lookup(input)? {
            Val::Tuple(v) => v,
            t => vec![t],
        };
        // Every item field runs along the folded dimension with the same block.
        let mut along: Option<BlockDim> = None;
        for f in &fields {
            let (x, dims) = f.tile().map_err(|m| (id, m))?;
            let i = dim_position(d, dims).ok_or(err("a fold over an unknown dimension"))?;
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
            run.items.push((x.to_string(), dims.len(), i, rest));
        }
        run.along = Some(along.ok_or(err("a fold of no items"))?);
        for (x, ..) in run.items.iter_mut() {
            if !is_simple(x) {
                let name = self.names.fresh("items");
                self.line_at(level, format!("{name} = {x}"));
                *x = name;
            }
        }
        Ok(())
    }

    fn fold_states(
        &mut self,
        level: Option<usize>,
        id: NodeId,
        reducer: &ReducerRef,
    ) -> WResult<FoldStates> {
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
            // A built-in fold keeps its items' dtype (exact i32 sums); a user reducer's state
            // starts as f32 (docs/ir.md §6.10).
            let dtype = match reducer {
                ReducerRef::Builtin(_) => t.dtype,
                ReducerRef::User(_) => DType::F32,
            };
            self.line_at(
                level,
                format!(
                    "{name} = tl.full([{}], {}, {})",
                    lens.join(", "),
                    lit(init.get(i).copied().unwrap_or(0.0), dtype),
                    compute_tl(dtype)
                ),
            );
            states.push((name, dims));
        }
        Ok(states)
    }

    /// `OpenLoop`: a loop over the tiles of `a`, for the folds initialised just before.
    pub(super) fn open_loop(&mut self, a: &str) {
        let group = std::mem::take(&mut self.recent_inits);
        self.loop_groups.push(group);
        self.inner.push(Loop {
            axis: a.to_string(),
            lines: Vec::new(),
            memo: HashMap::new(),
        });
        self.axis_offsets(a, true);
    }

    /// `OpenElementLoop`: a loop over a block's elements or a stack's entries.
    pub(super) fn open_element_loop(&mut self) -> WResult {
        let group = std::mem::take(&mut self.recent_inits);
        let fold = *group
            .first()
            .ok_or((NodeId(0), "an element loop with no fold".into()))?;
        self.loop_groups.push(group);
        self.inner.push(Loop {
            axis: String::new(),
            lines: Vec::new(),
            memo: HashMap::new(),
        });
        let run = self.run_of(fold)?;
        if run.kind == FoldKind::Stack {
            let a = run.axis.clone();
            let coord = format!("c_{a}");
            let here = self.inner.len().checked_sub(1);
            self.axis_offsets_from(&a, &coord, here);
        }
        Ok(())
    }

    /// `FoldUpdate`: the fold's next state, from its item.
    pub(super) fn fold_update(&mut self, id: NodeId) -> WResult {
        let body = &self.ctx.f.body;
        let ExprKind::Reduce {
            input,
            reducer,
            keep_dims,
            ..
        } = body.node(id).kind.clone()
        else {
            return Err((id, "a malformed fold".into()));
        };
        let kind = self.run_of(id)?.kind;
        let states = self.run_of(id)?.states.clone();
        let next = match kind {
            FoldKind::Loop | FoldKind::Collection => {
                // A collection fold folds the tiles under its stack.
                let x = if kind == FoldKind::Collection {
                    match body.node(stack_of(body, input)).kind {
                        ExprKind::Collection(_, x) => x,
                        _ => return Err((id, "a malformed collection fold".into())),
                    }
                } else {
                    input
                };
                let keep = kind == FoldKind::Collection && keep_dims;
                let item = self.lookup(x)?;
                match &reducer {
                    ReducerRef::Builtin(r) => {
                        let (item, item_dims) = item.tile().map_err(|e| (id, e))?;
                        let item = if keep {
                            format!("({item})[None{}]", ", :".repeat(item_dims.len()))
                        } else {
                            item.to_string()
                        };
                        let s = &states[0].0;
                        vec![match r {
                            BuiltinReducer::Add => format!("{s} + {item}"),
                            BuiltinReducer::Mul => format!("{s} * {item}"),
                            BuiltinReducer::Max => format!("tl.maximum({s}, {item})"),
                            BuiltinReducer::Min => format!("tl.minimum({s}, {item})"),
                        }]
                    }
                    ReducerRef::User(n) => self.user_step(id, n, &states, item)?,
                }
            }
            FoldKind::Sequential => self.sequential_step(id, &reducer, &states)?,
            FoldKind::Stack => self.stack_step(id, &reducer, &states)?,
            FoldKind::Block => return Err((id, "a block fold planned as a loop".into())),
        };
        self.assign_states(&states, next);
        Ok(())
    }

    /// The next states of a user reducer on the states and an item.
    fn user_step(
        &mut self,
        id: NodeId,
        reducer: &str,
        states: &FoldStates,
        item: Val,
    ) -> WResult<Vec<String>> {
        let Some(def) = self.ctx.info.reducer(reducer) else {
            return Err((id, format!("unknown reducer @{reducer}")));
        };
        let mut args = state_vals(states);
        match item {
            Val::Tuple(v) => args.extend(v),
            t => args.push(t),
        }
        self.next_states(id, def, args)
    }

    /// One element of each item, picked by a one-hot sum (exact: the other terms are zeros);
    /// elements past the tensor's end (a padded block) leave the state as it was.
    fn sequential_step(
        &mut self,
        id: NodeId,
        reducer: &ReducerRef,
        states: &FoldStates,
    ) -> WResult<Vec<String>> {
        let ReducerRef::User(name) = reducer else {
            return Err((id, "a built-in reducer folded element by element".into()));
        };
        let Some(def) = self.ctx.info.reducer(name) else {
            return Err((id, format!("unknown reducer @{name}")));
        };
        let run = self.run_of(id)?;
        let items = run.items.clone();
        let along = run.along.clone().ok_or((id, "a fold of no items".into()))?;
        let j = run.counter.clone();
        let one_hot = format!("(tl.arange(0, {}) == {j})", along.len);
        let mut args = state_vals(states);
        for (x, rank, i, rest) in items {
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
            for (e, (s, _)) in exprs.iter_mut().zip(states) {
                *e = format!("tl.where({inside}, {e}, {s})");
            }
        }
        Ok(exprs)
    }

    /// The stack's entry `c_<axis>`, loaded with that tile's offsets along the axis (the
    /// layout the storing kernel wrote), folded into the state.
    fn stack_step(
        &mut self,
        id: NodeId,
        reducer: &ReducerRef,
        states: &FoldStates,
    ) -> WResult<Vec<String>> {
        let body = &self.ctx.f.body;
        let ReducerRef::User(name) = reducer else {
            return Err((id, "a built-in reducer folded element by element".into()));
        };
        let Some(def) = self.ctx.info.reducer(name) else {
            return Err((id, format!("unknown reducer @{name}")));
        };
        let ExprKind::Reduce { input: stack, .. } = &body.node(id).kind else {
            return Err((id, "a malformed fold".into()));
        };
        let stack = *stack;
        let (types, is_tuple) = field_types(body.ty(stack)).map_err(|m| (id, m.to_string()))?;
        let run = self.run_of(id)?;
        let (a, read_before) = (run.axis.clone(), run.axis_read_before);
        let coord = format!("c_{a}");
        let mut args = state_vals(states);
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
        // Offsets along the axis are defined inside this loop only: uses there are not the
        // undefined reads `tile_axes_used` looks for.
        if !read_before {
            self.tile_axes_used.borrow_mut().remove(&a);
        }
        Ok(exprs)
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

    /// `CloseLoop`: the loop over `a` written at `level` around its body; its folds' results
    /// become values there.
    pub(super) fn close_loop(&mut self, a: &str, level: Option<usize>) -> WResult {
        let group = self.loop_groups.pop().unwrap_or_default();
        let Some(Loop { lines, .. }) = self.inner.pop() else {
            return Err((
                group.first().copied().unwrap_or(NodeId(0)),
                "loop state lost".into(),
            ));
        };
        self.line_at(level, format!("for c_{a} in range(0, EXT_{a}):"));
        for l in lines {
            self.line_at(level, format!("    {l}"));
        }
        self.after_loop(a, level, group)
    }

    /// After the loop (or loops, `skip.rs`) over `a` written at `level`: its folds' results.
    pub(super) fn after_loop(
        &mut self,
        a: &str,
        level: Option<usize>,
        group: Vec<NodeId>,
    ) -> WResult {
        // The loop left the offsets of its last tile: a grid axis gets its own back.
        if self.kernel.grid_axes.iter().any(|g| g == a) && !self.whole.contains(a) {
            let coord = self.grid_coordinate(a);
            self.axis_offsets_from(a, &coord, level);
        }
        self.finish(group)
    }

    /// `CloseElementLoop`: the element or stack loop written at `level` around its body.
    pub(super) fn close_element_loop(&mut self, level: Option<usize>) -> WResult {
        let group = self.loop_groups.pop().unwrap_or_default();
        let fold = *group
            .first()
            .ok_or((NodeId(0), "an element loop with no fold".into()))?;
        let Some(Loop { lines, .. }) = self.inner.pop() else {
            return Err((fold, "loop state lost".into()));
        };
        let run = self.run_of(fold)?;
        let header = match run.kind {
            FoldKind::Stack => format!("for c_{0} in range(0, EXT_{0}):", run.axis),
            _ => {
                let along = run
                    .along
                    .as_ref()
                    .ok_or((fold, "a fold of no items".into()))?;
                format!("for {} in range(0, {}):", run.counter, along.len)
            }
        };
        self.line_at(level, header);
        for l in lines {
            self.line_at(level, format!("    {l}"));
        }
        self.finish(group)
    }

    /// The results of the folds a loop computed: the first (the one asked for) becomes a
    /// value at its `Value` step; the others, sharing the loop, are values at once.
    fn finish(&mut self, group: Vec<NodeId>) -> WResult {
        for (i, m) in group.into_iter().enumerate() {
            let run = self
                .folds
                .remove(&m)
                .ok_or((m, "a fold the plan did not initialise".into()))?;
            let v = fold_result(self.ctx.f.body.ty(m), run.states);
            if run.kind == FoldKind::Collection {
                self.collection_folds.insert(m, v.clone());
            }
            if i == 0 {
                self.fold_results.insert(m, v);
            } else {
                self.memo_at(run.level).insert(m, v);
            }
        }
        Ok(())
    }

    /// A fold's result at its `Value` step.
    pub(super) fn fold_value(&mut self, id: NodeId) -> WResult<Option<Val>> {
        if let Some(v) = self.fold_results.remove(&id) {
            return Ok(Some(v));
        }
        // A collection fold asked for again, in another loop: the same result.
        if collection_fold_axis(&self.ctx.f.body, id).is_some() {
            if let Some(v) = self.collection_folds.get(&id) {
                return Ok(Some(v.clone()));
            }
        }
        Ok(None)
    }

    pub(super) fn next_states(
        &mut self,
        id: NodeId,
        def: &ReducerDef,
        args: Vec<Val>,
    ) -> WResult<Vec<String>> {
        let next = match self.inline_reducer(def, args).map_err(|m| (id, m))? {
            Val::Tuple(v) => v,
            t => vec![t],
        };
        next.iter()
            .map(|v| v.tile().map(|(e, _)| e.to_string()).map_err(|m| (id, m)))
            .collect()
    }
}
