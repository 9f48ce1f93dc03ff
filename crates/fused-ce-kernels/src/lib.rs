//! Fused cross-entropy kernels written once in CubeCL, for every cube runtime (CUDA for
//! users, wgpu/Vulkan in CI) and every float element type (f32, f16, bf16; math in f32).
//!
//! This crate knows cubecl handles only: no Burn types. `burn-fused-ce` turns Burn tensors
//! into launch arguments and does the reductions.
//!
//! The kernels come by op family, each in its folder with its launch functions: `rows`
//! (the per-row forward and backward), `one_pass` (the training step in one pass over the
//! logits, built from the row family's pieces), `shards` (the vocabulary-parallel loss's
//! per-row kernels), `reduce` (the reduced outputs), `checks` (the target check) and
//! `matmul` (`out += lhs rhs` in place). What they share is in `base`, which imports none
//! of them.

// In `#[cube]` bodies values are expand handles, which move: a struct passed twice is
// cloned there, though its host type is `Copy`.
#![allow(clippy::clone_on_copy)]

mod base;
mod checks;
#[cfg(feature = "cuda-source")]
pub mod cuda_source;
mod matmul;
mod one_pass;
mod reduce;
mod rows;
mod shards;

pub use base::launch_args::{GradientTarget, WeightArgs};
pub use base::row::{RUNNING_MAX_START, RowOptions, RowScalars, RowScalarsLaunch};
pub use base::row_launch::{LossSettings, RowLaunch};
pub use base::row_stat;
pub use base::tuning::{CacheHints, KernelTuning, MAX_CHUNKS, TuningError};
pub use checks::{first_bad_target_kernel, launch_first_bad_target};
pub use matmul::{
    PlaneRows, has_tma, launch_matmul_accumulate, split_k_slices, tma_readable, tma_readable_copy,
};
pub use one_pass::{
    OnePassBuffers, OnePassOptions, OnePassPlan, OnePassScratch, PARTIAL_SLOTS, UNPUBLISHED,
    cross_entropy_one_pass_kernel, launch_one_pass, launch_scale_gradient,
    one_pass_prologue_kernel, scale_gradient_kernel, scale_slot,
};
pub use reduce::{ReduceOptions, launch_reduce_stats, reduce_stats_kernel};
pub use rows::{
    GradOptions, IncomingGradient, cross_entropy_backward_kernel, cross_entropy_forward_kernel,
    launch_backward, launch_forward,
};
pub use shards::{
    ELSEWHERE, PackOptions, SHARD_IGNORE, ShardGradientOptions, ShardRowsOptions, ShardScalars,
    launch_pack_shard_rows, launch_shard_gradient_rows, launch_shard_targets,
    launch_whole_vocabulary_rows, log_sum_rows, pack_shard_rows_kernel, shard_gradient_rows_kernel,
    shard_targets_kernel, whole_vocabulary_rows_kernel,
};
