//! Fused cross-entropy loss for Burn.
//!
//! Forward and backward are CubeCL kernels that read each row of logits in place: no
//! N x V temporary, and the gradient goes over the logits when nothing else holds them.
//! Swap Burn's `CrossEntropyLoss` for [`FusedCrossEntropyLoss`], built from
//! [`FusedCrossEntropyLossConfig`], with the same runtime feature turned on in this crate
//! as in Burn (`wgpu`, `vulkan`, `cuda`, or `flex` for Burn's CPU backend):
//!
//! ```
//! use burn::tensor::{Device, DeviceKind, Distribution, Int, Tensor};
//! use burn_fused_ce::FusedCrossEntropyLossConfig;
//!
//! // Or Device::cuda(0), Device::vulkan(..), Device::flex(), as the features say.
//! let device = Device::wgpu(DeviceKind::DefaultDevice).autodiff();
//! let logits = Tensor::<2>::random([8, 1000], Distribution::Default, &device).require_grad();
//! let targets = Tensor::<1, Int>::from_ints([1, 2, 3, -100, 5, 6, 7, 8], &device);
//!
//! // let loss_fn = burn::nn::loss::CrossEntropyLossConfig::new().init(&device);
//! let loss_fn = FusedCrossEntropyLossConfig::new().init(&device);
//! let loss = loss_fn.forward(logits.clone(), targets); // [1]: the mean over 7 rows
//! let grads = loss.backward();
//! let grad = logits.grad(&grads).expect("logits require grad"); // [8, 1000]
//! assert_eq!(grad.dims(), [8, 1000]);
//! # device.sync().unwrap(); // exiting with work in flight can crash lavapipe
//! ```
//!
//! The three ops (the `try_` forms and methods return bad input as a
//! [`CrossEntropyError`], the others panic with its message):
//!
//! | op | takes | returns | costs |
//! |---|---|---|---|
//! | [`FusedCrossEntropyLoss`], [`fused_cross_entropy`] | logits `[N, V]` or `[B, T, V]` (f32, f16, bf16; rows may be strided), targets `[N]` or `[B, T]` (i64, i32), class weights `[V]` | the loss (one element, or one per row for `Reduction::None`) and the [`ExtraOutputs`] asked for, in a [`CrossEntropyOutput`] | one read of the logits in forward; for `Mean` and `Sum` the gradient is written over the logits in that same read (the one pass), otherwise backward reads them again; `O(N)` memory beside them |
//! | [`FusedLinearCrossEntropyLoss`], [`fused_linear_cross_entropy`] | hidden states `[N, H]` or `[B, T, H]`, the LM head (a Burn `&Linear`, or an [`LmHead`]: weight `[H, V]`, bias `[V]`), targets, class weights | the same, and the gradients of the hidden states, the weight and the bias that are tracked | the head's matmuls chunk by chunk (three a step; four with two passes), one chunk's logits ([`LinearChunking`]) and the `[H, V]` weight gradient in memory, never the whole `N x V` logits |
//! | [`vocab_parallel::try_vocab_parallel_cross_entropy`] | one device's shard of the logits `[N, V_s]`, the whole vocabulary's targets, a [`vocab_parallel::ShardExchange`] | the whole vocabulary's loss, and this shard's gradient | one read of the shard in forward (two with label smoothing) and one in backward, and an exchange of `O(N)` numbers per call |
//!
//! Options (reduction, ignore index, label smoothing, z-loss, temperature, softcap, class
//! weights, the [`TargetCheck`], the [`GradientPlan`], [`ExtraOutputs`], [`FastMath`]) are
//! the configs' fields and [`CrossEntropyOptions`]' for the functions. The ops plug into
//! Burn as backend extensions; [`backend`] has what implementing them on another backend
//! takes. The user's guide is `docs/usage.md` in the repository.
#![allow(clippy::clone_on_copy)]
// Without a backend feature the extension traits' dispatch over Burn's devices has no arm
// that reads the ops' arguments.
#![cfg_attr(not(any(feature = "cube", feature = "flex")), allow(unused_variables))]

mod autodiff_conversions;
#[cfg(feature = "cube")]
mod cube_tensors;
mod error;
pub mod linear;
mod loss;
mod mean_denominators;
mod options;
mod output;
mod primitive;
mod targets;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
#[cfg(not(feature = "test-hooks"))]
#[allow(dead_code)]
mod test_hooks;
#[cfg(feature = "train")]
mod train;
mod values;
pub mod vocab_parallel;

pub use error::{CrossEntropyError, Input};
pub use linear::api::{fused_linear_cross_entropy, try_fused_linear_cross_entropy};
pub use linear::chunk_products::ChunkProducts;
pub use linear::chunking::LinearChunking;
pub use linear::inputs::{LinearCrossEntropyInputs, LmHead};
pub use linear::module::{FusedLinearCrossEntropyLoss, FusedLinearCrossEntropyLossConfig};
pub use loss::api::{fused_cross_entropy, try_fused_cross_entropy};
pub use loss::module::{FusedCrossEntropyLoss, FusedCrossEntropyLossConfig};
pub use mean_denominators::MeanDenominators;
pub use options::{
    CrossEntropyOptions, EntropyOutput, ExtraOutputs, FastMath, GradientPlan, Reduction,
    TargetCheck,
};
pub use output::CrossEntropyOutput;
pub use targets::Targets;
#[cfg(feature = "train")]
pub use train::sequence_output::FusedSequenceOutput;

/// The deferred target check's wait (see [`TargetCheck::Deferred`]).
pub mod target_check {
    pub use crate::loss::target_check::wait_for_target_checks;
}

/// The kernels' launch shapes, for benches and tuning sweeps
/// ([`CrossEntropyOptions::with_tuning`]). They change speed, never results.
#[doc(hidden)]
pub mod tuning {
    pub use fused_ce_kernels::{CacheHints, KernelTuning, TuningError};
}

/// For implementing the ops on a backend of your own: the backend extensions (Burn's
/// `backend_extension`, one per op family), the values their ops take and return, and
/// the portable implementation on Burn's tensor ops that the defaults use. Training with
/// the losses needs none of this.
pub mod backend {
    pub use crate::linear::extension::LinearCrossEntropyBackend;
    pub use crate::linear::types::{LinearHead, LinearInputs};
    pub use crate::loss::check_read::TargetCheckRead;
    pub use crate::loss::extension::FusedCrossEntropyBackend;
    pub use crate::loss::incoming_guess::IncomingGuess;
    pub use crate::loss::pending_read::PendingRead;
    pub use crate::loss::portable;
    pub use crate::loss::types::{OnePassOutput, OnePassScale, Reduced, TwoPassBackward};
    pub use crate::values::{
        ClassWeights, CrossEntropyInputs, LossParts, OptionalFloat, OptionalInt, RowStats,
        RowWeights, row_stat,
    };
    pub use crate::vocab_parallel::extension::VocabParallelBackend;
    pub use crate::vocab_parallel::extension_types::{
        ExchangedRows, KernelBackwardRows, ShardBackwardRows,
    };
}

/// docs/usage.md's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/usage.md")]
pub struct UsageExamples;
