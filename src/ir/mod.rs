//! The efopt IR.
//!
//! # Semantics
//! A module holds reducer definitions and functions. A function body is a list of SSA
//! statements over *pure* expressions; every value is a tensor or a tuple of tensors.
//!
//! Each tensor value has a *logical* type (`tensor<QxK, f32>`) and a *parallel state*: a set of
//! entries on named parallel axes.
//! - `partition(K,p)`: at each coordinate of `p` the value is a distinct slice of dimension K;
//! - `replicate(p)`: every coordinate of `p` sees the whole value;
//! - `partial(p)`: each coordinate holds a contribution that `reduce … parallel=p` will fold.
//!
//! A value with parallel state denotes one tile per coordinate of its axes. Operations on such
//! values act tile by tile at matching coordinates: pointwise operators and `tile_matmul`
//! compute on local tiles; `combination` and `collection` leave the parallel world by joining or
//! stacking tiles; `reduce … parallel=p` folds over the coordinates of `p` in order. The logical
//! shape never changes under tiling, so a tensor-level expression and its tiled implementation
//! have the same type and can share an e-class.
//!
//! Bodies are arenas of [`Node`]s addressed by [`NodeId`]; operands always precede users.
//! Axis names, dimension symbols and reducer names are interned ([`Sym`]): types and e-nodes
//! copy and compare them constantly during saturation.

pub mod alpha;
pub mod finite;
mod module;
pub mod print;
pub mod sizes;
mod symbol;
mod types;

pub use module::*;
pub use sizes::{Poly, SizeDefs, SizeExpr};
pub use symbol::Sym;
pub use types::*;
