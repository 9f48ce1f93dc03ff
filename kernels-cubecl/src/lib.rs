//! Fused cross-entropy kernels written once in CubeCL, for every cube runtime (CUDA for
//! users, wgpu/Vulkan in CI) and every float element type (f32, f16, bf16; math in f32).
//!
//! This crate knows cubecl handles only: no Burn types. `burn-fused-ce` turns Burn tensors
//! into launch arguments and does the reductions.

#[cfg(feature = "cuda-source")]
pub mod cuda_source;
mod kernels;
mod launch;
mod reduce;
mod split;

pub use kernels::{
    GradOptions, RowOptions, RowScalars, RowScalarsLaunch, cross_entropy_backward_kernel,
    cross_entropy_forward_kernel, first_bad_target_kernel, scale_gradient_kernel,
};
pub use launch::*;
pub use reduce::{ReduceOptions, reduce_stats_kernel};
pub use split::{
    PARTIAL_SLOTS, SplitOptions, UNPUBLISHED, cross_entropy_split_grad_kernel,
    split_prologue_kernel,
};

/// Rows of the per-row statistics matrix `[COUNT, N]` (f32) that forward writes; each row
/// of it is contiguous. Ignored rows are 0 in every statistic.
pub mod row_stat {
    /// `ce + z`: the per-row loss (NaN for a target that is not a class).
    pub const LOSS: usize = 0;
    /// `s * lse^2`.
    pub const Z_LOSS: usize = 1;
    /// The target's class weight (1 without weights): the mean's `D` is their sum.
    pub const WEIGHT: usize = 2;
    /// 1: the mean's `n` is their sum.
    pub const VALID: usize = 3;
    /// 1 when the argmax is the target (only when the argmax is tracked).
    pub const CORRECT: usize = 4;
    /// Log-sum-exp of the (soft-capped) logits.
    pub const LSE: usize = 5;
    /// `p_y - 1`, formed without cancellation.
    pub const TARGET_GRAD: usize = 6;
    /// Number of statistics.
    pub const COUNT: usize = 7;
}
