//! The backend extension: the op every backend that runs our kernels implements, and the
//! device-side reductions built on it.

use burn::tensor::{
    DType, Int, Tensor, TensorPrimitive,
    backend::Backend,
    ops::{FloatTensor, IntTensor},
};

use crate::options::{CrossEntropyOptions, Reduction};

/// What the fused forward pass produces per row, all f32 of shape `[N]`.
#[derive(Debug, Clone)]
pub struct RowStats<B: Backend> {
    /// `lse - x_y` for counted rows, 0 for ignored ones.
    pub loss: FloatTensor<B>,
    /// 1 for a counted row, 0 for an ignored one: the mean's denominator is its sum.
    pub valid: FloatTensor<B>,
    /// What backward needs besides the logits.
    pub saved: SavedRows<B>,
}

/// Per-row f32 `[N]` values forward keeps for backward: `O(N)`, never `O(N x V)`.
#[derive(Debug, Clone)]
pub struct SavedRows<B: Backend> {
    /// The row's log-sum-exp: `p_c = exp(x_c - lse)`.
    pub lse: FloatTensor<B>,
    /// `p_y - 1`, formed without cancellation (it matters when `p_y` is near 1).
    pub target_grad: FloatTensor<B>,
}

/// A Burn backend that can run the fused cross-entropy.
pub trait FusedCrossEntropyBackend: Backend {
    /// Per-row forward over `logits [N, V]` and `targets [N]`: reads the logits once and
    /// writes nothing of size N x V.
    fn cross_entropy_rows(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        options: &CrossEntropyOptions,
    ) -> RowStats<Self>;

    /// Gradient with respect to the logits, `grad_scale[i] * (softmax(x_i) - onehot(y_i))`
    /// with zero rows for ignored targets. `grad_scale` is f32, `[N]` for
    /// `Reduction::None` and `[1]` otherwise. Writes over `logits` when nothing else holds
    /// that buffer, into a new buffer otherwise.
    fn cross_entropy_rows_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        saved: SavedRows<Self>,
        grad_scale: FloatTensor<Self>,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self>;

    /// The reduced loss: `[N]` for `Reduction::None`, `[1]` otherwise, in the logits'
    /// dtype. Backends with autodiff override this to register the backward step.
    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        let dtype = burn::tensor::TensorMetadata::dtype(&logits);
        let rows = Self::cross_entropy_rows(logits, targets, options);
        reduce_rows::<Self>(rows.loss, rows.valid, options.reduction, dtype).loss
    }
}

/// A reduced loss and, for `Mean`, the denominator backward divides by (f32 `[1]`).
pub(crate) struct Reduced<B: Backend> {
    pub loss: FloatTensor<B>,
    pub mean_denominator: Option<FloatTensor<B>>,
}

fn float<B: Backend>(primitive: FloatTensor<B>) -> Tensor<B, 1> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

fn primitive<B: Backend>(tensor: Tensor<B, 1>) -> FloatTensor<B> {
    tensor.into_primitive().tensor()
}

/// Reduces per-row f32 losses on the device, in f32, and casts the result to `dtype` last.
/// The mean divides by `max(count, 1)`: an all-ignored batch gives 0, not NaN.
pub(crate) fn reduce_rows<B: Backend>(
    loss_rows: FloatTensor<B>,
    valid_rows: FloatTensor<B>,
    reduction: Reduction,
    dtype: DType,
) -> Reduced<B> {
    let loss_rows = float::<B>(loss_rows);
    if loss_rows.dims()[0] == 0 {
        return reduce_no_rows::<B>(&loss_rows.device(), reduction, dtype);
    }
    let (loss, mean_denominator) = match reduction {
        Reduction::None => (loss_rows, None),
        Reduction::Sum => (loss_rows.sum(), None),
        Reduction::Mean => {
            let denominator = float::<B>(valid_rows).sum().clamp_min(1.0);
            (loss_rows.sum() / denominator.clone(), Some(denominator))
        }
    };
    Reduced {
        loss: primitive(loss.cast(dtype)),
        mean_denominator: mean_denominator.map(primitive),
    }
}

/// N = 0 without any launch (a kernel over zero elements is an invalid launch on CUDA):
/// an empty vector for `None`, 0 for `Sum` and `Mean`.
fn reduce_no_rows<B: Backend>(
    device: &B::Device,
    reduction: Reduction,
    dtype: DType,
) -> Reduced<B> {
    let (loss, mean_denominator) = match reduction {
        Reduction::None => (Tensor::<B, 1>::empty([0], (device, dtype)), None),
        Reduction::Sum => (Tensor::zeros([1], (device, dtype)), None),
        Reduction::Mean => (
            Tensor::zeros([1], (device, dtype)),
            Some(Tensor::<B, 1>::ones([1], (device, DType::F32))),
        ),
    };
    Reduced {
        loss: primitive(loss),
        mean_denominator: mean_denominator.map(primitive),
    }
}

/// The per-row (or shared) scale backward applies: the incoming gradient in f32, over the
/// mean's denominator when there is one. Stays on the device.
pub(crate) fn gradient_scale<B: Backend>(
    grad_output: FloatTensor<B>,
    mean_denominator: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    let grad = float::<B>(grad_output).cast(DType::F32);
    let scale = match mean_denominator {
        Some(denominator) => grad / float::<B>(denominator),
        None => grad,
    };
    primitive(scale)
}

/// Typed entry point: the fused loss of `logits [N, V]` against `targets [N]`.
pub fn fused_cross_entropy<B: FusedCrossEntropyBackend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    options: &CrossEntropyOptions,
) -> Tensor<B, 1> {
    let loss = B::fused_cross_entropy(
        logits.into_primitive().tensor(),
        targets.into_primitive(),
        options,
    );
    float::<B>(loss)
}
