//! The same math from ordinary Burn tensor ops, for backends without our kernels (NdArray
//! for CPU users, and as a cross-check of the kernels). Correct everywhere, not fused: it
//! builds N x V temporaries (exps, masks) that the kernels never do, and copies strided
//! logits into `[N, V]`.
//!
//! The statistics are the kernels' own (see [`row_stat`] and
//! `kernels-cubecl/src/forward.rs`): every option, the cancellation-free `p_y - 1`, the
//! same values on ignored rows (all 0, predicted -1) and on rows whose target is not a
//! class (NaN loss, weight 1, zero gradient, never used as an index). All math is f32
//! whatever the logits' dtype; the gradient is cast back to it once.
//!
//! Another backend gets the loss by implementing `FusedCrossEntropyBackend` with these two
//! functions, as the Flex impl (`flex.rs`) does.

use burn::backend::TensorMetadata;
use burn::backend::{
    Backend,
    tensor::{FloatTensor, IntTensor},
};
use burn::tensor::{DType, Shape};

use crate::loss::types::{
    ClassWeights, CrossEntropyInputs, OptionalInt, RowStats, TwoPassBackward, row_stat,
};
use crate::options::CrossEntropyOptions;
use crate::primitive::{BoolOf, FloatOf, IntOf};

// The kernels' start value of a running maximum (finite on purpose): a row whose logits
// are all below it (all `-inf`, say) gets the kernels' `-inf` log-sum-exp and NaN loss,
// and no column of it is an argmax (the prediction is then 0).
use fused_ce_kernels::RUNNING_MAX_START;

/// `(N, V)` of `[N, V]` or `[B, T, V]` logits (any rank >= 1: every dimension but the
/// last counts rows).
fn rows_and_vocab(shape: &Shape) -> (usize, usize) {
    let dims = shape.num_dims();
    let vocab = shape[dims - 1];
    let rows = (0..dims - 1).map(|dim| shape[dim]).product();
    (rows, vocab)
}

/// The logits as f32 `[N, V]` (a copy when they were strided), divided by the
/// temperature and soft-capped when asked.
fn logits_f32<B: Backend>(
    logits: FloatTensor<B>,
    rows: usize,
    vocab: usize,
    options: &CrossEntropyOptions,
) -> FloatOf<B, 2> {
    let logits =
        FloatOf::<B, 2>::new(B::float_reshape(logits, Shape::new([rows, vocab]))).cast(DType::F32);
    let logits = match options.temperature {
        Some(temperature) => logits.mul_scalar(1.0 / temperature as f64),
        None => logits,
    };
    match options.softcap {
        Some(cap) => logits.div_scalar(cap as f64).tanh().mul_scalar(cap as f64),
        None => logits,
    }
}

/// The value range of an integer dtype, as i64 (u64's top half is out of reach, and no
/// class index or ignore index lives there).
fn int_range(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::U64 => (0, i64::MAX),
        DType::U32 => (0, u32::MAX.into()),
        DType::U16 => (0, u16::MAX.into()),
        DType::U8 => (0, u8::MAX.into()),
        _ => (i64::MIN, i64::MAX),
    }
}

/// What every row's target says, `[N, 1]` unless noted.
struct Targets<B: Backend> {
    /// Not the ignore index and a class in `[0, V)`: the rows with a loss and a gradient.
    counted: BoolOf<B, 2>,
    /// The ignore index: every statistic 0, prediction -1.
    ignored: BoolOf<B, 2>,
    /// The target where it is a class, 0 elsewhere (every gather stays in bounds).
    safe: IntOf<B, 2>,
    /// `[N, V]`: the target's column (no column on rows that are not counted).
    one_hot: BoolOf<B, 2>,
}

/// `targets` (`[N]` or `[B, T]`, any int dtype) against a vocabulary of `vocab` classes.
/// Scalars are compared only where the targets' dtype can hold them (Burn panics when a
/// scalar does not fit): an ignore index outside that range ignores no row.
fn classify_targets<B: Backend>(
    targets: IntTensor<B>,
    rows: usize,
    vocab: usize,
    ignore_index: i64,
) -> Targets<B> {
    let targets = IntOf::<B, 2>::new(B::int_reshape(targets, Shape::new([rows, 1])));
    let device = targets.device();
    let dtype = targets.dtype();
    let (low, high) = int_range(dtype);
    let ignored = if (low..=high).contains(&ignore_index) {
        targets.clone().equal_elem(ignore_index)
    } else {
        IntOf::<B, 2>::zeros([rows, 1], &device, dtype).equal_elem(1)
    };
    let non_negative = targets.clone().greater_equal_elem(0);
    let in_range = if (vocab as u64) <= high as u64 {
        non_negative.and(targets.clone().lower_elem(vocab as i64))
    } else {
        non_negative
    };
    let counted = in_range.and(ignored.clone().not());
    let safe = targets.mask_fill(counted.clone().not(), 0);
    let classes = IntOf::<B, 1>::arange(0..vocab as i64, &device, dtype)
        .reshape([1, vocab])
        .expand([rows, vocab]);
    let one_hot = classes
        .equal(safe.clone().expand([rows, vocab]))
        .and(counted.clone().expand([rows, vocab]));
    Targets {
        counted,
        ignored,
        safe,
        one_hot,
    }
}

/// Class weights as f32 `[1, V]`, each row's target weight `[N, 1]` (1 on rows that are
/// not counted, as in the kernels) and the total `W` (`[1, 1]`; `V` without weights).
struct Weights<B: Backend> {
    row: Option<FloatOf<B, 2>>,
    target: FloatOf<B, 2>,
    total: FloatOf<B, 2>,
}

fn class_weights_f32<B: Backend>(
    class_weights: ClassWeights<B>,
    t: &Targets<B>,
    rows: usize,
    vocab: usize,
    device: &B::Device,
) -> Weights<B> {
    match class_weights.tensors() {
        Some((weights, total)) => {
            let row = FloatOf::<B, 1>::new(weights).cast(DType::F32);
            let total = FloatOf::<B, 1>::new(total).cast(DType::F32).reshape([1, 1]);
            let target = row
                .clone()
                .select(0, t.safe.clone().reshape([rows]))
                .reshape([rows, 1])
                .mask_fill(t.counted.clone().not(), 1.0);
            Weights {
                row: Some(row.reshape([1, vocab])),
                target,
                total,
            }
        }
        None => Weights {
            row: None,
            target: FloatOf::ones([rows, 1], device, DType::F32),
            total: FloatOf::full([1, 1], vocab as f64, device, DType::F32),
        },
    }
}

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

/// Per-row forward, as
/// [`FusedCrossEntropyBackend::cross_entropy_rows`](crate::FusedCrossEntropyBackend::cross_entropy_rows):
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
    } = inputs;
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
    let entropy = if options.outputs.entropy {
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

/// One statistic as a column `[N, 1]`.
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

fn stat_column<B: Backend>(stats: &FloatOf<B, 2>, stat: usize, rows: usize) -> FloatOf<B, 2> {
    stats
        .clone()
        .slice([stat..stat + 1, 0..rows])
        .reshape([rows, 1])
}

/// Gradient, as
/// [`FusedCrossEntropyBackend::cross_entropy_backward`](crate::FusedCrossEntropyBackend::cross_entropy_backward):
/// the logits' shape and dtype; zero rows where the target is ignored or not a class.
///
/// With `g` the incoming gradient of the row (`grad_output [N]` under `Reduction::None`,
/// its one value otherwise), `sc = g / D` and `sz = g / n` (`D`, `n` from `denominators`,
/// or `sc = sz = g` without them), `C = sc (1 - ls) w_y`, `Bc = sc ls / V`,
/// `E = Bc W + 2 s sz lse`:
/// `grad_c = (C + E) p_c - Bc w_c` for `c != y` and `C (p_y - 1) + E p_y - Bc w_y` at the
/// target, with forward's `p_y - 1`; all times `1 - (x'_c / cap)^2` under a softcap.
pub fn cross_entropy_backward<B: Backend>(
    inputs: CrossEntropyInputs<B>,
    backward: TwoPassBackward<B>,
    options: &CrossEntropyOptions,
) -> FloatTensor<B> {
    let CrossEntropyInputs {
        logits,
        targets,
        class_weights,
    } = inputs;
    let TwoPassBackward {
        stats,
        grad_output,
        denominators,
        entropy_grad_output,
    } = backward;
    let shape = logits.shape();
    let dtype = logits.dtype();
    let device = logits.device();
    let (rows, vocab) = rows_and_vocab(&shape);
    if rows == 0 || vocab == 0 {
        let zeros = FloatOf::<B, 1>::zeros([rows * vocab], &device, dtype);
        return B::float_reshape(zeros.into_primitive(), shape);
    }

    let x = logits_f32::<B>(logits, rows, vocab, options);
    let t = classify_targets::<B>(targets, rows, vocab, options.ignore_index);
    let weights = class_weights_f32::<B>(class_weights, &t, rows, vocab, &device);
    let not_counted = t.counted.clone().not();
    let stats = FloatOf::<B, 2>::new(stats);
    let lse = stat_column(&stats, row_stat::LSE, rows);
    let max = stat_column(&stats, row_stat::MAX, rows);
    let log_sum = stat_column(&stats, row_stat::LOG_SUM, rows);
    let target_grad = stat_column(&stats, row_stat::TARGET_GRAD, rows);

    // The incoming gradient per row, f32 `[N, 1]`, 0 on rows without a gradient.
    let incoming_len = grad_output.shape().num_elements();
    let incoming = FloatOf::<B, 1>::new(B::float_reshape(grad_output, Shape::new([incoming_len])))
        .cast(DType::F32);
    let incoming = if incoming_len == rows {
        incoming.reshape([rows, 1])
    } else {
        // One value for every row (`Mean`, `Sum`), materialised so masking is plain.
        FloatOf::<B, 2>::zeros([rows, 1], &device, DType::F32).add(incoming.reshape([1, 1]))
    };
    let incoming = incoming.mask_fill(not_counted.clone(), 0.0);
    let (ce_scale, z_scale) = match denominators.into_option() {
        Some(denominators) => {
            let denominators = FloatOf::<B, 1>::new(denominators).cast(DType::F32);
            let ce = denominators.clone().narrow(0, 0, 1).reshape([1, 1]);
            let z = denominators.narrow(0, 1, 1).reshape([1, 1]);
            (incoming.clone().div(ce), incoming.div(z))
        }
        None => (incoming.clone(), incoming),
    };

    let ls = options.label_smoothing;
    let s = options.z_loss_scale;
    // C: what multiplies `p_c - [c == y]`.
    let target_coef = ce_scale
        .clone()
        .mul_scalar(1.0 - ls as f64)
        .mul(weights.target.clone());
    // Bc and E (E: what multiplies `p_c` besides C).
    let mut smooth_coef = None;
    let mut extra = None;
    if ls > 0.0 {
        let coef = ce_scale.mul_scalar(ls as f64 / vocab as f64);
        extra = Some(coef.clone().mul(weights.total.clone()));
        smooth_coef = Some(coef);
    }
    if s > 0.0 {
        let z = z_scale.mul_scalar(2.0 * s as f64).mul(lse.clone());
        extra = Some(match extra {
            Some(extra) => extra.add(z),
            None => z,
        });
    }
    let mut target_value = target_coef.clone().mul(target_grad.clone());
    let mut prob_coef = target_coef;
    if let Some(extra) = extra {
        target_value = target_value.add(extra.clone().mul(target_grad.add_scalar(1.0)));
        prob_coef = prob_coef.add(extra);
    }
    if let Some(coef) = &smooth_coef {
        target_value = target_value.sub(coef.clone().mul(weights.target.clone()));
    }

    // `x - max` first: exact for the columns whose probability matters, where the
    // log-sum-exp rounded to f32 is off by up to its ulp.
    let log_probs = x.clone().sub(max).sub(log_sum);
    let probs = log_probs.clone().exp();
    let mut grad = probs.clone().mul(prob_coef);
    if let Some(coef) = smooth_coef {
        grad = match weights.row {
            Some(row) => grad.sub(coef.mul(row)),
            None => grad.sub(coef),
        };
    }
    let mut grad = grad.mask_where(t.one_hot, target_value.expand([rows, vocab]));
    if let Some(entropy_incoming) = entropy_grad_output.into_option() {
        // g_H dH/dx'_c = -g_H p_c (ln p_c + H), at the target too; a -inf logit's term is
        // 0, not 0 * -inf.
        let entropy_incoming = FloatOf::<B, 1>::new(entropy_incoming)
            .cast(DType::F32)
            .reshape([rows, 1])
            .mask_fill(not_counted.clone(), 0.0);
        let entropy = stat_column(&stats, row_stat::ENTROPY, rows);
        let term = probs
            .clone()
            .mul(log_probs.add(entropy))
            .mask_fill(probs.equal_elem(0.0), 0.0)
            .mul(entropy_incoming.neg());
        grad = grad.add(term);
    }
    if let Some(cap) = options.softcap {
        // d/dx c tanh(x / c) = 1 - tanh^2 = 1 - (x' / c)^2
        let capped = x.div_scalar(cap as f64);
        grad = grad.mul(capped.clone().mul(capped).neg().add_scalar(1.0));
    }
    if let Some(temperature) = options.temperature {
        grad = grad.mul_scalar(1.0 / temperature as f64);
    }
    // Exact zeros on rows without a gradient, whatever their logits (NaN included).
    let grad = grad.mask_fill(not_counted.expand([rows, vocab]), 0.0);
    B::float_reshape(grad.cast(dtype).into_primitive(), shape)
}
