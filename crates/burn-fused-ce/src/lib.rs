//! Fused cross-entropy loss for Burn.
//!
//! Forward and backward are CubeCL kernels (crate `fused-ce-kernels`) that read each row
//! of logits in place: no N x V temporary in forward, and backward writes the gradient
//! over the logits when nothing else holds them. Swap Burn's `CrossEntropyLoss` for
//! [`FusedCrossEntropyLoss`]:
//!
//! ```ignore
//! let loss = FusedCrossEntropyLossConfig::new().init(&device).forward(logits, targets);
//! ```

mod api;
mod autodiff;
mod backend;
mod cube;
#[cfg(feature = "fusion")]
mod fusion;
mod loss;
mod options;
pub mod portable;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
#[cfg(not(feature = "test-hooks"))]
#[allow(dead_code)]
mod test_hooks;

pub use api::{CrossEntropyOutput, fused_cross_entropy, try_fused_cross_entropy};
pub use backend::{
    ClassWeights, CrossEntropyInputs, FusedCrossEntropyBackend, LossParts, Reduced, RowStats,
    TwoPassBackward, row_stat,
};
#[doc(hidden)]
pub use fused_ce_kernels::{CacheHints, KernelTuning, TuningError};
pub use loss::{FusedCrossEntropyLoss, FusedCrossEntropyLossConfig};
pub use options::{
    CrossEntropyError, CrossEntropyOptions, ExtraOutputs, FastMath, GradientPlan, Reduction,
};
