//! The reduction's launch: one cube.

use cubecl::prelude::*;

use crate::base::grid::reduction_units;
use crate::base::launch_args::same_arg;
use crate::reduce::reduce_stats::{ReduceOptions, reduce_stats_kernel};

/// The reduced outputs of `N > 0` rows' statistics in one launch (`reduce_stats_kernel`):
/// `loss [1]` in `float_dtype`, f32 `z_loss [1]`, `accuracy [1]`, `denominators [2]`;
/// with f32 `row_weights [N]` and `entropy_weights [N]` the weighted objective's loss.
#[allow(clippy::too_many_arguments)]
pub fn launch_reduce_stats(
    client: &Client,
    stats: TensorArg,
    row_weights: Option<TensorArg>,
    entropy_weights: Option<TensorArg>,
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
    let (row_weighted, entropy_weighted) = (row_weights.is_some(), entropy_weights.is_some());
    // Without them the stats are bound in their place, unread.
    let row_weights = row_weights.unwrap_or_else(|| same_arg(&stats));
    let entropy_weights = entropy_weights.unwrap_or_else(|| same_arg(&stats));
    // SAFETY: every index is a row below `stats.shape(1)` or 0/1 of the outputs, which
    // the caller allocates with one and two elements.
    unsafe {
        reduce_stats_kernel::launch_unchecked(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(cube_size as u32),
            stats,
            row_weights,
            entropy_weights,
            loss,
            z_loss,
            accuracy,
            denominators,
            ReduceOptions {
                mean,
                z_loss: z_loss_on,
                weighted,
                row_weighted,
                entropy_weighted,
                cube_size,
            },
            float_dtype,
        );
    }
}
