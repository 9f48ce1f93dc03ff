//! Each row's coefficients of a shard's gradient, and the inputs of the shard's backward
//! kernel by tensor ops: the default of [`crate::backend::VocabParallelBackend::shard_gradient_rows`].

use burn::backend::{Backend, tensor::FloatTensor};
use burn::tensor::{DType, Shape};

use crate::loss::reduce::stat_row;
use crate::options::{CrossEntropyOptions, Reduction};
use crate::primitive::{BoolOf, FloatOf};
use crate::values::{OptionalFloat, row_stat};
use crate::vocab_parallel::extension_types::{KernelBackwardRows, ShardBackwardRows};
use crate::vocab_parallel::shard::{SHARD_IGNORE, VocabShard};
use crate::vocab_parallel::target_rows::TargetRows;

/// Each row's scales `(sc, sz)` of the spec's gradient, f32 `[N]`: the incoming gradient
/// (`[N]` for `None`, `[1]` otherwise) over the mean's denominators `[D, n]` for `Mean`,
/// itself otherwise; 0 outside `flowing`.
pub(crate) fn row_scales<B: Backend>(
    grad_output: FloatTensor<B>,
    denominators: Option<FloatTensor<B>>,
    reduction: Reduction,
    flowing: &BoolOf<B, 1>,
    rows: usize,
) -> (FloatOf<B, 1>, FloatOf<B, 1>) {
    let incoming = FloatOf::<B, 1>::new(grad_output).cast(DType::F32);
    let incoming = if reduction == Reduction::None {
        incoming.reshape_to::<1>(Shape::new([rows]))
    } else {
        incoming.reshape_to::<1>(Shape::new([1])).expand([rows])
    };
    let incoming = TargetRows::masked(flowing, incoming);
    match denominators {
        Some(denominators) if reduction == Reduction::Mean => {
            let denominators = FloatOf::<B, 1>::new(denominators);
            let part = |at: usize| denominators.clone().narrow(0, at, 1).expand([rows]);
            (incoming.clone().div(part(0)), incoming.div(part(1)))
        }
        _ => (incoming.clone(), incoming),
    }
}

/// Each row's coefficients of the spec's gradient on a shard, `c p_c - s w_c - [c = y]
/// target`, f32 `[N]`, from the row scales `(sc, sz)` of [`row_scales`] and the
/// log-sum-exps `lse`: `target = sc (1 - ls) w_y`, `s = sc ls / V`, `c = target + extra`
/// with `extra = s W + 2 z sz lse` (`W` the class-weight total, or `V`).
pub(crate) struct RowCoefficients<B: Backend> {
    pub target: FloatOf<B, 1>,
    /// `s`, with label smoothing.
    pub smooth: Option<FloatOf<B, 1>>,
    pub extra: FloatOf<B, 1>,
}

impl<B: Backend> RowCoefficients<B> {
    pub fn new(
        (ce_scale, z_scale): (FloatOf<B, 1>, FloatOf<B, 1>),
        stats: &FloatOf<B, 2>,
        lse: FloatOf<B, 1>,
        weight_total: Option<FloatTensor<B>>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
    ) -> Self {
        let rows = lse.dims()[0];
        let ls = options.label_smoothing as f64;
        let vocab = shard.vocab() as f64;
        let mut target = ce_scale.clone();
        if weight_total.is_some() {
            target = target.mul(stat_row(stats, row_stat::WEIGHT));
        }
        let mut extra = FloatOf::zeros([rows], &lse.device(), DType::F32);
        let mut smooth = None;
        if ls > 0.0 {
            target = target.mul_scalar(1.0 - ls);
            let smooth_coef = ce_scale.mul_scalar(ls / vocab);
            extra = match weight_total {
                Some(total) => smooth_coef
                    .clone()
                    .mul(FloatOf::<B, 1>::new(total).expand([rows])),
                None => smooth_coef.clone().mul_scalar(vocab),
            };
            smooth = Some(smooth_coef);
        }
        if options.z_loss_scale > 0.0 {
            let z = 2.0 * options.z_loss_scale as f64;
            extra = extra.add(z_scale.mul(lse.mul_scalar(z)));
        }
        Self {
            target,
            smooth,
            extra,
        }
    }

    /// `c`, the coefficient of `p_c`.
    pub fn probability(&self) -> FloatOf<B, 1> {
        self.target.clone().add(self.extra.clone())
    }
}

/// The kernel's inputs (see [`KernelBackwardRows`]) by tensor ops.
pub(crate) fn shard_gradient_rows_by_tensor_ops<B: Backend>(
    inputs: ShardBackwardRows<B>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> KernelBackwardRows<B> {
    let ShardBackwardRows {
        stats,
        targets,
        logits,
        grad_output,
        denominators,
        weight_total,
    } = inputs;
    let target_rows = &TargetRows::<B>::new(targets, shard, options.ignore_index);
    let stats = FloatOf::<B, 2>::new(stats);
    let rows = target_rows.rows();
    let width = shard.classes().len();
    let start = shard.classes().start as i64;
    let targets = target_rows
        .int_zeros()
        .mask_where(
            target_rows.here.clone(),
            target_rows.targets.clone().sub_scalar(start),
        )
        .mask_fill(target_rows.class.clone().not(), SHARD_IGNORE);
    let lse = stat_row(&stats, row_stat::LSE);
    let scales = row_scales::<B>(
        grad_output,
        denominators.into_option(),
        options.reduction,
        &target_rows.class,
        rows,
    );
    let weight_total = weight_total.into_option();
    let coefficients =
        RowCoefficients::new(scales, &stats, lse.clone(), weight_total, shard, options);
    let coefficient = coefficients.probability();
    let zero = coefficient.clone().equal_elem(0.0);
    let safe = coefficient.clone().mask_fill(zero.clone(), 1.0);
    let target_grad = stat_row(&stats, row_stat::TARGET_GRAD).add(coefficients.extra.div(safe));
    let first = FloatOf::<B, 2>::new(B::float_reshape(logits, Shape::new([rows, width])))
        .slice([0..rows, 0..1])
        .reshape([rows])
        .cast(DType::F32);
    let first = match options.softcap {
        Some(cap) => {
            let cap = cap as f64;
            first.div_scalar(cap).tanh().mul_scalar(cap)
        }
        None => first,
    };
    // As the backward kernel forms the other columns' probabilities.
    let elsewhere = first
        .sub(stat_row(&stats, row_stat::MAX))
        .sub(stat_row(&stats, row_stat::LOG_SUM))
        .exp();
    let written = elsewhere
        .mask_where(target_rows.here.clone(), target_grad)
        .mask_fill(zero, 0.0);
    let stats = (0..row_stat::COUNT)
        .map(|stat| {
            let row = if stat == row_stat::TARGET_GRAD {
                written.clone()
            } else {
                stat_row(&stats, stat)
            };
            row.reshape([1, rows])
        })
        .collect();
    KernelBackwardRows {
        targets: targets.into_primitive(),
        stats: FloatOf::cat(stats, 0).into_primitive(),
        coefficients: coefficient.into_primitive(),
        smooth: OptionalFloat::from_option(coefficients.smooth.map(FloatOf::into_primitive)),
    }
}
