//! Extension values between `Autodiff<B, C>` and its inner backend `B`: inputs lose their
//! nodes (the caller keeps the guards), outputs other than the tracked loss come back as
//! untracked tensors. Shared by every op family's autodiff impl.

use burn::backend::{
    AutodiffBackend, Backend,
    autodiff::{Autodiff, checkpoint::strategy::CheckpointStrategy},
    tensor::FloatTensor,
};

use crate::values::{
    ClassWeights, CrossEntropyInputs, LossParts, OptionalFloat, OptionalInt, RowStats, RowWeights,
};

/// Class weights of the inner backend (they are constants: no node).
pub(crate) fn inner_weights<B: Backend, C: CheckpointStrategy>(
    weights: ClassWeights<Autodiff<B, C>>,
) -> ClassWeights<B> {
    match weights {
        ClassWeights::Unweighted => ClassWeights::Unweighted,
        ClassWeights::Weighted { weights, total } => ClassWeights::Weighted {
            weights: weights.into_primitive(),
            total: total.into_primitive(),
        },
    }
}

/// Row weights of the inner backend (they are constants: no node).
pub(crate) fn inner_row_weights<B: Backend, C: CheckpointStrategy>(
    weights: RowWeights<Autodiff<B, C>>,
) -> RowWeights<B> {
    RowWeights {
        loss: inner_optional(weights.loss),
        entropy: inner_optional(weights.entropy),
    }
}

/// An optional float of the inner backend.
pub(crate) fn inner_optional<B: Backend, C: CheckpointStrategy>(
    tensor: OptionalFloat<Autodiff<B, C>>,
) -> OptionalFloat<B> {
    OptionalFloat::from_option(tensor.into_option().map(|t| t.into_primitive()))
}

/// An optional float of the inner backend as an untracked one of `Autodiff`.
pub(crate) fn outer_optional<B: Backend, C: CheckpointStrategy>(
    tensor: OptionalFloat<B>,
) -> OptionalFloat<Autodiff<B, C>> {
    OptionalFloat::from_option(tensor.into_option().map(Autodiff::<B, C>::from_inner))
}

/// The inner backend's inputs, the logits' autodiff node left behind.
pub(crate) fn inner_inputs<B: Backend, C: CheckpointStrategy>(
    inputs: CrossEntropyInputs<Autodiff<B, C>>,
) -> CrossEntropyInputs<B> {
    CrossEntropyInputs {
        logits: inputs.logits.into_primitive(),
        targets: inputs.targets,
        class_weights: inner_weights(inputs.class_weights),
        row_weights: inner_row_weights(inputs.row_weights),
    }
}

/// Per-row statistics of the inner backend as untracked ones of `Autodiff`.
pub(crate) fn outer_rows<B: Backend, C: CheckpointStrategy>(
    rows: RowStats<B>,
) -> RowStats<Autodiff<B, C>> {
    RowStats {
        stats: Autodiff::<B, C>::from_inner(rows.stats),
        predicted: OptionalInt::from_option(rows.predicted.into_option()),
        weighted: rows.weighted,
    }
}

/// Per-row statistics of `Autodiff` as the inner backend's.
pub(crate) fn inner_rows<B: Backend, C: CheckpointStrategy>(
    rows: RowStats<Autodiff<B, C>>,
) -> RowStats<B> {
    RowStats {
        stats: rows.stats.into_primitive(),
        predicted: OptionalInt::from_option(rows.predicted.into_option()),
        weighted: rows.weighted,
    }
}

/// The extra outputs of the inner backend as untracked tensors, around the tracked `loss`.
pub(crate) fn outer_parts<B: Backend, C: CheckpointStrategy>(
    loss: FloatTensor<Autodiff<B, C>>,
    parts: LossParts<B>,
) -> LossParts<Autodiff<B, C>> {
    LossParts {
        loss,
        z_loss: outer_optional(parts.z_loss),
        accuracy: outer_optional(parts.accuracy),
        predicted: OptionalInt::from_option(parts.predicted.into_option()),
        lse: outer_optional(parts.lse),
        entropy: outer_optional(parts.entropy),
    }
}
