//! Fused cross-entropy loss for Burn.
//!
//! Forward and backward are CubeCL kernels that read each row of logits in place: no
//! N x V temporary, and the gradient goes over the logits when nothing else holds them.
//! Swap Burn's `CrossEntropyLoss` for [`FusedCrossEntropyLoss`], built from
//! [`FusedCrossEntropyLossConfig`]:
//!
//! ```
//! use burn::backend::{Autodiff, Wgpu};
//! use burn::tensor::{Distribution, Int, Tensor};
//! use burn_fused_ce::FusedCrossEntropyLossConfig;
//!
//! type B = Autodiff<Wgpu>;
//! let device = Default::default();
//! let logits = Tensor::<B, 2>::random([8, 1000], Distribution::Default, &device).require_grad();
//! let targets = Tensor::<B, 1, Int>::from_ints([1, 2, 3, -100, 5, 6, 7, 8], &device);
//!
//! // let loss_fn = burn::nn::loss::CrossEntropyLossConfig::new().init(&device);
//! let loss_fn = FusedCrossEntropyLossConfig::new().init(&device);
//! let loss = loss_fn.forward(logits.clone(), targets); // [1]: the mean over 7 rows
//! let grads = loss.backward();
//! let grad = logits.grad(&grads).expect("logits require grad"); // [8, 1000]
//! ```
//!
//! Options (reduction, ignore index, label smoothing, z-loss, softcap, class weights, the
//! [`TargetCheck`], the [`GradientPlan`], [`ExtraOutputs`], [`FastMath`]) are the config's
//! fields; [`fused_cross_entropy`] is the same loss without a module. Other backends:
//! [`FusedCrossEntropyBackend`] and [`portable`].

mod api;
mod autodiff;
mod autodiff_linear;
mod autodiff_vocab_parallel;
mod backend;
mod cube;
#[cfg(feature = "fusion")]
mod fusion;
mod incoming_guess;
mod linear;
mod linear_loss;
mod loss;
mod options;
pub mod portable;
mod target_check;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
#[cfg(not(feature = "test-hooks"))]
#[allow(dead_code)]
mod test_hooks;
mod vocab_parallel;

pub use api::{
    CrossEntropyOutput, fused_cross_entropy, try_fused_cross_entropy,
    try_fused_linear_cross_entropy, try_vocab_parallel_cross_entropy,
};
pub use backend::{
    ClassWeights, CrossEntropyInputs, FusedCrossEntropyBackend, LossParts, OnePassScale, Reduced,
    RowStats, TwoPassBackward, row_stat,
};
#[doc(hidden)]
pub use fused_ce_kernels::{CacheHints, KernelTuning, TuningError};
pub use incoming_guess::IncomingGuess;
pub use linear::{LinearChunking, LinearGradients, LinearHead, LinearInputs};
pub use linear_loss::{FusedLinearCrossEntropyLoss, FusedLinearCrossEntropyLossConfig};
pub use loss::{FusedCrossEntropyLoss, FusedCrossEntropyLossConfig};
pub use options::{
    CrossEntropyError, CrossEntropyOptions, ExtraOutputs, FastMath, GradientPlan, Reduction,
    TargetCheck,
};
pub use target_check::{PendingRead, wait_for_target_checks};
#[cfg(feature = "collective")]
pub use vocab_parallel::CollectiveExchange;
pub use vocab_parallel::{
    ExchangedRows, KernelBackwardRows, ShardBackwardRows, ShardExchange, VocabShard,
};

/// docs/usage.md's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/usage.md")]
pub struct UsageExamples;
