//! The e-graph language: one e-node per IR operation, with its attributes resolved to what
//! rules match on (dimension indices, axis names, reducers, dtypes) and its operands as
//! e-class ids.

use crate::ir::*;
use egg::{Id, Language};

/// An operation with its attributes; operands live in [`ENode::children`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Function argument by position, with its declared type.
    Input(u32, TensorType),
    /// Literal (f64 bits) broadcast to its type.
    Constant(u64, TensorType),
    Fill(u64, TensorType),
    Iota(usize, TensorType),
    Tuple,
    Get(usize),
    Partition(usize, Sym),
    Replicate(Sym),
    Combination(usize, Sym),
    Collection(Sym),
    Unary(UnaryOp),
    Binary(BinaryOp),
    Select,
    Cast(DType),
    MatMul(Option<DType>),
    TileMatMul(Option<DType>),
    ReduceAxis {
        dim: usize,
        reducer: ReducerRef,
        keep_dims: bool,
    },
    ReduceParallel {
        axis: Sym,
        reducer: ReducerRef,
    },
    Transpose(Vec<usize>),
    Reshape(Vec<Dim>),
    Broadcast(Vec<Dim>),
    /// `slice[dim, start, end]`.
    Slice(usize, Dim, Dim),
    /// `concat[dim]` of the children in order.
    Concat(usize),
}

impl Op {
    /// Elementwise: unary and binary operators, `select` and `cast`.
    pub fn is_pointwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast(_)
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ENode {
    pub op: Op,
    /// Operands; all operations but wide tuples have at most three, so they live inline
    /// (e-nodes are cloned into the hashcons, their class and parent lists).
    pub children: Children,
}

pub type Children = smallvec::SmallVec<[Id; 3]>;

impl ENode {
    pub fn new(op: Op, children: impl Into<Children>) -> ENode {
        ENode {
            op,
            children: children.into(),
        }
    }

    pub fn leaf(op: Op) -> ENode {
        ENode {
            op,
            children: Children::new(),
        }
    }

    /// The IR expression kind of this e-node with placeholder operands `0..n` (operand `i`
    /// is `NodeId(i)`), so the IR's typing rules and printer apply unchanged.
    pub fn to_expr_kind(&self) -> ExprKind {
        let c = |i: usize| NodeId(i as u32);
        match &self.op {
            Op::Input(..) => ExprKind::Input,
            Op::Constant(bits, _) => ExprKind::Constant(f64::from_bits(*bits)),
            Op::Fill(bits, _) => ExprKind::Fill(f64::from_bits(*bits)),
            Op::Iota(d, _) => ExprKind::Iota(DimRef::Index(*d)),
            Op::Tuple => ExprKind::Tuple((0..self.children.len()).map(c).collect()),
            Op::Get(i) => ExprKind::Get(FieldRef::Index(*i), c(0)),
            Op::Partition(d, a) => ExprKind::Partition(DimRef::Index(*d), *a, c(0)),
            Op::Replicate(a) => ExprKind::Replicate(*a, c(0)),
            Op::Combination(d, a) => ExprKind::Combination(DimRef::Index(*d), *a, c(0)),
            Op::Collection(a) => ExprKind::Collection(*a, c(0)),
            Op::Unary(u) => ExprKind::Unary(*u, c(0)),
            Op::Binary(b) => ExprKind::Binary(*b, c(0), c(1)),
            Op::Select => ExprKind::Select(c(0), c(1), c(2)),
            Op::Cast(t) => ExprKind::Cast(*t, c(0)),
            Op::MatMul(acc) => ExprKind::MatMul {
                a: c(0),
                b: c(1),
                acc: *acc,
            },
            Op::TileMatMul(acc) => ExprKind::TileMatMul {
                a: c(0),
                b: c(1),
                acc: *acc,
            },
            Op::ReduceAxis {
                dim,
                reducer,
                keep_dims,
            } => ExprKind::Reduce {
                input: c(0),
                over: ReduceOver::Axis(DimRef::Index(*dim)),
                reducer: reducer.clone(),
                keep_dims: *keep_dims,
            },
            Op::ReduceParallel { axis, reducer } => ExprKind::Reduce {
                input: c(0),
                over: ReduceOver::Parallel(*axis),
                reducer: reducer.clone(),
                keep_dims: false,
            },
            Op::Transpose(p) => ExprKind::Transpose(p.clone(), c(0)),
            Op::Reshape(s) => ExprKind::Reshape(s.clone(), c(0)),
            Op::Broadcast(s) => ExprKind::Broadcast(s.clone(), c(0)),
            Op::Slice(d, a, b) => ExprKind::Slice(DimRef::Index(*d), a.clone(), b.clone(), c(0)),
            Op::Concat(d) => {
                ExprKind::Concat(DimRef::Index(*d), (0..self.children.len()).map(c).collect())
            }
        }
    }

    /// The annotation a leaf carries (its declared type).
    pub fn leaf_type(&self) -> Option<Type> {
        match &self.op {
            Op::Input(_, t) | Op::Constant(_, t) | Op::Fill(_, t) | Op::Iota(_, t) => {
                Some(Type::Tensor(t.clone()))
            }
            _ => None,
        }
    }

    /// Builds the e-node for an IR node whose operands are the given classes. Dimension
    /// references resolve against the operand types (`types[i]` is operand `i`'s type).
    pub fn from_node(
        node: &Node,
        param_index: Option<u32>,
        children: Vec<Id>,
        types: &[&Type],
    ) -> Result<ENode, String> {
        let dim = |d: &DimRef, i: usize| -> Result<usize, String> {
            match types.get(i) {
                Some(Type::Tensor(t)) => crate::ir::resolve_dim(&t.shape, d).map_err(|e| e.message),
                _ => match d {
                    DimRef::Index(i) => Ok(*i),
                    DimRef::Name(n) => Err(format!("dimension {n} of a non-tensor")),
                },
            }
        };
        let annot = || match &node.annot {
            Some(Type::Tensor(t)) => Ok(t.clone()),
            _ => Err("leaf without tensor type".to_string()),
        };
        let op = match &node.kind {
            ExprKind::Input => Op::Input(param_index.ok_or("input without position")?, annot()?),
            ExprKind::Param => return Err("reducer parameters do not enter the e-graph".into()),
            ExprKind::Constant(v) => Op::Constant(v.to_bits(), annot()?),
            ExprKind::Fill(v) => Op::Fill(v.to_bits(), annot()?),
            ExprKind::Iota(d) => {
                let t = annot()?;
                let i = crate::ir::resolve_dim(&t.shape, d).map_err(|e| e.message)?;
                Op::Iota(i, t)
            }
            ExprKind::Tuple(_) => Op::Tuple,
            ExprKind::Get(FieldRef::Index(i), _) => Op::Get(*i),
            ExprKind::Get(FieldRef::Name(n), _) => {
                return Err(format!("unresolved field name `{n}`"))
            }
            ExprKind::Partition(d, a, _) => Op::Partition(dim(d, 0)?, *a),
            ExprKind::Replicate(a, _) => Op::Replicate(*a),
            ExprKind::Combination(d, a, _) => Op::Combination(dim(d, 0)?, *a),
            ExprKind::Collection(a, _) => Op::Collection(*a),
            ExprKind::Unary(u, _) => Op::Unary(*u),
            ExprKind::Binary(b, ..) => Op::Binary(*b),
            ExprKind::Select(..) => Op::Select,
            ExprKind::Cast(t, _) => Op::Cast(*t),
            ExprKind::MatMul { acc, .. } => Op::MatMul(*acc),
            ExprKind::TileMatMul { acc, .. } => Op::TileMatMul(*acc),
            ExprKind::Reduce {
                over: ReduceOver::Axis(d),
                reducer,
                keep_dims,
                ..
            } => match types.first() {
                Some(Type::Tensor(_)) | None => Op::ReduceAxis {
                    dim: dim(d, 0)?,
                    reducer: reducer.clone(),
                    keep_dims: *keep_dims,
                },
                Some(Type::Tuple(fs)) => {
                    // All fields reduce the same index (collections put |p| first).
                    let first = fs.first().ok_or("reduce of an empty tuple")?;
                    let i = dim(d, usize::MAX).or_else(|_| match first {
                        Type::Tensor(t) => {
                            crate::ir::resolve_dim(&t.shape, d).map_err(|e| e.message)
                        }
                        Type::Tuple(_) => Err("nested tuple".to_string()),
                    })?;
                    Op::ReduceAxis {
                        dim: i,
                        reducer: reducer.clone(),
                        keep_dims: *keep_dims,
                    }
                }
            },
            ExprKind::Reduce {
                over: ReduceOver::Parallel(a),
                reducer,
                ..
            } => Op::ReduceParallel {
                axis: *a,
                reducer: reducer.clone(),
            },
            ExprKind::Transpose(p, _) => Op::Transpose(p.clone()),
            ExprKind::Reshape(s, _) => Op::Reshape(s.clone()),
            ExprKind::Broadcast(s, _) => Op::Broadcast(s.clone()),
            ExprKind::Slice(d, a, b, _) => Op::Slice(dim(d, 0)?, a.clone(), b.clone()),
            ExprKind::Concat(d, _) => Op::Concat(dim(d, 0)?),
            ExprKind::Call(f, _) => {
                return Err(format!(
                    "`call @{f}` does not enter an e-graph: the callee is saturated on its own and its candidates composed"
                ))
            }
        };
        Ok(ENode::new(op, children))
    }
}

impl Language for ENode {
    type Discriminant = std::mem::Discriminant<Op>;

    fn discriminant(&self) -> Self::Discriminant {
        std::mem::discriminant(&self.op)
    }

    fn matches(&self, other: &Self) -> bool {
        self.op == other.op && self.children.len() == other.children.len()
    }

    fn children(&self) -> &[Id] {
        &self.children
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.children
    }
}
