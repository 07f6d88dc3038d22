//! Syntax tree → arena IR. Resolves value names (SSA: one definition, defined before use),
//! checks each operation's operands, bracket arguments and attributes, and converts types.
//!
//! This file builds modules, functions, reducers, statements, types and bindings;
//! - `expr`: expressions (operators, their bracket arguments and attributes, reductions);
//! - `egraph`: e-graph dumps (classes of e-nodes over `%N` references);
//! - `names`: names for diagnostics (closest match, operator names, bracket syntax).

use crate::diag::{Diagnostic, Span};
use crate::ir::{
    is_axis_name, is_dim_symbol, shape_to_string, Binding, Body, BuiltinReducer, DType, ExprKind,
    Function, Module, Node, NodeId, ParKind, ParState, ReducerDef, ScheduleEntry, SizeExpr,
    TensorType, Type,
};
use crate::parse::ast::{
    BindingAst, Expr, ExprAst, FuncAst, Item, Loc, ReducerAst, SizeAst, SizeAstKind, Stmt, TypeAst,
};
use std::collections::HashMap;

mod egraph;
mod expr;
mod names;

pub fn build_module(items: &[Item], source: u32) -> Result<Module, Vec<Diagnostic>> {
    let mut b = Builder {
        source,
        diags: Vec::new(),
        reducer_names: HashMap::new(),
    };
    let mut seen_funcs: HashMap<&str, Loc> = HashMap::new();
    let mut seen_egraphs: HashMap<&str, Loc> = HashMap::new();
    for item in items {
        match item {
            Item::Reducer(r) => {
                if BuiltinReducer::parse(&r.name).is_some() {
                    let d = b.err(
                        r.name_loc,
                        format!(
                            "`@{}` is a built-in reducer and cannot be redefined",
                            r.name
                        ),
                    );
                    b.diags.push(d);
                } else if let Some(prev) = b.reducer_names.insert(r.name.clone(), r.name_loc) {
                    let d = b
                        .err(
                            r.name_loc,
                            format!("reducer `@{}` is defined twice", r.name),
                        )
                        .with_note(Some(b.span(prev)), "first defined here");
                    b.diags.push(d);
                }
            }
            Item::EGraph(g) => {
                // Extraction names candidates after their e-graph (`f.c0`, …).
                if let Some(prev) = seen_egraphs.insert(&g.name, g.name_loc) {
                    let d = b
                        .err(g.name_loc, format!("e-graph `{}` is defined twice", g.name))
                        .with_note(Some(b.span(prev)), "first defined here");
                    b.diags.push(d);
                }
            }
            Item::Func(f) => {
                if let Some(prev) = seen_funcs.insert(&f.name, f.name_loc) {
                    let d = b
                        .err(
                            f.name_loc,
                            format!("function `{}` is defined twice", f.name),
                        )
                        .with_note(Some(b.span(prev)), "first defined here");
                    b.diags.push(d);
                }
            }
        }
    }
    let mut module = Module::default();
    for item in items {
        match item {
            Item::Reducer(r) => {
                if let Some(def) = b.reducer(r) {
                    module.reducers.push(def);
                }
            }
            Item::Func(f) => {
                if let Some(func) = b.function(f) {
                    module.funcs.push(func);
                }
            }
            Item::EGraph(g) => {
                if let Some(dump) = b.egraph(g) {
                    module.egraphs.push(dump);
                }
            }
        }
    }
    if b.diags.iter().any(|d| d.is_error()) {
        Err(b.diags)
    } else {
        Ok(module)
    }
}

struct Builder {
    source: u32,
    diags: Vec<Diagnostic>,
    reducer_names: HashMap<String, Loc>,
}

/// Name resolution state for one body.
struct Scope {
    body: Body,
    names: HashMap<String, (NodeId, Loc)>,
    /// Names defined anywhere in the body, to explain use-before-definition.
    later: HashMap<String, Loc>,
    in_reducer: bool,
    /// Address of the expression that is the whole right-hand side of the statement being
    /// built: leaves that take their type from an annotation may only appear there.
    stmt_root: usize,
    /// Statements that failed to build: uses of their names are not reported again.
    failed: std::collections::HashSet<String>,
    /// In an e-graph dump: the argument position of an `input N` e-node.
    input_pos: Option<u32>,
    /// In an e-graph dump: the placeholder node made for each `%N` reference.
    class_refs: Option<Vec<(NodeId, u32)>>,
}

impl Builder {
    fn span(&self, loc: Loc) -> Span {
        Span::new(self.source, loc.0, loc.1)
    }

    fn err(&self, loc: Loc, msg: impl Into<String>) -> Diagnostic {
        Diagnostic::error(self.span(loc), msg)
    }

    fn push(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    fn function(&mut self, f: &FuncAst) -> Option<Function> {
        let errors_before = self.diags.len();
        if f.name.starts_with(|c: char| c.is_ascii_uppercase()) {
            let d = self.err(f.name_loc, "function names start with a lower-case letter");
            self.push(d);
        }
        let bindings = self.bindings(&f.bindings);
        let mut scope = Scope {
            body: Body::default(),
            names: HashMap::new(),
            later: f
                .stmts
                .iter()
                .filter_map(|s| match s {
                    Stmt::Let { name, name_loc, .. } => Some((name.clone(), *name_loc)),
                    Stmt::Return { .. } => None,
                })
                .collect(),
            in_reducer: false,
            failed: Default::default(),
            stmt_root: 0,
            input_pos: None,
            class_refs: None,
        };
        self.statements(
            &mut scope,
            &f.stmts,
            f.name_loc,
            &format!("function `{}`", f.name),
        );
        let schedule = f.schedule.as_ref().map(|entries| {
            let mut out: Vec<ScheduleEntry> = Vec::new();
            for (name, value, loc) in entries {
                if out.iter().any(|e| &e.name == name) {
                    let d = self
                        .err(*loc, format!("`{name}` is scheduled twice"))
                        .with_help("give each block size, `num_warps` and `num_stages` once");
                    self.push(d);
                    continue;
                }
                match value.parse::<u64>() {
                    Ok(value) => out.push(ScheduleEntry {
                        name: name.clone(),
                        value,
                        span: self.span(*loc),
                    }),
                    Err(_) => {
                        let d = self
                            .err(*loc, format!("schedule value `{value}` is too large"))
                            .with_help(
                                "block sizes, `num_warps` and `num_stages` are small powers of two",
                            );
                        self.push(d);
                    }
                }
            }
            out
        });
        if self.diags[errors_before..].iter().any(|d| d.is_error()) {
            return None;
        }
        Some(Function {
            name: f.name.clone(),
            name_span: self.span(f.name_loc),
            bindings,
            body: scope.body,
            comment: None,
            schedule,
        })
    }

    fn statements(&mut self, scope: &mut Scope, stmts: &[Stmt], owner_loc: Loc, owner: &str) {
        let mut returned = false;
        for stmt in stmts {
            if returned {
                let loc = match stmt {
                    Stmt::Let { name_loc, .. } => *name_loc,
                    Stmt::Return { loc, .. } => *loc,
                };
                let d = self
                    .err(loc, "statement after `return`")
                    .with_help("`return` must be the last statement of a body");
                self.push(d);
                return;
            }
            match stmt {
                Stmt::Let {
                    name,
                    name_loc,
                    annot,
                    expr,
                } => {
                    let before = self.diags.len();
                    self.let_stmt(scope, name, *name_loc, annot.as_deref(), expr);
                    if self.diags[before..].iter().any(|d| d.is_error()) {
                        scope.failed.insert(name.clone());
                    }
                }
                Stmt::Return { values, loc } => {
                    let mut results = Vec::new();
                    for v in values {
                        if let Some(id) = self.expr(scope, v) {
                            results.push(id);
                        }
                    }
                    scope.body.results = results;
                    scope.body.results_span = self.span(*loc);
                    returned = true;
                }
            }
        }
        if !returned {
            let d = self
                .err(owner_loc, format!("{owner} has no `return`"))
                .with_help("end the body with `return value` (or `return a, b`)");
            self.push(d);
        }
    }

    fn let_stmt(
        &mut self,
        scope: &mut Scope,
        name: &str,
        name_loc: Loc,
        annot: Option<&TypeAst>,
        expr: &Expr,
    ) {
        if !name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_') || name.contains('.') {
            let d = self
                .err(name_loc, format!("`{name}` is not a value name"))
                .with_help(
                    "value names are lower/snake case; upper-case names are dimension symbols",
                );
            self.push(d);
            return;
        }
        if let Some((_, prev)) = scope.names.get(name) {
            let prev = *prev;
            let d = self
                .err(name_loc, format!("`{name}` is already defined"))
                .with_note(Some(self.span(prev)), "previous definition here")
                .with_help("values are SSA: each name is bound once; pick a new name");
            self.push(d);
            return;
        }
        let annot = match annot {
            Some(t) => match self.ty(t) {
                Some(t) => Some(t),
                None => return,
            },
            None => None,
        };
        if let ExprAst::Name(other) = &expr.ast {
            if !matches!(other.as_str(), "inf" | "nan") || scope.names.contains_key(other) {
                let d = self
                    .err(expr.loc, format!("`{name} = {other}` only renames a value"))
                    .with_help(format!("use `{other}` directly"));
                self.push(d);
                return;
            }
        }
        scope.stmt_root = expr as *const Expr as usize;
        let id = match &expr.ast {
            ExprAst::Input => {
                if scope.in_reducer {
                    let d = self.err(expr.loc, "`input` is not allowed in a reducer body");
                    self.push(d);
                    return;
                }
                let id = scope.body.push(Node {
                    kind: ExprKind::Input,
                    name: None,
                    annot: None,
                    span: self.span(expr.loc),
                    ty: None,
                });
                scope.body.params.push(id);
                Some(id)
            }
            _ => self.expr(scope, expr),
        };
        let Some(id) = id else { return };
        let node = scope.body.node(id);
        if node.kind.needs_annotation() && annot.is_none() && node.annot.is_none() {
            let op = node.kind.op_name();
            let d = self
                .err(expr.loc, format!("`{op}` needs a type"))
                .with_help(format!("write `{name}: tensor<SHAPE, DTYPE> = {op} …`"));
            self.push(d);
            return;
        }
        if node.name.is_some() {
            // `y = x` where x is a literal that resolved to a shared node; keep SSA strict.
            let d = self.err(expr.loc, "expression is already named");
            self.push(d);
            return;
        }
        let node = scope.body.node_mut(id);
        node.name = Some(name.to_string());
        if annot.is_some() {
            node.annot = annot;
        }
        scope.names.insert(name.to_string(), (id, name_loc));
    }

    fn ty(&mut self, t: &TypeAst) -> Option<Type> {
        match t {
            TypeAst::Tuple(fields, _) => {
                let mut out = Vec::new();
                for f in fields {
                    out.push(self.ty(f)?);
                }
                Some(Type::Tuple(out))
            }
            TypeAst::Tensor {
                shape,
                dtype,
                state,
                ..
            } => {
                let Some(dt) = DType::parse(&dtype.0) else {
                    let d = self
                        .err(dtype.1, format!("unknown dtype `{}`", dtype.0))
                        .with_help("dtypes are bf16, f16, f32, i32 and i1");
                    self.push(d);
                    return None;
                };
                let mut par = ParState::default();
                for e in state {
                    let (axis, kind) = match (e.kind.as_str(), e.args.as_slice()) {
                        ("partition", [dim, axis]) => {
                            let idx = if let Ok(i) = dim.0.parse::<usize>() {
                                if i >= shape.len() {
                                    let d = self.err(
                                        dim.1,
                                        format!(
                                            "dimension index {i} is out of range for rank {}",
                                            shape.len()
                                        ),
                                    );
                                    self.push(d);
                                    return None;
                                }
                                i
                            } else {
                                let hits: Vec<usize> = (0..shape.len())
                                    .filter(|&i| shape[i].has_symbol(&dim.0))
                                    .collect();
                                match hits.as_slice() {
                                    [i] => *i,
                                    [] => {
                                        let d = self.err(
                                            dim.1,
                                            format!(
                                                "the shape {} has no dimension {}",
                                                shape_to_string(shape),
                                                dim.0
                                            ),
                                        );
                                        self.push(d);
                                        return None;
                                    }
                                    _ => {
                                        let d = self
                                            .err(
                                                dim.1,
                                                format!(
                                                    "dimension {} is ambiguous in {}",
                                                    dim.0,
                                                    shape_to_string(shape)
                                                ),
                                            )
                                            .with_help("refer to the dimension by index");
                                        self.push(d);
                                        return None;
                                    }
                                }
                            };
                            (axis, ParKind::Partition(idx))
                        }
                        ("replicate", [axis]) => (axis, ParKind::Replicate),
                        ("partial", [axis]) => (axis, ParKind::Partial),
                        _ => {
                            let d = self
                                .err(e.loc, format!("unknown parallel-state entry `{}` with {} argument(s)", e.kind, e.args.len()))
                                .with_help("entries are partition(DIM,axis), replicate(axis) and partial(axis)");
                            self.push(d);
                            return None;
                        }
                    };
                    if !is_axis_name(&axis.0) {
                        let d = self.err(
                            axis.1,
                            format!("`{}` is not a parallel axis name (lower case)", axis.0),
                        );
                        self.push(d);
                        return None;
                    }
                    if par.0.insert(axis.0.as_str().into(), kind).is_some() {
                        let d = self.err(
                            axis.1,
                            format!("axis `{}` appears twice in the parallel state", axis.0),
                        );
                        self.push(d);
                        return None;
                    }
                }
                Some(Type::Tensor(TensorType {
                    dtype: dt,
                    shape: shape.clone(),
                    par,
                }))
            }
        }
    }

    fn bindings(&mut self, asts: &[BindingAst]) -> Vec<Binding> {
        let mut bindings: Vec<Binding> = Vec::new();
        for bnd in asts {
            if let Some(prev) = bindings.iter().find(|x| x.name == bnd.name) {
                let prev_span = prev.span;
                let d = self
                    .err(bnd.loc, format!("`{}` is bound twice", bnd.name))
                    .with_note(Some(prev_span), "first bound here");
                self.push(d);
                continue;
            }
            if !is_dim_symbol(&bnd.name) && !is_axis_name(&bnd.name) {
                let d = self.err(
                    bnd.loc,
                    "a binding names a dimension (upper case) or a parallel axis (lower case)",
                );
                self.push(d);
                continue;
            }
            let def = size_expr(&bnd.value);
            // A definition over literals only is its value: a symbol bound to a number.
            let (value, def) = match def.eval(&|_| None) {
                Some(v) if def.symbols().is_empty() => (u64::try_from(v).unwrap_or(0), None),
                _ => (0, Some(def)),
            };
            if def.is_none() && value == 0 {
                let what = if is_axis_name(&bnd.name) {
                    "parallel axis"
                } else {
                    "dimension"
                };
                let d = self
                    .err(
                        bnd.loc,
                        format!("{what} `{}` needs a size of at least 1", bnd.name),
                    )
                    .with_help("empty tensors are not supported");
                self.push(d);
                continue;
            }
            bindings.push(Binding {
                name: bnd.name.clone(),
                value,
                def,
                span: self.span(bnd.loc),
            });
        }
        if let Err(errors) = crate::ir::sizes::resolve_bindings(&mut bindings) {
            for e in errors {
                let mut d = Diagnostic::error(bindings[e.binding].span, e.message);
                d.help = e.help;
                self.push(d);
            }
        }
        bindings
    }

    fn reducer(&mut self, r: &ReducerAst) -> Option<ReducerDef> {
        let errors_before = self.diags.len();
        let mut state = None;
        let mut item = None;
        for (key, loc, names) in &r.params {
            let slot = match key.as_str() {
                "state" => &mut state,
                "item" => &mut item,
                _ => {
                    let d = self
                        .err(*loc, format!("unexpected reducer parameter `{key}`"))
                        .with_help("a reducer is `reducer @r(state = <a, b>, item = <x, y>) init = <0.0, 0.0> { … }`");
                    self.push(d);
                    return None;
                }
            };
            if slot.is_some() {
                let d = self.err(*loc, format!("`{key}` is given twice"));
                self.push(d);
                return None;
            }
            *slot = Some(names.clone());
        }
        let (Some(state), Some(item)) = (state, item) else {
            let d = self
                .err(r.name_loc, "a reducer needs both `state = <…>` and `item = <…>`")
                .with_help("for example `reducer @sum(state = acc, item = x) init = 0.0 { return acc + x }`");
            self.push(d);
            return None;
        };
        if r.init_key.0 != "init" {
            let d = self.err(
                r.init_key.1,
                format!("expected `init`, found `{}`", r.init_key.0),
            );
            self.push(d);
            return None;
        }
        let mut init = Vec::new();
        for v in &r.init {
            init.push(self.literal_value(v)?);
        }
        if init.len() != state.len() {
            let d = self.err(
                r.init_key.1,
                format!(
                    "`init` has {} value(s) but the state has {} field(s)",
                    init.len(),
                    state.len()
                ),
            );
            self.push(d);
            return None;
        }
        let mut scope = Scope {
            body: Body::default(),
            names: HashMap::new(),
            later: r
                .stmts
                .iter()
                .filter_map(|s| match s {
                    Stmt::Let { name, name_loc, .. } => Some((name.clone(), *name_loc)),
                    Stmt::Return { .. } => None,
                })
                .collect(),
            in_reducer: true,
            failed: Default::default(),
            stmt_root: 0,
            input_pos: None,
            class_refs: None,
        };
        for (name, loc) in state.iter().chain(item.iter()) {
            if let Some((_, prev)) = scope.names.get(name) {
                let prev = *prev;
                let d = self
                    .err(*loc, format!("`{name}` names two reducer fields"))
                    .with_note(Some(self.span(prev)), "first used here");
                self.push(d);
                return None;
            }
            let id = self.new_node(&mut scope, ExprKind::Param, *loc);
            scope.body.node_mut(id).name = Some(name.clone());
            scope.body.params.push(id);
            scope.names.insert(name.clone(), (id, *loc));
        }
        self.statements(
            &mut scope,
            &r.stmts,
            r.name_loc,
            &format!("reducer `@{}`", r.name),
        );
        if self.diags[errors_before..].iter().any(|d| d.is_error()) {
            return None;
        }
        if scope.body.results.len() != 1 {
            let d = self
                .err(
                    r.name_loc,
                    "a reducer returns exactly one value: the new state",
                )
                .with_help("return `tuple(a, b)` for a tuple state");
            self.push(d);
            return None;
        }
        Some(ReducerDef {
            name: r.name.clone(),
            name_span: self.span(r.name_loc),
            state: state.into_iter().map(|(n, _)| n).collect(),
            item: item.into_iter().map(|(n, _)| n).collect(),
            init,
            body: scope.body,
        })
    }
}

/// A binding's size expression as the IR holds it.
fn size_expr(a: &SizeAst) -> SizeExpr {
    match &a.kind {
        SizeAstKind::Int(n) => SizeExpr::Lit(*n),
        SizeAstKind::Name(s) => SizeExpr::Sym(s.as_str().into()),
        SizeAstKind::Bin(op, x, y) => {
            let (x, y) = (Box::new(size_expr(x)), Box::new(size_expr(y)));
            match op {
                '+' => SizeExpr::Add(x, y),
                '-' => SizeExpr::Sub(x, y),
                _ => SizeExpr::Mul(x, y),
            }
        }
    }
}
