//! The vocabulary-parallel loss's per-row kernels, one unit per row: a shard's targets
//! made local and its contribution to the exchanged sums packed, the whole vocabulary's
//! statistics from those sums, and the backward kernel's inputs on a shard. Done with
//! Burn's tensor ops these were about a hundred small ops per step (a log-sum-exp over
//! the shards, gathers at the target's shard, masks), each with a fixed cost on the host
//! and the device.

use cubecl::prelude::*;

use crate::row::{RUNNING_MAX_START, is_class, read_target, row_offset, runtime_nan, stat_index};
use crate::row_stat;

/// Which terms a launch forms (each combination compiles its own kernel).
#[derive_cube_comptime]
pub struct ShardRowsOptions {
    /// Shards `K`: the exchanged matrix's first `K` rows are their maxima.
    pub shards: usize,
    /// Label smoothing > 0: one more exchanged row, the shards' smoothing sums.
    pub smoothing: bool,
    /// Class weights given.
    pub weighted: bool,
    /// The argmax is tracked: `2K` more exchanged rows, each shard's best value and its
    /// column in the whole vocabulary.
    pub argmax: bool,
}

/// The first of the exchanged matrix's last `K` rows, the shards' `row_stat::LOG_SUM`:
/// after `K` maxima, the target's two rows, the smoothing row and the argmax's `2K` rows,
/// as asked.
pub const fn log_sum_rows(shards: usize, smoothing: bool, argmax: bool) -> usize {
    shards + 2 + smoothing as usize + if argmax { 2 * shards } else { 0 }
}

/// One unit per row `n` of `summed [R, N]` (f32), the element-wise sum over the shards of
/// what each contributed (`burn-fused-ce`'s `vocab_parallel.rs` packs it): rows `0..K`
/// the shards' maxima `m_k` (each shard fills its own row); row `K` the owning shard's
/// `lse_y - x_y`, row `K + 1` its `p'_y - 1` (over its own classes); with smoothing, row
/// `K + 2` the shards' `sum_c w_c (lse_k - x_c)`; with the argmax, `K` rows of best values
/// then `K` rows of their columns; last, from [`log_sum_rows`], the shards' `s_k =
/// ln sum_{c in k} exp(x_c - m_k)`, so that `lse_k = m_k + s_k`. Writes the row's statistics of the whole
/// vocabulary into `stats [COUNT, N]` in [`row_stat`]'s layout (every statistic 0 for an
/// ignored row) and, with the argmax, `predicted [N]` (-1 for an ignored row).
///
/// `lse = m + s` with `m = max_k m_k` and `s = ln sum_k exp((m_k - m) + s_k)`, and every
/// difference of two log-sum-exps below taken as that of their maxima (exact when it
/// matters) plus that of their `s` (a log-sum-exp rounded to f32 is off by up to 5e-4
/// near 1e4); `lse - x_y = (lse_y - x_y) + (lse - lse_y)`;
/// `p_y - 1 = (p'_y - 1) r - (1 - r)` with `r = exp(lse_y - lse)` and `1 - r` summed
/// over the other shards (no cancellation); the smoothing term is
/// `sum_k (W_k (lse - lse_k) + sum_{c in k} w_c (lse_k - x_c))` with `W_k` the shard's
/// class-weight total (`shard_totals [K]`). A target that is neither ignored nor a class
/// gets a NaN loss. `targets` are bound as `[1, N]`; `class_weights [V]` and
/// `shard_totals` are read only when the options ask for them, `predicted` written only
/// with the argmax.
#[allow(clippy::too_many_arguments)]
#[cube(launch_unchecked)]
pub fn whole_vocabulary_rows_kernel<I: Int>(
    summed: &Tensor<f32>,
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    shard_totals: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    vocab: u32,
    shard_width: u32,
    ignore_index: i32,
    label_smoothing: f32,
    z_loss_scale: f32,
    #[comptime] options: ShardRowsOptions,
    #[define(I)] _dtype: ElemType,
) {
    let row = ABSOLUTE_POS;
    if row >= summed.shape(1) {
        terminate!();
    }
    let shards = comptime!(options.shards);
    let target = read_target::<I>(targets, row);
    let vocab = vocab as usize;
    let counted = target != ignore_index;
    let class = counted && is_class(target, vocab);
    let owner = u32::min(
        u32::cast_from(i32::max(target, 0)) / shard_width,
        comptime!(options.shards as u32 - 1),
    );

    // Finite start: shards whose logits are all -inf give lse = -inf, not NaN.
    let mut max = f32::new(RUNNING_MAX_START);
    #[unroll]
    for k in 0..shards {
        max = f32::max(max, exchanged(summed, k, row));
    }
    let log_sums = comptime!(log_sum_rows(
        options.shards,
        options.smoothing,
        options.argmax
    ));
    let mut total = f32::new(0.0);
    #[unroll]
    for k in 0..shards {
        total += f32::exp((exchanged(summed, k, row) - max) + exchanged(summed, log_sums + k, row));
    }
    let log_sum = f32::ln(total);
    let lse = max + log_sum;
    let mut max_owner = f32::new(0.0);
    let mut log_sum_owner = f32::new(0.0);
    let mut share_elsewhere = f32::new(0.0);
    #[unroll]
    for k in 0..shards {
        let max_k = exchanged(summed, k, row);
        let log_sum_k = exchanged(summed, log_sums + k, row);
        let here = owner == comptime!(k as u32);
        max_owner = select(here, max_k, max_owner);
        log_sum_owner = select(here, log_sum_k, log_sum_owner);
        share_elsewhere += select(
            here,
            f32::new(0.0),
            f32::exp(-lse_above(max, log_sum, max_k, log_sum_k)),
        );
    }
    let above_owner = lse_above(max, log_sum, max_owner, log_sum_owner);
    let nll = exchanged(summed, shards, row) + above_owner;
    let target_grad = exchanged(summed, shards + 1, row) * f32::exp(-above_owner) - share_elsewhere;

    let mut target_weight = f32::new(1.0);
    if comptime!(options.weighted) {
        let last = i32::cast_from(vocab) - 1;
        target_weight = class_weights[usize::cast_from(i32::min(i32::max(target, 0), last))];
    }
    let mut ce = nll * target_weight * (f32::new(1.0) - label_smoothing);
    if comptime!(options.smoothing) {
        let mut spread = f32::new(0.0);
        #[unroll]
        for k in 0..shards {
            let above = lse_above(
                max,
                log_sum,
                exchanged(summed, k, row),
                exchanged(summed, log_sums + k, row),
            );
            spread += above * shard_totals[k];
        }
        let smooth = spread + exchanged(summed, shards + 2, row);
        ce += smooth * (label_smoothing / f32::cast_from(vocab));
    }
    let z_loss = z_loss_scale * lse * lse;
    let loss = select(counted && !class, runtime_nan(lse), ce + z_loss);

    let mut correct = f32::new(0.0);
    if comptime!(options.argmax) {
        let first = comptime!(options.shards + 2 + options.smoothing as usize);
        // The first shard with the largest value, as an argmax over the shards picks it.
        let mut best = exchanged(summed, first, row);
        let mut column = exchanged(summed, first + shards, row);
        #[unroll]
        for k in 1..shards {
            let value = exchanged(summed, first + k, row);
            let better = value > best;
            best = select(better, value, best);
            column = select(better, exchanged(summed, first + shards + k, row), column);
        }
        let column = i32::cast_from(column);
        correct = select(column == target, f32::new(1.0), f32::new(0.0));
        predicted[row] = I::cast_from(select(counted, column, -1i32));
    }

    let zero = f32::new(0.0);
    let at = stat_index(&*stats, row_stat::LOSS, row);
    stats[at] = select(counted, loss, zero);
    let at = stat_index(&*stats, row_stat::Z_LOSS, row);
    stats[at] = select(counted, z_loss, zero);
    let at = stat_index(&*stats, row_stat::WEIGHT, row);
    stats[at] = select(counted, target_weight, zero);
    let at = stat_index(&*stats, row_stat::VALID, row);
    stats[at] = select(counted, f32::new(1.0), zero);
    let at = stat_index(&*stats, row_stat::CORRECT, row);
    stats[at] = select(counted, correct, zero);
    let at = stat_index(&*stats, row_stat::LSE, row);
    stats[at] = select(counted, lse, zero);
    let at = stat_index(&*stats, row_stat::TARGET_GRAD, row);
    stats[at] = select(counted, target_grad, zero);
    let at = stat_index(&*stats, row_stat::MAX, row);
    stats[at] = select(counted, max, zero);
    let at = stat_index(&*stats, row_stat::LOG_SUM, row);
    stats[at] = select(counted, log_sum, zero);
}

/// `lse - lse_k` of two log-sum-exps kept as maximum and `ln sum`: the maxima's
/// difference (exact when it matters) plus that of the sums.
#[cube]
fn lse_above(max: f32, log_sum: f32, max_k: f32, log_sum_k: f32) -> f32 {
    (max - max_k) + (log_sum - log_sum_k)
}

/// Row `stat` of the exchanged matrix at row `row` of the batch.
#[cube]
fn exchanged(summed: &Tensor<f32>, stat: usize, row: usize) -> f32 {
    summed[summed.stride(0) * stat + row * summed.stride(1)]
}

/// The target of a row whose class another shard holds, as a shard's row kernel takes it
/// (not a class: the kernel reads the whole row and reports its log-sum-exp).
pub const ELSEWHERE: i32 = -1;
/// The ignore index of a shard's own kernel passes: the caller's may be one of the
/// shard's columns.
pub const SHARD_IGNORE: i32 = -2;

/// One unit per row: the targets as the row kernel of the shard holding classes
/// `start..end` takes them, `local [N]`: a class of the shard as its column, an ignored
/// row as [`SHARD_IGNORE`], any other target as [`ELSEWHERE`]; with `smoothing`, also
/// `first_class [N]`: 0, or [`SHARD_IGNORE`] for an ignored row (the smoothing pass's
/// targets). `targets` are bound as `[1, N]`.
#[cube(launch_unchecked)]
pub fn shard_targets_kernel<I: Int>(
    targets: &Tensor<I>,
    local: &mut Tensor<I>,
    first_class: &mut Tensor<I>,
    start: u32,
    end: u32,
    ignore_index: i32,
    #[comptime] smoothing: bool,
    #[define(I)] _dtype: ElemType,
) {
    let row = ABSOLUTE_POS;
    if row >= local.shape(0) {
        terminate!();
    }
    let target = read_target::<I>(targets, row);
    let counted = target != ignore_index;
    let here = counted && target >= i32::cast_from(start) && target < i32::cast_from(end);
    let elsewhere = select(counted, ELSEWHERE, SHARD_IGNORE);
    local[row] = I::cast_from(select(here, target - i32::cast_from(start), elsewhere));
    if comptime!(smoothing) {
        first_class[row] = I::cast_from(select(counted, 0i32, SHARD_IGNORE));
    }
}

/// Which rows a shard packs (each combination compiles its own kernel).
#[derive_cube_comptime]
pub struct PackOptions {
    /// Shards `K`.
    pub shards: usize,
    /// The smoothing pass ran: its loss times the shard's width is packed.
    pub smoothing: bool,
    /// The argmax is tracked: the shard's best value and its column are packed.
    pub argmax: bool,
    /// Softcap the best value (`c * tanh(x / c)`), as the row kernel compared it.
    pub softcap: bool,
}

/// One unit per row: what the shard `index` of `K` (classes `start..start + width`)
/// contributes to the exchanged sums, `packed [R, N]` in the layout
/// [`whole_vocabulary_rows_kernel`] reads: its row kernel's maximum in row `index` and 0
/// in the other shards' rows; where the target is one of its classes, the row
/// kernel's loss and `p'_y - 1`, else 0; with `smoothing`, the smoothing pass's loss
/// (`own` and `smoothed` are those passes' statistics `[COUNT, N]`) times `width`; with
/// the argmax, the value of the logits at the row kernel's argmax (`predicted [N]`,
/// soft-capped) and that column in the whole vocabulary, in row `index` of each block of
/// `K` rows, 0 elsewhere and for ignored rows; last, its row kernel's `row_stat::LOG_SUM`
/// in row `index` of the block at [`log_sum_rows`]. `logits` are bound as `[1, N, width]` and
/// `targets` as `[1, N]`; `smoothed`, `predicted` and `logits` are read only when the
/// options ask for them.
#[allow(clippy::too_many_arguments)]
#[cube(launch_unchecked)]
pub fn pack_shard_rows_kernel<F: Float, I: Int>(
    own: &Tensor<f32>,
    smoothed: &Tensor<f32>,
    predicted: &Tensor<I>,
    logits: &Tensor<F>,
    targets: &Tensor<I>,
    packed: &mut Tensor<f32>,
    index: u32,
    start: u32,
    width: u32,
    ignore_index: i32,
    softcap: f32,
    #[comptime] options: PackOptions,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let row = ABSOLUTE_POS;
    if row >= packed.shape(1) {
        terminate!();
    }
    let shards = comptime!(options.shards);
    let zero = f32::new(0.0);
    let target = read_target::<I>(targets, row);
    let counted = target != ignore_index;
    let first = i32::cast_from(start);
    let here = counted && target >= first && target < first + i32::cast_from(width);
    let max = own[stat_index(own, row_stat::MAX, row)];
    pack_own_row(packed, 0usize, row, index, max, shards);
    let at = packed_index(&*packed, shards, row);
    packed[at] = select(here, own[stat_index(own, row_stat::LOSS, row)], zero);
    let at = packed_index(&*packed, shards + 1, row);
    packed[at] = select(here, own[stat_index(own, row_stat::TARGET_GRAD, row)], zero);
    if comptime!(options.smoothing) {
        let smooth = smoothed[stat_index(smoothed, row_stat::LOSS, row)];
        let at = packed_index(&*packed, shards + 2, row);
        packed[at] = smooth * f32::cast_from(width);
    }
    let log_sums = comptime!(log_sum_rows(
        options.shards,
        options.smoothing,
        options.argmax
    ));
    let log_sum = own[stat_index(own, row_stat::LOG_SUM, row)];
    pack_own_row(packed, log_sums, row, index, log_sum, shards);
    if comptime!(options.argmax) {
        let best_at = comptime!(options.shards + 2 + options.smoothing as usize);
        let last = i32::cast_from(width) - 1;
        let column = i32::min(i32::max(i32::cast_from(predicted[row]), 0), last);
        let at = row_offset::<F>(logits, row) + usize::cast_from(column) * logits.stride(2);
        let mut best = f32::cast_from(logits[at]);
        if comptime!(options.softcap) {
            best = softcap * f32::tanh(best / softcap);
        }
        let whole_column = f32::cast_from(column + first);
        let best = select(counted, best, zero);
        pack_own_row(packed, best_at, row, index, best, shards);
        let whole_column = select(counted, whole_column, zero);
        pack_own_row(packed, best_at + shards, row, index, whole_column, shards);
    }
}

/// `value` in row `index` of the packed matrix's block of `K` rows from `block`, 0 in
/// the other shards' rows (the exchange sums them).
#[cube]
fn pack_own_row(
    packed: &mut Tensor<f32>,
    block: usize,
    row: usize,
    index: u32,
    value: f32,
    #[comptime] shards: usize,
) {
    #[unroll]
    for k in 0..shards {
        let mine = index == comptime!(k as u32);
        let at = packed_index(&*packed, block + k, row);
        packed[at] = select(mine, value, f32::new(0.0));
    }
}

/// Where row `stat` of the packed matrix holds row `row` of the batch.
#[cube]
fn packed_index(packed: &Tensor<f32>, stat: usize, row: usize) -> usize {
    packed.stride(0) * stat + row * packed.stride(1)
}

/// What a shard's backward reads (each combination compiles its own kernel).
#[derive_cube_comptime]
pub struct ShardGradientOptions {
    /// `Reduction::None`: the incoming gradient has one value per row, else one.
    pub per_row: bool,
    /// `Reduction::Mean` with the denominators `[D, n]`: the scales are divided by them.
    pub mean: bool,
    /// z-loss scale > 0.
    pub z_loss: bool,
    /// Softcap the first column's logit.
    pub softcap: bool,
    /// Label smoothing > 0.
    pub smoothing: bool,
    /// Class weights given: `w_y` from the statistics, `W` from `weight_total`.
    pub weighted: bool,
}

/// One unit per row: the inputs of the backward kernel over the shard of classes
/// `start..end` of a vocabulary of `vocab` classes, run with one incoming gradient per row
/// and no smoothing, z-loss or class weights of its own, for the whole vocabulary's
/// statistics `stats [COUNT, N]`. With `sc` and `sz` the incoming gradient `grad_output`
/// (`[N]` or `[1]`, divided for `Mean` by `denominators [D, n]`), `s = sc ls / V` and `W`
/// the class-weight total (`weight_total [1]`, or `V`), the spec's gradient is
/// `c p_c - s w_c - [c = y] sc (1 - ls) w_y` with `c = sc (1 - ls) w_y + s W + 2 z sz lse`.
/// Writes `local [N]`: the target's column where the shard holds it, column 0 for any
/// other class, [`SHARD_IGNORE`] for a row with no gradient (ignored, or not a class);
/// `coefficients [N]`: `c` (0 for a row with no gradient), the kernel's per-row incoming
/// gradient; `smooth [N]`: `s`, which the caller subtracts times `w_c` (with `smoothing`);
/// `local_stats`: `stats` with `p_y - 1` replaced by what makes the kernel's target value
/// `c tg` right: `(p_y - 1) + (c - sc (1 - ls) w_y) / c` at the shard's target, and `p_0`
/// (the row's first logit, soft-capped) where another shard holds it, so that column 0 is
/// written as any other. `logits` are bound as `[1, N, V_s]` and `targets` as `[1, N]`.
#[allow(clippy::too_many_arguments)]
#[cube(launch_unchecked)]
pub fn shard_gradient_rows_kernel<F: Float, G: Float, I: Int>(
    stats: &Tensor<f32>,
    targets: &Tensor<I>,
    logits: &Tensor<F>,
    grad_output: &Tensor<G>,
    denominators: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    local: &mut Tensor<I>,
    local_stats: &mut Tensor<f32>,
    coefficients: &mut Tensor<f32>,
    smooth: &mut Tensor<f32>,
    start: u32,
    end: u32,
    vocab: u32,
    ignore_index: i32,
    softcap: f32,
    z_loss_scale: f32,
    label_smoothing: f32,
    #[comptime] options: ShardGradientOptions,
    #[define(F, G, I)] _dtypes: [ElemType; 3],
) {
    let row = ABSOLUTE_POS;
    if row >= local.shape(0) {
        terminate!();
    }
    let target = read_target::<I>(targets, row);
    let class = target != ignore_index && is_class(target, vocab as usize);
    let first = i32::cast_from(start);
    let here = class && target >= first && target < i32::cast_from(end);
    let elsewhere_target = select(class, 0i32, SHARD_IGNORE);
    local[row] = I::cast_from(select(here, target - first, elsewhere_target));

    let zero = f32::new(0.0);
    let lse = stats[stat_index(stats, row_stat::LSE, row)];
    let mut incoming = f32::cast_from(grad_output[0]);
    if comptime!(options.per_row) {
        incoming = f32::cast_from(grad_output[row]);
    }
    let incoming = select(class, incoming, zero);
    let mut ce_scale = incoming;
    let mut z_scale = incoming;
    if comptime!(options.mean) {
        ce_scale = incoming / denominators[0];
        z_scale = incoming / denominators[1];
    }
    let mut target_coef = ce_scale;
    if comptime!(options.weighted) {
        target_coef *= stats[stat_index(stats, row_stat::WEIGHT, row)];
    }
    let mut extra = zero;
    let mut smooth_coef = zero;
    if comptime!(options.smoothing) {
        target_coef *= f32::new(1.0) - label_smoothing;
        smooth_coef = ce_scale * label_smoothing / f32::cast_from(vocab);
        let mut weight_sum = f32::cast_from(vocab);
        if comptime!(options.weighted) {
            weight_sum = weight_total[0];
        }
        extra = smooth_coef * weight_sum;
    }
    if comptime!(options.z_loss) {
        extra += z_scale * (lse * (f32::new(2.0) * z_loss_scale));
    }
    let coefficient = target_coef + extra;
    let safe = select(coefficient == zero, f32::new(1.0), coefficient);
    let target_grad = stats[stat_index(stats, row_stat::TARGET_GRAD, row)] + extra / safe;

    let mut logit = f32::cast_from(logits[row_offset::<F>(logits, row)]);
    if comptime!(options.softcap) {
        logit = softcap * f32::tanh(logit / softcap);
    }
    // `p` of column 0 as the backward kernel forms the others'.
    let elsewhere = f32::exp(logit - stats[stat_index(stats, row_stat::MAX, row)])
        * f32::exp(-stats[stat_index(stats, row_stat::LOG_SUM, row)]);
    let written = select(
        coefficient == zero,
        zero,
        select(here, target_grad, elsewhere),
    );
    coefficients[row] = coefficient;
    if comptime!(options.smoothing) {
        smooth[row] = smooth_coef;
    }
    #[unroll]
    for stat in 0..row_stat::COUNT {
        let value = stats[stat_index(stats, stat, row)];
        let value = if comptime!(stat == row_stat::TARGET_GRAD) {
            written
        } else {
            value
        };
        let at = stat_index(&*local_stats, stat, row);
        local_stats[at] = value;
    }
}
