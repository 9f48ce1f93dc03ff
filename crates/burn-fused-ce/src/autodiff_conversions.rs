//! Extension values between `Autodiff<B, C>` and its inner backend `B`: inputs lose their
//! nodes (the caller keeps the guards), outputs other than the tracked loss come back as
//! untracked tensors. Shared by every op family's autodiff impl.

use burn::backend::{
    AutodiffBackend,
    autodiff::{Autodiff, checkpoint::strategy::CheckpointStrategy},
    tensor::FloatTensor,
};

use crate::loss::entropy_node::{EntropyGradient, tracked_entropy};
use crate::loss::extension::FusedCrossEntropyBackend;
use crate::loss::types::{ClassWeights, CrossEntropyInputs, LossParts, OptionalFloat, OptionalInt};

/// Class weights of the inner backend (they are constants: no node).
pub(crate) fn inner_weights<B: FusedCrossEntropyBackend, C: CheckpointStrategy>(
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

/// An optional float of the inner backend.
pub(crate) fn inner_optional<B: FusedCrossEntropyBackend, C: CheckpointStrategy>(
    tensor: OptionalFloat<Autodiff<B, C>>,
) -> OptionalFloat<B> {
    OptionalFloat::from_option(tensor.into_option().map(|t| t.into_primitive()))
}

/// An optional float of the inner backend as an untracked one of `Autodiff`.
pub(crate) fn outer_optional<B: FusedCrossEntropyBackend, C: CheckpointStrategy>(
    tensor: OptionalFloat<B>,
) -> OptionalFloat<Autodiff<B, C>> {
    OptionalFloat::from_option(tensor.into_option().map(Autodiff::<B, C>::from_inner))
}

/// The inner backend's inputs, the logits' autodiff node left behind.
pub(crate) fn inner_inputs<B: FusedCrossEntropyBackend, C: CheckpointStrategy>(
    inputs: CrossEntropyInputs<Autodiff<B, C>>,
) -> CrossEntropyInputs<B> {
    CrossEntropyInputs {
        logits: inputs.logits.into_primitive(),
        targets: inputs.targets,
        class_weights: inner_weights(inputs.class_weights),
    }
}

/// [`outer_parts`] with the entropy tracked as a child of the tracked `loss`, its
/// incoming gradient handed to `gradient` (`None`: the one pass, which cannot
/// differentiate it; see `loss/entropy_node.rs`).
pub(crate) fn outer_parts_with_entropy<B: FusedCrossEntropyBackend, C: CheckpointStrategy>(
    loss: FloatTensor<Autodiff<B, C>>,
    mut parts: LossParts<B>,
    gradient: Option<EntropyGradient<B>>,
) -> LossParts<Autodiff<B, C>> {
    let entropy = parts.entropy.into_option();
    parts.entropy = OptionalFloat::Absent;
    let entropy = entropy.map(|entropy| tracked_entropy::<B, C>(&loss, entropy, gradient));
    LossParts {
        entropy: OptionalFloat::from_option(entropy),
        ..outer_parts(loss, parts)
    }
}

/// The extra outputs of the inner backend as untracked tensors, around the tracked `loss`.
pub(crate) fn outer_parts<B: FusedCrossEntropyBackend, C: CheckpointStrategy>(
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
