//! The same math from ordinary Burn tensor ops, for backends without our kernels (NdArray
//! for CPU users, and as a cross-check of the kernels). Correct everywhere, not fused: it
//! builds N x V temporaries (exps, masks) that the kernels never do, and copies strided
//! logits into `[N, V]`.
//!
//! The statistics are the kernels' own (see [`row_stat`] and
//! `crates/fused-ce-kernels/src/forward.rs`): every option, the cancellation-free `p_y - 1`, the
//! same values on ignored rows (all 0, predicted -1) and on rows whose target is not a
//! class (NaN loss, weight 1, zero gradient, never used as an index). All math is f32
//! whatever the logits' dtype; the gradient is cast back to it once.
//!
//! Another backend gets the loss by implementing `FusedCrossEntropyBackend` with these two
//! functions, as the Flex impl (`flex.rs`) does.

mod backward;
mod inputs;
mod rows;

pub use backward::cross_entropy_backward;
pub use rows::cross_entropy_rows;
