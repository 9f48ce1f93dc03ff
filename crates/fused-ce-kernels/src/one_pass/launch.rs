//! The one pass's launches: its prologue and kernel, and the rescale of its gradient.

use cubecl::prelude::*;

use crate::base::grid::{grid_of, reduction_units};
use crate::base::launch_args::{GradientTarget, WeightArgs, same_arg};
use crate::base::row_launch::{RowLaunch, row_scalars};
use crate::base::target::Target;
use crate::one_pass::kernel::cross_entropy_one_pass_kernel;
use crate::one_pass::plan::OnePassPlan;
use crate::one_pass::prologue::one_pass_prologue_kernel;
use crate::one_pass::scale_gradient::scale_gradient_kernel;

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
    /// f32 `[rows]`: the loss's per-row weights, when it has them.
    pub row_weights: Option<TensorArg>,
    /// f32 `[rows]`: the entropy's per-row weights `c_r` (the objective's `-c_r H_r`),
    /// bound when `shape.settings.entropy_weighted`.
    pub entropy_weights: Option<TensorArg>,
    pub scratch: OnePassScratch,
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
        row_weights,
        entropy_weights,
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
    let mut options = shape.launch_options(client, plan.cube_size, plan.loads_per_step);
    options.row_weighted = row_weights.is_some();
    // The plan leaves the kept exponentials out for the entropy weights (`settings`).
    debug_assert_eq!(shape.settings.entropy_weighted, entropy_weights.is_some());
    options.entropy_gradient = entropy_weights.is_some();
    // Without them the stats are bound in their place, unread.
    let row_weights = row_weights.unwrap_or_else(|| same_arg(&stats));
    let entropy_weights = entropy_weights.unwrap_or_else(|| same_arg(&stats));
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
            row_weights,
            entropy_weights,
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
