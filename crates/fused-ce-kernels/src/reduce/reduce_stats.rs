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
    /// Units of the one cube, a power of two.
    pub cube_size: usize,
}

/// One cube sums the statistics of every row (unit `u` takes rows `u, u + cube_size, ..`,
/// then a tree in shared memory) and unit 0 writes, from `stats [COUNT, N]` (N > 0):
/// `loss [1]` in the logits' type, and f32 `z_loss [1]`, `accuracy [1]`,
/// `denominators [2]` (`D`, `n`). As `burn-fused-ce`'s tensor-op reduction: `n =
/// max(sum VALID, 1)`, `D = max(sum WEIGHT, MIN_POSITIVE)` (or `n`); `Mean` gives
/// `(sum LOSS - sum Z) / D + sum Z / n` (`sum LOSS / D` without z-loss) and `sum Z / n`,
/// `Sum` the plain sums; the accuracy is `sum CORRECT / n`.
#[cube(launch_unchecked)]
pub fn reduce_stats_kernel<F: Float>(
    stats: &Tensor<f32>,
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
    let mut row = UNIT_POS as usize;
    while row < rows {
        loss_sum += stats[stat_index(stats, row_stat::LOSS, row)];
        z_sum += stats[stat_index(stats, row_stat::Z_LOSS, row)];
        if comptime!(options.weighted) {
            weight_sum += stats[stat_index(stats, row_stat::WEIGHT, row)];
        }
        valid_sum += stats[stat_index(stats, row_stat::VALID, row)];
        correct_sum += stats[stat_index(stats, row_stat::CORRECT, row)];
        row += cube_size;
    }
    let mut shared = Shared::<[f32]>::new_slice(comptime!(5 * cube_size));
    let unit = UNIT_POS as usize;
    shared[unit] = loss_sum;
    shared[cube_size + unit] = z_sum;
    shared[2 * cube_size + unit] = weight_sum;
    shared[3 * cube_size + unit] = valid_sum;
    shared[4 * cube_size + unit] = correct_sum;
    sum_stacked(&mut shared, 5usize, cube_size);
    // Every unit forms the outputs (no branch around the arithmetic); unit 0 stores them.
    let loss_sum = shared[0];
    let z_sum = shared[cube_size];
    let n = f32::max(shared[3 * cube_size], f32::new(1.0));
    let mut weight_total = n;
    if comptime!(options.weighted) {
        weight_total = f32::max(shared[2 * cube_size], f32::new(f32::MIN_POSITIVE));
    }
    let mut loss_value = loss_sum;
    let mut z_value = z_sum;
    if comptime!(options.mean) {
        loss_value = loss_sum / weight_total;
        if comptime!(options.z_loss) {
            loss_value = (loss_sum - z_sum) / weight_total + z_sum / n;
        }
        z_value = z_sum / n;
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
