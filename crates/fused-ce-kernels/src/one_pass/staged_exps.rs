//! The one pass's `staged_exps` path (see `OnePassOptions::staged_exps`): a chunk's
//! staged vectors kept in shared memory as exponentials, so that their gradient is a
//! multiply per element instead of an exponential.

use core::f32::consts::LN_2;

use cubecl::prelude::*;

use crate::base::ptx::{load_vector, store_vector};
use crate::base::row::{
    RUNNING_MAX_START, RowOptions, RowScalars, fast_exp, fast_exp_scalar, fast_log2, lane_max,
    lane_sum, weights_vector,
};
use crate::rows::gradient::{RowGradient, gradient_from_probs, with_entropy_term};
use crate::rows::reduce_span::{absorb_held_target, target_share};
use crate::rows::row_state::{
    RowState, entropy_term, first_col_of, fold_vector_max, rescaled_entropy_sum, smooth_reference,
    smoothing_term,
};

/// `reduce_span` for the one pass with `staged_exps` (no softcap), and the reference
/// maximum `m` of the unit's kept exponentials. No barrier: a unit reads back only what
/// it staged. The unit's staged vectors (the chunk's first `staged_limit`) go to shared
/// memory; then they are turned into `exp(x - m)` in place (in the logits' type) and
/// summed, so their gradient is `exp(x - m) * exp(m - max) * coefficient`, a multiply per
/// element instead of an exponential (`write_staged_exps_gradient`); the rest of the
/// chunk is reduced as it streams by (one maximum per step of `loads_per_step` vectors, so
/// one rescale per step). In bf16 the kept `exp(x - m)` is rounded once more than a
/// recomputed one (relative 2^-9), well within the spec's 2e-2 for bf16.
///
/// The staged part first, only its maximum kept as it passes (per lane, two bf16 lanes
/// per instruction), then its exponentials, then the rest, so that the part the gradient
/// pass re-reads from L2 is the part read last. (Staging through CUDA's `cp.async` while
/// the rest streams by measured slower: docs/history.md.)
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce_chunk_staging_exps<F: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    row_start: usize,
    first: usize,
    len: usize,
    target_col: usize,
    class_weights: &Tensor<f32>,
    staged: &mut Shared<[Vector<F, N>]>,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] staged_limit: usize,
    #[comptime] stream_loads: bool,
) -> (RowState, f32) {
    let vector_size = logits.vector_size();
    let vocab = logits.shape(2);
    let staged_len = select(len < staged_limit, len, staged_limit);
    let empty = RowState {
        max: f32::new(RUNNING_MAX_START),
        others: f32::new(0.0),
        target_logit: f32::new(0.0),
        best: f32::new(RUNNING_MAX_START),
        best_col: u32::cast_from(vocab),
        smooth: f32::new(0.0),
        smooth_reference: smooth_reference::<F, N>(logits, row_start, scalars.clone(), options),
        entropy_sum: f32::new(0.0),
    };
    let top = stage_logits::<F, N>(
        logits,
        row_start,
        first,
        staged_len,
        staged,
        options,
        stream_loads,
    );
    let reference = lane_max::<N>(Vector::<f32, N>::cast_from(top));
    // With the accuracy, each unit's best vector as it was read, so that the lane holding
    // the maximum is found without reading it again: the staged part came through
    // evict-first loads, and reading it back went to DRAM; reading the rest back from L2
    // put a load's latency at the end of every chunk.
    let mut best_vectors = Shared::<[Vector<F, N>]>::new_slice(comptime!(if options.argmax {
        options.cube_size
    } else {
        1
    }));
    let kept = staged_to_exps::<F, N>(
        staged,
        &mut best_vectors,
        first,
        staged_len,
        target_col,
        class_weights,
        reference,
        empty,
        options,
    );
    // The unstaged part is read again by the gradient pass: plain loads, kept in L2.
    let mut state = reduce_rest::<F, N>(
        logits,
        row_start,
        first,
        staged_len,
        len,
        target_col,
        class_weights,
        &mut best_vectors,
        kept,
        options,
    );
    if comptime!(options.argmax) {
        // No temperature or softcap with staged exponentials: the logits as read.
        let col = usize::cast_from(state.best_col);
        let found = col < vocab;
        let best_vector = Vector::<f32, N>::cast_from(best_vectors[UNIT_POS as usize]);
        state.best_col = select(
            found,
            first_col_of::<N>(best_vector, state.best, col),
            state.best_col,
        );
    }
    // The target's vector, by the unit whose share it is, from its logits (the stage
    // holds exponentials); every unit computes it, the others discard it.
    let target_vector = target_col / vector_size;
    let (holds, at) = target_share(target_vector, first, len, options.cube_size);
    let mut state = absorb_held_target::<F, N>(
        state.clone(),
        holds,
        load_vector::<F, N>(logits, row_start + first + at, stream_loads),
        (first + at) * vector_size,
        target_col,
        class_weights,
        scalars,
        options,
    );
    if comptime!(options.entropy) {
        // NaN with a finite sum of exponentials: a -inf logit's 0 * -inf, not a NaN or
        // +inf logit (those make the sum NaN too). Rare: the share is summed again.
        if f32::is_nan(state.entropy_sum) && !f32::is_nan(state.others) {
            state.entropy_sum = clamped_entropy_sum::<F, N>(
                logits, row_start, first, len, state.max, target_col, options,
            );
        }
    }
    (state, reference)
}

/// The unit's vectors `0..staged_len` of the chunk into `staged` through registers
/// (`loads_per_step` loads in flight), and their maximum per lane; `streaming`: see
/// [`load_vector()`].
#[cube]
fn stage_logits<F: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    row_start: usize,
    first: usize,
    staged_len: usize,
    staged: &mut Shared<[Vector<F, N>]>,
    #[comptime] options: RowOptions,
    #[comptime] streaming: bool,
) -> Vector<F, N> {
    let cube_size = options.cube_size;
    let loads = options.loads_per_step;
    let mut loaded = Array::<Vector<F, N>>::new(loads);
    let mut top = Vector::<F, N>::new(F::min_value());
    let mut local = UNIT_POS as usize;
    while local < staged_len {
        #[unroll]
        for step in 0..loads {
            let at = local + step * cube_size;
            let index = row_start + first + select(at < staged_len, at, 0usize);
            loaded[step] = load_vector::<F, N>(logits, index, streaming);
        }
        #[unroll]
        for step in 0..loads {
            let at = local + step * cube_size;
            // A vector past the end is one of the chunk's: it may raise the reference,
            // never past the row's maximum.
            top = max(top, loaded[step]);
            if at < staged_len {
                staged[at] = loaded[step];
            }
        }
        local += loads * cube_size;
    }
    top
}

/// The unit's staged vectors turned into `exp(x - reference)` in place and folded into
/// `state` (whose maximum becomes `reference`; `state` holds nothing yet): the sum, and
/// the argmax and smoothing sum of the logits they were. The target's vector is left out
/// of the sums (absorbed at the end).
#[cube]
#[allow(clippy::too_many_arguments)]
fn staged_to_exps<F: Float, N: Size>(
    staged: &mut Shared<[Vector<F, N>]>,
    best_vectors: &mut Shared<[Vector<F, N>]>,
    first: usize,
    staged_len: usize,
    target_col: usize,
    class_weights: &Tensor<f32>,
    reference: f32,
    state: RowState,
    #[comptime] options: RowOptions,
) -> RowState {
    let vector_size = staged.vector_size();
    let target_vector = target_col / vector_size;
    let mut others = state.others;
    let mut best = state.best;
    let mut best_col = state.best_col;
    let mut smooth = state.smooth;
    let mut entropy_sum = state.entropy_sum;
    let mut local = UNIT_POS as usize;
    while local < staged_len {
        let raw = staged[local];
        let values = Vector::<f32, N>::cast_from(raw);
        let exps = fast_exp::<N>(values, reference, options.exp_flush_to_zero);
        staged[local] = Vector::cast_from(exps);
        let take = first + local != target_vector;
        let first_col = (first + local) * vector_size;
        let next = absorb_exps::<N>(
            others,
            smooth,
            state.smooth_reference,
            entropy_sum,
            values,
            exps,
            reference,
            first_col,
            class_weights,
            take,
            options,
        );
        others = next.0;
        smooth = next.1;
        entropy_sum = next.2;
        if comptime!(options.argmax) {
            let found = fold_best_vector(best, best_col, raw, first_col, take, best_vectors);
            best = found.0;
            best_col = found.1;
        }
        local += options.cube_size;
    }
    RowState {
        max: reference,
        others,
        target_logit: f32::new(0.0),
        best,
        best_col,
        smooth,
        smooth_reference: state.smooth_reference,
        entropy_sum,
    }
}

/// The chunk's vectors `staged_len..len` folded into `state` as they stream by: one
/// maximum per step of `loads_per_step` vectors, so one rescale of the sum per step. The
/// target's vector is left out (absorbed at the end). With the accuracy, the unit's best
/// vector goes to its slot of `best_vectors`, as in [`staged_to_exps`].
#[cube]
#[allow(clippy::too_many_arguments)]
fn reduce_rest<F: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    row_start: usize,
    first: usize,
    staged_len: usize,
    len: usize,
    target_col: usize,
    class_weights: &Tensor<f32>,
    best_vectors: &mut Shared<[Vector<F, N>]>,
    state: RowState,
    #[comptime] options: RowOptions,
) -> RowState {
    let cube_size = options.cube_size;
    let loads = options.loads_per_step;
    let vector_size = logits.vector_size();
    let target_vector = target_col / vector_size;
    let mut running_max = state.max;
    let mut others = state.others;
    let mut best = state.best;
    let mut best_col = state.best_col;
    let mut smooth = state.smooth;
    let mut entropy_sum = state.entropy_sum;
    let mut loaded = Array::<Vector<F, N>>::new(loads);
    let rest = len - staged_len;
    let mut local = UNIT_POS as usize;
    while local < rest {
        #[unroll]
        for step in 0..loads {
            let at = local + step * cube_size;
            loaded[step] = logits[row_start + first + staged_len + select(at < rest, at, 0usize)];
        }
        let mut step_top = loaded[0];
        #[unroll]
        for step in 1..loads {
            step_top = max(step_top, loaded[step]);
        }
        let step_max = f32::max(
            running_max,
            lane_max::<N>(Vector::<f32, N>::cast_from(step_top)),
        );
        let rescale = fast_exp_scalar(running_max - step_max, options.exp_flush_to_zero);
        if comptime!(options.entropy) {
            entropy_sum =
                rescaled_entropy_sum(entropy_sum, others, running_max - step_max, rescale);
        }
        others *= rescale;
        running_max = step_max;
        #[unroll]
        for step in 0..loads {
            let at = local + step * cube_size;
            let in_range = at < rest;
            let take = in_range && first + staged_len + at != target_vector;
            let first_col = (first + staged_len + select(in_range, at, 0usize)) * vector_size;
            // The argmax first, so that the vector as read is dropped before the sums.
            if comptime!(options.argmax) {
                let found =
                    fold_best_vector(best, best_col, loaded[step], first_col, take, best_vectors);
                best = found.0;
                best_col = found.1;
            }
            let values = Vector::<f32, N>::cast_from(loaded[step]);
            let exps = fast_exp::<N>(values, step_max, options.exp_flush_to_zero);
            let next = absorb_exps::<N>(
                others,
                smooth,
                state.smooth_reference,
                entropy_sum,
                values,
                exps,
                step_max,
                first_col,
                class_weights,
                take,
                options,
            );
            others = next.0;
            smooth = next.1;
            entropy_sum = next.2;
        }
        local += loads * cube_size;
    }
    RowState {
        max: running_max,
        others,
        target_logit: f32::new(0.0),
        best,
        best_col,
        smooth,
        smooth_reference: state.smooth_reference,
        entropy_sum,
    }
}

/// [`fold_vector_max`] for one vector as read (`raw`, columns `first_col..`), which the
/// unit keeps in its slot of `best_vectors` when it holds the new best: the argmax's lane
/// is found in it at the end.
#[cube]
fn fold_best_vector<F: Float, N: Size>(
    best: f32,
    best_col: u32,
    raw: Vector<F, N>,
    first_col: usize,
    take: bool,
    best_vectors: &mut Shared<[Vector<F, N>]>,
) -> (f32, u32) {
    let top = lane_max::<N>(Vector::<f32, N>::cast_from(raw));
    if take && top > best {
        best_vectors[UNIT_POS as usize] = raw;
    }
    fold_vector_max(best, best_col, top, first_col, take)
}

/// One vector (`values`, columns `first_col..`, with `exps` their exponentials on the
/// running maximum `max`) folded, when `take`, into `(others, smooth, entropy_sum)`: the
/// sum of exponentials, label smoothing's weighted sum and the entropy's
/// `sum exp(x - max) (x - max)`. The entropy's term is one multiply-add per element,
/// without [`entropy_term`]'s clamp: a -inf logit makes it NaN (0 * -inf), and
/// [`reduce_chunk_staging_exps`] then sums the unit's share again with the clamp.
#[cube]
#[allow(clippy::too_many_arguments)]
fn absorb_exps<N: Size>(
    others: f32,
    smooth: f32,
    smooth_reference: f32,
    entropy_sum: f32,
    values: Vector<f32, N>,
    exps: Vector<f32, N>,
    max: f32,
    first_col: usize,
    class_weights: &Tensor<f32>,
    take: bool,
    #[comptime] options: RowOptions,
) -> (f32, f32, f32) {
    let others = others + select(take, lane_sum::<N>(exps), f32::new(0.0));
    let mut entropy_sum = entropy_sum;
    if comptime!(options.entropy) {
        let added = lane_sum::<N>(exps * (values - Vector::new(max)));
        entropy_sum += select(take, added, f32::new(0.0));
    }
    let mut smooth = smooth;
    if comptime!(options.smoothing) {
        let mut weights = Vector::<f32, N>::new(1.0);
        if comptime!(options.weighted) {
            weights = weights_vector::<N>(class_weights, first_col);
        }
        let term = smoothing_term::<N>(values, smooth_reference, weights);
        smooth += select(take, term, f32::new(0.0));
    }
    (others, smooth, entropy_sum)
}

/// The entropy's sum over the unit's share of the chunk (vectors `first + u, first + u +
/// cube_size, ..` below `first + len`), the target's column left out, taken at the unit's
/// final maximum `max` with [`entropy_term`]'s clamp: for a share whose fast sum came out
/// NaN from a -inf logit. Read again from `logits` (the stage holds exponentials).
#[cube]
fn clamped_entropy_sum<F: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    row_start: usize,
    first: usize,
    len: usize,
    max: f32,
    target_col: usize,
    #[comptime] options: RowOptions,
) -> f32 {
    let vector_size = logits.vector_size();
    let mut sum = f32::new(0.0);
    let mut local = UNIT_POS as usize;
    while local < len {
        let values = Vector::<f32, N>::cast_from(logits[row_start + first + local]);
        let exps = fast_exp::<N>(values, max, options.exp_flush_to_zero);
        let first_col = (first + local) * vector_size;
        #[unroll]
        for lane in 0..values.vector_size() {
            let term = entropy_term(exps.extract(lane), values.extract(lane) - max);
            sum += select(first_col + lane == target_col, f32::new(0.0), term);
        }
        local += options.cube_size;
    }
    sum
}

/// What the gradient of a unit's kept exponentials `e_c = exp(x_c - reference)` needs,
/// formed once per unit. With `r = exp(reference - max)`, the loss's part is `e_c * prob`
/// (`prob = r * prob_coef`), and the entropy's part (`RowGradient::entropy_coef` and
/// `entropy_offset` on `exp(x_c - max) = r e_c` and `x_c - max = ln e_c + (reference -
/// max)`) is `entropy_log2 * e_c log2(e_c) + entropy_offset * e_c`: one logarithm per
/// element where the logits' path takes one exponential.
#[derive(CubeType, Clone, Copy)]
#[expand(derive(Clone))]
pub(crate) struct StagedExpsScale {
    prob: f32,
    entropy_log2: f32,
    entropy_offset: f32,
}

/// The [`StagedExpsScale`] of a unit whose staged vectors were kept on `reference`.
#[cube]
pub(crate) fn staged_exps_scale(
    reference: f32,
    row_grad: RowGradient,
    #[comptime] options: RowOptions,
) -> StagedExpsScale {
    let shift = reference - row_grad.max;
    let rescale = fast_exp_scalar(shift, options.exp_flush_to_zero);
    let mut entropy_log2 = f32::new(0.0);
    let mut entropy_offset = f32::new(0.0);
    if comptime!(options.entropy_gradient) {
        entropy_log2 = rescale * row_grad.entropy_coef * f32::new(LN_2);
        // A unit whose exponentials all vanish beside the row's maximum (`r` = 0) may have
        // kept them on a reference near `f32::MIN`, where `entropy_coef * shift` overflows.
        entropy_offset = select(
            rescale > f32::new(0.0),
            rescale * (row_grad.entropy_coef * shift + row_grad.entropy_offset),
            f32::new(0.0),
        );
    }
    StagedExpsScale {
        prob: rescale * row_grad.prob_coef,
        entropy_log2,
        entropy_offset,
    }
}

/// The gradient of a chunk's staged vectors `0..staged_len` (at `out_start + first + ..`)
/// from the exponentials [`reduce_chunk_staging_exps()`] kept, as if none held the target,
/// with the unit's `scale`; `streaming`: see [`store_vector()`].
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_staged_exps_gradient<F: Float, N: Size>(
    grad: &mut Tensor<Vector<F, N>>,
    out_start: usize,
    first: usize,
    staged_len: usize,
    staged: &Shared<[Vector<F, N>]>,
    scale: StagedExpsScale,
    class_weights: &Tensor<f32>,
    row_grad: RowGradient,
    #[comptime] options: RowOptions,
    #[comptime] streaming: bool,
) {
    let cube_size = options.cube_size;
    let vector_size = grad.vector_size();
    let mut local = UNIT_POS as usize;
    while local < staged_len {
        let value = gradient_from_staged_exps::<F, N>(
            staged[local],
            scale.clone(),
            class_weights,
            (first + local) * vector_size,
            row_grad.clone(),
            options,
            false,
        );
        store_vector::<F, N>(grad, out_start + first + local, value, streaming);
        local += cube_size;
    }
}

/// The gradient of one staged vector (columns `first_col..`) from its kept `exps` and
/// the unit's `scale`; with `with_target` the target's lane set (to the loss's part:
/// the entropy's is added to every lane, as in `gradient_vector`).
#[cube]
pub(crate) fn gradient_from_staged_exps<F: Float, N: Size>(
    exps: Vector<F, N>,
    scale: StagedExpsScale,
    class_weights: &Tensor<f32>,
    first_col: usize,
    row_grad: RowGradient,
    #[comptime] options: RowOptions,
    #[comptime] with_target: bool,
) -> Vector<F, N> {
    let mut weights = Vector::<f32, N>::new(1.0);
    if comptime!(options.smoothing && options.weighted) {
        weights = weights_vector::<N>(class_weights, first_col);
    }
    let exps = Vector::<f32, N>::cast_from(exps);
    let mut grad = gradient_from_probs::<N>(
        exps,
        scale.prob,
        weights,
        first_col,
        row_grad.clone(),
        options,
        with_target,
    );
    if comptime!(options.entropy_gradient) {
        grad = with_entropy_term::<N>(
            grad,
            exps,
            fast_log2::<N>(exps, options.exp_flush_to_zero),
            scale.entropy_log2,
            scale.entropy_offset,
        );
    }
    Vector::cast_from(grad)
}
