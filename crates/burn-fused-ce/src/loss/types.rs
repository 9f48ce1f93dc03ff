//! The values the loss's own extension ops take and return, grouped as Burn's dispatch
//! maps them (`ExtensionType`); the values every family shares are in `values.rs`.

use burn::backend::{Backend, ExtensionType, tensor::FloatTensor};

use crate::values::{LossParts, OptionalFloat, RowStats};

/// What the two-pass backward reads besides the call's inputs.
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct TwoPassBackward<B: Backend> {
    /// Forward's per-row statistics (see [`RowStats::stats`]).
    pub stats: FloatTensor<B>,
    /// The loss's incoming gradient: `[N]` for `Reduction::None`, `[1]` otherwise, any
    /// float dtype.
    pub grad_output: FloatTensor<B>,
    /// For `Mean`, f32 `[2]`: the class-weight total `D` for the cross-entropy part and
    /// the row count `n` for the z-loss part.
    #[extension_type]
    pub denominators: OptionalFloat<B>,
    /// The entropy output's incoming gradient, f32 `[N]`, when the entropy is used in the
    /// graph: its gradient joins the loss's in the same pass (`stats` then hold the
    /// entropy, as forward writes it when asked for).
    #[extension_type]
    pub entropy_grad_output: OptionalFloat<B>,
}

/// What the one pass forms the gradient for: the guessed incoming gradient (f32 `[1]`)
/// and, for `Mean`, the denominators `[D, n]` (f32 `[2]`) when they are the whole
/// batch's rather than the call's rows' (the fused linear cross-entropy's chunks).
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct OnePassScale<B: Backend> {
    pub guess: FloatTensor<B>,
    #[extension_type]
    pub denominators: OptionalFloat<B>,
}

/// The one pass's outputs: forward's statistics and the gradient of the logits.
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct OnePassOutput<B: Backend> {
    #[extension_type]
    pub rows: RowStats<B>,
    pub grad: FloatTensor<B>,
}

/// The reduced outputs and, for `Mean`, the denominators backward divides by.
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct Reduced<B: Backend> {
    /// The loss (in the logits' dtype) and the extra outputs asked for.
    #[extension_type]
    pub parts: LossParts<B>,
    /// f32 `[2]`: `max(D, MIN_POSITIVE)` and `max(n, 1)`, when asked for (a tracked
    /// `Mean`).
    #[extension_type]
    pub denominators: OptionalFloat<B>,
}
