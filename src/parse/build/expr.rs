//! Expressions: operators with their operands, bracket arguments and attributes, reductions,
//! and the nodes they become.

use super::names::{all_op_names, bracket_help, closest};
use super::{Builder, Scope};
use crate::ir::{
    is_axis_name, is_dim_symbol, BinaryOp, BuiltinReducer, DType, Dim, DimRef, ExprKind, FieldRef,
    Node, NodeId, ReduceOver, ReducerRef, TensorType, Type, UnaryOp, BINARY_OPS, OP_ALIASES,
    UNARY_OPS,
};
use crate::parse::ast::{Attr, AttrValue, BracketArg, Expr, ExprAst, InfixOp, Loc};

impl Builder {
    pub(super) fn new_node(&self, scope: &mut Scope, kind: ExprKind, loc: Loc) -> NodeId {
        scope.body.push(Node {
            kind,
            name: None,
            annot: None,
            span: self.span(loc),
            ty: None,
        })
    }

    pub(super) fn literal_value(&mut self, e: &Expr) -> Option<f64> {
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

    pub(super) fn scalar_constant(&self, scope: &mut Scope, v: f64, loc: Loc) -> NodeId {
        let id = self.new_node(scope, ExprKind::Constant(v), loc);
        scope.body.node_mut(id).annot = Some(Type::Tensor(TensorType::new(DType::F32, vec![])));
        id
    }

    pub(super) fn expr(&mut self, scope: &mut Scope, e: &Expr) -> Option<NodeId> {
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
            ExprAst::FuncCall {
                keyword,
                name,
                name_loc,
                args,
            } => {
                if keyword != "call" {
                    let d = self
                        .err(
                            e.loc,
                            format!("`{keyword} @{name}(…)` is not an expression"),
                        )
                        .with_help(format!(
                            "a call of function `{name}` is written `call @{name}(…)`"
                        ));
                    self.push(d);
                    return None;
                }
                let mut operands = Vec::new();
                let mut failed = false;
                for a in args {
                    match self.expr(scope, a) {
                        Some(id) => operands.push(id),
                        None => failed = true,
                    }
                }
                if failed {
                    return None;
                }
                let _ = name_loc;
                Some(self.new_node(scope, ExprKind::Call(name.clone(), operands), e.loc))
            }
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

    pub(super) fn reduce(
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

    pub(super) fn dim_ref_attr(&mut self, v: &AttrValue, loc: Loc) -> Option<DimRef> {
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

    pub(super) fn dim_ref_arg(&mut self, arg: &(BracketArg, Loc)) -> Option<DimRef> {
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

    /// A bound of `slice`: an integer or a dimension symbol.
    pub(super) fn slice_bound(&mut self, arg: &(BracketArg, Loc)) -> Option<Dim> {
        match &arg.0 {
            BracketArg::Int(i) => Some(Dim::lit(*i)),
            BracketArg::Word(w) if is_dim_symbol(w) => Some(Dim::sym(w)),
            _ => {
                let d = self
                    .err(arg.1, "a slice bound is a non-negative integer or a dimension symbol")
                    .with_help("for example `slice[1, 0, 4](x)` or `slice[0, 1, T1](x)`; name other sizes in `where` (`T1 = T + 1`)");
                self.push(d);
                None
            }
        }
    }

    pub(super) fn axis_arg(&mut self, arg: &(BracketArg, Loc)) -> Option<String> {
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
    pub(super) fn call(
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
                "concat" => (None, 1, &[]),
                "slice" => (Some(1), 3, &[]),
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
            None if canonical == "concat" && nargs < 2 => {
                let d = self
                    .err(e.loc, "`concat` needs at least two operands")
                    .with_help("a single operand is the value itself");
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
            "slice" => {
                let dim = self.dim_ref_arg(&brackets[0])?;
                let start = self.slice_bound(&brackets[1])?;
                let end = self.slice_bound(&brackets[2])?;
                ExprKind::Slice(dim, start, end, x?)
            }
            "concat" => ExprKind::Concat(self.dim_ref_arg(&brackets[0])?, operands),
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
}
