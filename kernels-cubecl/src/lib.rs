//! Fused cross-entropy kernels written once in CubeCL, for every cube runtime (CUDA for
//! users, wgpu/Vulkan in CI) and every float element type (f32, f16, bf16; math in f32).
//!
//! This crate knows cubecl handles only: no Burn types. `burn-fused-ce` turns Burn tensors
//! into launch arguments and does the reductions.

mod kernels;
mod launch;

pub use kernels::{cross_entropy_backward_kernel, cross_entropy_forward_kernel};
pub use launch::*;
