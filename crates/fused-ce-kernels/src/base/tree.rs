//! Reductions over a cube's units as a tree in shared memory: each level halves the units
//! that fold, with a barrier between levels. Shared memory rather than plane (warp)
//! operations, so the very same kernels run on lavapipe, which has no plane ops.

use cubecl::prelude::*;

/// Sums `sums` stacked arrays of `cube_size` f32 in `shared` (unit `u` has stored its
/// values at `u`, `cube_size + u`, ..) by a tree over the units: array `k`'s total ends
/// at `k * cube_size`. Every unit of the cube calls it (it holds the barriers).
#[cube]
pub(crate) fn sum_stacked(
    shared: &mut Shared<[f32]>,
    #[comptime] sums: usize,
    #[comptime] cube_size: usize,
) {
    let unit = UNIT_POS as usize;
    sync_cube();
    let levels = comptime!(cube_size.trailing_zeros() as usize);
    #[unroll]
    for level in 0..levels {
        let half = comptime!(cube_size >> (level + 1));
        if unit < half {
            #[unroll]
            for sum in 0..sums {
                let at = comptime!(sum * cube_size);
                shared[at + unit] += shared[at + unit + half];
            }
        }
        sync_cube();
    }
}
