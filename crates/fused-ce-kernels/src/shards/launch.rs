//! The vocabulary-parallel kernels' launches: one unit per row.

use cubecl::prelude::*;

use crate::shards::gradient::{ShardGradientOptions, shard_gradient_rows_kernel};
use crate::shards::local_targets::shard_targets_kernel;
use crate::shards::pack::{PackOptions, pack_shard_rows_kernel};
use crate::shards::whole_vocabulary::{ShardRowsOptions, whole_vocabulary_rows_kernel};

/// One shard of the vocabulary-parallel loss and the loss's options, as its kernels take
/// them.
#[derive(Debug, Clone)]
pub struct ShardScalars {
    /// This shard's position.
    pub index: usize,
    /// This shard's classes.
    pub classes: core::ops::Range<usize>,
    /// Classes per shard (all but the last).
    pub shard_width: usize,
    /// The whole vocabulary's size.
    pub vocab: usize,
    /// As the loss kernels compare it (i32).
    pub ignore_index: i32,
    /// Softcap's `c`, when on.
    pub softcap: Option<f32>,
    pub label_smoothing: f32,
    pub z_loss_scale: f32,
}

/// Cubes of 256 units, one unit per row.
fn per_row_grid(rows: usize) -> (CubeCount, CubeDim) {
    let cube_size = 256u32;
    let cubes = u32::try_from(rows.div_ceil(cube_size as usize)).unwrap_or(u32::MAX);
    (CubeCount::new_1d(cubes), CubeDim::new_1d(cube_size))
}

/// The vocabulary-parallel loss's per-row statistics from the exchanged sums
/// (`whole_vocabulary_rows_kernel`): `summed [R, N]` f32, `targets` bound as `[1, N]`,
/// `class_weights [V]` and `shard_totals [K]` (any small f32 buffers when the options do
/// not read them), `stats [COUNT, N]` f32 and `predicted [N]` (the targets' int type; any
/// buffer without the argmax). One unit per row; `rows > 0`.
#[allow(clippy::too_many_arguments)]
pub fn launch_whole_vocabulary_rows(
    client: &Client,
    rows: usize,
    summed: TensorArg,
    targets: TensorArg,
    class_weights: TensorArg,
    shard_totals: TensorArg,
    stats: TensorArg,
    predicted: TensorArg,
    int_dtype: ElemType,
    scalars: &ShardScalars,
    options: ShardRowsOptions,
) {
    let (cubes, cube_dim) = per_row_grid(rows);
    // SAFETY: a unit past the last row returns first; the exchanged rows read are those
    // the options say were packed, the class weight's index is clamped into `[0, V)` and
    // the shard totals are read at `0..K`.
    unsafe {
        whole_vocabulary_rows_kernel::launch_unchecked(
            client,
            cubes,
            cube_dim,
            summed,
            targets,
            class_weights,
            shard_totals,
            stats,
            predicted,
            u32::try_from(scalars.vocab).unwrap_or(u32::MAX),
            u32::try_from(scalars.shard_width).unwrap_or(u32::MAX),
            scalars.ignore_index,
            scalars.label_smoothing,
            scalars.z_loss_scale,
            options,
            int_dtype,
        );
    }
}

/// The targets of a shard's row kernel (`shard_targets_kernel`): `targets` bound as
/// `[1, N]`, `local [N]`, and `first_class [N]` when `smoothing` (any buffer otherwise), in
/// `int_dtype`. `rows > 0`.
#[allow(clippy::too_many_arguments)]
pub fn launch_shard_targets(
    client: &Client,
    rows: usize,
    targets: TensorArg,
    local: TensorArg,
    first_class: TensorArg,
    int_dtype: ElemType,
    scalars: &ShardScalars,
    smoothing: bool,
) {
    let (cubes, cube_dim) = per_row_grid(rows);
    // SAFETY: a unit past the last row returns first; each writes its own row.
    unsafe {
        shard_targets_kernel::launch_unchecked(
            client,
            cubes,
            cube_dim,
            targets,
            local,
            first_class,
            u32::try_from(scalars.classes.start).unwrap_or(u32::MAX),
            u32::try_from(scalars.classes.end).unwrap_or(u32::MAX),
            scalars.ignore_index,
            smoothing,
            int_dtype,
        );
    }
}

/// A shard's contribution to the exchanged sums (`pack_shard_rows_kernel`): `own` and
/// `smoothed` `[COUNT, N]` f32, `predicted [N]`, `logits` bound as `[1, N, V_s]`,
/// `targets` as `[1, N]`, into `packed [R, N]` f32. `rows > 0`.
#[allow(clippy::too_many_arguments)]
pub fn launch_pack_shard_rows(
    client: &Client,
    rows: usize,
    own: TensorArg,
    smoothed: TensorArg,
    predicted: TensorArg,
    logits: TensorArg,
    targets: TensorArg,
    packed: TensorArg,
    dtypes: [ElemType; 2],
    scalars: &ShardScalars,
    options: PackOptions,
) {
    let (cubes, cube_dim) = per_row_grid(rows);
    let width = scalars.classes.end - scalars.classes.start;
    // SAFETY: a unit past the last row returns first; the argmax column is clamped into
    // the shard's width; each unit writes its own column of `packed`.
    unsafe {
        pack_shard_rows_kernel::launch_unchecked(
            client,
            cubes,
            cube_dim,
            own,
            smoothed,
            predicted,
            logits,
            targets,
            packed,
            u32::try_from(scalars.index).unwrap_or(u32::MAX),
            u32::try_from(scalars.classes.start).unwrap_or(u32::MAX),
            u32::try_from(width).unwrap_or(u32::MAX),
            scalars.ignore_index,
            scalars.softcap.unwrap_or(1.0),
            options,
            dtypes,
        );
    }
}

/// The inputs of a shard's backward kernel (`shard_gradient_rows_kernel`): from the whole
/// vocabulary's `stats [COUNT, N]`, `targets` bound as `[1, N]`, `logits` as `[1, N, V_s]`,
/// `grad_output` (`[N]` or `[1]`), `denominators [2]` (any buffer unless `Mean`) and
/// `weight_total [1]` (any buffer without class weights), into `local [N]`,
/// `local_stats [COUNT, N]`, `coefficients [N]` and `smooth [N]` (any buffer without
/// smoothing). `dtypes`: the logits', the incoming gradient's, the targets'. `rows > 0`.
#[allow(clippy::too_many_arguments)]
pub fn launch_shard_gradient_rows(
    client: &Client,
    rows: usize,
    inputs: [TensorArg; 6],
    outputs: [TensorArg; 4],
    dtypes: [ElemType; 3],
    scalars: &ShardScalars,
    options: ShardGradientOptions,
) {
    let (cubes, cube_dim) = per_row_grid(rows);
    let [
        stats,
        targets,
        logits,
        grad_output,
        denominators,
        weight_total,
    ] = inputs;
    let [local, local_stats, coefficients, smooth] = outputs;
    // SAFETY: a unit past the last row returns first; `grad_output` is read at the row
    // only when it has one value per row; each unit writes its own row.
    unsafe {
        shard_gradient_rows_kernel::launch_unchecked(
            client,
            cubes,
            cube_dim,
            stats,
            targets,
            logits,
            grad_output,
            denominators,
            weight_total,
            local,
            local_stats,
            coefficients,
            smooth,
            u32::try_from(scalars.classes.start).unwrap_or(u32::MAX),
            u32::try_from(scalars.classes.end).unwrap_or(u32::MAX),
            u32::try_from(scalars.vocab).unwrap_or(u32::MAX),
            scalars.ignore_index,
            scalars.softcap.unwrap_or(1.0),
            scalars.z_loss_scale,
            scalars.label_smoothing,
            options,
            dtypes,
        );
    }
}
