//! Writers of kernel plans. A backend takes a [`crate::lower::KernelPlan`] and a concrete
//! [`crate::lower::Schedule`] and only writes text: every decision (kernels, buffers, axes,
//! folds, the order of steps) and every refusal is the plan's.
//!
//! [`triton`] writes a Python module of `@triton.jit` kernels and a host function per
//! candidate.

pub mod triton;
