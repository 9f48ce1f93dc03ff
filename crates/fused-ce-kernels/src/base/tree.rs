//! Reductions over a cube's units as a tree in shared memory: each level halves the units
//! that fold, with a barrier between levels. Shared memory rather than plane (warp)
//! operations, so the very same kernels run on lavapipe, which has no plane ops.

use cubecl::prelude::*;

/// Values the units of a cube keep side by side in shared memory, a slot per unit (in one
/// array or several), that [`tree_fold`] folds into slot 0.
#[cube]
pub(crate) trait TreeFold: CubeType {
    /// Folds slot `unit + half` into slot `unit`.
    fn fold(&mut self, unit: usize, #[comptime] half: usize);
}

/// Folds the slots of the cube's `cube_size` units (a power of two) into slot 0 as a tree:
/// the units below `half` fold in the slot `half` above theirs, for `half` from
/// `cube_size / 2` down to 1. Every unit of the cube calls it (it holds the barriers); the
/// first barrier publishes the slots the units stored.
#[cube]
pub(crate) fn tree_fold<T: TreeFold>(slots: &mut T, #[comptime] cube_size: usize) {
    let unit = UNIT_POS as usize;
    sync_cube();
    let levels = comptime!(cube_size.trailing_zeros() as usize);
    #[unroll]
    for level in 0..levels {
        let half = comptime!(cube_size >> (level + 1));
        if unit < half {
            slots.fold(unit, half);
        }
        sync_cube();
    }
}

/// `sums` arrays of `cube_size` f32 stacked in one shared slice.
#[derive(CubeType)]
struct StackedSums {
    shared: Shared<[f32]>,
    #[cube(comptime)]
    sums: usize,
    #[cube(comptime)]
    cube_size: usize,
}

#[cube]
impl TreeFold for StackedSums {
    fn fold(&mut self, unit: usize, #[comptime] half: usize) {
        #[unroll]
        for sum in 0..self.sums {
            let at = comptime!(sum * self.cube_size);
            self.shared[at + unit] += self.shared[at + unit + half];
        }
    }
}

/// Sums `sums` stacked arrays of `cube_size` f32 in `shared` (unit `u` has stored its
/// values at `u`, `cube_size + u`, ..) by [`tree_fold`]: array `k`'s total ends at
/// `k * cube_size`. Every unit of the cube calls it (it holds the barriers).
#[cube]
pub(crate) fn sum_stacked(
    shared: &mut Shared<[f32]>,
    #[comptime] sums: usize,
    #[comptime] cube_size: usize,
) {
    let mut stacked = StackedSums {
        shared: shared.clone(),
        sums,
        cube_size,
    };
    tree_fold::<StackedSums>(&mut stacked, cube_size);
}
