//! The fused linear cross-entropy against an f64 reference of `hidden @ W + b` and the
//! loss (the spec's formulas) and against the unfused composition (Burn's matmul, then our
//! loss): every reduction with non-uniform incoming gradients, every option, class
//! weights, ignored and all-ignored rows, 3-D input, with and without a bias, the chunk
//! boundaries (one chunk, a partial last one, many), through the module with Burn's
//! `Linear` and through the function, on every backend.
//!
//! Burn 0.22 picks the backend by the device, and this build has Burn's fusion on: a cube
//! device's `Tensor<D>` runs on `Fusion<CubeBackend>`, whose custom ops run the plain
//! `CubeBackend`'s products. The plain backend has no `Tensor<D>` and no autodiff of its
//! own here, so it is tested on its primitives: its forward against the reference, and
//! each product it runs by kernels of its own (`accumulate_product`, `matmul_split_k`,
//! `add_into_columns`, `with_matmul_aligned_rows`) against the f64 product. Gradients on
//! a cube device are checked through `Fusion<CubeBackend>`.
//!
//! The case, its inputs and the f64 reference are `case.rs`, the check of one case through
//! `Tensor<D>` `check.rs`; the other linear test files use them.

mod case;
mod check;
mod chunks;
mod concurrency;
mod counted_rows;
mod cublaslt;
mod empty_and_bad_input;
mod frozen;
mod matrix;
mod memory;
mod non_finite;
mod products;
mod saved_config;

pub(crate) use case::{
    DrawnHead, LinearCase, LinearValues, bound, case_bound, check_close, check_gradients,
    linear_reference, loss_len, matmul_f64, reference_as_seen, transpose_f64, uniform,
};
pub(crate) use check::{check_linear_case, check_linear_case_seeded, module_config, objective_of};
