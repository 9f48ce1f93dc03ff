//! The two-pass backward's incoming gradient of the entropy under a weighted objective
//! `R(w_r loss_r - c_r H_r)`, by Burn's tensor ops (`O(N)`): every backend's backward
//! adds it to the entropy output's own.

use burn::backend::{Backend, tensor::FloatTensor};
use burn::tensor::DType;

use crate::primitive::FloatOf;

/// The two-pass backward's incoming gradient of the entropy per row, f32 `[N]`: the
/// entropy output's own (`output`, when the objective used it) plus the weighted
/// objective's `-g c_r` (divided by `n` for `Mean`: `denominators [D, n]` given), with
/// `g` the loss's incoming gradient (`[N]` per row, or one value for every row). `None`
/// when neither is there.
pub(crate) fn entropy_incoming<B: Backend>(
    output: Option<FloatTensor<B>>,
    entropy_weights: Option<FloatTensor<B>>,
    grad_output: &FloatTensor<B>,
    denominators: Option<&FloatTensor<B>>,
) -> Option<FloatTensor<B>> {
    let output = output.map(FloatOf::<B, 1>::flat_f32);
    let Some(weights) = entropy_weights else {
        return output.map(FloatOf::into_primitive);
    };
    let incoming = FloatOf::<B, 1>::flat_f32(grad_output.clone());
    let mut term = FloatOf::<B, 1>::flat_f32(weights).mul(incoming).neg();
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
