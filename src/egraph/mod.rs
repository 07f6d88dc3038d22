//! The typed e-graph and the equality-rule library (paper sections 2–4).
//!
//! - [`lang`]: the e-node language — every IR operation with attributes rules match on;
//! - [`graph`]: egg's e-graph with the verifier's type as e-class analysis, and conversion
//!   from functions and dumps and back to dumps;
//! - [`rules`]: the rules, one module per family, each rule a named, documented function;
//! - [`finite`]: which classes have a finite term, bottom-up;
//! - [`runner`]: equality saturation with limits and a typed stop reason.

pub mod extract;
pub mod graph;
pub mod lang;
pub mod rules;
pub mod runner;

pub use graph::{EGraph, TypedEGraph};
pub use lang::{ENode, Op};
