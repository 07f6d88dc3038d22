//! The arena-based SSA IR: a module of functions and reducer definitions. Every expression —
//! named by a statement or nested inside another — is a [`Node`] in its body's arena and is
//! referred to by a [`NodeId`] handle. Nodes only refer to earlier nodes, so arena order is a
//! topological order.

use super::symbol::Sym;
use super::types::{DType, Dim, Type};
use crate::diag::Span;

/// Handle of a node in a [`Body`] arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Reciprocal,
    Neg,
    Abs,
    Tanh,
    Sigmoid,
    Silu,
    Gelu,
    Square,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    Add,
    Subtract,
    Multiply,
    Divide,
    Maximum,
    Minimum,
    Pow,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
    Equal,
    NotEqual,
    And,
    Or,
}

pub const UNARY_OPS: &[(&str, UnaryOp)] = &[
    ("exp", UnaryOp::Exp),
    ("log", UnaryOp::Log),
    ("sqrt", UnaryOp::Sqrt),
    ("rsqrt", UnaryOp::Rsqrt),
    ("reciprocal", UnaryOp::Reciprocal),
    ("neg", UnaryOp::Neg),
    ("abs", UnaryOp::Abs),
    ("tanh", UnaryOp::Tanh),
    ("sigmoid", UnaryOp::Sigmoid),
    ("silu", UnaryOp::Silu),
    ("gelu", UnaryOp::Gelu),
    ("square", UnaryOp::Square),
];

pub const BINARY_OPS: &[(&str, BinaryOp)] = &[
    ("add", BinaryOp::Add),
    ("subtract", BinaryOp::Subtract),
    ("multiply", BinaryOp::Multiply),
    ("divide", BinaryOp::Divide),
    ("maximum", BinaryOp::Maximum),
    ("minimum", BinaryOp::Minimum),
    ("pow", BinaryOp::Pow),
    ("less", BinaryOp::Less),
    ("less_equal", BinaryOp::LessEqual),
    ("greater", BinaryOp::Greater),
    ("greater_equal", BinaryOp::GreaterEqual),
    ("equal", BinaryOp::Equal),
    ("not_equal", BinaryOp::NotEqual),
    ("logical_and", BinaryOp::And),
    ("logical_or", BinaryOp::Or),
];

/// Short spellings accepted on input and printed in canonical form.
pub const OP_ALIASES: &[(&str, &str)] = &[
    ("mul", "multiply"),
    ("sub", "subtract"),
    ("div", "divide"),
    ("max", "maximum"),
    ("min", "minimum"),
];

impl UnaryOp {
    pub fn name(self) -> &'static str {
        UNARY_OPS
            .iter()
            .find(|(_, o)| *o == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }
}

impl BinaryOp {
    /// `a ∘ b = b ∘ a`: sums, products, extrema, (in)equality and the logical operators.
    pub fn is_commutative(self) -> bool {
        matches!(
            self,
            BinaryOp::Add
                | BinaryOp::Multiply
                | BinaryOp::Maximum
                | BinaryOp::Minimum
                | BinaryOp::Equal
                | BinaryOp::NotEqual
                | BinaryOp::And
                | BinaryOp::Or
        )
    }

    pub fn name(self) -> &'static str {
        BINARY_OPS
            .iter()
            .find(|(_, o)| *o == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }

    /// The infix spelling, for the four arithmetic operators.
    pub fn infix(self) -> Option<(&'static str, u8)> {
        match self {
            BinaryOp::Add => Some(("+", 1)),
            BinaryOp::Subtract => Some(("-", 1)),
            BinaryOp::Multiply => Some(("*", 2)),
            BinaryOp::Divide => Some(("/", 2)),
            _ => None,
        }
    }

    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Less
                | BinaryOp::LessEqual
                | BinaryOp::Greater
                | BinaryOp::GreaterEqual
                | BinaryOp::Equal
                | BinaryOp::NotEqual
        )
    }

    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or)
    }
}

/// A dimension named in an attribute: by symbol (`K`) or by index (`0`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DimRef {
    Name(String),
    Index(usize),
}

impl std::fmt::Display for DimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DimRef::Name(n) => f.write_str(n),
            DimRef::Index(i) => write!(f, "{i}"),
        }
    }
}

/// A field of a tuple: by position or by the state-field name of the reducer that built it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FieldRef {
    Index(usize),
    Name(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BuiltinReducer {
    Add,
    Mul,
    Max,
    Min,
}

impl BuiltinReducer {
    pub fn parse(name: &str) -> Option<BuiltinReducer> {
        Some(match name {
            "add" => BuiltinReducer::Add,
            "mul" => BuiltinReducer::Mul,
            "max" => BuiltinReducer::Max,
            "min" => BuiltinReducer::Min,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            BuiltinReducer::Add => "add",
            BuiltinReducer::Mul => "mul",
            BuiltinReducer::Max => "max",
            BuiltinReducer::Min => "min",
        }
    }

    /// The binary operator one fold step applies: `state' = state ∘ item`.
    pub fn fold_op(self) -> BinaryOp {
        match self {
            BuiltinReducer::Add => BinaryOp::Add,
            BuiltinReducer::Mul => BinaryOp::Multiply,
            BuiltinReducer::Max => BinaryOp::Maximum,
            BuiltinReducer::Min => BinaryOp::Minimum,
        }
    }

    pub fn identity(self) -> f64 {
        match self {
            BuiltinReducer::Add => 0.0,
            BuiltinReducer::Mul => 1.0,
            BuiltinReducer::Max => f64::NEG_INFINITY,
            BuiltinReducer::Min => f64::INFINITY,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReducerRef {
    Builtin(BuiltinReducer),
    /// A reducer defined in the module (`reducer @name(...)`), by name without `@`.
    User(Sym),
}

impl std::fmt::Display for ReducerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReducerRef::Builtin(b) => write!(f, "@{}", b.name()),
            ReducerRef::User(n) => write!(f, "@{n}"),
        }
    }
}

/// What a `reduce` folds over: a tensor dimension, or the coordinates of a parallel axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOver {
    Axis(DimRef),
    Parallel(Sym),
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    /// A function argument; its position is its index in [`Body::params`].
    Input,
    /// A reducer's state or item field; its position is its index in [`Body::params`].
    Param,
    /// A broadcastable literal of the annotated type.
    Constant(f64),
    /// A tensor of the annotated type filled with a value.
    Fill(f64),
    /// The coordinate along a dimension, broadcast over the others (annotated type).
    Iota(DimRef),
    Tuple(Vec<NodeId>),
    Get(FieldRef, NodeId),
    Partition(DimRef, Sym, NodeId),
    Replicate(Sym, NodeId),
    Combination(DimRef, Sym, NodeId),
    Collection(Sym, NodeId),
    Unary(UnaryOp, NodeId),
    Binary(BinaryOp, NodeId, NodeId),
    Select(NodeId, NodeId, NodeId),
    Cast(DType, NodeId),
    MatMul {
        a: NodeId,
        b: NodeId,
        acc: Option<DType>,
    },
    TileMatMul {
        a: NodeId,
        b: NodeId,
        acc: Option<DType>,
    },
    Reduce {
        input: NodeId,
        over: ReduceOver,
        reducer: ReducerRef,
        keep_dims: bool,
    },
    Transpose(Vec<usize>, NodeId),
    Reshape(Vec<Dim>, NodeId),
    Broadcast(Vec<Dim>, NodeId),
    /// `slice[D, START, END](x)`: indices `START … END-1` of dimension `D` (bounds are
    /// literals or dimension symbols).
    Slice(DimRef, Dim, Dim, NodeId),
    /// `concat[D](a, b, …)`: the operands one after another along dimension `D`.
    Concat(DimRef, Vec<NodeId>),
    /// `call @f(a, b, …)`: the results of function `f` (defined earlier in the module) on the
    /// operands; one result is that value, several are a tuple (`get[i]`).
    Call(String, Vec<NodeId>),
}

impl ExprKind {
    /// Operand handles in order.
    pub fn operands(&self) -> Vec<NodeId> {
        use ExprKind::*;
        match self {
            Input | Param | Constant(_) | Fill(_) | Iota(_) => vec![],
            Tuple(xs) | Concat(_, xs) | Call(_, xs) => xs.clone(),
            Get(_, x)
            | Slice(_, _, _, x)
            | Partition(_, _, x)
            | Replicate(_, x)
            | Combination(_, _, x)
            | Collection(_, x)
            | Unary(_, x)
            | Cast(_, x)
            | Transpose(_, x)
            | Reshape(_, x)
            | Broadcast(_, x) => vec![*x],
            Reduce { input, .. } => vec![*input],
            Binary(_, a, b) | MatMul { a, b, .. } | TileMatMul { a, b, .. } => vec![*a, *b],
            Select(c, a, b) => vec![*c, *a, *b],
        }
    }

    /// The operation's name as written in the text.
    pub fn op_name(&self) -> &'static str {
        use ExprKind::*;
        match self {
            Input => "input",
            Param => "param",
            Constant(_) => "constant",
            Fill(_) => "fill",
            Iota(_) => "iota",
            Tuple(_) => "tuple",
            Get(..) => "get",
            Partition(..) => "partition",
            Replicate(..) => "replicate",
            Combination(..) => "combination",
            Collection(..) => "collection",
            Unary(op, _) => op.name(),
            Binary(op, ..) => op.name(),
            Select(..) => "select",
            Cast(..) => "cast",
            MatMul { .. } => "matmul",
            TileMatMul { .. } => "tile_matmul",
            Reduce { .. } => "reduce",
            Transpose(..) => "transpose",
            Reshape(..) => "reshape",
            Broadcast(..) => "broadcast",
            Slice(..) => "slice",
            Concat(..) => "concat",
            Call(..) => "call",
        }
    }

    /// The same operation over other operands (in the order of [`ExprKind::operands`]).
    pub fn with_operands(&self, ops: &[NodeId]) -> ExprKind {
        use ExprKind::*;
        let o = |i: usize| ops.get(i).copied().unwrap_or(NodeId(0));
        match self {
            Input | Param | Constant(_) | Fill(_) | Iota(_) => self.clone(),
            Tuple(_) => Tuple(ops.to_vec()),
            Get(f, _) => Get(f.clone(), o(0)),
            Partition(d, a, _) => Partition(d.clone(), *a, o(0)),
            Replicate(a, _) => Replicate(*a, o(0)),
            Combination(d, a, _) => Combination(d.clone(), *a, o(0)),
            Collection(a, _) => Collection(*a, o(0)),
            Unary(u, _) => Unary(*u, o(0)),
            Cast(t, _) => Cast(*t, o(0)),
            Transpose(p, _) => Transpose(p.clone(), o(0)),
            Reshape(s, _) => Reshape(s.clone(), o(0)),
            Broadcast(s, _) => Broadcast(s.clone(), o(0)),
            Slice(d, a, b, _) => Slice(d.clone(), a.clone(), b.clone(), o(0)),
            Concat(d, _) => Concat(d.clone(), ops.to_vec()),
            Call(f, _) => Call(f.clone(), ops.to_vec()),
            Reduce {
                over,
                reducer,
                keep_dims,
                ..
            } => Reduce {
                input: o(0),
                over: over.clone(),
                reducer: reducer.clone(),
                keep_dims: *keep_dims,
            },
            Binary(b, _, _) => Binary(*b, o(0), o(1)),
            MatMul { acc, .. } => MatMul {
                a: o(0),
                b: o(1),
                acc: *acc,
            },
            TileMatMul { acc, .. } => TileMatMul {
                a: o(0),
                b: o(1),
                acc: *acc,
            },
            Select(..) => Select(o(0), o(1), o(2)),
        }
    }

    /// True for the leaves whose type comes from their annotation.
    pub fn needs_annotation(&self) -> bool {
        matches!(
            self,
            ExprKind::Input | ExprKind::Constant(_) | ExprKind::Fill(_) | ExprKind::Iota(_)
        )
    }
}

#[derive(Clone, Debug)]
pub struct Node {
    pub kind: ExprKind,
    /// The SSA name a statement gave it; nested sub-expressions have none.
    pub name: Option<String>,
    /// The type written in the source (`name: TYPE = …`), checked by `verify`.
    pub annot: Option<Type>,
    /// Source location of the expression (the whole statement's right-hand side).
    pub span: Span,
    /// The type inferred by `verify`.
    pub ty: Option<Type>,
}

/// A body: a node arena, its parameters in order and its results.
#[derive(Clone, Debug, Default)]
pub struct Body {
    pub nodes: Vec<Node>,
    pub params: Vec<NodeId>,
    pub results: Vec<NodeId>,
    pub results_span: Span,
}

impl Body {
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.index()]
    }

    pub fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        NodeId((self.nodes.len() - 1) as u32)
    }

    pub fn ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    pub fn ty(&self, id: NodeId) -> Option<&Type> {
        self.nodes[id.index()].ty.as_ref()
    }

    /// How many times each node is used as an operand or result.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut uses = vec![0; self.nodes.len()];
        for n in &self.nodes {
            for o in n.kind.operands() {
                uses[o.index()] += 1;
            }
        }
        for r in &self.results {
            uses[r.index()] += 1;
        }
        uses
    }
}

/// A `where` binding: a dimension size (`K = 4096`), a parallel-axis extent (`p = 4`), or a
/// derived size (`HD = NH*D`): then `def` is its definition and `value` its size at the
/// current values of its factors (`sizes::resolve_bindings` keeps the two in step).
#[derive(Clone, Debug)]
pub struct Binding {
    pub name: String,
    pub value: u64,
    pub def: Option<super::sizes::SizeExpr>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Function {
    pub name: String,
    pub name_span: Span,
    pub bindings: Vec<Binding>,
    pub body: Body,
    /// A one-line comment printed above the function (candidate summaries).
    pub comment: Option<String>,
    /// `schedule(m = 64, num_warps = 4, num_stages = 3)`: what `lower` emits by default
    /// (`rank` chooses it). Checked by the verifier: block sizes of the function's split axes,
    /// `num_warps` and `num_stages`.
    pub schedule: Option<Vec<ScheduleEntry>>,
}

/// One `name = value` of a function's `schedule(…)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleEntry {
    pub name: String,
    pub value: u64,
    pub span: Span,
}

impl Function {
    pub fn binding(&self, name: &str) -> Option<u64> {
        self.bindings
            .iter()
            .find(|b| b.name == name)
            .map(|b| b.value)
    }
}

/// `reducer @name(state = <a, b>, item = <x, y>) init = <0.0, -inf> { … }`: a left fold
/// `state' = body(state, item)` starting from `init`.
#[derive(Clone, Debug)]
pub struct ReducerDef {
    pub name: String,
    pub name_span: Span,
    pub state: Vec<String>,
    pub item: Vec<String>,
    pub init: Vec<f64>,
    /// Params are the state fields followed by the item fields.
    pub body: Body,
}

impl ReducerDef {
    /// The built-in reducers this reducer runs side by side, when it is their product
    /// (`state'ᵢ = stateᵢ ∘ᵢ itemᵢ` from `init`ᵢ the identity of `∘ᵢ`, as product fusion
    /// builds): such a fold can run field by field, in any order and grouping.
    pub fn as_product(&self) -> Option<Vec<BuiltinReducer>> {
        let n = self.state.len();
        let body = &self.body;
        if self.item.len() != n || self.init.len() != n || body.params.len() != 2 * n {
            return None;
        }
        let [result] = body.results.as_slice() else {
            return None;
        };
        // One field may be returned bare, several as a tuple.
        let fields = match &body.node(*result).kind {
            ExprKind::Tuple(fields) => fields.clone(),
            _ => vec![*result],
        };
        if fields.len() != n {
            return None;
        }
        let builtins = [
            BuiltinReducer::Add,
            BuiltinReducer::Mul,
            BuiltinReducer::Max,
            BuiltinReducer::Min,
        ];
        fields
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let ExprKind::Binary(op, a, b) = &body.node(*f).kind else {
                    return None;
                };
                let (acc, item) = (body.params[i], body.params[n + i]);
                let r = builtins.into_iter().find(|r| r.fold_op() == *op)?;
                let operands_ok = (*a, *b) == (acc, item) || (*a, *b) == (item, acc);
                (operands_ok && self.init[i] == r.identity()).then_some(r)
            })
            .collect()
    }
}

/// One e-node of an e-graph dump: an operation whose operand `i` (`NodeId(i)` in `kind`) is
/// the e-class `children[i]`.
#[derive(Clone, Debug)]
pub struct DumpNode {
    pub kind: ExprKind,
    pub children: Vec<u32>,
    /// For `input N`: the argument position.
    pub input: Option<u32>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct DumpClass {
    pub id: u32,
    pub ty: Type,
    pub span: Span,
    pub nodes: Vec<DumpNode>,
}

/// `egraph NAME where … { eclass %N : TYPE { … } … root %R }`: the output of `saturate` as
/// text, so that later passes can start from a saved e-graph.
#[derive(Clone, Debug)]
pub struct EGraphDump {
    pub name: String,
    pub name_span: Span,
    pub bindings: Vec<Binding>,
    pub classes: Vec<DumpClass>,
    pub roots: Vec<u32>,
    pub roots_span: Span,
}

#[derive(Clone, Debug, Default)]
pub struct Module {
    pub reducers: Vec<ReducerDef>,
    pub funcs: Vec<Function>,
    pub egraphs: Vec<EGraphDump>,
}

impl Module {
    pub fn reducer(&self, name: &str) -> Option<&ReducerDef> {
        self.reducers.iter().find(|r| r.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reducers(src: &str) -> Vec<ReducerDef> {
        let mut m = crate::parse::parse_module(src, 0).expect("parses");
        crate::verify::verify_module(&mut m).expect("verifies");
        m.reducers
    }

    #[test]
    fn products_of_builtin_reducers_are_recognised_and_nothing_else() {
        let rs = reducers(
            "reducer @sum2(state = <a0, a1>, item = <x0, x1>) init = <0.0, 0.0> {\n  return tuple(a0 + x0, x1 + a1)\n}\n\
             reducer @maxsum(state = <m, s>, item = <x, y>) init = <-inf, 0.0> {\n  return tuple(maximum(m, x), s + y)\n}\n\
             reducer @rowmax(state = <m>, item = <x>) init = <-inf> {\n  return maximum(m, x)\n}\n\
             reducer @badinit(state = <a>, item = <x>) init = <1.0> {\n  return a + x\n}\n\
             reducer @crossed(state = <a0, a1>, item = <x0, x1>) init = <0.0, 0.0> {\n  return tuple(a0 + x1, a1 + x0)\n}\n\
             reducer @rolling(state = <m, s>, item = <x>) init = <-inf, 0.0> {\n  return tuple(maximum(m, x), s * exp(m - maximum(m, x)) + exp(x - maximum(m, x)))\n}\n",
        );
        let product = |name: &str| {
            rs.iter()
                .find(|r| r.name == name)
                .expect("defined")
                .as_product()
        };
        use BuiltinReducer::*;
        assert_eq!(product("sum2"), Some(vec![Add, Add]));
        assert_eq!(product("maxsum"), Some(vec![Max, Add]));
        assert_eq!(product("rowmax"), Some(vec![Max]));
        assert_eq!(product("badinit"), None);
        assert_eq!(product("crossed"), None);
        assert_eq!(product("rolling"), None);
    }
}
