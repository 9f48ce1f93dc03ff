//! A unit's share of a span of a row (the whole row, or one chunk of it) reduced into its
//! state: unit `u` takes vectors `u, u + cube_size, ..`, and the target's vector is
//! folded in last, by the unit whose share it is.

use cubecl::prelude::*;

use crate::base::row::{RUNNING_MAX_START, RowOptions, RowScalars, transformed, weights_vector};
use crate::rows::row_state::{RowState, absorb, best_lane_col, smooth_reference};

/// [`absorb`] of one vector as loaded (`raw`, columns `first_col..`): in f32,
/// soft-capped and with its class weights when the options say so.
#[cube]
#[allow(clippy::too_many_arguments)]
fn absorb_vector<F: Float, N: Size>(
    state: RowState,
    raw: Vector<F, N>,
    first_col: usize,
    target_col: usize,
    class_weights: &Tensor<f32>,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] with_target: bool,
) -> RowState {
    let values = transformed::<N>(Vector::<f32, N>::cast_from(raw), scalars, options);
    let mut weights = Vector::<f32, N>::new(1.0);
    if comptime!(options.smoothing && options.weighted) {
        weights = weights_vector::<N>(class_weights, first_col);
    }
    absorb::<N>(
        state.clone(),
        values,
        weights,
        first_col,
        target_col,
        options,
        with_target,
    )
}

/// Whether this unit's share of vectors `first..first + len` (vectors `first + u,
/// first + u + cube_size, ..` for unit `u`) holds `target_vector`, and its index in the
/// span (0 when not).
#[cube]
pub(crate) fn target_share(
    target_vector: usize,
    first: usize,
    len: usize,
    #[comptime] cube_size: usize,
) -> (bool, usize) {
    let holds = target_vector >= first
        && target_vector < first + len
        && (target_vector - first) % cube_size == UNIT_POS as usize;
    (holds, select(holds, target_vector - first, 0usize))
}

/// Reduces vectors `first..first + len` of a row (`row_start`: the row's first vector) into
/// this unit's state: unit `u` takes vectors `u, u + cube_size, ..`, `loads_per_step` of
/// them at a time, all loads issued before any is used (a vector past the span's end is
/// loaded from its start but not absorbed). The span's first `staged_limit` vectors are
/// also kept in `staged` at their index in the span (0: none).
#[cube]
// A comptime `if` around a runtime one: merged, the option's code would stay compiled in.
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
pub(crate) fn reduce_span<F: Float, N: Size>(
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
) -> RowState {
    let cube_size = options.cube_size;
    let vector_size = logits.vector_size();
    let vocab = logits.shape(2);
    // The running state as scalars, not a `RowState` reassigned in the loop: see the
    // note above `absorb`.
    let mut max = f32::new(RUNNING_MAX_START);
    let mut others = f32::new(0.0);
    let target_logit = f32::new(0.0);
    let mut best = f32::new(RUNNING_MAX_START);
    let mut best_col = u32::cast_from(vocab);
    let mut smooth = f32::new(0.0);
    let reference = smooth_reference::<F, N>(logits, row_start, scalars.clone(), options);
    let mut entropy_sum = f32::new(0.0);
    // `vocab / vector_size` (no vector) when the target is not a class.
    let target_vector = target_col / vector_size;
    let mut local = UNIT_POS as usize;
    // Every load of a step issued before any is used, in registers: left interleaved,
    // NVCC kept only two or three of four in flight.
    let mut loaded = Array::<Vector<F, N>>::new(options.loads_per_step);
    while local < len {
        #[unroll]
        for step in 0..options.loads_per_step {
            let at = local + step * cube_size;
            let safe = select(at < len, at, 0usize);
            loaded[step] = logits[row_start + first + safe];
        }
        #[unroll]
        for step in 0..options.loads_per_step {
            let at = local + step * cube_size;
            let in_range = at < len;
            let safe = select(in_range, at, 0usize);
            let raw = loaded[step];
            if comptime!(staged_limit > 0) {
                if in_range && at < staged_limit {
                    staged[at] = raw;
                }
            }
            let state = RowState {
                max,
                others,
                target_logit: f32::new(0.0),
                best,
                best_col,
                smooth,
                smooth_reference: reference,
                entropy_sum,
            };
            let next = absorb_vector::<F, N>(
                state.clone(),
                raw,
                (first + safe) * vector_size,
                vocab,
                class_weights,
                scalars.clone(),
                options,
                false,
            );
            // The target's vector is absorbed after the loop.
            let take = in_range && first + at != target_vector;
            max = select(take, next.max, max);
            others = select(take, next.others, others);
            best = select(take, next.best, best);
            best_col = select(take, next.best_col, best_col);
            smooth = select(take, next.smooth, smooth);
            entropy_sum = select(take, next.entropy_sum, entropy_sum);
        }
        local += options.loads_per_step * cube_size;
    }
    if comptime!(options.argmax) {
        best_col =
            best_lane_col::<F, N>(logits, row_start, best, best_col, scalars.clone(), options);
    }
    let state = RowState {
        max,
        others,
        target_logit,
        best,
        best_col,
        smooth,
        smooth_reference: reference,
        entropy_sum,
    };
    // The target's vector, by the unit whose share it is (re-read: from L1, or from
    // `staged`); every unit computes it, the others discard it.
    let (holds, at) = target_share(target_vector, first, len, cube_size);
    let mut raw = logits[row_start + first + at];
    if comptime!(staged_limit > 0) {
        let from_stage = at < staged_limit;
        raw = select(from_stage, staged[select(from_stage, at, 0usize)], raw);
    }
    absorb_held_target::<F, N>(
        state.clone(),
        holds,
        raw,
        (first + at) * vector_size,
        target_col,
        class_weights,
        scalars.clone(),
        options,
    )
}

/// The target's vector (`raw`, columns `first_col..`) folded into a unit's `state` when
/// the unit `holds` it (see [`target_share`]); every unit computes it, the others keep
/// their state: the target's lane out of the sum, its logit kept.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn absorb_held_target<F: Float, N: Size>(
    state: RowState,
    holds: bool,
    raw: Vector<F, N>,
    first_col: usize,
    target_col: usize,
    class_weights: &Tensor<f32>,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) -> RowState {
    let next = absorb_vector::<F, N>(
        state.clone(),
        raw,
        first_col,
        target_col,
        class_weights,
        scalars.clone(),
        options,
        true,
    );
    RowState {
        max: select(holds, next.max, state.max),
        others: select(holds, next.others, state.others),
        target_logit: select(holds, next.target_logit, state.target_logit),
        best: select(holds, next.best, state.best),
        best_col: select(holds, next.best_col, state.best_col),
        smooth: select(holds, next.smooth, state.smooth),
        smooth_reference: state.smooth_reference,
        entropy_sum: select(holds, next.entropy_sum, state.entropy_sum),
    }
}
