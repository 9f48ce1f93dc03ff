//! The row kernels' launches: bind the shape to the kernels and launch them. Callers hand
//! in launch arguments already bound to buffers; nothing here allocates.

use cubecl::prelude::*;

use crate::base::launch_args::{GradientTarget, WeightArgs, same_arg};
use crate::base::row_launch::{RowLaunch, row_scalars};
use crate::rows::backward::{GradOptions, cross_entropy_backward_kernel};
use crate::rows::forward::cross_entropy_forward_kernel;

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
    /// f32 `[rows]`: the loss's per-row weights, when it has them.
    pub row_weights: Option<TensorArg>,
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
    // Without them the stats are bound in their place, unread.
    let entropy = incoming.entropy.unwrap_or_else(|| same_arg(&stats));
    options.row_weighted = incoming.row_weights.is_some();
    let row_weights = incoming.row_weights.unwrap_or_else(|| same_arg(&stats));
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
            row_weights,
            grad,
            row_scalars(&shape),
            options,
            grad_options,
            [shape.float_dtype, shape.int_dtype, incoming.dtype],
        );
    }
}
