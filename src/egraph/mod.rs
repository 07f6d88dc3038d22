//! The typed e-graph, the equality-rule library, saturation and extraction (paper sections
//! 2–5).
//!
//! - [`lang`]: the e-node language — every IR operation with attributes rules match on;
//! - [`graph`]: egg's e-graph with the verifier's type as e-class analysis, and conversion
//!   from functions and dumps and back to dumps;
//! - [`runner`]: equality saturation with limits and a typed stop reason;
//! - [`rules`]: the rules, one module per family, each rule a named, documented function
//!   (policy in `rules/README.md`):
//!   - `rules/algebraic`: real-arithmetic equalities (commutativity, matmul reassociation,
//!     factor motion);
//!   - `rules/fusion`: reduction fusion over a tuple state (§4.2);
//!   - [`rules::repair`]: the repairs of repair fusion, and the check that accepts one (§4.2);
//!   - `rules/propagation`: partitions and replicas moved to inputs, combinations to outputs
//!     (§4.3);
//!   - `rules/refinement`: tensor-level operators as computations on tiles;
//!   - `rules/storage`: intermediate storage, folding per-coordinate values in a later kernel
//!     (§4.4);
//!   - `rules/structural`: cancelling and reordering parallel views;
//! - [`extract`]: candidate programs from the saturated e-graph (§5.1, Algorithm 1): the
//!   options and the report; its submodules, all private:
//!   - `extract/search`: the search (`Search`);
//!   - `extract/extract_graph`: the e-graph as extraction sees it, and the cost estimates;
//!   - `extract/canon`: canonical forms of partial programs (≈ₚ);
//!   - `extract/reach`: what the holes of a partial program can still reach;
//!   - `extract/validity`: each value computed once, no dead component;
//!   - `extract/kernels`: regions, kernel graph, launch order, kernel bounds;
//!   - `extract/context`: the hole context of ≈ₚ;
//!   - `extract/queue`: lowering complete programs on a second thread;
//!   - `extract/memory`: the memory limit;
//!   - `extract/output`: rebuilt functions and their summaries.
//!
//! Which classes have a finite term lives beside the IR, in [`crate::ir::finite`].

pub mod extract;
pub mod graph;
pub mod lang;
pub mod rules;
pub mod runner;

pub use graph::{EGraph, TypedEGraph};
pub use lang::{ENode, Op};
