//! The check's launch: one cube.

use cubecl::prelude::*;

use crate::base::grid::reduction_units;
use crate::checks::first_bad_target::first_bad_target_kernel;

/// Writes `[first bad row, its target]` of `targets` (`[B, T]`) into `result` (`[2]`, the
/// targets' int type; the row is the number of rows when every target is a class in
/// `[0, vocab)` or `ignore_index`). One cube.
pub fn launch_first_bad_target(
    client: &Client,
    targets: TensorArg,
    result: TensorArg,
    int_dtype: ElemType,
    vocab: usize,
    ignore_index: i32,
) {
    let cube_size = reduction_units(client);
    first_bad_target_kernel::launch(
        client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(cube_size as u32),
        targets,
        result,
        i32::try_from(vocab).unwrap_or(i32::MAX),
        ignore_index,
        cube_size,
        int_dtype,
    );
}
