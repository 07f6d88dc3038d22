//! Syntax tree → arena IR. Resolves value names (SSA: one definition, defined before use),
//! checks each operation's operands, bracket arguments and attributes, and converts types.

use super::ast::*;
use crate::diag::{Diagnostic, Span};
use crate::ir::*;
use std::collections::HashMap;

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

fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut cur = vec![i + 1; b.len() + 1];
            for (j, cb) in b.iter().enumerate() {
                cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                    .min(prev[j + 1] + 1)
                    .min(cur[j] + 1);
            }
            prev = cur;
        }
        prev[b.len()]
    }
    candidates
        .map(|c| (distance(name, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min()
        .map(|(_, c)| c)
}

fn all_op_names() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = UNARY_OPS.iter().map(|(n, _)| *n).collect();
    v.extend(BINARY_OPS.iter().map(|(n, _)| *n));
    v.extend([
        "select",
        "tuple",
        "get",
        "partition",
        "replicate",
        "combination",
        "collection",
        "cast",
        "matmul",
        "tile_matmul",
        "transpose",
        "reshape",
        "broadcast",
        "fill",
        "iota",
    ]);
    v
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
        if self.diags[errors_before..].iter().any(|d| d.is_error()) {
            return None;
        }
        Some(Function {
            name: f.name.clone(),
            name_span: self.span(f.name_loc),
            bindings,
            body: scope.body,
            comment: None,
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

    fn new_node(&self, scope: &mut Scope, kind: ExprKind, loc: Loc) -> NodeId {
        scope.body.push(Node {
            kind,
            name: None,
            annot: None,
            span: self.span(loc),
            ty: None,
        })
    }

    fn literal_value(&mut self, e: &Expr) -> Option<f64> {
        match &e.ast {
            ExprAst::Number(v) => Some(*v),
            ExprAst::Name(n) if n == "inf" => Some(f64::INFINITY),
            ExprAst::Name(n) if n == "nan" => Some(f64::NAN),
            ExprAst::Neg(inner) => self.literal_value(inner).map(|v| -v),
            _ => {
                let d = self
                    .err(e.loc, "expected a number")
                    .with_help("for example `0.5`, `-1e9` or `-inf`");
                self.push(d);
                None
            }
        }
    }

    fn scalar_constant(&self, scope: &mut Scope, v: f64, loc: Loc) -> NodeId {
        let id = self.new_node(scope, ExprKind::Constant(v), loc);
        scope.body.node_mut(id).annot = Some(Type::Tensor(TensorType::new(DType::F32, vec![])));
        id
    }

    fn expr(&mut self, scope: &mut Scope, e: &Expr) -> Option<NodeId> {
        // `constant`, `fill` and `iota` take their type from the statement's annotation.
        let needs_type = match &e.ast {
            ExprAst::Constant(_) => Some("constant"),
            ExprAst::Call { op, .. } if op == "fill" || op == "iota" => Some(op.as_str()),
            _ => None,
        };
        if let Some(op) = needs_type {
            if scope.class_refs.is_none() && scope.stmt_root != e as *const Expr as usize {
                let d = self
                    .err(
                        e.loc,
                        format!("`{op}` needs a type, so it must be a whole statement"),
                    )
                    .with_help(format!(
                        "write `name: tensor<SHAPE, DTYPE> = {op} …` and use `name`"
                    ));
                self.push(d);
                return None;
            }
        }
        match &e.ast {
            ExprAst::Name(n) => {
                if let Some((id, _)) = scope.names.get(n) {
                    return Some(*id);
                }
                match n.as_str() {
                    "inf" => return Some(self.scalar_constant(scope, f64::INFINITY, e.loc)),
                    "nan" => return Some(self.scalar_constant(scope, f64::NAN, e.loc)),
                    _ => {}
                }
                if scope.failed.contains(n) {
                    return None; // its definition was already reported
                }
                let mut d = self.err(e.loc, format!("use of undefined value `{n}`"));
                if let Some(later) = scope.later.get(n) {
                    let later = *later;
                    d = d
                        .with_note(Some(self.span(later)), "defined later here")
                        .with_help("values must be defined before they are used");
                } else if is_dim_symbol(n) {
                    d = d.with_help("upper-case names are dimension symbols; they appear in attributes and types");
                } else if let Some(c) = closest(n, scope.names.keys().map(|s| s.as_str())) {
                    d = d.with_help(format!("did you mean `{c}`?"));
                }
                self.push(d);
                None
            }
            ExprAst::Number(v) => Some(self.scalar_constant(scope, *v, e.loc)),
            ExprAst::ClassRef(n) => {
                let Some(refs) = scope.class_refs.as_ref() else {
                    let d = self
                        .err(
                            e.loc,
                            format!(
                                "`%{n}` refers to an e-class, which only exists in `egraph` dumps"
                            ),
                        )
                        .with_help("in a function, refer to values by name");
                    self.push(d);
                    return None;
                };
                if let Some((id, _)) = refs.iter().find(|(_, c)| c == n) {
                    return Some(*id);
                }
                let id = self.new_node(scope, ExprKind::Param, e.loc);
                if let Some(refs) = scope.class_refs.as_mut() {
                    refs.push((id, *n));
                }
                Some(id)
            }
            ExprAst::InputAt(n) => {
                if scope.class_refs.is_none() {
                    let d = self
                        .err(e.loc, "`input N` only appears in `egraph` dumps")
                        .with_help("declare arguments as `x: tensor<…> = input`");
                    self.push(d);
                    return None;
                }
                let Ok(pos) = u32::try_from(*n) else {
                    let d = self.err(e.loc, "input position is too large");
                    self.push(d);
                    return None;
                };
                let id = self.new_node(scope, ExprKind::Input, e.loc);
                scope.body.params.push(id);
                scope.input_pos = Some(pos);
                Some(id)
            }
            ExprAst::Neg(inner) => {
                // `-1.0` and `-inf` are literals (unless `inf` names a value).
                match &inner.ast {
                    ExprAst::Number(v) => return Some(self.scalar_constant(scope, -v, e.loc)),
                    ExprAst::Name(n) if n == "inf" && !scope.names.contains_key(n) => {
                        return Some(self.scalar_constant(scope, f64::NEG_INFINITY, e.loc))
                    }
                    _ => {}
                }
                let x = self.expr(scope, inner)?;
                Some(self.new_node(scope, ExprKind::Unary(UnaryOp::Neg, x), e.loc))
            }
            ExprAst::Infix(op, a, b) => {
                let a = self.expr(scope, a);
                let b = self.expr(scope, b);
                let op = match op {
                    InfixOp::Add => BinaryOp::Add,
                    InfixOp::Sub => BinaryOp::Subtract,
                    InfixOp::Mul => BinaryOp::Multiply,
                    InfixOp::Div => BinaryOp::Divide,
                };
                Some(self.new_node(scope, ExprKind::Binary(op, a?, b?), e.loc))
            }
            ExprAst::Input => {
                let d = self
                    .err(
                        e.loc,
                        "`input` must be the whole right-hand side of a statement",
                    )
                    .with_help("declare arguments as `x: tensor<…> = input`");
                self.push(d);
                None
            }
            ExprAst::Constant(v) => {
                let v = self.literal_value(v)?;
                Some(self.new_node(scope, ExprKind::Constant(v), e.loc))
            }
            ExprAst::Angle(_) => {
                let d = self
                    .err(
                        e.loc,
                        "`<…>` tuple literals only appear in a reducer's `init`",
                    )
                    .with_help("build tuples with `tuple(a, b)`");
                self.push(d);
                None
            }
            ExprAst::Reduce { input, attrs } => self.reduce(scope, e, input, attrs),
            ExprAst::Call {
                op,
                op_loc,
                brackets,
                args,
                attrs,
            } => self.call(
                scope,
                e,
                op,
                *op_loc,
                brackets.as_deref(),
                args.as_deref(),
                attrs,
            ),
        }
    }

    fn reduce(
        &mut self,
        scope: &mut Scope,
        e: &Expr,
        input: &Expr,
        attrs: &[Attr],
    ) -> Option<NodeId> {
        let x = self.expr(scope, input);
        let mut over = None;
        let mut reducer = None;
        let mut keep_dims = false;
        for a in attrs {
            match (a.key.as_str(), &a.value) {
                ("axis", Some(v)) => over = Some(ReduceOver::Axis(self.dim_ref_attr(v, a.loc)?)),
                ("parallel", Some(AttrValue::Word(w))) if is_axis_name(w) => {
                    over = Some(ReduceOver::Parallel(w.as_str().into()))
                }
                ("reducer", Some(AttrValue::Reducer(r))) => {
                    reducer = Some(match BuiltinReducer::parse(r) {
                        Some(b) => ReducerRef::Builtin(b),
                        None if self.reducer_names.contains_key(r) => {
                            ReducerRef::User(r.as_str().into())
                        }
                        None => {
                            let known = self
                                .reducer_names
                                .keys()
                                .map(|s| s.as_str())
                                .chain(["add", "mul", "max", "min"]);
                            let mut d = self.err(a.loc, format!("unknown reducer `@{r}`"));
                            d = d.with_help(match closest(r, known) {
                                Some(c) => format!("did you mean `@{c}`?"),
                                None => "built-in reducers are @add, @mul, @max, @min; others need a `reducer` definition".into(),
                            });
                            self.push(d);
                            return None;
                        }
                    })
                }
                ("keep_dims", None) => keep_dims = true,
                _ => {
                    let d = self
                        .err(a.loc, format!("unexpected attribute `{}` on `reduce`", a.key))
                        .with_help("reduce takes `axis=DIM` or `parallel=AXIS`, `reducer=@r` and optionally `keep_dims`");
                    self.push(d);
                    return None;
                }
            }
        }
        let Some(over) = over else {
            let d = self
                .err(e.loc, "`reduce` needs `axis=DIM` or `parallel=AXIS`")
                .with_help("for example `reduce x axis=K reducer=@add`");
            self.push(d);
            return None;
        };
        let Some(reducer) = reducer else {
            let d = self
                .err(e.loc, "`reduce` needs `reducer=@r`")
                .with_help("built-in reducers are @add, @mul, @max and @min");
            self.push(d);
            return None;
        };
        Some(self.new_node(
            scope,
            ExprKind::Reduce {
                input: x?,
                over,
                reducer,
                keep_dims,
            },
            e.loc,
        ))
    }

    fn dim_ref_attr(&mut self, v: &AttrValue, loc: Loc) -> Option<DimRef> {
        match v {
            AttrValue::Word(w) if is_dim_symbol(w) => Some(DimRef::Name(w.clone())),
            AttrValue::Int(i) => Some(DimRef::Index(*i as usize)),
            _ => {
                let d = self
                    .err(
                        loc,
                        "expected a dimension: an upper-case symbol or an index",
                    )
                    .with_help("for example `axis=K` or `axis=0`");
                self.push(d);
                None
            }
        }
    }

    fn dim_ref_arg(&mut self, arg: &(BracketArg, Loc)) -> Option<DimRef> {
        match &arg.0 {
            BracketArg::Word(w) if is_dim_symbol(w) => Some(DimRef::Name(w.clone())),
            BracketArg::Int(i) => Some(DimRef::Index(*i as usize)),
            _ => {
                let d = self
                    .err(arg.1, "expected a dimension: an upper-case symbol or an index")
                    .with_help("dimension symbols are upper case (`K`); parallel axes are lower case (`p`)");
                self.push(d);
                None
            }
        }
    }

    fn axis_arg(&mut self, arg: &(BracketArg, Loc)) -> Option<String> {
        match &arg.0 {
            BracketArg::Word(w) if is_axis_name(w) => Some(w.clone()),
            _ => {
                let d = self
                    .err(arg.1, "expected a parallel axis name (lower case)")
                    .with_help(
                        "parallel axes are lower case (`p`, `m`); dimensions are upper case (`K`)",
                    );
                self.push(d);
                None
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        scope: &mut Scope,
        e: &Expr,
        op: &str,
        op_loc: Loc,
        brackets: Option<&[(BracketArg, Loc)]>,
        args: Option<&[Expr]>,
        attrs: &[Attr],
    ) -> Option<NodeId> {
        let canonical = OP_ALIASES
            .iter()
            .find(|(a, _)| *a == op)
            .map(|(_, c)| *c)
            .unwrap_or(op);
        let is_known = all_op_names().contains(&canonical);
        if !is_known {
            let mut d = self.err(op_loc, format!("unknown operation `{op}`"));
            d = d.with_help(match closest(op, all_op_names().into_iter()) {
                Some(c) => format!("did you mean `{c}`?"),
                None => "see docs/ir.md for the list of operations".to_string(),
            });
            self.push(d);
            return None;
        }
        // Operands first, so errors inside them are reported even if this call is malformed.
        let mut operands = Vec::new();
        let mut operand_failed = false;
        for a in args.unwrap_or(&[]) {
            match self.expr(scope, a) {
                Some(id) => operands.push(id),
                None => operand_failed = true,
            }
        }
        let no_parens = matches!(canonical, "fill" | "iota");
        let (want_args, want_brackets, allowed_attrs): (Option<usize>, usize, &[&str]) =
            match canonical {
                "select" => (Some(3), 0, &[]),
                "tuple" => (None, 0, &[]),
                "get" | "partition" | "combination" | "replicate" | "collection" | "transpose"
                | "reshape" | "broadcast" => {
                    let nb = match canonical {
                        "partition" | "combination" => 2,
                        "transpose" => usize::MAX, // any count, checked below
                        _ => 1,
                    };
                    (Some(1), nb, &[])
                }
                "cast" => (Some(1), 0, &["to"]),
                "matmul" | "tile_matmul" => (Some(2), 0, &["acc"]),
                "fill" | "iota" => (Some(0), 1, &[]),
                _ if UNARY_OPS.iter().any(|(n, _)| *n == canonical) => (Some(1), 0, &[]),
                _ => (Some(2), 0, &[]),
            };
        if no_parens && args.is_some() {
            let d = self
                .err(e.loc, format!("`{canonical}` takes no operands"))
                .with_help(format!("write `name: tensor<…> = {canonical}[…]`"));
            self.push(d);
            return None;
        }
        if !no_parens && args.is_none() {
            let d = self.err(
                e.loc,
                format!("`{canonical}` needs operands in parentheses"),
            );
            self.push(d);
            return None;
        }
        let nargs = args.map(|a| a.len()).unwrap_or(0);
        match want_args {
            Some(n) if n != nargs => {
                let d = self.err(
                    e.loc,
                    format!(
                        "`{canonical}` takes {n} operand{}, got {nargs}",
                        if n == 1 { "" } else { "s" }
                    ),
                );
                self.push(d);
                return None;
            }
            None if nargs == 0 => {
                let d = self.err(e.loc, format!("`{canonical}` needs at least one operand"));
                self.push(d);
                return None;
            }
            _ => {}
        }
        let brackets = brackets.unwrap_or(&[]);
        if want_brackets != usize::MAX
            && brackets.len() != want_brackets
            && !(canonical == "cast" && brackets.len() == 1)
        {
            let d = if want_brackets == 0 {
                self.err(e.loc, format!("`{canonical}` takes no `[…]` arguments"))
            } else {
                self.err(
                    e.loc,
                    format!(
                        "`{canonical}` takes {want_brackets} `[…]` argument(s), got {}",
                        brackets.len()
                    ),
                )
                .with_help(bracket_help(canonical))
            };
            self.push(d);
            return None;
        }
        let mut acc = None;
        let mut cast_to = None;
        for a in attrs {
            if !allowed_attrs.contains(&a.key.as_str()) {
                let d = self
                    .err(a.loc, format!("`{canonical}` has no attribute `{}`", a.key))
                    .with_help(if allowed_attrs.is_empty() {
                        format!("`{canonical}` takes no attributes")
                    } else {
                        format!("`{canonical}` takes: {}", allowed_attrs.join(", "))
                    });
                self.push(d);
                return None;
            }
            let dt = match &a.value {
                Some(AttrValue::Word(w)) => DType::parse(w),
                _ => None,
            };
            let Some(dt) = dt else {
                let d = self
                    .err(a.loc, format!("`{}` expects a dtype", a.key))
                    .with_help("dtypes are bf16, f16, f32, i32 and i1");
                self.push(d);
                return None;
            };
            if a.key == "acc" {
                acc = Some(dt);
            } else {
                cast_to = Some(dt);
            }
        }
        if operand_failed {
            return None;
        }
        let x = operands.first().copied();
        let kind = match canonical {
            "select" => ExprKind::Select(operands[0], operands[1], operands[2]),
            "tuple" => ExprKind::Tuple(operands),
            "get" => {
                let field = match &brackets[0].0 {
                    BracketArg::Int(i) => FieldRef::Index(*i as usize),
                    BracketArg::Word(w) if is_axis_name(w) => FieldRef::Name(w.clone()),
                    _ => {
                        let d = self.err(
                            brackets[0].1,
                            "expected a field index or a reducer state-field name",
                        );
                        self.push(d);
                        return None;
                    }
                };
                ExprKind::Get(field, x?)
            }
            "partition" | "combination" => {
                let dim = self.dim_ref_arg(&brackets[0])?;
                let axis = self.axis_arg(&brackets[1])?;
                if canonical == "partition" {
                    ExprKind::Partition(dim, axis.into(), x?)
                } else {
                    ExprKind::Combination(dim, axis.into(), x?)
                }
            }
            "replicate" => ExprKind::Replicate(self.axis_arg(&brackets[0])?.into(), x?),
            "collection" => ExprKind::Collection(self.axis_arg(&brackets[0])?.into(), x?),
            "cast" => {
                let to = match (cast_to, brackets.first()) {
                    (Some(t), None) => t,
                    (None, Some((BracketArg::Word(w), loc))) => match DType::parse(w) {
                        Some(t) => t,
                        None => {
                            let d = self.err(*loc, format!("unknown dtype `{w}`"));
                            self.push(d);
                            return None;
                        }
                    },
                    _ => {
                        let d = self
                            .err(e.loc, "`cast` needs exactly one target dtype")
                            .with_help("write `cast(x) to=bf16`");
                        self.push(d);
                        return None;
                    }
                };
                ExprKind::Cast(to, x?)
            }
            "matmul" => ExprKind::MatMul {
                a: operands[0],
                b: operands[1],
                acc,
            },
            "tile_matmul" => ExprKind::TileMatMul {
                a: operands[0],
                b: operands[1],
                acc,
            },
            "transpose" => {
                let mut perm = Vec::new();
                for b in brackets {
                    match b.0 {
                        BracketArg::Int(i) => perm.push(i as usize),
                        _ => {
                            let d = self.err(
                                b.1,
                                "transpose takes a permutation of dimension indices, like `[1,0]`",
                            );
                            self.push(d);
                            return None;
                        }
                    }
                }
                ExprKind::Transpose(perm, x?)
            }
            "reshape" | "broadcast" => {
                let shape = match &brackets[0].0 {
                    BracketArg::Shape(s) => s.clone(),
                    BracketArg::Word(w) if is_dim_symbol(w) => vec![Dim::sym(w)],
                    BracketArg::Int(n) => vec![Dim::lit(*n)],
                    _ => {
                        let d = self.err(brackets[0].1, "expected a shape like `Bx32x128`");
                        self.push(d);
                        return None;
                    }
                };
                if canonical == "reshape" {
                    ExprKind::Reshape(shape, x?)
                } else {
                    ExprKind::Broadcast(shape, x?)
                }
            }
            "fill" => {
                let v = match &brackets[0].0 {
                    BracketArg::Number(v) => *v,
                    BracketArg::Int(i) => *i as f64,
                    BracketArg::Word(w) if w == "inf" => f64::INFINITY,
                    BracketArg::Word(w) if w == "-inf" => f64::NEG_INFINITY,
                    BracketArg::Word(w) if w == "nan" => f64::NAN,
                    _ => {
                        let d = self.err(brackets[0].1, "`fill` takes a number, like `fill[0.0]`");
                        self.push(d);
                        return None;
                    }
                };
                ExprKind::Fill(v)
            }
            "iota" => ExprKind::Iota(self.dim_ref_arg(&brackets[0])?),
            name => {
                if let Some((_, u)) = UNARY_OPS.iter().find(|(n, _)| *n == name) {
                    ExprKind::Unary(*u, x?)
                } else if let Some((_, b)) = BINARY_OPS.iter().find(|(n, _)| *n == name) {
                    ExprKind::Binary(*b, operands[0], operands[1])
                } else {
                    let d = self.err(op_loc, format!("unknown operation `{name}`"));
                    self.push(d);
                    return None;
                }
            }
        };
        Some(self.new_node(scope, kind, e.loc))
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
            if bnd.value == 0 {
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
                value: bnd.value,
                span: self.span(bnd.loc),
            });
        }
        bindings
    }

    fn egraph(&mut self, g: &EGraphAst) -> Option<EGraphDump> {
        let errors_before = self.diags.len();
        if g.keyword.0 != "egraph" {
            let d = self
                .err(
                    g.keyword.1,
                    format!("unexpected `{}` at the top level", g.keyword.0),
                )
                .with_help("a module holds `func`, `reducer` and `egraph` definitions");
            self.push(d);
            return None;
        }
        let bindings = self.bindings(&g.bindings);
        let mut classes: Vec<DumpClass> = Vec::new();
        // Every class id declared, with a valid type or not (its error is reported already).
        let mut defined: std::collections::HashSet<u32> = std::collections::HashSet::new();
        let mut roots = Vec::new();
        let mut roots_span = self.span(g.name_loc);
        for entry in &g.entries {
            match entry {
                EGraphEntry::Roots { keyword, ids } => {
                    if keyword.0 != "root" {
                        let d = self.err(
                            keyword.1,
                            format!("expected `eclass` or `root`, found `{}`", keyword.0),
                        );
                        self.push(d);
                        continue;
                    }
                    roots.extend(ids.iter().map(|(n, _)| *n));
                    roots_span = self.span(keyword.1);
                }
                EGraphEntry::Class {
                    keyword,
                    id,
                    ty,
                    nodes,
                } => {
                    if keyword.0 != "eclass" {
                        let d = self.err(
                            keyword.1,
                            format!("expected `eclass` or `root`, found `{}`", keyword.0),
                        );
                        self.push(d);
                        continue;
                    }
                    if !defined.insert(id.0) {
                        let d = self.err(id.1, format!("e-class %{} is defined twice", id.0));
                        self.push(d);
                        continue;
                    }
                    let Some(ty) = self.ty(ty) else { continue };
                    let mut enodes = Vec::new();
                    for n in nodes {
                        if let Some(node) = self.dump_node(n) {
                            enodes.push(node);
                        }
                    }
                    classes.push(DumpClass {
                        id: id.0,
                        ty,
                        span: self.span(id.1),
                        nodes: enodes,
                    });
                }
            }
        }
        for c in &classes {
            for n in &c.nodes {
                for child in &n.children {
                    if !defined.contains(child) {
                        let d = self.err_span(n.span, format!("e-class %{child} is not defined"));
                        self.push(d);
                    }
                }
            }
            if c.nodes.is_empty() {
                let d = self.err_span(c.span, format!("e-class %{} has no e-nodes", c.id));
                self.push(d);
            }
        }
        if roots.is_empty() {
            let d = self
                .err(g.name_loc, "the e-graph has no `root`")
                .with_help("end the dump with `root %N`");
            self.push(d);
        }
        for r in &roots {
            if !defined.contains(r) {
                let d = self.err_span(roots_span, format!("root e-class %{r} is not defined"));
                self.push(d);
            }
        }
        if self.diags[errors_before..].iter().any(|d| d.is_error()) {
            return None;
        }
        Some(EGraphDump {
            name: g.name.clone(),
            name_span: self.span(g.name_loc),
            bindings,
            classes,
            roots,
            roots_span,
        })
    }

    fn err_span(&self, span: Span, msg: impl Into<String>) -> Diagnostic {
        Diagnostic::error(span, msg)
    }

    /// One e-node: a single operation whose operands are all `%N` references.
    fn dump_node(&mut self, e: &Expr) -> Option<DumpNode> {
        let mut scope = Scope {
            body: Body::default(),
            names: HashMap::new(),
            later: HashMap::new(),
            in_reducer: false,
            failed: Default::default(),
            stmt_root: 0,
            input_pos: None,
            class_refs: Some(Vec::new()),
        };
        let id = self.expr(&mut scope, e)?;
        let refs = scope.class_refs.take().unwrap_or_default();
        let node = scope.body.node(id).clone();
        if node.kind == ExprKind::Param {
            let d = self.err(
                e.loc,
                "an e-node is an operation, not a bare e-class reference",
            );
            self.push(d);
            return None;
        }
        let mut children = Vec::new();
        for o in node.kind.operands() {
            match refs.iter().find(|(nid, _)| *nid == o) {
                Some((_, c)) => children.push(*c),
                None => {
                    let d = self
                        .err(e.loc, "e-node operands must be e-class references like `%3`")
                        .with_help("write one operation per e-node; nested expressions are separate e-classes");
                    self.push(d);
                    return None;
                }
            }
        }
        let placeholders: Vec<NodeId> = (0..children.len() as u32).map(NodeId).collect();
        let input = match node.kind {
            ExprKind::Input => scope.input_pos,
            _ => None,
        };
        Some(DumpNode {
            kind: node.kind.with_operands(&placeholders),
            children,
            input,
            span: node.span,
        })
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

fn bracket_help(op: &str) -> String {
    match op {
        "partition" | "combination" => format!("write `{op}[DIM,axis](x)`, e.g. `{op}[K,p](x)`"),
        "replicate" | "collection" => format!("write `{op}[axis](x)`"),
        "get" => "write `get[0](t)` or `get[field](t)`".into(),
        "reshape" | "broadcast" => format!("write `{op}[SHAPE](x)`, e.g. `{op}[Bx32x128](x)`"),
        "fill" => "write `fill[0.0]`".into(),
        "iota" => "write `iota[DIM]`".into(),
        _ => String::new(),
    }
}
