//! The whole test suite as one executable (one link instead of several: a faster CI build
//! and a smaller GPU bundle). Runtime: Vulkan by default, CUDA with `--features cuda`.

mod backends;
mod bad_input;
mod common;
mod contract;
mod defaults;
mod in_place;
mod linear;
mod llm_shapes;
mod lm;
mod options;
mod ownership_and_autodiff;
mod shapes;
mod vocab_parallel;
