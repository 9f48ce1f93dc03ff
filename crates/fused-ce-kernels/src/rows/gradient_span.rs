//! The gradient written over a span of a row's vectors: streamed from the logits, one
//! vector at a time, or zeros.

use cubecl::prelude::*;

use crate::base::ptx::{load_vector, store_vector};
use crate::base::row::{RowOptions, RowScalars, weights_vector};
use crate::rows::gradient::{RowGradient, gradient_vector};

/// Writes the gradient of vectors `first..first + len` of a row (`in_start`/`out_start`:
/// the row's first vector in `logits`/`grad`) as if none held the target: unit `u` takes
/// vectors `first + u, first + u + cube_size, ..`. `stream_loads`/`stream_stores`: the
/// evict-first forms of [`load_vector()`]/[`store_vector()`].
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_gradient_span<F: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    grad: &mut Tensor<Vector<F, N>>,
    in_start: usize,
    out_start: usize,
    first: usize,
    len: usize,
    row_grad: RowGradient,
    class_weights: &Tensor<f32>,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] loads: usize,
    #[comptime] stream_loads: bool,
    #[comptime] stream_stores: bool,
) {
    let cube_size = options.cube_size;
    let in_row = in_start + first;
    let mut index = UNIT_POS as usize;
    // Four vectors per step, all loads issued before any store (the stores may alias
    // the loads, so the compiler would not move a load above them).
    let mut loaded = Array::<Vector<F, N>>::new(loads);
    while index + (loads - 1) * cube_size < len {
        #[unroll]
        for step in 0..loads {
            loaded[step] =
                load_vector::<F, N>(logits, in_row + index + step * cube_size, stream_loads);
        }
        #[unroll]
        for step in 0..loads {
            store_gradient_vector::<F, N>(
                grad,
                out_start,
                first + index + step * cube_size,
                loaded[step],
                class_weights,
                row_grad.clone(),
                scalars.clone(),
                options,
                false,
                stream_stores,
            );
        }
        index += loads * cube_size;
    }
    while index < len {
        let values = load_vector::<F, N>(logits, in_row + index, stream_loads);
        store_gradient_vector::<F, N>(
            grad,
            out_start,
            first + index,
            values,
            class_weights,
            row_grad.clone(),
            scalars.clone(),
            options,
            false,
            stream_stores,
        );
        index += cube_size;
    }
}

/// Writes the gradient of vector `index` of a row (`values`: its logits; `out_start`:
/// the row's first vector in `grad`) at `out_start + index`; without `with_target` as if
/// it held no target (see `write_gradient_row`); `streaming`: see [`store_vector()`].
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_gradient_vector<F: Float, N: Size>(
    grad: &mut Tensor<Vector<F, N>>,
    out_start: usize,
    index: usize,
    values: Vector<F, N>,
    class_weights: &Tensor<f32>,
    row_grad: RowGradient,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] with_target: bool,
    #[comptime] streaming: bool,
) {
    let vector_size = grad.vector_size();
    let mut weights = Vector::<f32, N>::new(1.0);
    if comptime!(options.smoothing && options.weighted) {
        weights = weights_vector::<N>(class_weights, index * vector_size);
    }
    let value = gradient_vector::<F, N>(
        values,
        weights,
        index * vector_size,
        row_grad.clone(),
        scalars.clone(),
        options,
        with_target,
    );
    store_vector::<F, N>(grad, out_start + index, value, streaming);
}

/// Zeros over `len` vectors of a row's gradient from `out_start` (unit `u` writes
/// `out_start + u, out_start + u + cube_size, ..`); `streaming`: see [`store_vector()`].
#[cube]
pub(crate) fn zero_vectors<F: Float, N: Size>(
    grad: &mut Tensor<Vector<F, N>>,
    out_start: usize,
    len: usize,
    #[comptime] cube_size: usize,
    #[comptime] streaming: bool,
) {
    let mut local = UNIT_POS as usize;
    while local < len {
        store_vector::<F, N>(grad, out_start + local, Vector::new(F::new(0.0)), streaming);
        local += cube_size;
    }
}
