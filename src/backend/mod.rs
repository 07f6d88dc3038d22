//! Code emitters. [`triton`] writes a Python module of `@triton.jit` kernels and a host
//! function per candidate.

pub mod triton;
