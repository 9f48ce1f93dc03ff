//! One chunk of a row that is not ignored: reduced (staged in shared memory), exchanged
//! with the row's other chunks, and its gradient written.

use cubecl::prelude::*;

use crate::base::ptx::{load_vector, store_vector};
use crate::base::row::{RowOptions, RowScalars, is_class, row_offset};
use crate::one_pass::exchange::{merge_chunks, publish_and_gather};
use crate::one_pass::options::OnePassOptions;
use crate::one_pass::prologue::scale_slot;
use crate::one_pass::staged_exps::{
    gradient_from_staged_exps, reduce_chunk_staging_exps, staged_exps_scale,
    write_staged_exps_gradient,
};
use crate::rows::cube_merge::cube_merge;
use crate::rows::forward::{RowForward, finish_row};
use crate::rows::gradient::{
    RowGradient, gradient_coefficients, incoming_scales, with_entropy_gradient,
};
use crate::rows::gradient_span::{store_gradient_vector, write_gradient_span, zero_vectors};
use crate::rows::reduce_span::{reduce_span, target_share};
use crate::rows::row_state::RowState;

/// One chunk of a row that is not ignored, in four phases: reduce it, staging it
/// ([`reduce_chunk`]); publish its state and gather those of the row's chunks
/// ([`publish_and_gather`]); merge them into the row's ([`merge_chunks`]); write the
/// chunk's gradient ([`write_chunk_gradient`]).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn one_pass_chunk<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    scales: &Tensor<f32>,
    row_weights: &Tensor<f32>,
    entropy_weights: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    grad: &mut Tensor<Vector<F, N>>,
    partials: &mut Tensor<Atomic<i32>>,
    row: usize,
    chunk: usize,
    chunks: usize,
    first: usize,
    len: usize,
    target: i32,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] one_pass: OnePassOptions,
) {
    let vocab = logits.shape(2);
    let target_is_class = is_class(target, vocab);
    // When the target is not a class, `target_col` is one no unit reaches.
    let target_col = select(target_is_class, usize::cast_from(target), vocab);
    let mut staged =
        Shared::<[Vector<F, N>]>::new_slice(comptime!(if one_pass.staged_vectors > 0 {
            one_pass.staged_vectors
        } else {
            1
        }));
    let reduced = reduce_chunk::<F, N>(
        logits,
        class_weights,
        &mut staged,
        row.clone(),
        first,
        len,
        target_col,
        scalars.clone(),
        options,
        one_pass,
    );
    let gathered = publish_and_gather(
        partials,
        reduced.merged.clone(),
        &reduced.target_logit,
        reduced.has_target,
        row.clone(),
        chunk,
        chunks,
        options,
        one_pass,
    );
    let row_state = merge_chunks(
        &gathered,
        chunks,
        vocab,
        reduced.merged.smooth_reference,
        options,
    );
    // The row's statistics, written by chunk 0, and what its gradient needs.
    let forward = finish_row::<I>(
        row_state.clone(),
        select(target_is_class, row_state.target_logit, f32::new(0.0)),
        target,
        vocab,
        class_weights,
        weight_total,
        stats,
        predicted,
        row.clone(),
        chunk == 0 && UNIT_POS == 0,
        scalars.clone(),
        options,
    );
    write_chunk_gradient::<F, N>(
        logits,
        grad,
        class_weights,
        weight_total,
        scales,
        row_weights,
        entropy_weights,
        &staged,
        &reduced,
        forward,
        row,
        first,
        len,
        vocab,
        target_col,
        target_is_class,
        scalars,
        options,
        one_pass,
    );
}

/// What a cube knows of its chunk after reducing it.
#[derive(CubeType)]
struct ReducedChunk {
    /// The units' states merged: the chunk's, in every unit.
    merged: RowState,
    /// The reference maximum of the unit's staged exponentials (`staged_exps`; 0 without).
    reference: f32,
    /// The target's logit, where the chunk holds the target (published by the merge's
    /// barriers).
    target_logit: Shared<[f32]>,
    /// The chunk holds the target's vector.
    has_target: bool,
    /// This unit's share holds it, at `target_at` in the chunk (see `target_share`).
    holds_target: bool,
    target_at: usize,
}

/// Phase 1: reduces the chunk, keeping it in shared memory (`staged`) when it fits, and
/// merges the units' states.
#[cube]
#[allow(clippy::too_many_arguments)]
fn reduce_chunk<F: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    class_weights: &Tensor<f32>,
    staged: &mut Shared<[Vector<F, N>]>,
    row: usize,
    first: usize,
    len: usize,
    target_col: usize,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] one_pass: OnePassOptions,
) -> ReducedChunk {
    let cube_size = options.cube_size;
    let stream_loads = comptime!(one_pass.stream_loads());
    let vector_size = logits.vector_size();
    let row_start = row_offset::<Vector<F, N>>(logits, row) / vector_size;
    // With `staged_exps`, the unit's staged vectors are kept as `exp(x - reference)`.
    let (state, reference) = if comptime!(one_pass.staged_exps) {
        reduce_chunk_staging_exps::<F, N>(
            logits,
            row_start,
            first,
            len,
            target_col,
            class_weights,
            staged,
            scalars.clone(),
            options,
            one_pass.staged_vectors,
            stream_loads,
        )
    } else {
        // Staged and unstaged vectors come through the same loads here: plain ones.
        let state = reduce_span::<F, N>(
            logits,
            row_start,
            first,
            len,
            target_col,
            class_weights,
            staged,
            scalars.clone(),
            options,
            one_pass.staged_vectors,
        );
        (state, f32::new(0.0))
    };
    let target_vector = target_col / vector_size;
    let chunk_has_target = target_vector >= first && target_vector < first + len;
    let (holds_target, target_at) = target_share(target_vector, first, len, cube_size);
    let mut shared_target_logit = Shared::<[f32]>::new_slice(1usize);
    if holds_target {
        shared_target_logit[0] = state.target_logit;
    }
    // The merge's barriers also publish `shared_target_logit`.
    let merged = cube_merge(state, options);
    ReducedChunk {
        merged,
        reference,
        target_logit: shared_target_logit,
        has_target: chunk_has_target,
        holds_target,
        target_at,
    }
}

/// Phase 4: writes the chunk's gradient for the guessed incoming gradient, from the row's
/// `forward` and the chunk as `reduced` left it.
#[cube]
// A comptime `if` around a runtime one: merged, the option's code would stay compiled in.
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
fn write_chunk_gradient<F: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    grad: &mut Tensor<Vector<F, N>>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    scales: &Tensor<f32>,
    row_weights: &Tensor<f32>,
    entropy_weights: &Tensor<f32>,
    staged: &Shared<[Vector<F, N>]>,
    reduced: &ReducedChunk,
    forward: RowForward,
    row: usize,
    first: usize,
    len: usize,
    vocab: usize,
    target_col: usize,
    target_is_class: bool,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] one_pass: OnePassOptions,
) {
    let cube_size = options.cube_size;
    let stream_loads = comptime!(one_pass.stream_loads());
    let stream_stores = comptime!(one_pass.stream_stores());
    let vector_size = logits.vector_size();
    let holds_target = reduced.holds_target;
    let target_at = reduced.target_at;
    let reference = reduced.reference;
    let guess = scales[scale_slot::GUESS];
    let mut incoming = guess;
    if comptime!(options.row_weighted) {
        incoming *= row_weights[row * row_weights.stride(0)];
    }
    let incoming = select(target_is_class, incoming, f32::new(0.0));
    let (ce_scale, z_scale) = incoming_scales(incoming, scales, one_pass.mean);
    let row_grad = gradient_coefficients(
        target_col,
        ce_scale,
        z_scale,
        forward.max,
        forward.log_sum,
        forward.target_grad,
        class_weights,
        weight_total,
        vocab,
        scalars.clone(),
        options,
    );
    let row_grad = if comptime!(options.entropy_gradient) {
        // The objective's `-c_r H_r`, reduced as the z-loss is (divided by `n` for `Mean`).
        let mut entropy_incoming = -guess * entropy_weights[row * entropy_weights.stride(0)];
        if comptime!(one_pass.mean) {
            entropy_incoming /= scales[scale_slot::COUNT];
        }
        with_entropy_gradient(
            row_grad,
            select(target_is_class, entropy_incoming, f32::new(0.0)),
            forward.entropy,
            forward.log_sum,
        )
    } else {
        row_grad
    };
    let out_start = row_offset::<Vector<F, N>>(&*grad, row) / vector_size;
    if !target_is_class {
        zero_vectors::<F, N>(grad, out_start + first, len, cube_size, stream_stores);
    } else {
        let in_start = row_offset::<Vector<F, N>>(logits, row) / vector_size;
        // A select, not `min`: cubecl 0.10 types the constant as 32 bits, and NVRTC finds
        // `min(uint64, uint32)` ambiguous in a 64-bit-indexed kernel.
        let staged_len = select(len < one_pass.staged_vectors, len, one_pass.staged_vectors);
        // As in `write_gradient_row`: the target's vector is written as if it held no
        // target, then fixed from its logits read before the loop.
        let target_staged = target_at < staged_len;
        let target_in_stage = staged[select(target_staged, target_at, 0usize)];
        let target_logits = load_vector::<F, N>(logits, in_start + first + target_at, stream_loads);
        let target_values = select(
            target_staged && comptime!(!one_pass.staged_exps),
            target_in_stage,
            target_logits,
        );
        // The part not staged first: it was read last, so it is the likeliest in L2.
        if comptime!(one_pass.reread) {
            write_gradient_span::<F, N>(
                logits,
                grad,
                in_start,
                out_start,
                first + staged_len,
                len - staged_len,
                row_grad.clone(),
                class_weights,
                scalars.clone(),
                options,
                one_pass.reread_loads,
                stream_loads,
                stream_stores,
            );
        }
        // The staged part, as if none of it held the target; then the target's vector,
        // from its kept exponentials when staged as such, else (below) from its logits.
        let from_exps = holds_target && target_staged && comptime!(one_pass.staged_exps);
        if comptime!(one_pass.staged_exps) {
            let scale = staged_exps_scale(reference, row_grad.clone(), options);
            write_staged_exps_gradient::<F, N>(
                grad,
                out_start,
                first,
                staged_len,
                staged,
                scale.clone(),
                class_weights,
                row_grad.clone(),
                options,
                stream_stores,
            );
            if from_exps {
                let value = gradient_from_staged_exps::<F, N>(
                    target_in_stage,
                    scale,
                    class_weights,
                    (first + target_at) * vector_size,
                    row_grad.clone(),
                    options,
                    true,
                );
                store_vector::<F, N>(grad, out_start + first + target_at, value, stream_stores);
            }
        } else {
            write_staged_logits_gradient::<F, N>(
                grad,
                out_start,
                first,
                staged_len,
                staged,
                class_weights,
                row_grad.clone(),
                scalars.clone(),
                options,
                stream_stores,
            );
        }
        if holds_target && !from_exps {
            store_gradient_vector::<F, N>(
                grad,
                out_start,
                first + target_at,
                target_values,
                class_weights,
                row_grad.clone(),
                scalars.clone(),
                options,
                true,
                stream_stores,
            );
        }
    }
}

/// The gradient of a chunk's staged vectors `0..staged_len` (at `out_start + first + ..`)
/// from the staged logits, as if none held the target; `streaming`: see
/// `store_vector()`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_staged_logits_gradient<F: Float, N: Size>(
    grad: &mut Tensor<Vector<F, N>>,
    out_start: usize,
    first: usize,
    staged_len: usize,
    staged: &Shared<[Vector<F, N>]>,
    class_weights: &Tensor<f32>,
    row_grad: RowGradient,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] streaming: bool,
) {
    let mut local = UNIT_POS as usize;
    while local < staged_len {
        // Each unit reads back only the vectors it staged itself.
        store_gradient_vector::<F, N>(
            grad,
            out_start,
            first + local,
            staged[local],
            class_weights,
            row_grad.clone(),
            scalars.clone(),
            options,
            false,
            streaming,
        );
        local += options.cube_size;
    }
}
