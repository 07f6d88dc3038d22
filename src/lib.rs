//! efopt: a superoptimizer for tensor programs, by equality saturation (EquiForge). Equality
//! rules relate a program's algebraic forms and its tiled, fused implementations in one typed
//! e-graph; extraction enumerates the distinct candidate programs, which are lowered to GPU
//! kernels and emitted as Triton code.
//!
//! The pipeline runs one way: [`parse`] text into the [`ir`]; [`verify`] it (types and
//! module rules); run [`passes`] over it — `saturate` (equality saturation on the
//! [`egraph`]) and `extract` (candidate programs from the saturated e-graph); [`lower`] each
//! candidate to a kernel plan; and hand the plan to a [`backend`] (Triton). The [`driver`]
//! runs such pipelines for the `efopt` command.
//!
//! Modules:
//! - `alloc`: the global allocator (mimalloc), and [`release_free_memory`];
//! - [`backend`]: writers of kernel plans (Triton kernels and a host function per candidate);
//! - [`diag`]: source spans and diagnostics, rendered with `ariadne`;
//! - [`driver`]: the `efopt` command: arguments, pass pipelines, dumps, statistics;
//! - [`egraph`]: the typed e-graph, the rule library, saturation and extraction;
//! - [`interp`]: the reference interpreter, for tensor-level and tiled programs alike;
//! - [`ir`]: the IR: modules, functions, types, printing;
//! - [`lower`]: the kernel plan of a verified candidate: kernels, buffers, folds, the order of
//!   its steps, the schedule space; what cannot be lowered is refused there;
//! - [`parse`]: text to IR: lexer, grammar and the builder;
//! - [`partition`]: convex subgraphs of a large function, and the composition of their
//!   candidates (k-best merge, inlining);
//! - [`passes`]: the named passes with typed options (`saturate`, `extract`, `lower`, …) and
//!   [`passes::PassManager`], which runs a pipeline of them on a module;
//! - [`support`]: where the Python scripts `triton-check` and `tune` run are found;
//! - [`verify`]: the type rules and the verifier.

mod alloc;
pub use alloc::release_free_memory;

pub mod backend;
pub mod diag;
pub mod driver;
pub mod egraph;
pub mod interp;
pub mod ir;
pub mod lower;
pub mod parse;
pub mod partition;
pub mod passes;
pub mod rank;
pub mod support;
pub mod tune;
pub mod verify;

/// The stack of every thread efopt starts (the driver's, the lowering worker's, rayon's):
/// the IR's walks recurse over the nesting of expressions, which a long chain of statements
/// inlined into one expression makes thousands deep (a 2,000-statement chain overflowed a
/// 2 MiB worker stack). Reserved address space, not memory.
pub const THREAD_STACK: usize = 256 * 1024 * 1024;

/// Sizes rayon's global pool's stacks as [`THREAD_STACK`]; once, before any parallel work.
pub fn init_thread_pool() {
    // An error means a pool already exists (a second call): it is used as it is.
    let _ = rayon::ThreadPoolBuilder::new()
        .stack_size(THREAD_STACK)
        .build_global();
}
