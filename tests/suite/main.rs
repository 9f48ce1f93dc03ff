//! The whole test suite as one executable (one link instead of several: a faster CI build
//! and a smaller GPU bundle). Runtime: Vulkan by default, CUDA with `--features cuda`, wgpu from WGSL
//! with `--features wgpu`.

mod accumulation;
mod backends;
mod bad_input;
mod call;
mod common;
mod contract;
mod counted_rows;
mod cube_primitives;
mod cublaslt;
mod defaults;
mod entropy_gradient;
mod in_place;
mod learner;
mod linear;
mod linear_concurrency;
mod linear_frozen;
mod linear_memory;
mod linear_non_finite;
mod llm_shapes;
mod lm;
mod log_probs;
mod options;
mod ownership_and_autodiff;
mod properties;
mod run_call;
mod shapes;
mod vocab_parallel;
mod vocab_parallel_non_finite;
