//! What the losses return: the loss and the extra outputs, shaped like the targets.

use burn::backend::Dispatch;
use burn::tensor::{Int, Shape, Tensor};

use crate::options::Reduction;
use crate::values::LossParts;

/// The loss and the extra outputs asked for in [`CrossEntropyOptions::outputs`](crate::CrossEntropyOptions::outputs).
///
/// `D` is the targets' rank. Per-row tensors have the targets' shape (`[N]` or `[B, T]`);
/// reduced ones have one element (`[1]` or `[1, 1]`).
#[derive(Debug, Clone)]
pub struct CrossEntropyOutput<const D: usize> {
    /// The loss in the logits' dtype.
    pub loss: Tensor<D>,
    /// The z-loss part alone (f32), reduced like the loss.
    pub z_loss: Option<Tensor<D>>,
    /// Share of non-ignored rows whose argmax is the target (f32 `[1]`; 0 when none).
    pub accuracy: Option<Tensor<1>>,
    /// Argmax per row (first on ties), -1 on ignored rows.
    pub predicted: Option<Tensor<D, Int>>,
    /// Per-row log-sum-exp of the (soft-capped) logits (f32), 0 on ignored rows.
    pub lse: Option<Tensor<D>>,
    /// Per-row entropy of the softmax after temperature and softcap (f32), 0 on ignored
    /// rows; differentiable where backward reads the logits (see
    /// [`ExtraOutputs::entropy`](crate::ExtraOutputs::entropy)). The other outputs have
    /// no gradient.
    pub entropy: Option<Tensor<D>>,
}

/// The op's outputs with the targets' shape (`target_dims`): per-row ones `[N]` or
/// `[B, T]`, reduced ones `[1]` or `[1, 1]`.
pub(crate) fn shaped_output<const DT: usize>(
    parts: LossParts<Dispatch>,
    target_dims: [usize; DT],
    reduction: Reduction,
) -> CrossEntropyOutput<DT> {
    let per_row_shape = Shape::new(target_dims);
    let loss_shape = if reduction == Reduction::None {
        per_row_shape.clone()
    } else {
        Shape::new([1; DT])
    };
    let float =
        |tensor, shape: Shape| -> Tensor<DT> { Tensor::<1>::from_dispatch(tensor).reshape(shape) };
    CrossEntropyOutput {
        loss: float(parts.loss, loss_shape.clone()),
        z_loss: parts.z_loss.into_option().map(|z| float(z, loss_shape)),
        accuracy: parts.accuracy.into_option().map(Tensor::from_dispatch),
        predicted: parts
            .predicted
            .into_option()
            .map(|p| Tensor::<1, Int>::from_dispatch(p).reshape(per_row_shape.clone())),
        lse: parts
            .lse
            .into_option()
            .map(|lse| float(lse, per_row_shape.clone())),
        entropy: parts
            .entropy
            .into_option()
            .map(|entropy| float(entropy, per_row_shape)),
    }
}
