//! efopt: a tensor-program superoptimizer over a unified tensor/tiled IR.
//!
//! Data flows one way: [`parse`] text into the [`ir`], [`passes`] verify and transform it (the
//! [`interp`] reference interpreter evaluates it), [`lower`] and [`backend`] emit GPU code. The
//! [`driver`] runs pass pipelines for the `efopt` command.

pub mod backend;
pub mod diag;
pub mod driver;
pub mod egraph;
pub mod interp;
pub mod ir;
pub mod lower;
pub mod parse;
pub mod passes;
