//! Fused cross-entropy kernels written once in CubeCL, for every cube runtime (CUDA for
//! users, wgpu/Vulkan in CI) and every float element type (f32, f16, bf16; math in f32).
//!
//! This crate knows cubecl handles only: no Burn types. `burn-fused-ce` turns Burn tensors
//! into launch arguments and does the reductions.

// In `#[cube]` bodies values are expand handles, which move: a struct passed twice is
// cloned there, though its host type is `Copy`.
#![allow(clippy::clone_on_copy)]

mod backward;
mod checks;
#[cfg(feature = "cuda-source")]
pub mod cuda_source;
mod forward;
mod launch;
mod matmul_accumulate;
mod one_pass;
mod plan;
mod ptx;
mod reduce;
mod row;
pub mod row_stat;
mod row_state;
mod shards;
mod staged_exps;
mod sum_writer;
mod tma_rows;
mod tuning;

pub use backward::{GradOptions, cross_entropy_backward_kernel, scale_gradient_kernel};
pub use checks::first_bad_target_kernel;
pub use forward::cross_entropy_forward_kernel;
pub use launch::{
    GradientTarget, IncomingGradient, OnePassBuffers, OnePassScratch, ShardScalars, WeightArgs,
    launch_backward, launch_first_bad_target, launch_forward, launch_one_pass,
    launch_pack_shard_rows, launch_reduce_stats, launch_scale_gradient, launch_shard_gradient_rows,
    launch_shard_targets, launch_whole_vocabulary_rows,
};
pub use matmul_accumulate::{PlaneRows, launch_matmul_accumulate, split_k_slices};
pub use one_pass::{
    OnePassOptions, PARTIAL_SLOTS, UNPUBLISHED, cross_entropy_one_pass_kernel,
    one_pass_prologue_kernel, scale_slot,
};
pub use plan::{LossSettings, OnePassPlan, RowLaunch};
pub use reduce::{ReduceOptions, reduce_stats_kernel};
pub use row::{RUNNING_MAX_START, RowOptions, RowScalars, RowScalarsLaunch};
pub use shards::{
    ELSEWHERE, PackOptions, SHARD_IGNORE, ShardGradientOptions, ShardRowsOptions, log_sum_rows,
    pack_shard_rows_kernel, shard_gradient_rows_kernel, shard_targets_kernel,
    whole_vocabulary_rows_kernel,
};
pub use tma_rows::{has_tma, tma_readable, tma_readable_copy};
pub use tuning::{CacheHints, KernelTuning, MAX_CHUNKS, TuningError};
