//! The inputs of a shard's backward kernel, from the whole vocabulary's statistics.

use cubecl::prelude::*;

use crate::base::row::{is_class, read_target, row_offset, stat_index};
use crate::base::row_stat;
use crate::shards::local_targets::SHARD_IGNORE;

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
