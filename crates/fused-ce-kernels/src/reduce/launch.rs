//! The reduction's launch: one cube.

use cubecl::prelude::*;

use crate::base::grid::reduction_units;
use crate::reduce::reduce_stats::{ReduceOptions, reduce_stats_kernel};

/// The reduced outputs of `N > 0` rows' statistics in one launch (`reduce_stats_kernel`):
/// `loss [1]` in `float_dtype`, f32 `z_loss [1]`, `accuracy [1]`, `denominators [2]`.
#[allow(clippy::too_many_arguments)]
pub fn launch_reduce_stats(
    client: &Client,
    stats: TensorArg,
    loss: TensorArg,
    z_loss: TensorArg,
    accuracy: TensorArg,
    denominators: TensorArg,
    float_dtype: ElemType,
    mean: bool,
    z_loss_on: bool,
    weighted: bool,
) {
    let cube_size = reduction_units(client);
    // SAFETY: every index is a row below `stats.shape(1)` or 0/1 of the outputs, which
    // the caller allocates with one and two elements.
    unsafe {
        reduce_stats_kernel::launch_unchecked(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(cube_size as u32),
            stats,
            loss,
            z_loss,
            accuracy,
            denominators,
            ReduceOptions {
                mean,
                z_loss: z_loss_on,
                weighted,
                cube_size,
            },
            float_dtype,
        );
    }
}
