//! Forward: one cube per row reads the row once and writes its statistics.

use cubecl::prelude::*;

use crate::base::row::{
    RowOptions, RowScalars, is_class, ln_one_plus, read_target, row_of_cube, row_offset,
    runtime_nan, stat_index,
};
use crate::base::row_stat;
use crate::rows::cube_merge::cube_merge;
use crate::rows::reduce_span::reduce_span;
use crate::rows::row_state::{RowState, entropy_term};

/// What the one pass's gradient needs of a row after [`finish_row`].
#[derive(CubeType, Clone, Copy)]
#[expand(derive(Clone))]
pub(crate) struct RowForward {
    /// [`row_stat::MAX`].
    pub(crate) max: f32,
    /// [`row_stat::LOG_SUM`].
    pub(crate) log_sum: f32,
    /// `p_y - 1`.
    pub(crate) target_grad: f32,
    /// [`row_stat::ENTROPY`] (0 unless `options.entropy`).
    pub(crate) entropy: f32,
}

/// Reads one row and writes its statistics of [`row_stat`] into `stats [COUNT, rows]`:
/// the loss `ce + z`, the z-loss, the target's class weight and a 1 (the mean's
/// denominators sum these), whether the argmax is the target, the log-sum-exp and
/// `p_y - 1` (backward's needs besides the logits); and the argmax into `predicted` when
/// `options.argmax`.
///
/// The target's own exp is kept out of the running sum: with `others = sum_{c != y}
/// exp(x_c - max)`, `p_y - 1 = -others / (others + exp(x_y - max))` keeps its relative
/// precision when the model is confident (`p_y` near 1), where `exp(x_y - lse) - 1` would
/// cancel. Likewise `lse - x_y = (max - x_y) + ln(sum)`, exact in its first term.
///
/// Ignored rows are not read at all. A target outside `[0, vocab)` gives a NaN loss and is
/// never used as an address.
#[cube]
#[allow(clippy::too_many_arguments)]
fn forward_row<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    row: usize,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) {
    let target = read_target::<I>(targets, row);
    if target == scalars.ignore_index {
        if UNIT_POS == 0 {
            write_ignored_row::<I>(stats, predicted, row, options);
        }
    } else {
        read_row::<F, I, N>(
            logits,
            class_weights,
            weight_total,
            stats,
            predicted,
            row.clone(),
            target,
            scalars.clone(),
            options,
        );
    }
}

/// An ignored row's statistics (all 0) and prediction (-1).
#[cube]
pub(crate) fn write_ignored_row<I: Int>(
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    row: usize,
    #[comptime] options: RowOptions,
) {
    #[unroll]
    for stat in 0..row_stat::COUNT {
        let at = stat_index(&*stats, stat, row);
        stats[at] = f32::new(0.0);
    }
    if comptime!(options.argmax) {
        predicted[row] = I::new(-1);
    }
}

/// The work of [`forward_row`] for a row that is not ignored.
#[cube]
#[allow(clippy::too_many_arguments)]
fn read_row<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    row: usize,
    target: i32,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) {
    let cube_size = options.cube_size;
    let vector_size = logits.vector_size();
    let vocab = logits.shape(2);

    let target_is_class = is_class(target, vocab);
    // When the target is not a class, `target_col` is one no unit reaches.
    let vectors_per_row = vocab / vector_size;
    let target_col = select(target_is_class, usize::cast_from(target), vocab);
    let row_start = row_offset::<Vector<F, N>>(logits, row) / vector_size;
    let mut shared_target_logit = Shared::<[f32]>::new_slice(1usize);
    let mut unstaged = Shared::<[Vector<F, N>]>::new_slice(1usize);
    let state = reduce_span::<F, N>(
        logits,
        row_start,
        0usize,
        vectors_per_row,
        target_col,
        class_weights,
        &mut unstaged,
        scalars.clone(),
        options,
        0usize,
    );
    let target_vector = target_col / vector_size;
    let holds_target =
        target_vector % cube_size == UNIT_POS as usize && target_vector < vectors_per_row;
    if holds_target {
        shared_target_logit[0] = state.target_logit;
    }
    // The merge's barriers also publish `shared_target_logit`.
    let merged = cube_merge(state, options);

    if UNIT_POS == 0 {
        // A target that is not a class reads a zero logit and gets a NaN loss.
        let target_logit = select(target_is_class, shared_target_logit[0], f32::new(0.0));
        finish_row::<I>(
            merged.clone(),
            target_logit,
            target,
            vocab,
            class_weights,
            weight_total,
            stats,
            predicted,
            row.clone(),
            true,
            scalars.clone(),
            options,
        );
    }
}

/// A row's loss and statistics from its merged state (one unit calls it): writes them to
/// `stats` (and the argmax to `predicted`) when `write`, and returns what the one pass's
/// gradient needs. `target_logit` is 0 when the target is not a class (the loss is then NaN).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish_row<I: Int>(
    merged: RowState,
    target_logit: f32,
    target: i32,
    vocab: usize,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    row: usize,
    write: bool,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) -> RowForward {
    let target_is_class = is_class(target, vocab);
    let target_col = select(target_is_class, usize::cast_from(target), vocab);
    let target_exp = select(
        target_is_class,
        f32::exp(target_logit - merged.max),
        f32::new(0.0),
    );
    let sum = merged.others + target_exp;
    // `ln(sum)` from `sum - 1`, formed without rounding when the target is the max
    // (`target_exp` is then exactly 1): a confident row's loss is `ln(1 + others)`
    // with `others` tiny, where `ln` of the rounded sum would keep few digits.
    let log_sum = ln_one_plus(merged.others + (target_exp - f32::new(1.0)));
    let lse = merged.max + log_sum;
    let nll = (merged.max - target_logit) + log_sum;
    let safe_col = select(target_is_class, target_col, 0usize);
    let mut target_weight = f32::new(1.0);
    if comptime!(options.weighted) {
        target_weight = select(target_is_class, class_weights[safe_col], f32::new(1.0));
    }
    let mut loss = target_weight * nll;
    if comptime!(options.smoothing) {
        // (1 - ls) w_y (lse - x_y) + (ls / V) sum_c w_c (lse - x_c), the last sum as
        // `W (lse - r) - sum_c w_c (x_c - r)` with `r` the smoothing sum's reference.
        let mut weight_sum = f32::cast_from(vocab);
        if comptime!(options.weighted) {
            weight_sum = weight_total[0];
        }
        let ls = scalars.label_smoothing;
        let above_reference = (merged.max - merged.smooth_reference) + log_sum;
        loss = (f32::new(1.0) - ls) * loss
            + ls / f32::cast_from(vocab) * (weight_sum * above_reference - merged.smooth);
    }
    let mut z_loss = f32::new(0.0);
    if comptime!(options.z_loss) {
        z_loss = scalars.z_loss_scale * lse * lse;
    }
    let not_a_number = runtime_nan(f32::cast_from(target));
    let mut correct = f32::new(0.0);
    let mut best_col = 0usize;
    if comptime!(options.argmax) {
        // An all -inf (or NaN) row never beat the start value: `argmax` says 0.
        best_col = usize::cast_from(merged.best_col);
        best_col = select(best_col < vocab, best_col, 0usize);
        correct = select(best_col == target_col, f32::new(1.0), f32::new(0.0));
    }
    let target_grad = -merged.others / sum;
    let mut entropy = f32::new(0.0);
    if comptime!(options.entropy) {
        // H = ln(sum) - sum_c p_c (x'_c - max), the target's term added to `entropy_sum`.
        let target_term = entropy_term(target_exp, target_logit - merged.max);
        entropy = log_sum - (merged.entropy_sum + target_term) / sum;
    }
    if write {
        let at = stat_index(&*stats, row_stat::LOSS, row);
        stats[at] = select(target_is_class, loss + z_loss, not_a_number);
        let at = stat_index(&*stats, row_stat::Z_LOSS, row);
        stats[at] = z_loss;
        let at = stat_index(&*stats, row_stat::WEIGHT, row);
        stats[at] = target_weight;
        let at = stat_index(&*stats, row_stat::VALID, row);
        stats[at] = f32::new(1.0);
        let at = stat_index(&*stats, row_stat::CORRECT, row);
        stats[at] = correct;
        let at = stat_index(&*stats, row_stat::LSE, row);
        stats[at] = lse;
        let at = stat_index(&*stats, row_stat::TARGET_GRAD, row);
        stats[at] = target_grad;
        let at = stat_index(&*stats, row_stat::ENTROPY, row);
        stats[at] = entropy;
        let at = stat_index(&*stats, row_stat::MAX, row);
        stats[at] = merged.max;
        let at = stat_index(&*stats, row_stat::LOG_SUM, row);
        stats[at] = log_sum;
        if comptime!(options.argmax) {
            predicted[row] = I::cast_from(best_col);
        }
    }
    RowForward {
        max: merged.max,
        log_sum,
        target_grad,
        entropy,
    }
}

/// Forward: one cube per row, see [`forward_row`].
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_forward_kernel<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let row = row_of_cube();
    if row >= stats.shape(1) {
        terminate!();
    }
    forward_row::<F, I, N>(
        logits,
        targets,
        class_weights,
        weight_total,
        stats,
        predicted,
        row.clone(),
        scalars.clone(),
        options,
    );
}
