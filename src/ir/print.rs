//! The canonical printer. Its output parses back to the same IR, and printing that again gives
//! the same text (print ∘ parse ∘ print = print).
//!
//! Canonical choices: operation aliases print under their full name (`mul` → `multiply`), the
//! four arithmetic operators print infix with minimal parentheses, `neg` prints as a call,
//! unnamed single-use sub-expressions print nested, and anything else unnamed gets a fresh name
//! from the [`Namer`].

use super::module::*;
use super::types::*;
use std::collections::HashSet;
use std::fmt::Write;

#[derive(Clone, Copy, Debug, Default)]
pub struct PrintOptions {
    /// Print the inferred type of every statement, not only the written annotations.
    pub types: bool,
}

/// Generates identifiers that collide with nothing already in use.
#[derive(Default)]
pub struct Namer {
    used: HashSet<String>,
    /// Per base, the suffix to try first: every smaller one is taken (names are never
    /// released), so naming n values with one base costs O(n), not O(n²).
    next_suffix: std::collections::HashMap<String, u64>,
}

impl Namer {
    pub fn reserve(&mut self, name: &str) {
        self.used.insert(name.to_string());
    }

    pub fn fresh(&mut self, base: &str) -> String {
        if self.used.insert(base.to_string()) {
            return base.to_string();
        }
        let next = self.next_suffix.entry(base.to_string()).or_insert(1);
        loop {
            let candidate = format!("{base}_{next}");
            *next += 1;
            if self.used.insert(candidate.clone()) {
                return candidate;
            }
        }
    }
}

pub fn format_number(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v == f64::INFINITY {
        "inf".into()
    } else if v == f64::NEG_INFINITY {
        "-inf".into()
    } else {
        format!("{v:?}")
    }
}

/// A constant or fill of an integer type as an integer (`constant 200`, not `200.0`): the
/// value is the same, the text is what its author wrote.
fn format_value(v: f64, annot: Option<&Type>) -> String {
    let integer =
        matches!(annot, Some(Type::Tensor(t)) if matches!(t.dtype, DType::I32 | DType::I1));
    if integer && v.is_finite() && v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format_number(v)
    }
}

/// Depth beyond which the printer names a sub-expression instead of nesting it further.
const MAX_INLINE_DEPTH: usize = 48;

struct BodyPrinter<'a> {
    body: &'a Body,
    names: Vec<Option<String>>,
    opts: PrintOptions,
}

fn is_inline_literal(n: &Node) -> bool {
    matches!(n.kind, ExprKind::Constant(_))
        && n.name.is_none()
        && matches!(&n.annot, Some(Type::Tensor(t)) if t.shape.is_empty() && t.dtype == DType::F32 && t.par.is_empty())
}

impl<'a> BodyPrinter<'a> {
    fn new(body: &'a Body, opts: PrintOptions) -> BodyPrinter<'a> {
        let uses = body.use_counts();
        let mut namer = Namer::default();
        for n in &body.nodes {
            if let Some(name) = &n.name {
                namer.reserve(name);
            }
        }
        // Nesting depth if every unnamed node were inlined, to cap it.
        let mut depth = vec![0usize; body.nodes.len()];
        let mut names: Vec<Option<String>> = body.nodes.iter().map(|n| n.name.clone()).collect();
        for id in body.ids() {
            let n = body.node(id);
            if names[id.index()].is_some() {
                continue;
            }
            let d = 1 + n
                .kind
                .operands()
                .iter()
                .filter(|o| names[o.index()].is_none())
                .map(|o| depth[o.index()])
                .max()
                .unwrap_or(0);
            depth[id.index()] = d;
            let must_name = !is_inline_literal(n)
                && (uses[id.index()] != 1
                    || d > MAX_INLINE_DEPTH
                    || n.kind.needs_annotation()
                    || n.kind == ExprKind::Param);
            if must_name {
                names[id.index()] = Some(namer.fresh("v"));
                depth[id.index()] = 0;
            }
        }
        BodyPrinter { body, names, opts }
    }

    fn operand(&self, id: NodeId, out: &mut String, prec: u8) {
        match &self.names[id.index()] {
            Some(n) => out.push_str(n),
            None => self.expr(id, out, prec),
        }
    }

    /// An operand in a position that only takes an atom (`reduce X …`).
    fn atom(&self, id: NodeId, out: &mut String) {
        match &self.names[id.index()] {
            Some(n) => out.push_str(n),
            None => {
                out.push('(');
                self.expr(id, out, 0);
                out.push(')');
            }
        }
    }

    fn args(&self, ids: &[NodeId], out: &mut String) {
        out.push('(');
        for (i, id) in ids.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            self.operand(*id, out, 0);
        }
        out.push(')');
    }

    /// Prints a node's expression. `prec` is the binding strength the context requires:
    /// 0 anywhere, 1 as an operand of `+`/`-`, 2 of `*`/`/`, 3 as the right operand of `*`/`/`.
    fn expr(&self, id: NodeId, out: &mut String, prec: u8) {
        let n = self.body.node(id);
        match &n.kind {
            ExprKind::Input => out.push_str("input"),
            ExprKind::Param => out.push_str("param"),
            ExprKind::Constant(v) => {
                if is_inline_literal(n) {
                    let text = format_number(*v);
                    // A negative literal is a unary minus: fine everywhere an operand can go.
                    out.push_str(&text);
                } else {
                    write!(
                        out,
                        "constant {}",
                        format_value(*v, n.annot.as_ref().or(n.ty.as_ref()))
                    )
                    .ok();
                }
            }
            ExprKind::Fill(v) => {
                write!(
                    out,
                    "fill[{}]",
                    format_value(*v, n.annot.as_ref().or(n.ty.as_ref()))
                )
                .ok();
            }
            ExprKind::Iota(d) => {
                write!(out, "iota[{d}]").ok();
            }
            ExprKind::Binary(op, a, b) if op.infix().is_some() => {
                let (sym, p) = op.infix().unwrap_or(("+", 1));
                let paren = p < prec;
                if paren {
                    out.push('(');
                }
                self.operand(*a, out, p);
                write!(out, " {sym} ").ok();
                self.operand(*b, out, p + 1);
                if paren {
                    out.push(')');
                }
            }
            ExprKind::Binary(op, a, b) => {
                out.push_str(op.name());
                self.args(&[*a, *b], out);
            }
            ExprKind::Unary(op, x) => {
                out.push_str(op.name());
                self.args(&[*x], out);
            }
            ExprKind::Select(c, a, b) => {
                out.push_str("select");
                self.args(&[*c, *a, *b], out);
            }
            ExprKind::Tuple(xs) => {
                out.push_str("tuple");
                self.args(xs, out);
            }
            ExprKind::Call(f, xs) => {
                write!(out, "call @{f}").ok();
                self.args(xs, out);
            }
            ExprKind::Get(f, x) => {
                match f {
                    FieldRef::Index(i) => write!(out, "get[{i}]").ok(),
                    FieldRef::Name(s) => write!(out, "get[{s}]").ok(),
                };
                self.args(&[*x], out);
            }
            ExprKind::Partition(d, a, x) => {
                write!(out, "partition[{d},{a}]").ok();
                self.args(&[*x], out);
            }
            ExprKind::Combination(d, a, x) => {
                write!(out, "combination[{d},{a}]").ok();
                self.args(&[*x], out);
            }
            ExprKind::Replicate(a, x) => {
                write!(out, "replicate[{a}]").ok();
                self.args(&[*x], out);
            }
            ExprKind::Collection(a, x) => {
                write!(out, "collection[{a}]").ok();
                self.args(&[*x], out);
            }
            ExprKind::Cast(t, x) => {
                out.push_str("cast");
                self.args(&[*x], out);
                write!(out, " to={t}").ok();
            }
            ExprKind::MatMul { a, b, acc } | ExprKind::TileMatMul { a, b, acc } => {
                out.push_str(n.kind.op_name());
                self.args(&[*a, *b], out);
                if let Some(t) = acc {
                    write!(out, " acc={t}").ok();
                }
            }
            ExprKind::Reduce {
                input,
                over,
                reducer,
                keep_dims,
            } => {
                out.push_str("reduce ");
                self.atom(*input, out);
                match over {
                    ReduceOver::Axis(d) => write!(out, " axis={d}").ok(),
                    ReduceOver::Parallel(p) => write!(out, " parallel={p}").ok(),
                };
                write!(out, " reducer={reducer}").ok();
                if *keep_dims {
                    out.push_str(" keep_dims");
                }
            }
            ExprKind::Transpose(perm, x) => {
                let p: Vec<String> = perm.iter().map(|i| i.to_string()).collect();
                write!(out, "transpose[{}]", p.join(",")).ok();
                self.args(&[*x], out);
            }
            ExprKind::Reshape(s, x) => {
                write!(out, "reshape[{}]", shape_to_string(s)).ok();
                self.args(&[*x], out);
            }
            ExprKind::Broadcast(s, x) => {
                write!(out, "broadcast[{}]", shape_to_string(s)).ok();
                self.args(&[*x], out);
            }
            ExprKind::Slice(d, start, end, x) => {
                write!(out, "slice[{d},{start},{end}]").ok();
                self.args(&[*x], out);
            }
            ExprKind::Concat(d, xs) => {
                write!(out, "concat[{d}]").ok();
                self.args(xs, out);
            }
        }
    }

    fn statements(&self, out: &mut String, indent: &str) {
        for id in self.body.ids() {
            let n = self.body.node(id);
            let Some(name) = &self.names[id.index()] else {
                continue;
            };
            if n.kind == ExprKind::Param {
                continue;
            }
            let ty = if n.kind.needs_annotation() || !self.opts.types {
                n.annot
                    .as_ref()
                    .or(n.ty.as_ref().filter(|_| self.opts.types))
            } else {
                n.ty.as_ref().or(n.annot.as_ref())
            };
            write!(out, "{indent}{name}").ok();
            if let Some(t) = ty {
                write!(out, ": {t}").ok();
            }
            out.push_str(" = ");
            self.expr(id, out, 0);
            out.push('\n');
        }
        write!(out, "{indent}return ").ok();
        for (i, r) in self.body.results.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            self.operand(*r, out, 0);
        }
        out.push('\n');
    }
}

/// ` where A = 1, b = 2`, or nothing.
fn where_clause(bindings: &[Binding]) -> String {
    if bindings.is_empty() {
        return String::new();
    }
    let b: Vec<String> = bindings
        .iter()
        .map(|b| match &b.def {
            Some(def) => format!("{} = {def}", b.name),
            None => format!("{} = {}", b.name, b.value),
        })
        .collect();
    format!(" where {}", b.join(", "))
}

/// The expression of node `id` as the canonical printer writes it inside its body (operands
/// that the body names appear by name), for messages about one node.
pub fn print_expr(body: &Body, id: NodeId) -> String {
    let mut out = String::new();
    if id.index() < body.nodes.len() {
        BodyPrinter::new(body, PrintOptions::default()).expr(id, &mut out, 0);
    }
    out
}

pub fn print_function(f: &Function, opts: PrintOptions) -> String {
    let mut out = String::new();
    if let Some(c) = &f.comment {
        for line in c.lines() {
            writeln!(out, "// {line}").ok();
        }
    }
    write!(out, "func {}{}", f.name, where_clause(&f.bindings)).ok();
    if let Some(entries) = &f.schedule {
        let e: Vec<String> = entries
            .iter()
            .map(|e| format!("{} = {}", e.name, e.value))
            .collect();
        write!(out, " schedule({})", e.join(", ")).ok();
    }
    out.push_str(" {\n");
    BodyPrinter::new(&f.body, opts).statements(&mut out, "  ");
    out.push_str("}\n");
    out
}

pub fn print_reducer(r: &ReducerDef, opts: PrintOptions) -> String {
    let mut out = String::new();
    let init: Vec<String> = r.init.iter().map(|v| format_number(*v)).collect();
    writeln!(
        out,
        "reducer @{}(state = <{}>, item = <{}>) init = <{}> {{",
        r.name,
        r.state.join(", "),
        r.item.join(", "),
        init.join(", ")
    )
    .ok();
    BodyPrinter::new(&r.body, opts).statements(&mut out, "  ");
    out.push_str("}\n");
    out
}

/// Text of one e-node: the operation with `%N` operands.
pub fn dump_node_text(n: &DumpNode) -> String {
    if let (ExprKind::Input, Some(pos)) = (&n.kind, n.input) {
        return format!("input {pos}");
    }
    let mut body = Body::default();
    for c in &n.children {
        let id = body.push(Node {
            kind: ExprKind::Param,
            name: Some(format!("%{c}")),
            annot: None,
            span: n.span,
            ty: None,
        });
        body.params.push(id);
    }
    let placeholders: Vec<NodeId> = body.params.clone();
    let id = body.push(Node {
        kind: n.kind.with_operands(&placeholders),
        name: None,
        annot: None,
        span: n.span,
        ty: None,
    });
    body.results.push(id);
    let printer = BodyPrinter::new(&body, PrintOptions::default());
    let mut out = String::new();
    printer.expr(id, &mut out, 0);
    out
}

pub fn print_egraph(g: &EGraphDump) -> String {
    let mut out = format!("egraph {}{}", g.name, where_clause(&g.bindings));
    out.push_str(" {\n");
    for c in &g.classes {
        writeln!(out, "  eclass %{} : {} {{", c.id, c.ty).ok();
        for n in &c.nodes {
            writeln!(out, "    {}", dump_node_text(n)).ok();
        }
        out.push_str("  }\n");
    }
    let roots: Vec<String> = g.roots.iter().map(|r| format!("%{r}")).collect();
    writeln!(out, "  root {}", roots.join(", ")).ok();
    out.push_str("}\n");
    out
}

pub fn print_module(m: &Module, opts: PrintOptions) -> String {
    let mut out = Vec::new();
    // Writing into memory does not fail, and every part is UTF-8 text.
    let _ = write_module(&mut out, m, opts);
    String::from_utf8(out).unwrap_or_default()
}

/// Prints `m` part by part into `w`: a module of an extraction's candidates can print to
/// hundreds of megabytes, which are then never held at once.
pub fn write_module(
    w: &mut impl std::io::Write,
    m: &Module,
    opts: PrintOptions,
) -> std::io::Result<()> {
    let parts = (m.reducers.iter().map(|r| print_reducer(r, opts)))
        .chain(m.funcs.iter().map(|f| print_function(f, opts)))
        .chain(m.egraphs.iter().map(print_egraph));
    for (i, part) in parts.enumerate() {
        if i > 0 {
            w.write_all(b"\n")?;
        }
        w.write_all(part.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Namer;

    /// A fresh name is the base, else the base with the smallest free suffix: names reserved
    /// or handed out in between are skipped, never reused.
    #[test]
    fn fresh_names_take_the_smallest_free_suffix() {
        let mut namer = Namer::default();
        namer.reserve("v_2");
        let names: Vec<String> = (0..4).map(|_| namer.fresh("v")).collect();
        assert_eq!(names, ["v", "v_1", "v_3", "v_4"]);
        namer.reserve("v_6");
        assert_eq!(namer.fresh("v_5"), "v_5");
        assert_eq!(namer.fresh("v"), "v_7");
        assert_eq!(namer.fresh("w"), "w");
    }
}
