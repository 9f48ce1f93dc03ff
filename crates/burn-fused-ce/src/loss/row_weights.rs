//! The weighted objective `R(w_r loss_r - c_r H_r)` by Burn's tensor ops, where it is not
//! a kernel's: the per-row loss, the reduction's sums, and the entropy's incoming gradient
//! of the two-pass backward. Ignored rows add nothing whatever their weights (a select,
//! not a product: a weight may be NaN there).

use burn::backend::{Backend, TensorMetadata, tensor::FloatTensor};
use burn::tensor::{DType, Shape};

use crate::loss::reduce::stat_row;
use crate::primitive::FloatOf;
use crate::values::{RowWeights, row_stat};

/// A row weight as f32 `[N]`, 0 on rows that are not counted (`VALID` is 0 there).
fn counted_weight<B: Backend>(weights: FloatTensor<B>, stats: &FloatOf<B, 2>) -> FloatOf<B, 1> {
    let rows = stats.dims()[1];
    let weights =
        FloatOf::<B, 1>::new(B::float_reshape(weights, Shape::new([rows]))).cast(DType::F32);
    let ignored = stat_row(stats, row_stat::VALID).equal_elem(0.0);
    weights.mask_fill(ignored, 0.0)
}

/// The rows' terms of the weighted objective, f32 `[N]` each: `w_r LOSS_r`, `w_r Z_r`
/// and `c_r ENTROPY_r` (each the plain statistic where its weight is not given; the
/// entropy term `None` without entropy weights).
pub(crate) struct WeightedRows<B: Backend> {
    pub loss: FloatOf<B, 1>,
    pub z_loss: FloatOf<B, 1>,
    pub entropy: Option<FloatOf<B, 1>>,
}

impl<B: Backend> WeightedRows<B> {
    pub(crate) fn of(stats: &FloatOf<B, 2>, weights: RowWeights<B>) -> Self {
        let loss = stat_row(stats, row_stat::LOSS);
        let z_loss = stat_row(stats, row_stat::Z_LOSS);
        let (loss, z_loss) = match weights.loss.into_option() {
            Some(w) => {
                let w = counted_weight(w, stats);
                (loss.mul(w.clone()), z_loss.mul(w))
            }
            None => (loss, z_loss),
        };
        let entropy = weights
            .entropy
            .into_option()
            .map(|c| counted_weight(c, stats).mul(stat_row(stats, row_stat::ENTROPY)));
        Self {
            loss,
            z_loss,
            entropy,
        }
    }

    /// `Reduction::None`'s loss: `w_r LOSS_r - c_r ENTROPY_r`.
    pub(crate) fn per_row(self) -> FloatOf<B, 1> {
        match self.entropy {
            Some(entropy) => self.loss.sub(entropy),
            None => self.loss,
        }
    }
}

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
