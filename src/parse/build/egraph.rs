//! E-graph dumps: classes of e-nodes, each e-node one operation over `%N` class references.

use super::{Builder, Scope};
use crate::diag::{Diagnostic, Span};
use crate::ir::{Body, DumpClass, DumpNode, EGraphDump, ExprKind, NodeId};
use crate::parse::ast::{EGraphAst, EGraphEntry, Expr};
use std::collections::HashMap;

impl Builder {
    pub(super) fn egraph(&mut self, g: &EGraphAst) -> Option<EGraphDump> {
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

    pub(super) fn err_span(&self, span: Span, msg: impl Into<String>) -> Diagnostic {
        Diagnostic::error(span, msg)
    }

    /// One e-node: a single operation whose operands are all `%N` references.
    pub(super) fn dump_node(&mut self, e: &Expr) -> Option<DumpNode> {
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
}
