//! The cube's merge of its units' row states into the row's (or chunk's).

use cubecl::prelude::*;

use crate::base::row::RowOptions;
use crate::base::tree::{TreeFold, TreeFoldExpand, tree_fold};
use crate::rows::row_state::{RowState, rescaled_entropy_sum};

/// The units' row states in shared memory, a slot per unit in one array per value; the
/// options that track nothing keep a one-slot array.
#[derive(CubeType)]
struct SharedStates {
    max: Shared<[f32]>,
    others: Shared<[f32]>,
    best: Shared<[f32]>,
    col: Shared<[u32]>,
    smooth: Shared<[f32]>,
    entropy: Shared<[f32]>,
    #[cube(comptime)]
    options: RowOptions,
}

#[cube]
impl TreeFold for SharedStates {
    fn fold(&mut self, unit: usize, #[comptime] half: usize) {
        let options = comptime!(self.options);
        let max_a = self.max[unit];
        let max_b = self.max[unit + half];
        let merged_max = f32::max(max_a, max_b);
        let (rescale_a, rescale_b) = (f32::exp(max_a - merged_max), f32::exp(max_b - merged_max));
        let (others_a, others_b) = (self.others[unit], self.others[unit + half]);
        if comptime!(options.entropy) {
            self.entropy[unit] =
                rescaled_entropy_sum(self.entropy[unit], others_a, max_a - merged_max, rescale_a)
                    + rescaled_entropy_sum(
                        self.entropy[unit + half],
                        others_b,
                        max_b - merged_max,
                        rescale_b,
                    );
        }
        self.others[unit] = others_a * rescale_a + others_b * rescale_b;
        self.max[unit] = merged_max;
        if comptime!(options.argmax) {
            let best_a = self.best[unit];
            let best_b = self.best[unit + half];
            let col_a = self.col[unit];
            let col_b = self.col[unit + half];
            let take_b = best_b > best_a || (best_b == best_a && col_b < col_a);
            self.best[unit] = select(take_b, best_b, best_a);
            self.col[unit] = select(take_b, col_b, col_a);
        }
        if comptime!(options.smoothing) {
            self.smooth[unit] += self.smooth[unit + half];
        }
    }
}

/// Merges the units' states as a tree in shared memory; every unit gets the row's state.
/// (A plane-op merge, one barrier instead of one per level, timed the same on the H200:
/// the merge is not on the critical path. The tree runs everywhere; lavapipe has no plane
/// ops.)
#[cube]
pub(crate) fn cube_merge(state: RowState, #[comptime] options: RowOptions) -> RowState {
    let cube_size = options.cube_size;
    let mut states = SharedStates {
        max: Shared::<[f32]>::new_slice(cube_size),
        others: Shared::<[f32]>::new_slice(cube_size),
        best: Shared::<[f32]>::new_slice(comptime!(if options.argmax { cube_size } else { 1 })),
        col: Shared::<[u32]>::new_slice(comptime!(if options.argmax { cube_size } else { 1 })),
        smooth: Shared::<[f32]>::new_slice(comptime!(if options.smoothing {
            cube_size
        } else {
            1
        })),
        entropy: Shared::<[f32]>::new_slice(comptime!(if options.entropy { cube_size } else { 1 })),
        options,
    };
    let unit = UNIT_POS as usize;
    states.max[unit] = state.max;
    states.others[unit] = state.others;
    if comptime!(options.argmax) {
        states.best[unit] = state.best;
        states.col[unit] = state.best_col;
    }
    if comptime!(options.smoothing) {
        states.smooth[unit] = state.smooth;
    }
    if comptime!(options.entropy) {
        states.entropy[unit] = state.entropy_sum;
    }
    tree_fold::<SharedStates>(&mut states, cube_size);
    let mut merged = state;
    merged.max = states.max[0];
    merged.others = states.others[0];
    if comptime!(options.argmax) {
        merged.best = states.best[0];
        merged.best_col = states.col[0];
    }
    if comptime!(options.smoothing) {
        merged.smooth = states.smooth[0];
    }
    if comptime!(options.entropy) {
        merged.entropy_sum = states.entropy[0];
    }
    merged
}
