//! Backward: the gradient of each row from forward's statistics (one more read of the
//! logits).

use cubecl::prelude::*;

use crate::base::row::{
    RowOptions, RowScalars, is_class, read_target, row_of_cube, row_offset, stat_index,
};
use crate::base::row_stat;
use crate::rows::gradient::{
    RowGradient, gradient_coefficients, incoming_scales, with_entropy_gradient,
};
use crate::rows::gradient_span::{store_gradient_vector, write_gradient_span, zero_vectors};
use crate::rows::reduce_span::target_share;

/// How backward reads the incoming gradient.
#[derive_cube_comptime]
pub struct GradOptions {
    /// One incoming gradient per row (`Reduction::None`), else one for all rows.
    pub per_row: bool,
    /// Divide by the mean's denominators.
    pub mean: bool,
}

/// Reads what backward needs of a row from forward's statistics and the incoming
/// gradient, and forms its coefficients.
#[cube]
#[allow(clippy::too_many_arguments)]
fn row_gradient<I: Int, G: Float>(
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    stats: &Tensor<f32>,
    grad_output: &Tensor<G>,
    denominators: &Tensor<f32>,
    entropy_grad_output: &Tensor<f32>,
    row_weights: &Tensor<f32>,
    row: usize,
    vocab: usize,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] grad_options: GradOptions,
) -> RowGradient {
    let target = read_target::<I>(targets, row);
    let counted = target != scalars.ignore_index && is_class(target, vocab);
    let target_col = select(counted, usize::cast_from(target), vocab);
    let mut incoming = f32::cast_from(grad_output[0]);
    if comptime!(grad_options.per_row) {
        incoming = f32::cast_from(grad_output[row * grad_output.stride(0)]);
    }
    if comptime!(options.row_weighted) {
        incoming *= row_weights[row * row_weights.stride(0)];
    }
    // A select, not a product: an ignored row's gradient is 0 whatever its weight.
    let incoming = select(counted, incoming, f32::new(0.0));
    let (ce_scale, z_scale) = incoming_scales(incoming, denominators, grad_options.mean);
    let log_sum = stats[stat_index(stats, row_stat::LOG_SUM, row)];
    let row_grad = gradient_coefficients(
        target_col,
        ce_scale,
        z_scale,
        stats[stat_index(stats, row_stat::MAX, row)],
        log_sum,
        stats[stat_index(stats, row_stat::TARGET_GRAD, row)],
        class_weights,
        weight_total,
        vocab,
        scalars.clone(),
        options,
    );
    if comptime!(options.entropy_gradient) {
        let entropy_incoming = select(
            counted,
            entropy_grad_output[row * entropy_grad_output.stride(0)],
            f32::new(0.0),
        );
        with_entropy_gradient(
            row_grad,
            entropy_incoming,
            stats[stat_index(stats, row_stat::ENTROPY, row)],
            log_sum,
        )
    } else {
        row_grad
    }
}

/// Backward: reads `logits`, writes `grad` (same shape). When nothing else holds the
/// logits, the launch binds `grad` as an alias of `logits`, so the gradient is written
/// over them (no N x V allocation at all); each unit reads its vectors before writing
/// them.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_backward_kernel<F: Float, I: Int, G: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    stats: &Tensor<f32>,
    grad_output: &Tensor<G>,
    denominators: &Tensor<f32>,
    entropy_grad_output: &Tensor<f32>,
    row_weights: &Tensor<f32>,
    grad: &mut Tensor<Vector<F, N>>,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] grad_options: GradOptions,
    #[define(F, I, G)] _dtypes: [ElemType; 3],
) {
    let row = row_of_cube();
    if row >= stats.shape(1) {
        terminate!();
    }
    let vocab = logits.shape(2);
    let row_grad = row_gradient::<I, G>(
        targets,
        class_weights,
        weight_total,
        stats,
        grad_output,
        denominators,
        entropy_grad_output,
        row_weights,
        row.clone(),
        vocab,
        scalars.clone(),
        options,
        grad_options,
    );
    write_gradient_row::<F, N>(
        logits,
        grad,
        row.clone(),
        row_grad.clone(),
        class_weights,
        scalars.clone(),
        options,
    );
}

/// Streams one row: reads its logits, writes its gradient (zeros, unread, for a row whose
/// gradient is zero). Each unit reads its vectors before writing them, so `grad` may alias
/// `logits`.
#[cube]
fn write_gradient_row<F: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    grad: &mut Tensor<Vector<F, N>>,
    row: usize,
    row_grad: RowGradient,
    class_weights: &Tensor<f32>,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) {
    let cube_size = options.cube_size;
    let vector_size = logits.vector_size();
    let vocab = logits.shape(2);
    let in_start = row_offset::<Vector<F, N>>(logits, row) / vector_size;
    let out_start = row_offset::<Vector<F, N>>(&*grad, row) / vector_size;
    let vectors_per_row = vocab / vector_size;
    if row_grad.target_col == vocab {
        // Zero row: the logits are not read (they may be anything, NaN included).
        zero_vectors::<F, N>(grad, out_start, vectors_per_row, cube_size, false);
    } else {
        // The target's vector is written twice by the unit whose share it is: in the loop
        // as if it held no target, then fixed from its logits read before the loop (the
        // loop may write over them when `grad` aliases `logits`).
        let (holds, target_at) = target_share(
            row_grad.target_col / vector_size,
            0usize,
            vectors_per_row,
            cube_size,
        );
        let target_values = logits[in_start + target_at];
        write_gradient_span::<F, N>(
            logits,
            grad,
            in_start,
            out_start,
            0usize,
            vectors_per_row,
            row_grad.clone(),
            class_weights,
            scalars.clone(),
            options,
            4usize,
            false,
            false,
        );
        if holds {
            store_gradient_vector::<F, N>(
                grad,
                out_start,
                target_at,
                target_values,
                class_weights,
                row_grad.clone(),
                scalars.clone(),
                options,
                true,
                false,
            );
        }
    }
}
