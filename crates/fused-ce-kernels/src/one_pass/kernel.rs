//! The one-pass kernel: one cube per chunk of a row, taken from a ticket counter in the
//! order cubes start (see the `one_pass` module's text).

use cubecl::prelude::*;

use crate::base::row::{RowOptions, RowScalars, read_target, row_offset};
use crate::one_pass::chunk::one_pass_chunk;
use crate::one_pass::options::OnePassOptions;
use crate::rows::forward::write_ignored_row;
use crate::rows::gradient_span::zero_vectors;

/// Forward that also writes the gradient for the guessed incoming gradient in `scales`
/// (divided by the mean's denominators when `one_pass.mean`), over the logits when `grad`
/// aliases them: one cube per chunk of `chunk_vectors` vectors of a row (see the `one_pass`
/// module's text). With `options.row_weighted` each row's gradient is its weight's
/// (`row_weights [rows]`) share; with `options.entropy_gradient` it also carries the
/// gradient of `-c_r H_r` (`entropy_weights [rows]`, divided by `n` when `mean`).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_one_pass_kernel<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    scales: &Tensor<f32>,
    row_weights: &Tensor<f32>,
    entropy_weights: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    grad: &mut Tensor<Vector<F, N>>,
    tickets: &mut Tensor<Atomic<i32>>,
    partials: &mut Tensor<Atomic<i32>>,
    chunk_vectors: u32,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] one_pass: OnePassOptions,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let rows = stats.shape(1);
    let vector_size = logits.vector_size();
    let vectors_per_row = logits.shape(2) / vector_size;
    let chunk_vectors = chunk_vectors as usize;
    let chunks = vectors_per_row.div_ceil(chunk_vectors);

    // The chunk: the next ticket, in the order cubes start.
    let mut shared_ticket = Shared::<[u32]>::new_slice(1usize);
    if UNIT_POS == 0 {
        shared_ticket[0] = u32::cast_from(tickets[0].fetch_add(i32::new(1)));
    }
    sync_cube();
    let ticket = shared_ticket[0] as usize;
    let row = ticket / chunks;
    if row >= rows {
        terminate!();
    }
    let chunk = ticket % chunks;
    let first = chunk * chunk_vectors;
    let len = usize::min(chunk_vectors, vectors_per_row - first);

    let target = read_target::<I>(targets, row);
    if target == scalars.ignore_index {
        // Nobody waits for an ignored row's chunks: they publish nothing.
        let out_start = row_offset::<Vector<F, N>>(&*grad, row) / grad.vector_size() + first;
        zero_vectors::<F, N>(
            grad,
            out_start,
            len,
            options.cube_size,
            comptime!(one_pass.stream_stores()),
        );
        if chunk == 0 && UNIT_POS == 0 {
            write_ignored_row::<I>(stats, predicted, row, options);
        }
    } else {
        one_pass_chunk::<F, I, N>(
            logits,
            class_weights,
            weight_total,
            scales,
            row_weights,
            entropy_weights,
            stats,
            predicted,
            grad,
            partials,
            row.clone(),
            chunk,
            chunks,
            first,
            len,
            target,
            scalars.clone(),
            options,
            one_pass,
        );
    }
}
