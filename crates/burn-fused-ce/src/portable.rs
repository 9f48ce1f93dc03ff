//! The same math from ordinary Burn tensor ops, for backends without our kernels (NdArray
//! for CPU users, and as a cross-check). Correct everywhere, not fused: it builds N x V
//! temporaries (exps, a one-hot mask) that the kernels never do.
//!
//! Another backend gets the loss by implementing `FusedCrossEntropyBackend` with these two
//! functions, as the NdArray impl below does.

use burn::tensor::{
    Bool, DType, Int, Tensor, TensorPrimitive,
    backend::Backend,
    ops::{FloatTensor, IntTensor},
};

use crate::{
    backend::{RowStats, SavedRows},
    options::{CrossEntropyOptions, Reduction},
};

fn float<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

fn primitive<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> FloatTensor<B> {
    tensor.into_primitive().tensor()
}

/// Rows that count (`y != ignore_index` and `0 <= y < V`), and the targets with every
/// other row pointed at class 0 so that gathers stay in bounds.
struct Targets<B: Backend> {
    /// `[N, 1]`.
    counted: Tensor<B, 2, Bool>,
    /// `[N, 1]`: not the ignore index (counted in the mean, even when out of range).
    not_ignored: Tensor<B, 2, Bool>,
    /// `[N, V]`: the target's column.
    one_hot: Tensor<B, 2, Bool>,
    /// `[N, 1]`, always in `[0, V)`.
    safe: Tensor<B, 2, Int>,
}

fn targets<B: Backend>(targets: IntTensor<B>, vocab: usize, ignore_index: i64) -> Targets<B> {
    let targets: Tensor<B, 2, Int> = Tensor::<B, 1, Int>::from_primitive(targets).unsqueeze_dim(1);
    let device = targets.device();
    let not_ignored = targets.clone().not_equal_elem(ignore_index);
    let in_range = targets
        .clone()
        .greater_equal_elem(0)
        .bool_and(targets.clone().lower_elem(vocab as i64));
    let counted = not_ignored.clone().bool_and(in_range);
    let safe = targets.mask_fill(counted.clone().bool_not(), 0);
    let classes = Tensor::<B, 1, Int>::arange(0..vocab as i64, &device).unsqueeze_dim::<2>(0);
    let one_hot = classes.equal(safe.clone()).bool_and(counted.clone());
    Targets {
        counted,
        not_ignored,
        one_hot,
        safe,
    }
}

/// Per-row forward, as [`FusedCrossEntropyBackend::cross_entropy_rows`](crate::FusedCrossEntropyBackend::cross_entropy_rows).
pub fn cross_entropy_rows<B: Backend>(
    logits: FloatTensor<B>,
    targets_in: IntTensor<B>,
    options: &CrossEntropyOptions,
) -> RowStats<B> {
    let logits: Tensor<B, 2> = float::<B, 2>(logits).cast(DType::F32);
    let [_, vocab] = logits.dims();
    let t = targets::<B>(targets_in, vocab, options.ignore_index);
    let max = logits.clone().max_dim(1);
    let shifted = logits - max.clone();
    let target_shifted = shifted.clone().gather(1, t.safe);
    let exps = shifted.exp();
    // Sum without the target's own term: `p_y - 1 = -others / sum` keeps its digits.
    let others = exps.mask_fill(t.one_hot, 0.0).sum_dim(1);
    let sum = others.clone()
        + target_shifted
            .clone()
            .exp()
            .mask_fill(t.counted.clone().bool_not(), 0.0);
    let log_sum = sum.clone().log();
    let nan = Tensor::<B, 2>::full(max.dims(), f32::NAN, &max.device());
    let loss = (log_sum.clone() - target_shifted)
        .mask_where(t.counted.clone().bool_not(), nan)
        .mask_fill(t.not_ignored.clone().bool_not(), 0.0);
    let lse = (max + log_sum).mask_fill(t.not_ignored.clone().bool_not(), 0.0);
    let target_grad = (-others / sum).mask_fill(t.counted.bool_not(), 0.0);
    RowStats {
        loss: primitive(loss.squeeze_dim::<1>(1)),
        valid: primitive(t.not_ignored.float().cast(DType::F32).squeeze_dim::<1>(1)),
        saved: SavedRows {
            lse: primitive(lse.squeeze_dim::<1>(1)),
            target_grad: primitive(target_grad.squeeze_dim::<1>(1)),
        },
    }
}

/// Gradient, as [`FusedCrossEntropyBackend::cross_entropy_rows_backward`](crate::FusedCrossEntropyBackend::cross_entropy_rows_backward).
pub fn cross_entropy_rows_backward<B: Backend>(
    logits: FloatTensor<B>,
    targets_in: IntTensor<B>,
    saved: SavedRows<B>,
    grad_scale: FloatTensor<B>,
    options: &CrossEntropyOptions,
) -> FloatTensor<B> {
    let logits: Tensor<B, 2> = float::<B, 2>(logits);
    let dtype = logits.dtype();
    let [rows, vocab] = logits.dims();
    let t = targets::<B>(targets_in, vocab, options.ignore_index);
    let scale: Tensor<B, 2> = match options.reduction {
        Reduction::None => float::<B, 1>(grad_scale).reshape([rows, 1]),
        _ => float::<B, 1>(grad_scale).reshape([1, 1]).expand([rows, 1]),
    };
    let lse: Tensor<B, 2> = float::<B, 1>(saved.lse).reshape([rows, 1]);
    let target_grad: Tensor<B, 2> = float::<B, 1>(saved.target_grad).reshape([rows, 1]);
    let probs = (logits.cast(DType::F32) - lse).exp();
    let grad = probs
        .mask_where(t.one_hot, target_grad.expand([rows, vocab]))
        .mul(scale)
        .mask_fill(t.counted.bool_not().expand([rows, vocab]), 0.0);
    primitive(grad.cast(dtype))
}

/// NdArray (CPU): the portable math.
#[cfg(feature = "ndarray")]
mod ndarray {
    use burn_ndarray::{
        FloatNdArrayElement, IntNdArrayElement, NdArray, NdArrayTensor, QuantElement, SharedArray,
    };

    use super::*;
    use crate::backend::FusedCrossEntropyBackend;

    impl<E: FloatNdArrayElement, I: IntNdArrayElement, Q: QuantElement> FusedCrossEntropyBackend
        for NdArray<E, I, Q>
    where
        NdArrayTensor: From<SharedArray<E>>,
        NdArrayTensor: From<SharedArray<I>>,
    {
        fn cross_entropy_rows(
            logits: FloatTensor<Self>,
            targets: IntTensor<Self>,
            options: &CrossEntropyOptions,
        ) -> RowStats<Self> {
            cross_entropy_rows::<Self>(logits, targets, options)
        }

        fn cross_entropy_rows_backward(
            logits: FloatTensor<Self>,
            targets: IntTensor<Self>,
            saved: SavedRows<Self>,
            grad_scale: FloatTensor<Self>,
            options: &CrossEntropyOptions,
        ) -> FloatTensor<Self> {
            cross_entropy_rows_backward::<Self>(logits, targets, saved, grad_scale, options)
        }
    }
}
