//! A shard's contribution to the exchanged sums.

use cubecl::prelude::*;

use crate::base::row::{read_target, row_offset, stat_index};
use crate::base::row_stat;
use crate::shards::whole_vocabulary::log_sum_rows;

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
///
/// [`whole_vocabulary_rows_kernel`]: super::whole_vocabulary::whole_vocabulary_rows_kernel
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
