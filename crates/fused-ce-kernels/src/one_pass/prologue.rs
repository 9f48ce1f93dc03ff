//! What runs before the one-pass kernel: the exchange's slots and ticket counter reset,
//! and the scales its gradient is formed with.

use cubecl::prelude::*;

use crate::base::row::{RowOptions, RowScalars, is_class, read_target};
use crate::base::tree::sum_stacked;
use crate::one_pass::exchange::UNPUBLISHED;

/// Where each value lives in the one pass's `scales` (f32 `[3]`): the mean's
/// denominators `D` and `n` (written for `Mean` only) and the guessed incoming gradient.
pub mod scale_slot {
    pub const WEIGHT_TOTAL: usize = 0;
    pub const COUNT: usize = 1;
    pub const GUESS: usize = 2;
    /// Length of the buffer.
    pub const LEN: usize = 3;
}

/// Before the one-pass kernel: every slot of `partials` to `UNPUBLISHED`, the ticket counter
/// to 0, the guessed incoming gradient `guess [1]` into `scales` and, for `Mean`, the
/// denominators `D` and `n`: `given [2]` when `given_denominators`, else from the targets
/// (cube 0).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn one_pass_prologue_kernel<I: Int>(
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    guess: &Tensor<f32>,
    given: &Tensor<f32>,
    scales: &mut Tensor<f32>,
    tickets: &mut Tensor<Atomic<i32>>,
    partials: &mut Tensor<Atomic<i32>>,
    vocab: u32,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] mean: bool,
    #[comptime] given_denominators: bool,
    #[define(I)] _dtype: ElemType,
) {
    let len = partials.len();
    let stride = CUBE_COUNT * CUBE_DIM as usize;
    let mut at = ABSOLUTE_POS;
    while at < len {
        partials[at].store(i32::new(UNPUBLISHED as i64));
        at += stride;
    }
    if CUBE_POS == 0 {
        if UNIT_POS == 0 {
            tickets[0].store(i32::new(0));
            scales[scale_slot::GUESS] = guess[0];
        }
        if comptime!(mean && given_denominators) {
            if UNIT_POS == 0 {
                scales[scale_slot::WEIGHT_TOTAL] = given[0];
                scales[scale_slot::COUNT] = given[1];
            }
        } else if comptime!(mean) {
            let rows = targets.shape(0) * targets.shape(1);
            let (weight_sum, count) = mean_denominators::<I>(
                targets,
                class_weights,
                rows,
                vocab as usize,
                scalars.clone(),
                options,
            );
            if UNIT_POS == 0 {
                scales[scale_slot::WEIGHT_TOTAL] = weight_sum;
                scales[scale_slot::COUNT] = count;
            }
        }
    }
}

/// The mean's denominators from the targets alone, as forward's statistics would sum
/// them: `D` (the targets' class weights over non-ignored rows; 1 for a target that is not
/// a class) and `n` (non-ignored rows), clamped like `reduce_stats` clamps them. Every
/// cube computes them (reading `rows` targets is cheap next to one row of logits).
#[cube]
pub(crate) fn mean_denominators<I: Int>(
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    rows: usize,
    vocab: usize,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) -> (f32, f32) {
    let cube_size = options.cube_size;
    let mut weight_sum = f32::new(0.0);
    let mut count = f32::new(0.0);
    let mut row = UNIT_POS as usize;
    while row < rows {
        let target = read_target::<I>(targets, row);
        let counted = target != scalars.ignore_index;
        let class = is_class(target, vocab);
        let mut weight = f32::new(1.0);
        if comptime!(options.weighted) {
            weight = select(
                class,
                class_weights[select(class, usize::cast_from(target), 0usize)],
                f32::new(1.0),
            );
        }
        weight_sum += select(counted, weight, f32::new(0.0));
        count += select(counted, f32::new(1.0), f32::new(0.0));
        row += cube_size;
    }
    let mut shared = Shared::<[f32]>::new_slice(comptime!(2 * cube_size));
    let unit = UNIT_POS as usize;
    shared[unit] = weight_sum;
    shared[cube_size + unit] = count;
    sum_stacked(&mut shared, 2usize, cube_size);
    (
        f32::max(shared[0], f32::new(f32::MIN_POSITIVE)),
        f32::max(shared[cube_size], f32::new(1.0)),
    )
}
