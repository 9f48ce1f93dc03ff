//! The reduction of forward's per-row statistics by Burn's own ops: the default of
//! [`FusedCrossEntropyBackend::reduce_row_stats`](crate::backend::FusedCrossEntropyBackend::reduce_row_stats)
//! (cube backends run one kernel instead, but for per-row losses and empty batches).

use burn::backend::{
    Backend,
    tensor::{FloatTensor, IntTensor},
};
use burn::tensor::{DType, TensorData};

use crate::loss::types::Reduced;
use crate::mean_denominators::{LEAST_ROWS, LEAST_WEIGHT_TOTAL};
use crate::options::{CrossEntropyOptions, Reduction};
use crate::primitive::{BoolOf, FloatOf, IntOf};
use crate::values::{LossParts, OptionalFloat, OptionalInt, RowStats, RowWeights, row_stat};

/// One statistic's row of the stats matrix, `[N]` (a view: rows are contiguous).
pub(crate) fn stat_row<B: Backend>(stats: &FloatOf<B, 2>, stat: usize) -> FloatOf<B, 1> {
    let rows = stats.dims()[1];
    stats
        .clone()
        .slice([stat..stat + 1, 0..rows])
        .reshape([rows])
}

/// Reduces the per-row statistics on the device, in f32; the loss is cast to `dtype`
/// last. `Mean` divides the cross-entropy part by `max(D, MIN_POSITIVE)` and the z-loss
/// part by `max(n, 1)` (the call's own, or those the options give): an all-ignored batch
/// gives 0, not NaN. With row weights the loss is that of the weighted objective (see
/// [`RowWeights`]; the z-loss output is its weighted part). `keep_denominators` (a
/// tracked `Mean`) also returns `[D, n]` for backward. Each launch here has a fixed cost,
/// so only what an output needs is computed.
pub(crate) fn reduce_stats<B: Backend>(
    rows: RowStats<B>,
    row_weights: RowWeights<B>,
    options: &CrossEntropyOptions,
    dtype: DType,
    keep_denominators: bool,
) -> Reduced<B> {
    let stats = FloatOf::<B, 2>::new(rows.stats);
    let [_, n_rows] = stats.dims();
    let wanted = options.outputs;
    let has_z = options.z_loss_scale > 0.0;
    if n_rows == 0 {
        return reduce_no_rows::<B>(
            &stats.device(),
            options,
            dtype,
            rows.predicted.into_option(),
            keep_denominators,
        );
    }
    // Whole-vector sums of the statistics' rows: full reductions are fast where a
    // `sum_dim` over the `[row_stat::COUNT, N]` matrix is far slower (one unit per row).
    let sum_of = |stat: usize| -> FloatOf<B, 1> { stat_row(&stats, stat).sum() };
    // `D` and `n` (clamped), once: the mean and the accuracy share `n`. A mean over
    // given denominators divides by those; the accuracy stays the call's own.
    let given = given_denominators::<B>(options, &stats.device())
        .map(|given| (given.clone().narrow(0, 0, 1), given.narrow(0, 1, 1)));
    let counts = (wanted.accuracy || (options.reduction == Reduction::Mean && given.is_none()))
        .then(|| clamped_denominators(&stats, rows.weighted));

    let terms = WeightedRows::of(&stats, row_weights);
    let (loss, z_loss, denominators) = match options.reduction {
        Reduction::None => {
            let z_loss = wanted.z_loss.then(|| terms.z_loss.clone());
            (terms.per_row(), z_loss, None)
        }
        Reduction::Sum => {
            let loss = terms.loss.sum();
            let loss = match terms.entropy {
                Some(entropy) => loss.sub(entropy.sum()),
                None => loss,
            };
            (loss, wanted.z_loss.then(|| terms.z_loss.sum()), None)
        }
        Reduction::Mean => {
            let (weight_total, n) = given
                .or_else(|| counts.clone())
                .expect("the counts are summed for the mean");
            let z_sum = (has_z || wanted.z_loss).then(|| terms.z_loss.sum());
            let loss = match &z_sum {
                Some(z_sum) if has_z => terms
                    .loss
                    .sum()
                    .sub(z_sum.clone())
                    .div(weight_total.clone())
                    .add(z_sum.clone().div(n.clone())),
                _ => terms.loss.sum().div(weight_total.clone()),
            };
            // The entropy's term is reduced as the z-loss is.
            let loss = match terms.entropy {
                Some(entropy) => loss.sub(entropy.sum().div(n.clone())),
                None => loss,
            };
            let z_loss = z_sum.filter(|_| wanted.z_loss).map(|z| z.div(n.clone()));
            let denominators = keep_denominators.then(|| FloatOf::cat(vec![weight_total, n], 0));
            (loss, z_loss, denominators)
        }
    };
    let parts = LossParts {
        loss: loss.cast(dtype).into_primitive(),
        z_loss: OptionalFloat::from_option(z_loss.map(FloatOf::into_primitive)),
        accuracy: OptionalFloat::from_option(
            counts
                .filter(|_| wanted.accuracy)
                .map(|(_, n)| sum_of(row_stat::CORRECT).div(n).into_primitive()),
        ),
        predicted: if wanted.predicted {
            rows.predicted
        } else {
            OptionalInt::Absent
        },
        lse: OptionalFloat::from_option(
            wanted
                .lse
                .then(|| stat_row(&stats, row_stat::LSE).into_primitive()),
        ),
        entropy: OptionalFloat::from_option(
            wanted
                .entropy
                .is_on()
                .then(|| stat_row(&stats, row_stat::ENTROPY).into_primitive()),
        ),
    };
    Reduced {
        parts,
        denominators: OptionalFloat::from_option(denominators.map(FloatOf::into_primitive)),
    }
}

/// Index of the first `true` in `mask [len]`, or `len` when there is none, as `[1]` of
/// int type `dtype`.
pub(crate) fn first_true<B: Backend>(mask: BoolOf<B, 1>, len: usize, dtype: DType) -> IntOf<B, 1> {
    let device = burn::backend::TensorMetadata::device(&mask.0);
    let positions = IntOf::<B, 1>::arange(0..len as i64, &device, dtype);
    let past_end = IntOf::<B, 1>::full([len], len as i64, &device, dtype);
    past_end.mask_where(mask, positions).min()
}

/// The mean's denominators from the statistics of `N > 0` rows, as backward divides by
/// them: `max(D, MIN_POSITIVE)` and `max(n, 1)`. Without class weights `D` is `n`: one
/// sum serves both.
fn clamped_denominators<B: Backend>(
    stats: &FloatOf<B, 2>,
    weighted: bool,
) -> (FloatOf<B, 1>, FloatOf<B, 1>) {
    let n = stat_row(stats, row_stat::VALID).sum().clamp_min(LEAST_ROWS);
    let weight_total = if weighted {
        stat_row(stats, row_stat::WEIGHT)
            .sum()
            .clamp_min(LEAST_WEIGHT_TOTAL)
    } else {
        n.clone()
    };
    (weight_total, n)
}

/// f32 `[2]` (`D`, `n`) from the statistics of `N > 0` rows.
pub(crate) fn mean_denominators<B: Backend>(rows: &RowStats<B>) -> FloatTensor<B> {
    let (weight_total, n) =
        clamped_denominators(&FloatOf::<B, 2>::new(rows.stats.clone()), rows.weighted);
    FloatOf::cat(vec![weight_total, n], 0).into_primitive()
}

/// N = 0 without any launch (a kernel over zero elements is an invalid launch on CUDA):
/// empty vectors for `None` and per-row outputs, 0 for reduced ones.
fn reduce_no_rows<B: Backend>(
    device: &B::Device,
    options: &CrossEntropyOptions,
    dtype: DType,
    predicted: Option<IntTensor<B>>,
    keep_denominators: bool,
) -> Reduced<B> {
    let per_row = options.reduction == Reduction::None;
    let value = |dtype: DType| -> FloatTensor<B> {
        if per_row {
            FloatOf::<B, 1>::empty([0], device, dtype).into_primitive()
        } else {
            FloatOf::<B, 1>::zeros([1], device, dtype).into_primitive()
        }
    };
    let wanted = options.outputs;
    let int_dtype = burn::backend::get_device_settings::<B>(device)
        .int_dtype
        .into();
    let parts = LossParts {
        loss: value(dtype),
        z_loss: OptionalFloat::from_option(wanted.z_loss.then(|| value(DType::F32))),
        accuracy: OptionalFloat::from_option(
            wanted
                .accuracy
                .then(|| FloatOf::<B, 1>::zeros([1], device, DType::F32).into_primitive()),
        ),
        predicted: OptionalInt::from_option(if wanted.predicted {
            predicted
                .or_else(|| Some(IntOf::<B, 1>::empty([0], device, int_dtype).into_primitive()))
        } else {
            None
        }),
        lse: OptionalFloat::from_option(
            wanted
                .lse
                .then(|| FloatOf::<B, 1>::empty([0], device, DType::F32).into_primitive()),
        ),
        entropy: OptionalFloat::from_option(
            wanted
                .entropy
                .is_on()
                .then(|| FloatOf::<B, 1>::empty([0], device, DType::F32).into_primitive()),
        ),
    };
    Reduced {
        parts,
        denominators: OptionalFloat::from_option(
            (options.reduction == Reduction::Mean && keep_denominators)
                .then(|| FloatOf::<B, 1>::ones([2], device, DType::F32).into_primitive()),
        ),
    }
}

/// The given denominators of a `Mean` call as the ops divide by them: f32 `[2]` (`D`,
/// `n`) on `device`, clamped; `None` when the call's own apply.
pub(crate) fn given_denominators<B: Backend>(
    options: &CrossEntropyOptions,
    device: &B::Device,
) -> Option<FloatOf<B, 1>> {
    let given = options
        .mean_denominators
        .filter(|_| options.reduction == Reduction::Mean)?;
    let values = [
        given.weight_total.max(LEAST_WEIGHT_TOTAL) as f32,
        given.rows.max(LEAST_ROWS) as f32,
    ];
    Some(FloatOf::from_data(
        TensorData::new(values.to_vec(), [2]),
        device,
    ))
}

/// A row weight as f32 `[N]`, 0 on rows that are not counted (`VALID` is 0 there).
fn counted_weight<B: Backend>(weights: FloatTensor<B>, stats: &FloatOf<B, 2>) -> FloatOf<B, 1> {
    let ignored = stat_row(stats, row_stat::VALID).equal_elem(0.0);
    FloatOf::<B, 1>::flat_f32(weights).mask_fill(ignored, 0.0)
}

/// The rows' terms of the weighted objective, f32 `[N]` each: `w_r LOSS_r`, `w_r Z_r`
/// and `c_r ENTROPY_r` (each the plain statistic where its weight is not given; the
/// entropy term `None` without entropy weights).
struct WeightedRows<B: Backend> {
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
