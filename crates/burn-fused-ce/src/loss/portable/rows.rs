//! Per-row forward by Burn's tensor ops: the kernels' statistics, row by row.

use burn::backend::{Backend, TensorMetadata};
use burn::tensor::DType;

use super::inputs::{class_weights_f32, classify_targets, logits_f32, rows_and_vocab};
use crate::options::CrossEntropyOptions;
use crate::primitive::{BoolOf, FloatOf, IntOf};
use crate::values::{CrossEntropyInputs, OptionalInt, RowStats, row_stat};

// The kernels' start value of a running maximum (finite on purpose): a row whose logits
// are all below it (all `-inf`, say) gets the kernels' `-inf` log-sum-exp and NaN loss,
// and no column of it is an argmax (the prediction is then 0).
use fused_ce_kernels::RUNNING_MAX_START;

/// Argmax per row (`[N, 1]`, the targets' dtype) as the kernels find it: the first column
/// holding the row's largest value, NaNs never win, and a row with no value above the
/// running maximum's start value (all `-inf`) predicts 0. Computed in the default int
/// dtype (V need not fit a narrow targets' dtype until the very end).
fn argmax_first<B: Backend>(logits: &FloatOf<B, 2>, dtype: DType) -> IntOf<B, 2> {
    let [rows, vocab] = logits.dims();
    let device = logits.device();
    let clean = logits
        .clone()
        .mask_fill(logits.clone().is_nan(), f64::NEG_INFINITY);
    let best = clean.clone().max_dim(1).expand([rows, vocab]);
    let hit = clean
        .clone()
        .equal(best)
        .and(clean.greater_elem(RUNNING_MAX_START as f64));
    let index_dtype = burn::backend::get_device_settings::<B>(&device)
        .int_dtype
        .into();
    let columns = IntOf::<B, 1>::arange(0..vocab as i64, &device, index_dtype)
        .reshape([1, vocab])
        .expand([rows, vocab]);
    let past_end = IntOf::<B, 2>::full([rows, vocab], vocab as i64, &device, index_dtype);
    let first = past_end.mask_where(hit, columns).min_dim(1);
    first
        .clone()
        .mask_fill(first.greater_equal_elem(vocab as i64), 0)
        .cast(dtype)
}

/// `-1` in an integer dtype, wrapped for unsigned ones as the kernels' `I::new(-1)` is.
fn fill_minus_one<B: Backend>(tensor: IntOf<B, 2>, mask: BoolOf<B, 2>) -> IntOf<B, 2> {
    match tensor.dtype() {
        DType::U64 => tensor.mask_fill(mask, u64::MAX),
        DType::U32 => tensor.mask_fill(mask, i64::from(u32::MAX)),
        DType::U16 => tensor.mask_fill(mask, i64::from(u16::MAX)),
        DType::U8 => tensor.mask_fill(mask, i64::from(u8::MAX)),
        _ => tensor.mask_fill(mask, -1i64),
    }
}

/// `ln(1 + x)`, accurate for small `x` (the kernels' `ln_one_plus`): a Taylor polynomial
/// below |x| = 0.05, `ln(1 + x)` above, where rounding `1 + x` would keep few digits of a
/// confident row's loss. Burn's backends have no `log1p` op to lean on.
fn ln_one_plus<B: Backend>(x: FloatOf<B, 2>) -> FloatOf<B, 2> {
    let mut series = x.clone().mul_scalar(1.0 / 7.0);
    for coefficient in [-1.0 / 6.0, 0.2, -0.25, 1.0 / 3.0, -0.5, 1.0] {
        series = series.add_scalar(coefficient).mul(x.clone());
    }
    let large = x.clone().mul(x.clone()).greater_elem(0.05 * 0.05);
    series.mask_where(large, x.add_scalar(1.0).log())
}

/// Per-row forward, as
/// [`FusedCrossEntropyBackend::cross_entropy_rows`](crate::backend::FusedCrossEntropyBackend::cross_entropy_rows):
/// the f32 statistics `[row_stat::COUNT, N]` (contiguous rows) and, when
/// `options.outputs` asks for accuracy or predictions, the argmax per row.
pub fn cross_entropy_rows<B: Backend>(
    inputs: CrossEntropyInputs<B>,
    options: &CrossEntropyOptions,
) -> RowStats<B> {
    let CrossEntropyInputs {
        logits,
        targets,
        class_weights,
        row_weights,
    } = inputs;
    // Entropy weights need the rows' entropy in the statistics.
    let track_entropy = options.outputs.entropy.is_on() || row_weights.has_entropy();
    let (rows, vocab) = rows_and_vocab(&logits.shape());
    let device = logits.device();
    let int_dtype = targets.dtype();
    let track_argmax = options.outputs.needs_argmax();
    let weighted = class_weights.is_weighted();
    if rows == 0 || vocab == 0 {
        // Nothing to read (the typed API refuses rows without classes before this).
        return RowStats {
            stats: FloatOf::<B, 2>::zeros([row_stat::COUNT, rows], &device, DType::F32)
                .into_primitive(),
            predicted: OptionalInt::from_option(
                track_argmax
                    .then(|| IntOf::<B, 1>::zeros([rows], &device, int_dtype).into_primitive()),
            ),
            weighted,
        };
    }

    let x = logits_f32::<B>(logits, rows, vocab, options);
    let t = classify_targets::<B>(targets, rows, vocab, options.ignore_index);
    let weights = class_weights_f32::<B>(class_weights, &t, rows, vocab, &device);
    let not_counted = t.counted.clone().not();

    let max = x.clone().max_dim(1).clamp_min(RUNNING_MAX_START as f64);
    let shifted = x.clone().sub(max.clone());
    // x_y - max; 0 on rows without a class target (their loss is NaN anyway).
    let target_shifted = shifted
        .clone()
        .gather(1, t.safe.clone())
        .mask_fill(not_counted.clone(), 0.0);
    let target_exp = target_shifted
        .clone()
        .exp()
        .mask_fill(not_counted.clone(), 0.0);
    // The sum without the target's own term: `p_y - 1 = -others / sum` keeps its digits
    // when the model is confident (p_y near 1), where `exp(x_y - lse) - 1` cancels.
    let exps = shifted.clone().exp();
    let others = exps.clone().mask_fill(t.one_hot.clone(), 0.0).sum_dim(1);
    let sum = others.clone().add(target_exp.clone());
    // ln(sum) as ln(1 + (sum - 1)), with `sum - 1` formed exactly when the target is the
    // max: a confident row's loss keeps its digits (as in the kernels).
    let log_sum = ln_one_plus::<B>(others.clone().add(target_exp.sub_scalar(1.0)));
    let entropy = if track_entropy {
        // H = ln(sum) - sum_c p_c (x'_c - max); a -inf logit's term is 0, not 0 * -inf.
        let spread = exps
            .clone()
            .mul(shifted.clone())
            .mask_fill(exps.equal_elem(0.0), 0.0)
            .sum_dim(1);
        log_sum.clone().sub(spread.div(sum.clone()))
    } else {
        drop(exps);
        FloatOf::zeros([rows, 1], &device, DType::F32)
    };
    let lse = max.clone().add(log_sum.clone());
    // lse - x_y = (max - x_y) + ln(sum): exact in its first term.
    let nll = log_sum.clone().sub(target_shifted);

    let mut loss = nll.mul(weights.target.clone());
    let ls = options.label_smoothing;
    if ls > 0.0 {
        // sum_c w_c (lse - x'_c) = W ln(sum) - sum_c w_c (x'_c - max): both terms >= 0 for
        // finite logits, so no cancellation (the kernels' `W lse - sum_c w_c x'_c` equals
        // it mathematically).
        let weighted_shifted = match &weights.row {
            Some(row) => shifted.clone().mul(row.clone()).sum_dim(1),
            None => shifted.clone().sum_dim(1),
        };
        let smooth = log_sum
            .clone()
            .mul(weights.total.clone())
            .sub(weighted_shifted);
        loss = loss
            .mul_scalar(1.0 - ls as f64)
            .add(smooth.mul_scalar(ls as f64 / vocab as f64));
    }
    let s = options.z_loss_scale;
    let z_loss = if s > 0.0 {
        lse.clone().mul(lse.clone()).mul_scalar(s as f64)
    } else {
        FloatOf::zeros([rows, 1], &device, DType::F32)
    };
    let loss = loss
        .add(z_loss.clone())
        .mask_fill(not_counted, f64::NAN)
        .mask_fill(t.ignored.clone(), 0.0);
    let target_grad = others.div(sum).neg();

    let zeros = || FloatOf::<B, 2>::zeros([rows, 1], &device, DType::F32);
    let predicted = track_argmax.then(|| argmax_first::<B>(&x, int_dtype));
    let correct = match &predicted {
        Some(predicted) => zeros().mask_fill(
            predicted
                .clone()
                .equal(t.safe.clone())
                .and(t.counted.clone()),
            1.0,
        ),
        None => zeros(),
    };
    let valid = zeros().mask_fill(t.ignored.clone().not(), 1.0);

    // One contiguous row per statistic, in `row_stat` order; ignored rows all 0.
    let mut columns: Vec<(usize, FloatOf<B, 2>)> = vec![
        (row_stat::LOSS, loss),
        (row_stat::Z_LOSS, z_loss),
        (row_stat::WEIGHT, weights.target),
        (row_stat::VALID, valid),
        (row_stat::CORRECT, correct),
        (row_stat::LSE, lse),
        (row_stat::TARGET_GRAD, target_grad),
        (row_stat::ENTROPY, entropy),
        (row_stat::MAX, max),
        (row_stat::LOG_SUM, log_sum.clone()),
    ];
    columns.sort_by_key(|(stat, _)| *stat);
    debug_assert_eq!(columns.len(), row_stat::COUNT);
    let stats = FloatOf::cat(
        columns
            .into_iter()
            .map(|(_, column)| column.mask_fill(t.ignored.clone(), 0.0).reshape([1, rows]))
            .collect(),
        0,
    );
    RowStats {
        weighted,
        stats: stats.into_primitive(),
        predicted: OptionalInt::from_option(predicted.map(|predicted| {
            fill_minus_one::<B>(predicted, t.ignored)
                .reshape([rows])
                .into_primitive()
        })),
    }
}
