//! Backward of the one pass: its gradient rescaled when the guessed incoming gradient
//! missed.

use cubecl::prelude::*;

use crate::base::row::{row_of_cube, row_offset};

/// Backward of the one pass: `grad *= g / guess` in place for a scalar incoming gradient
/// `g` and the `guess` the one pass formed the gradient with, each cube taking rows in
/// turn; every cube returns at once when the guess was right (a training loop's constant
/// scale), so that case costs one near-empty launch and no host read. Also writes the
/// next call's guess: `g` when it is finite and not 0 (a gradient formed for 0 or NaN
/// could not be rescaled), else the same guess.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn scale_gradient_kernel<F: Float, G: Float, N: Size>(
    grad: &mut Tensor<Vector<F, N>>,
    grad_output: &Tensor<G>,
    guess: &Tensor<f32>,
    next_guess: &mut Tensor<f32>,
    #[comptime] cube_size: usize,
    #[define(F, G)] _dtypes: [ElemType; 2],
) {
    let incoming = f32::cast_from(grad_output[0]);
    let guessed = guess[0];
    if CUBE_POS == 0 && UNIT_POS == 0 {
        let usable = !f32::is_nan(incoming) && !f32::is_inf(incoming) && incoming != f32::new(0.0);
        next_guess[0] = select(usable, incoming, guessed);
    }
    if incoming == guessed {
        terminate!();
    }
    let scale = incoming / guessed;
    // The grid may hold fewer cubes than rows: each cube takes every `cubes`-th row.
    let cubes = (CUBE_COUNT_X * CUBE_COUNT_Y) as usize;
    let rows = grad.shape(0) * grad.shape(1);
    let vector_size = grad.vector_size();
    let vectors_per_row = grad.shape(2) / vector_size;
    let mut row = row_of_cube();
    while row < rows {
        let start = row_offset::<Vector<F, N>>(&*grad, row) / vector_size;
        let mut index = UNIT_POS as usize;
        while index < vectors_per_row {
            let values = Vector::<f32, N>::cast_from(grad[start + index]);
            grad[start + index] = Vector::cast_from(values * Vector::new(scale));
            index += cube_size;
        }
        row += cubes;
    }
}
