//! The cube's merge of its units' row states into the row's (or chunk's).

use cubecl::prelude::*;

use crate::base::row::RowOptions;
use crate::rows::row_state::{RowState, rescaled_entropy_sum};

/// Merges the units' states as a tree in shared memory; every unit gets the row's state.
/// (A plane-op merge, one barrier instead of one per level, timed the same on the H200:
/// the merge is not on the critical path. The tree runs everywhere; lavapipe has no plane
/// ops.)
#[cube]
pub(crate) fn cube_merge(state: RowState, #[comptime] options: RowOptions) -> RowState {
    let cube_size = options.cube_size;
    let mut shared_max = Shared::<[f32]>::new_slice(cube_size);
    let mut shared_others = Shared::<[f32]>::new_slice(cube_size);
    let mut shared_best =
        Shared::<[f32]>::new_slice(comptime!(if options.argmax { cube_size } else { 1 }));
    let mut shared_col =
        Shared::<[u32]>::new_slice(comptime!(if options.argmax { cube_size } else { 1 }));
    let mut shared_smooth =
        Shared::<[f32]>::new_slice(comptime!(if options.smoothing { cube_size } else { 1 }));
    let mut shared_entropy =
        Shared::<[f32]>::new_slice(comptime!(if options.entropy { cube_size } else { 1 }));
    let unit = UNIT_POS as usize;
    shared_max[unit] = state.max;
    shared_others[unit] = state.others;
    if comptime!(options.argmax) {
        shared_best[unit] = state.best;
        shared_col[unit] = state.best_col;
    }
    if comptime!(options.smoothing) {
        shared_smooth[unit] = state.smooth;
    }
    if comptime!(options.entropy) {
        shared_entropy[unit] = state.entropy_sum;
    }
    sync_cube();

    let levels = comptime!(cube_size.trailing_zeros() as usize);
    #[unroll]
    for level in 0..levels {
        let half = comptime!(cube_size >> (level + 1));
        if unit < half {
            let max_a = shared_max[unit];
            let max_b = shared_max[unit + half];
            let merged_max = f32::max(max_a, max_b);
            let (rescale_a, rescale_b) =
                (f32::exp(max_a - merged_max), f32::exp(max_b - merged_max));
            let (others_a, others_b) = (shared_others[unit], shared_others[unit + half]);
            if comptime!(options.entropy) {
                shared_entropy[unit] = rescaled_entropy_sum(
                    shared_entropy[unit],
                    others_a,
                    max_a - merged_max,
                    rescale_a,
                ) + rescaled_entropy_sum(
                    shared_entropy[unit + half],
                    others_b,
                    max_b - merged_max,
                    rescale_b,
                );
            }
            shared_others[unit] = others_a * rescale_a + others_b * rescale_b;
            shared_max[unit] = merged_max;
            if comptime!(options.argmax) {
                let best_a = shared_best[unit];
                let best_b = shared_best[unit + half];
                let col_a = shared_col[unit];
                let col_b = shared_col[unit + half];
                let take_b = best_b > best_a || (best_b == best_a && col_b < col_a);
                shared_best[unit] = select(take_b, best_b, best_a);
                shared_col[unit] = select(take_b, col_b, col_a);
            }
            if comptime!(options.smoothing) {
                shared_smooth[unit] += shared_smooth[unit + half];
            }
        }
        sync_cube();
    }
    let mut merged = state;
    merged.max = shared_max[0];
    merged.others = shared_others[0];
    if comptime!(options.argmax) {
        merged.best = shared_best[0];
        merged.best_col = shared_col[0];
    }
    if comptime!(options.smoothing) {
        merged.smooth = shared_smooth[0];
    }
    if comptime!(options.entropy) {
        merged.entropy_sum = shared_entropy[0];
    }
    merged
}
