//! The values every op family's extension ops take and return, on any backend: optional
//! tensors as enums, the class weights, the per-row statistics and the losses' parts,
//! grouped as Burn's dispatch maps them (`ExtensionType`). Imports nothing of the
//! families.

use burn::backend::{
    Backend, ExtensionType,
    tensor::{FloatTensor, IntTensor},
};

pub use fused_ce_kernels::row_stat;

/// Class weights on the device: `weights [V]` and their sum `total [1]`, f32 (the functions
/// cast them; the cube ops cast weights of another float dtype they are given).
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
/// class dimension is read as it is laid out), targets `[N]` or `[B, T]`, the class
/// weights and the rows' weights.
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct CrossEntropyInputs<B: Backend> {
    pub logits: FloatTensor<B>,
    pub targets: IntTensor<B>,
    #[extension_type]
    pub class_weights: ClassWeights<B>,
    #[extension_type]
    pub row_weights: RowWeights<B>,
}

/// Each row's weights in a weighted objective, f32 `[N]` each when given: the loss is
/// the reduction of `w_r loss_r - c_r H_r` (`H_r` the row's entropy; reduced as the
/// z-loss is), and its gradient is formed for it. An ignored row adds nothing whatever
/// its weights.
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct RowWeights<B: Backend> {
    /// `w_r`, each row's loss weight (1 without).
    #[extension_type]
    pub loss: OptionalFloat<B>,
    /// `c_r`, each row's entropy weight (0 without).
    #[extension_type]
    pub entropy: OptionalFloat<B>,
}

impl<B: Backend> RowWeights<B> {
    /// No weights: every row's loss counts once, and the entropy not at all.
    pub fn none() -> Self {
        Self {
            loss: OptionalFloat::Absent,
            entropy: OptionalFloat::Absent,
        }
    }

    /// Whether the entropy weights are given (the entropy is then tracked).
    pub fn has_entropy(&self) -> bool {
        matches!(self.entropy, OptionalFloat::Present { .. })
    }

    /// Whether any weights are given.
    pub fn is_weighted(&self) -> bool {
        self.has_entropy() || matches!(self.loss, OptionalFloat::Present { .. })
    }
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
