//! The whole test suite as one executable (one link instead of several: a faster CI build
//! and a smaller GPU bundle). Runtime: Vulkan by default, CUDA with `--features cuda`, wgpu from WGSL
//! with `--features wgpu`.
//!
//! The tests are grouped by op family as the library is: `loss/`, `linear/`,
//! `vocab_parallel/`, `train/`; the harness they share (`common.rs`, `call.rs`,
//! `run_call.rs`, `cube_primitives.rs`, and `vocab_shards.rs`, included from
//! `crates/burn-fused-ce/tests/support/`) and the tests across families (`accumulation.rs`,
//! `properties.rs`) are at the top.

mod accumulation;
mod call;
mod common;
mod cube_primitives;
mod linear;
mod loss;
mod properties;
mod run_call;
mod train;
mod vocab_parallel;
mod weighted;
// Shared with the crate's smoke test: one copy.
#[path = "../../../burn-fused-ce/tests/support/vocab_shards.rs"]
mod vocab_shards;
