//! Thin launch functions: bind the plan's shapes to the kernels and launch them. Callers
//! hand in launch arguments already bound to buffers; nothing here allocates.

use cubecl::prelude::*;

use crate::backward::{GradOptions, cross_entropy_backward_kernel, scale_gradient_kernel};
use crate::checks::first_bad_target_kernel;
use crate::forward::cross_entropy_forward_kernel;
use crate::one_pass::{cross_entropy_one_pass_kernel, one_pass_prologue_kernel};
use crate::plan::{OnePassPlan, RowLaunch, Target, grid_of, reduction_units};
use crate::reduce::{ReduceOptions, reduce_stats_kernel};
use crate::row::RowScalarsLaunch;
use crate::shards::{
    PackOptions, ShardGradientOptions, ShardRowsOptions, pack_shard_rows_kernel,
    shard_gradient_rows_kernel, shard_targets_kernel, whole_vocabulary_rows_kernel,
};

/// The options' values as the row kernels take them (runtime scalars).
pub(crate) fn row_scalars(shape: &RowLaunch) -> RowScalarsLaunch {
    let settings = shape.settings;
    RowScalarsLaunch::new(
        settings.ignore_index,
        settings.label_smoothing,
        settings.z_loss_scale,
        settings.softcap.unwrap_or(1.0),
        settings
            .temperature
            .map_or(1.0, |temperature| 1.0 / temperature),
    )
}

/// Class weights `[V]` and their total `[1]` (f32), or any small f32 buffers when the
/// launch is not weighted (they are then never read).
pub struct WeightArgs {
    pub weights: TensorArg,
    pub total: TensorArg,
}

/// Per-row forward: writes `stats [row_stat::COUNT, rows]` (f32) and, when the argmax is
/// tracked, `predicted [rows]` (the targets' int type; any buffer otherwise). `logits` are
/// `[B, T, V]`, `targets` `[B, T]` (2-D inputs bound as `[1, N, ..]`).
pub fn launch_forward(
    client: &Client,
    shape: RowLaunch,
    logits: TensorArg,
    targets: TensorArg,
    weights: WeightArgs,
    stats: TensorArg,
    predicted: TensorArg,
) {
    if shape.rows == 0 {
        return;
    }
    let options = shape.launch_options(client, shape.cube_size(), shape.tuning.row_loads);
    // Unchecked: every index is in bounds by construction (clamped or masked in the
    // kernel), and the checked launch's per-lane selects cost about one instruction per
    // element.
    unsafe {
        cross_entropy_forward_kernel::launch_unchecked(
            client,
            shape.cube_count(),
            CubeDim::new_1d(options.cube_size as u32),
            shape.address_type,
            shape.vector_size,
            logits,
            targets,
            weights.weights,
            weights.total,
            stats,
            predicted,
            row_scalars(&shape),
            options,
            [shape.float_dtype, shape.int_dtype],
        );
    }
}

/// Where backward writes the gradient.
pub enum GradientTarget {
    /// Over the logits themselves (they are not read again by anyone).
    InPlace(TensorArg),
    /// Read `logits`, write `grad` (same shape).
    Separate { logits: TensorArg, grad: TensorArg },
}

impl GradientTarget {
    /// The `(logits, grad)` launch arguments. Every gradient-writing kernel takes the
    /// logits as its first input, so an in-place gradient is an alias of input 0.
    pub(crate) fn into_args(self) -> (TensorArg, TensorArg) {
        match self {
            GradientTarget::InPlace(logits) => {
                let grad = TensorArg::Alias {
                    input_pos: 0,
                    strides: logits.strides().into(),
                    shape: logits.shape().into(),
                };
                (logits, grad)
            }
            GradientTarget::Separate { logits, grad } => (logits, grad),
        }
    }
}

/// The loss's incoming gradient as backward reads it.
pub struct IncomingGradient {
    /// `[rows]` when `per_row`, else `[1]`; any float type (`dtype`).
    pub grad: TensorArg,
    pub dtype: ElemType,
    pub per_row: bool,
    /// Divide by the mean's denominators.
    pub mean: bool,
    /// f32 `[2]` (`D`, `n`) when `mean`; any buffer otherwise (never read).
    pub denominators: TensorArg,
    /// f32 `[rows]`: the entropy output's incoming gradient, when it has one.
    pub entropy: Option<TensorArg>,
}

/// Per-row backward: the spec's gradient for every row, zero rows for ignored targets.
pub fn launch_backward(
    client: &Client,
    shape: RowLaunch,
    target: GradientTarget,
    targets: TensorArg,
    weights: WeightArgs,
    stats: TensorArg,
    incoming: IncomingGradient,
) {
    if shape.rows == 0 {
        return;
    }
    let mut options = shape.launch_options(client, shape.cube_size(), shape.tuning.row_loads);
    options.entropy_gradient = incoming.entropy.is_some();
    let grad_options = GradOptions {
        per_row: incoming.per_row,
        mean: incoming.mean,
    };
    // Without it the stats are bound in its place, unread.
    let entropy = incoming.entropy.unwrap_or_else(|| same_arg(&stats));
    let (logits, grad) = target.into_args();
    // Unchecked: every index is in bounds by construction (clamped or masked in the
    // kernel), and the checked launch's per-lane selects cost about one instruction per
    // element.
    unsafe {
        cross_entropy_backward_kernel::launch_unchecked(
            client,
            shape.cube_count(),
            CubeDim::new_1d(options.cube_size as u32),
            shape.address_type,
            shape.vector_size,
            logits,
            targets,
            weights.weights,
            weights.total,
            stats,
            incoming.grad,
            incoming.denominators,
            entropy,
            grad,
            row_scalars(&shape),
            options,
            grad_options,
            [shape.float_dtype, shape.int_dtype, incoming.dtype],
        );
    }
}

/// The one-pass kernel's scratch buffers, written by its prologue: f32
/// `[scale_slot::LEN]` for the mean's denominators and the guessed incoming gradient, i32
/// `[1]` for the ticket counter, i32 `[plan.partials_len(rows)]`.
pub struct OnePassScratch {
    pub scales: TensorArg,
    pub tickets: TensorArg,
    pub partials: TensorArg,
}

/// The buffers of one launch of the one pass.
pub struct OnePassBuffers {
    /// Where the gradient goes (over the logits, or a new buffer).
    pub target: GradientTarget,
    pub targets: TensorArg,
    pub weights: WeightArgs,
    /// f32 `[row_stat::COUNT, rows]`.
    pub stats: TensorArg,
    /// The argmax per row when tracked; any buffer otherwise.
    pub predicted: TensorArg,
    /// f32 `[1]`: the incoming gradient the gradient is formed for (the loss's guess).
    pub guess: TensorArg,
    /// f32 `[2]`: the mean's denominators `[D, n]` to divide by, when not those of the
    /// launch's rows (which the prologue then sums from the targets).
    pub denominators: Option<TensorArg>,
    pub scratch: OnePassScratch,
}

/// A second launch argument for the same buffer (`TensorArg` is not `Clone`).
fn same_arg(arg: &TensorArg) -> TensorArg {
    match arg {
        TensorArg::Handle { handle } => TensorArg::Handle {
            handle: handle.clone(),
        },
        TensorArg::Alias {
            input_pos,
            strides,
            shape,
        } => TensorArg::Alias {
            input_pos: *input_pos,
            strides: strides.clone(),
            shape: shape.clone(),
        },
    }
}

/// Forward that also writes the gradient for the guessed incoming gradient, divided by
/// the mean's denominators when `mean` (see `cross_entropy_one_pass_kernel`): one pass over
/// the logits, after a small prologue.
pub fn launch_one_pass(
    client: &Client,
    shape: RowLaunch,
    plan: OnePassPlan,
    buffers: OnePassBuffers,
    mean: bool,
) {
    if shape.rows == 0 {
        return;
    }
    let OnePassBuffers {
        target,
        targets,
        weights,
        stats,
        predicted,
        guess,
        denominators,
        scratch,
    } = buffers;
    let given_denominators = denominators.is_some();
    // Without given denominators the guess is bound in their place, unread.
    let given = denominators.unwrap_or_else(|| same_arg(&guess));
    let prologue_units = reduction_units(client);
    let prologue_cubes = plan
        .partials_len(shape.rows)
        .div_ceil(prologue_units * 4)
        .clamp(1, 1024);
    one_pass_prologue_kernel::launch(
        client,
        CubeCount::Static(prologue_cubes as u32, 1, 1),
        CubeDim::new_1d(prologue_units as u32),
        same_arg(&targets),
        same_arg(&weights.weights),
        guess,
        given,
        same_arg(&scratch.scales),
        same_arg(&scratch.tickets),
        same_arg(&scratch.partials),
        u32::try_from(shape.vocab).unwrap_or(u32::MAX),
        row_scalars(&shape),
        shape.options_on(Target::OTHER, prologue_units, shape.tuning.row_loads),
        mean,
        given_denominators,
        shape.int_dtype,
    );
    let one_pass = plan.options(mean);
    let options = shape.launch_options(client, plan.cube_size, plan.loads_per_step);
    let (logits, grad) = target.into_args();
    // Unchecked: every index is in bounds by construction (clamped or masked in the
    // kernel), and the checked launch's per-lane selects cost about one instruction per
    // element.
    unsafe {
        cross_entropy_one_pass_kernel::launch_unchecked(
            client,
            plan.cube_count(shape.rows),
            CubeDim::new_1d(plan.cube_size as u32),
            shape.address_type,
            shape.vector_size,
            logits,
            targets,
            weights.weights,
            weights.total,
            scratch.scales,
            stats,
            predicted,
            grad,
            scratch.tickets,
            scratch.partials,
            plan.chunk_vectors as u32,
            row_scalars(&shape),
            options,
            one_pass,
            [shape.float_dtype, shape.int_dtype],
        );
    }
}

/// `grad *= g / guess` in place for a scalar incoming gradient `g` (`[1]`, any float type
/// `grad_dtype`) and the f32 `guess [1]` the one pass formed `grad` with, skipped on the
/// device when they are equal; the next guess into f32 `next_guess [1]`. `grad` is
/// `[B, T, V]` with at least one row.
#[allow(clippy::too_many_arguments)]
pub fn launch_scale_gradient(
    client: &Client,
    shape: RowLaunch,
    grad: TensorArg,
    grad_output: TensorArg,
    guess: TensorArg,
    next_guess: TensorArg,
    grad_dtype: ElemType,
) {
    let cube_size = shape.cube_size();
    // As many cubes as the device holds at once, each looping over rows: when the
    // guess was right every cube exits at once, and one cube per row would pay
    // for thousands of empty cubes; a device of unknown size gets one cube per row.
    let cubes = client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .map_or(shape.rows, |sms| {
            shape.rows.min(sms as usize * (2048 / cube_size).max(1))
        });
    // Unchecked: every index is in bounds by construction (clamped or masked in the
    // kernel), and the checked launch's per-lane selects cost about one instruction per
    // element.
    unsafe {
        scale_gradient_kernel::launch_unchecked(
            client,
            grid_of(cubes),
            CubeDim::new_1d(cube_size as u32),
            shape.address_type,
            shape.vector_size,
            grad,
            grad_output,
            guess,
            next_guess,
            cube_size,
            [shape.float_dtype, grad_dtype],
        );
    }
}

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

/// Cubes of 256 units, one unit per row.
fn per_row_grid(rows: usize) -> (CubeCount, CubeDim) {
    let cube_size = 256u32;
    let cubes = u32::try_from(rows.div_ceil(cube_size as usize)).unwrap_or(u32::MAX);
    (CubeCount::new_1d(cubes), CubeDim::new_1d(cube_size))
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
