//! One cube sums every row's statistics and forms the reduced outputs.

use cubecl::prelude::*;

use crate::base::row::stat_index;
use crate::base::row_stat;
use crate::base::tree::sum_stacked;

/// Which reduced outputs a launch forms (each combination compiles its own kernel).
#[derive_cube_comptime]
pub struct ReduceOptions {
    /// Divide by the mean's denominators (else sums).
    pub mean: bool,
    /// z-loss scale > 0: under `Mean` the z part of the loss is divided by `n`, not `D`.
    pub z_loss: bool,
    /// Class weights given: `D` is the sum of the targets' weights, else `D = n`.
    pub weighted: bool,
    /// Per-row weights of the loss (`row_weights [N]`): each row's loss and z-loss count
    /// `w_r` times.
    pub row_weighted: bool,
    /// Per-row weights of the entropy (`entropy_weights [N]`): the loss has `-c_r H_r`
    /// too, reduced as the z-loss is.
    pub entropy_weighted: bool,
    /// Units of the one cube, a power of two.
    pub cube_size: usize,
}

/// One cube sums the statistics of every row (unit `u` takes rows `u, u + cube_size, ..`,
/// then a tree in shared memory) and unit 0 writes, from `stats [COUNT, N]` (N > 0):
/// `loss [1]` in the logits' type, and f32 `z_loss [1]`, `accuracy [1]`,
/// `denominators [2]` (`D`, `n`). As `burn-fused-ce`'s tensor-op reduction: `n =
/// max(sum VALID, 1)`, `D = max(sum WEIGHT, MIN_POSITIVE)` (or `n`); `Mean` gives
/// `(sum LOSS - sum Z) / D + sum Z / n` (`sum LOSS / D` without z-loss) and `sum Z / n`,
/// `Sum` the plain sums; the accuracy is `sum CORRECT / n`. With row weights `LOSS` and
/// `Z` are summed as `w_r LOSS_r` and `w_r Z_r`; with entropy weights the loss has
/// `- sum c_r ENTROPY_r` (divided by `n` for `Mean`). An ignored row adds nothing
/// whatever its weights.
#[cube(launch_unchecked)]
pub fn reduce_stats_kernel<F: Float>(
    stats: &Tensor<f32>,
    row_weights: &Tensor<f32>,
    entropy_weights: &Tensor<f32>,
    loss: &mut Tensor<F>,
    z_loss: &mut Tensor<f32>,
    accuracy: &mut Tensor<f32>,
    denominators: &mut Tensor<f32>,
    #[comptime] options: ReduceOptions,
    #[define(F)] _dtype: ElemType,
) {
    let cube_size = options.cube_size;
    let rows = stats.shape(1);
    let mut loss_sum = f32::new(0.0);
    let mut z_sum = f32::new(0.0);
    let mut weight_sum = f32::new(0.0);
    let mut valid_sum = f32::new(0.0);
    let mut correct_sum = f32::new(0.0);
    let mut entropy_sum = f32::new(0.0);
    let mut row = UNIT_POS as usize;
    while row < rows {
        let valid = stats[stat_index(stats, row_stat::VALID, row)];
        let mut row_weight = f32::new(1.0);
        if comptime!(options.row_weighted) {
            // A select, not a product: an ignored row's weight may be anything.
            row_weight = select(
                valid > f32::new(0.0),
                row_weights[row * row_weights.stride(0)],
                f32::new(0.0),
            );
        }
        loss_sum += row_weight * stats[stat_index(stats, row_stat::LOSS, row)];
        z_sum += row_weight * stats[stat_index(stats, row_stat::Z_LOSS, row)];
        if comptime!(options.weighted) {
            weight_sum += stats[stat_index(stats, row_stat::WEIGHT, row)];
        }
        if comptime!(options.entropy_weighted) {
            let entropy_weight = select(
                valid > f32::new(0.0),
                entropy_weights[row * entropy_weights.stride(0)],
                f32::new(0.0),
            );
            entropy_sum += entropy_weight * stats[stat_index(stats, row_stat::ENTROPY, row)];
        }
        valid_sum += valid;
        correct_sum += stats[stat_index(stats, row_stat::CORRECT, row)];
        row += cube_size;
    }
    let mut shared = Shared::<[f32]>::new_slice(comptime!(6 * cube_size));
    let unit = UNIT_POS as usize;
    shared[unit] = loss_sum;
    shared[cube_size + unit] = z_sum;
    shared[2 * cube_size + unit] = weight_sum;
    shared[3 * cube_size + unit] = valid_sum;
    shared[4 * cube_size + unit] = correct_sum;
    shared[5 * cube_size + unit] = entropy_sum;
    sum_stacked(&mut shared, 6usize, cube_size);
    // Every unit forms the outputs (no branch around the arithmetic); unit 0 stores them.
    let loss_sum = shared[0];
    let z_sum = shared[cube_size];
    let n = f32::max(shared[3 * cube_size], f32::new(1.0));
    let mut weight_total = n;
    if comptime!(options.weighted) {
        weight_total = f32::max(shared[2 * cube_size], f32::new(f32::MIN_POSITIVE));
    }
    let entropy_sum = shared[5 * cube_size];
    let mut loss_value = loss_sum;
    let mut z_value = z_sum;
    if comptime!(options.mean) {
        loss_value = loss_sum / weight_total;
        if comptime!(options.z_loss) {
            loss_value = (loss_sum - z_sum) / weight_total + z_sum / n;
        }
        z_value = z_sum / n;
    }
    if comptime!(options.entropy_weighted) {
        let mut entropy_value = entropy_sum;
        if comptime!(options.mean) {
            entropy_value = entropy_sum / n;
        }
        loss_value -= entropy_value;
    }
    let accuracy_value = shared[4 * cube_size] / n;
    if unit == 0 {
        loss[0] = F::cast_from(loss_value);
        z_loss[0] = z_value;
        accuracy[0] = accuracy_value;
        denominators[0] = weight_total;
        denominators[1] = n;
    }
}
