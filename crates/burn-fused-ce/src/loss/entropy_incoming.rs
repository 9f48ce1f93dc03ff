//! The two-pass backward's incoming gradient of the entropy under a weighted objective
//! `R(w_r loss_r - c_r H_r)`, by Burn's tensor ops (`O(N)`): every backend's backward
//! adds it to the entropy output's own.

use burn::backend::{Backend, TensorMetadata, tensor::FloatTensor};
use burn::tensor::{DType, Shape};

use crate::primitive::FloatOf;

/// The two-pass backward's incoming gradient of the entropy per row, f32 `[N]`: the
/// entropy output's own (`output`, when the objective used it) plus the weighted
/// objective's `-g c_r` (divided by `n` for `Mean`: `denominators [D, n]` given), with
/// `g` the loss's incoming gradient (`[N]` when `per_row`, else one value). `None` when
/// neither is there.
pub(crate) fn entropy_incoming<B: Backend>(
    output: Option<FloatTensor<B>>,
    entropy_weights: Option<FloatTensor<B>>,
    grad_output: &FloatTensor<B>,
    per_row: bool,
    denominators: Option<&FloatTensor<B>>,
    rows: usize,
) -> Option<FloatTensor<B>> {
    let output = output
        .map(|g| FloatOf::<B, 1>::new(B::float_reshape(g, Shape::new([rows]))).cast(DType::F32));
    let Some(weights) = entropy_weights else {
        return output.map(FloatOf::into_primitive);
    };
    let weights =
        FloatOf::<B, 1>::new(B::float_reshape(weights, Shape::new([rows]))).cast(DType::F32);
    let incoming_len = grad_output.shape().num_elements();
    let incoming = FloatOf::<B, 1>::new(B::float_reshape(
        grad_output.clone(),
        Shape::new([incoming_len]),
    ))
    .cast(DType::F32);
    let mut term = if per_row {
        weights.mul(incoming).neg()
    } else {
        weights.mul(incoming.reshape([1])).neg()
    };
    if let Some(denominators) = denominators {
        let n = FloatOf::<B, 1>::new(denominators.clone())
            .cast(DType::F32)
            .narrow(0, 1, 1);
        term = term.div(n);
    }
    Some(
        match output {
            Some(output) => output.add(term),
            None => term,
        }
        .into_primitive(),
    )
}
