//! The values the loss's extension ops take and return: tensors of one backend grouped
//! as Burn's dispatch maps them (`ExtensionType`), optional tensors as enums.

use burn::backend::{
    Backend, ExtensionType,
    tensor::{FloatTensor, IntTensor},
};

pub use fused_ce_kernels::row_stat;

/// Class weights on the device, f32: `weights [V]` and their sum `total [1]`.
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub enum ClassWeights<B: Backend> {
    /// Every class weighs 1.
    Unweighted,
    /// One weight per class.
    Weighted {
        weights: FloatTensor<B>,
        total: FloatTensor<B>,
    },
}

impl<B: Backend> ClassWeights<B> {
    /// The weights and their total, when given.
    pub fn tensors(self) -> Option<(FloatTensor<B>, FloatTensor<B>)> {
        match self {
            Self::Unweighted => None,
            Self::Weighted { weights, total } => Some((weights, total)),
        }
    }

    /// Whether weights were given.
    pub fn is_weighted(&self) -> bool {
        matches!(self, Self::Weighted { .. })
    }
}

/// A float output that is there only when asked for.
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub enum OptionalFloat<B: Backend> {
    Absent,
    Present { tensor: FloatTensor<B> },
}

impl<B: Backend> OptionalFloat<B> {
    pub fn from_option(tensor: Option<FloatTensor<B>>) -> Self {
        match tensor {
            Some(tensor) => Self::Present { tensor },
            None => Self::Absent,
        }
    }

    pub fn into_option(self) -> Option<FloatTensor<B>> {
        match self {
            Self::Absent => None,
            Self::Present { tensor } => Some(tensor),
        }
    }
}

/// An int output that is there only when asked for.
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub enum OptionalInt<B: Backend> {
    Absent,
    Present { tensor: IntTensor<B> },
}

impl<B: Backend> OptionalInt<B> {
    pub fn from_option(tensor: Option<IntTensor<B>>) -> Self {
        match tensor {
            Some(tensor) => Self::Present { tensor },
            None => Self::Absent,
        }
    }

    pub fn into_option(self) -> Option<IntTensor<B>> {
        match self {
            Self::Absent => None,
            Self::Present { tensor } => Some(tensor),
        }
    }
}

/// The tensors of one call: logits `[N, V]` or `[B, T, V]` (rows may be strided; the
/// class dimension is read as it is laid out), targets `[N]` or `[B, T]`, and the class
/// weights.
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct CrossEntropyInputs<B: Backend> {
    pub logits: FloatTensor<B>,
    pub targets: IntTensor<B>,
    #[extension_type]
    pub class_weights: ClassWeights<B>,
}

/// What the fused forward pass produces.
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct RowStats<B: Backend> {
    /// f32 `[row_stat::COUNT, N]`, one row per statistic (see [`row_stat`]); `N` counts
    /// the rows of `[N, V]` or `[B, T, V]` logits in row-major order. `O(N)`, and all that
    /// backward needs besides the logits.
    pub stats: FloatTensor<B>,
    /// The argmax per row (-1 on ignored rows), in the targets' int type, `[N]`; present
    /// when `options.outputs` asks for accuracy or predictions.
    #[extension_type]
    pub predicted: OptionalInt<B>,
    /// Class weights were given (the `WEIGHT` statistic differs from `VALID`).
    pub weighted: bool,
}

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

/// The loss and extra outputs as primitives, all rank 1 (`[N]` per row, `[1]` reduced).
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct LossParts<B: Backend> {
    /// In the logits' dtype.
    pub loss: FloatTensor<B>,
    /// f32, reduced like the loss.
    #[extension_type]
    pub z_loss: OptionalFloat<B>,
    /// f32 `[1]`.
    #[extension_type]
    pub accuracy: OptionalFloat<B>,
    /// `[N]`, -1 on ignored rows.
    #[extension_type]
    pub predicted: OptionalInt<B>,
    /// f32 `[N]`.
    #[extension_type]
    pub lse: OptionalFloat<B>,
    /// f32 `[N]`.
    #[extension_type]
    pub entropy: OptionalFloat<B>,
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
