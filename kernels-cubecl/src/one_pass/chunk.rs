//! One chunk of a row that is not ignored: reduced (staged in shared memory), exchanged
//! with the row's other chunks, and its gradient written.

use cubecl::prelude::*;

use crate::base::ptx::{load_vector, store_vector};
use crate::base::row::{
    RUNNING_MAX_START, RowOptions, RowScalars, fast_exp_scalar, is_class, row_offset,
};
use crate::one_pass::exchange::{PARTIAL_SLOTS, UNPUBLISHED, published_bits, slot};
use crate::one_pass::options::OnePassOptions;
use crate::one_pass::prologue::scale_slot;
use crate::one_pass::staged_exps::{
    gradient_from_staged_exps, reduce_chunk_staging_exps, write_staged_exps_gradient,
};
use crate::rows::cube_merge::cube_merge;
use crate::rows::forward::finish_row;
use crate::rows::gradient::{gradient_coefficients, incoming_scales};
use crate::rows::gradient_span::{store_gradient_vector, write_gradient_span, zero_vectors};
use crate::rows::reduce_span::{reduce_span, target_share};
use crate::rows::row_state::{RowState, rescaled_entropy_sum};

/// One chunk of a row that is not ignored: reduce (staging the chunk), exchange, write
/// the gradient.
#[cube]
// A comptime `if` around a runtime one: merged, the option's code would stay compiled in.
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
pub(crate) fn one_pass_chunk<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    scales: &Tensor<f32>,
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
    let cube_size = options.cube_size;
    let stream_loads = comptime!(one_pass.stream_loads());
    let stream_stores = comptime!(one_pass.stream_stores());
    let vector_size = logits.vector_size();
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

    // 1. Reduce the chunk, keeping it in shared memory when it fits.
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
            &mut staged,
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
            &mut staged,
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

    // 2. Publish the chunk's state, then gather every chunk's; each slot is checked on its
    // own, so no ordering between the stores is assumed. Only the slots the options use
    // are published and polled (each poll is an atomic at L2).
    let row_base = row * chunks * PARTIAL_SLOTS;
    if UNIT_POS == 0 {
        let base = row_base + chunk * PARTIAL_SLOTS;
        let chunk_target_logit = select(chunk_has_target, shared_target_logit[0], f32::new(0.0));
        partials[base + slot::OTHERS].store(published_bits(merged.others));
        partials[base + slot::TARGET_LOGIT].store(published_bits(chunk_target_logit));
        if comptime!(options.argmax) {
            partials[base + slot::BEST].store(published_bits(merged.best));
            partials[base + slot::BEST_COL].store(i32::cast_from(merged.best_col));
        }
        if comptime!(options.smoothing) {
            partials[base + slot::SMOOTH].store(published_bits(merged.smooth));
        }
        if comptime!(options.entropy) {
            partials[base + slot::ENTROPY].store(published_bits(merged.entropy_sum));
        }
        partials[base + slot::MAX].store(published_bits(merged.max));
    }
    let mut gathered = Shared::<[i32]>::new_slice(comptime!(one_pass.max_chunks * PARTIAL_SLOTS));
    // Unit `u` waits for slot `u % PARTIAL_SLOTS` of chunk `u / PARTIAL_SLOTS` when the
    // options use that slot. (A unit never loops over several slots: cubecl 0.10 made a
    // `break` inside nested loops leave the outer one too.)
    let count = chunks * PARTIAL_SLOTS;
    let mut at = UNIT_POS as usize;
    while at < count {
        let index = at % PARTIAL_SLOTS;
        let wanted = index <= slot::TARGET_LOGIT
            || (comptime!(options.argmax) && (index == slot::BEST || index == slot::BEST_COL))
            || (comptime!(options.smoothing) && index == slot::SMOOTH)
            || (comptime!(options.entropy) && index == slot::ENTROPY);
        if wanted {
            // `loop` + `break` with the copy inside: a `while` re-assigning the loaded
            // value never saw the published value.
            loop {
                let value = partials[row_base + at].load();
                if value != i32::new(UNPUBLISHED as i64) {
                    gathered[at] = value;
                    break;
                }
            }
        }
        at += cube_size;
    }
    sync_cube();

    // 3. Every unit merges the chunks' states in chunk order (ties of the argmax go to
    // the first column, as within a chunk).
    let mut row_max = f32::new(RUNNING_MAX_START);
    let mut row_others = f32::new(0.0);
    let mut row_target_logit = f32::new(0.0);
    let mut row_best = f32::new(RUNNING_MAX_START);
    let mut row_best_col = u32::cast_from(vocab);
    let mut row_smooth = f32::new(0.0);
    let mut row_entropy = f32::new(0.0);
    let mut index = 0usize;
    while index < chunks {
        let base = index * PARTIAL_SLOTS;
        let chunk_max = f32::reinterpret(gathered[base + slot::MAX]);
        let chunk_others = f32::reinterpret(gathered[base + slot::OTHERS]);
        let new_max = f32::max(row_max, chunk_max);
        let (row_rescale, chunk_rescale) =
            (f32::exp(row_max - new_max), f32::exp(chunk_max - new_max));
        if comptime!(options.entropy) {
            let chunk_entropy = f32::reinterpret(gathered[base + slot::ENTROPY]);
            row_entropy =
                rescaled_entropy_sum(row_entropy, row_others, row_max - new_max, row_rescale)
                    + rescaled_entropy_sum(
                        chunk_entropy,
                        chunk_others,
                        chunk_max - new_max,
                        chunk_rescale,
                    );
        }
        row_others = row_others * row_rescale + chunk_others * chunk_rescale;
        row_max = new_max;
        // One chunk holds the target; the others published 0.
        row_target_logit += f32::reinterpret(gathered[base + slot::TARGET_LOGIT]);
        if comptime!(options.argmax) {
            let chunk_best = f32::reinterpret(gathered[base + slot::BEST]);
            let better = chunk_best > row_best;
            row_best = select(better, chunk_best, row_best);
            row_best_col = select(
                better,
                u32::cast_from(gathered[base + slot::BEST_COL]),
                row_best_col,
            );
        }
        if comptime!(options.smoothing) {
            row_smooth += f32::reinterpret(gathered[base + slot::SMOOTH]);
        }
        index += 1;
    }
    let row_state = RowState {
        max: row_max,
        others: row_others,
        target_logit: row_target_logit,
        best: row_best,
        best_col: row_best_col,
        smooth: row_smooth,
        smooth_reference: merged.smooth_reference,
        entropy_sum: row_entropy,
    };
    let forward = finish_row::<I>(
        row_state,
        select(target_is_class, row_target_logit, f32::new(0.0)),
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

    // 4. The chunk's gradient for the guessed incoming gradient.
    let incoming = select(target_is_class, scales[scale_slot::GUESS], f32::new(0.0));
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
        if comptime!(one_pass.staged_exps) {
            write_staged_exps_gradient::<F, N>(
                grad,
                out_start,
                first,
                staged_len,
                &staged,
                reference,
                class_weights,
                row_grad.clone(),
                options,
                stream_stores,
            );
        } else {
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
                    stream_stores,
                );
                local += cube_size;
            }
        }
        // The target's vector: from its kept exponentials when staged as such, else from
        // its logits.
        let from_exps = holds_target && target_staged && comptime!(one_pass.staged_exps);
        if comptime!(one_pass.staged_exps) {
            if from_exps {
                let coefficient =
                    fast_exp_scalar(reference - row_grad.max, options.exp_flush_to_zero)
                        * row_grad.prob_coef;
                let value = gradient_from_staged_exps::<F, N>(
                    target_in_stage,
                    coefficient,
                    class_weights,
                    (first + target_at) * vector_size,
                    row_grad.clone(),
                    options,
                    true,
                );
                store_vector::<F, N>(grad, out_start + first + target_at, value, stream_stores);
            }
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
