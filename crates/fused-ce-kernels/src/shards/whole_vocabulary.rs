//! The whole vocabulary's per-row statistics from the sums the shards exchanged.

use cubecl::prelude::*;

use crate::base::row::{RUNNING_MAX_START, is_class, read_target, runtime_nan, stat_index};
use crate::base::row_stat;

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
