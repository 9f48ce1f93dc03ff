//! A row's online state. One cube reduces one row (or one chunk of a row): every unit
//! streams a strided share of the row's vectors, keeps an online (max, sum of exp) state
//! in f32, and the cube then merges the states in shared memory. Shared memory rather
//! than plane (warp) operations, so the very same kernels run on lavapipe, which has no
//! plane ops.

use cubecl::prelude::*;

use crate::row::{
    RUNNING_MAX_START, RowOptions, RowScalars, fast_exp, fast_exp_scalar, lane_max, lane_sum,
    transformed, weights_vector,
};

/// What one unit (then the whole cube) knows of a row after reading it.
#[derive(CubeType, Clone, Copy)]
#[expand(derive(Clone))]
pub(crate) struct RowState {
    pub(crate) max: f32,
    /// `sum exp(x_c - max)` over the classes other than the target.
    pub(crate) others: f32,
    pub(crate) target_logit: f32,
    /// Argmax so far (value, column; column `vocab` until a value is seen).
    pub(crate) best: f32,
    pub(crate) best_col: u32,
    /// `sum_c w_c (x'_c - smooth_reference)` (label smoothing).
    pub(crate) smooth: f32,
    /// The row's transformed logit at column 0 (0 when it is not finite, or without label
    /// smoothing), the same in every unit and chunk: summed relative to it, `smooth` keeps
    /// its digits for logits far from 0, where `sum_c w_c x'_c` and `W lse` would be
    /// large and nearly cancel.
    pub(crate) smooth_reference: f32,
    /// `sum_{c != y} exp(x'_c - max) (x'_c - max)`, over the classes `others` sums (the
    /// entropy; rescaled with `others` when the maximum moves).
    pub(crate) entropy_sum: f32,
}

/// Folds one vector (columns `first_col..`) into a unit's state. With `with_target`, the
/// column `target_col` (if in this vector) is kept out of the sum and its logit kept;
/// without, the vector holds no target (the streaming loops leave the target's vector to
/// one unit, so the per-lane compares run once per row, not per element).
#[cube]
pub(crate) fn absorb<N: Size>(
    state: RowState,
    values: Vector<f32, N>,
    weights: Vector<f32, N>,
    first_col: usize,
    target_col: usize,
    #[comptime] options: RowOptions,
    #[comptime] with_target: bool,
) -> RowState {
    let vector_max = lane_max::<N>(values);
    let new_max = f32::max(state.max, vector_max);
    let exps = fast_exp::<N>(values, new_max, options.exp_flush_to_zero);
    let mut exp_sum = f32::new(0.0);
    let mut target_logit = state.target_logit;
    let mut best = state.best;
    let mut best_col = state.best_col;
    if comptime!(with_target) {
        // The target's lane in this vector, compared in 32 bits; a target before
        // `first_col` wraps to a huge value, never a lane.
        let target_lane = u32::cast_from(target_col - first_col);
        #[unroll]
        for lane in 0..values.vector_size() {
            let is_target = target_lane == lane as u32;
            exp_sum += select(is_target, f32::new(0.0), exps.extract(lane));
            target_logit = select(is_target, values.extract(lane), target_logit);
        }
    } else {
        exp_sum = lane_sum::<N>(exps);
    }
    if comptime!(options.argmax) {
        if comptime!(with_target) {
            // The target's vector is folded in after the unit's others, out of column
            // order: a tie goes to the lower column, as in `argmax`.
            let col = first_col_of::<N>(values, vector_max, first_col);
            let better = vector_max > best || (vector_max == best && col < best_col);
            best_col = select(better, col, best_col);
            best = select(better, vector_max, best);
        } else {
            let found = fold_vector_max(best, best_col, vector_max, first_col, true);
            best = found.0;
            best_col = found.1;
        }
    }
    let mut smooth = state.smooth;
    if comptime!(options.smoothing) {
        smooth += smoothing_term::<N>(values, state.smooth_reference, weights);
    }
    // The fast exponential here too (its argument is <= 0): the accurate `expf` per
    // vector cost about 2.5 instructions per element.
    let rescale = fast_exp_scalar(state.max - new_max, options.exp_flush_to_zero);
    let mut entropy_sum = state.entropy_sum;
    if comptime!(options.entropy) {
        let mut added = f32::new(0.0);
        #[unroll]
        for lane in 0..values.vector_size() {
            let mut skip = false;
            if comptime!(with_target) {
                skip = u32::cast_from(target_col - first_col) == lane as u32;
            }
            let term = entropy_term(exps.extract(lane), values.extract(lane) - new_max);
            added += select(skip, f32::new(0.0), term);
        }
        entropy_sum = rescaled_entropy_sum(
            state.entropy_sum,
            state.others,
            state.max - new_max,
            rescale,
        ) + added;
    }
    RowState {
        max: new_max,
        others: state.others * rescale + exp_sum,
        target_logit,
        best,
        best_col,
        smooth,
        smooth_reference: state.smooth_reference,
        entropy_sum,
    }
}

/// One class's term of `entropy_sum`, `exp(x - m) (x - m)`, from `exp = exp(x - m)` and
/// `shifted = x - m`. A -inf logit's exp is 0: its term is 0, not 0 * -inf (the shift is
/// clamped to the lowest finite value; a NaN logit's term stays NaN). A multiply the
/// compiler fuses with the sum it goes to: this runs once per element.
#[cube]
pub(crate) fn entropy_term(exp: f32, shifted: f32) -> f32 {
    exp * f32::max(shifted, f32::MIN)
}

/// The first column of `values` (columns `first_col..`) that holds `top`, one of its
/// lanes' values.
#[cube]
pub(crate) fn first_col_of<N: Size>(values: Vector<f32, N>, top: f32, first_col: usize) -> u32 {
    let mut col = u32::cast_from(first_col);
    let mut found = false;
    #[unroll]
    for lane in 0..values.vector_size() {
        let hit = !found && values.extract(lane) == top;
        col = select(hit, u32::cast_from(first_col + lane), col);
        found = found || hit;
    }
    col
}

/// An `entropy_sum` (with its `others`) taken from maximum `m` to `m'`, `shift = m - m'`
/// (<= 0), `rescale = exp(shift)`: `sum e^(x-m') (x-m') = e^shift (sum e^(x-m) (x-m) +
/// shift sum e^(x-m))`. A state with nothing summed (`others` 0) stays 0 whatever the
/// shift (the start value's shift is finite, so no 0 * inf).
#[cube]
pub(crate) fn rescaled_entropy_sum(entropy_sum: f32, others: f32, shift: f32, rescale: f32) -> f32 {
    select(
        others > f32::new(0.0),
        rescale * (entropy_sum + shift * others),
        f32::new(0.0),
    )
}

/// One vector's part of [`RowState::smooth`]: `sum_c w_c (x'_c - reference)`.
#[cube]
pub(crate) fn smoothing_term<N: Size>(
    values: Vector<f32, N>,
    reference: f32,
    weights: Vector<f32, N>,
) -> f32 {
    lane_sum::<N>((values - Vector::new(reference)) * weights)
}

/// [`smooth_reference`](RowState::smooth_reference) of the row whose first vector is
/// `row_start` (read only with label smoothing).
#[cube]
pub(crate) fn smooth_reference<F: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    row_start: usize,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) -> f32 {
    let mut reference = f32::new(0.0);
    if comptime!(options.smoothing) {
        let first = transformed::<N>(
            Vector::<f32, N>::cast_from(logits[row_start]),
            scalars,
            options,
        )
        .extract(0usize);
        // NaN fails the comparison too.
        reference = select(f32::abs(first) <= f32::MAX, first, f32::new(0.0));
    }
    reference
}

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
    // The running state as scalars: cubecl cannot reassign a struct variable in a loop.
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

/// The argmax `(best, vector_col)` with a vector whose largest lane is `top` (columns
/// `first_col..`) folded in when `take`. Strictly greater: of equal vectors the first (a
/// unit's come in column order) wins, as in `argmax`. The column kept is the vector's
/// first; its lane is looked for once, after the unit's share ([`best_lane_col`]): a
/// search on each new best was compiled into every vector's instructions.
#[cube]
pub(crate) fn fold_vector_max(
    best: f32,
    vector_col: u32,
    top: f32,
    first_col: usize,
    take: bool,
) -> (f32, u32) {
    let better = take && top > best;
    (
        select(better, top, best),
        select(better, u32::cast_from(first_col), vector_col),
    )
}

/// The column of the argmax `best` that [`fold_vector_max`] left as the first column of
/// the vector holding it (`vector_col`): that vector read again from `logits` and
/// transformed as the loop did (one load per unit and row), its first lane holding
/// `best`, as `argmax` takes ties. Where no vector was taken the column stays the
/// vocabulary size.
#[cube]
pub(crate) fn best_lane_col<F: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    row_start: usize,
    best: f32,
    vector_col: u32,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) -> u32 {
    let col = usize::cast_from(vector_col);
    let found = col < logits.shape(2);
    let raw = logits[row_start + select(found, col / logits.vector_size(), 0usize)];
    let values = transformed::<N>(Vector::<f32, N>::cast_from(raw), scalars, options);
    select(found, first_col_of::<N>(values, best, col), vector_col)
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

/// Merges the units' states as a tree in shared memory; every unit gets the row's state.
/// (A plane-op merge, one barrier instead of one per level, timed the same on the H200:
/// the merge is not on the critical path. The tree runs everywhere; lavapipe has no plane
/// ops.)
#[cube]
pub(crate) fn cube_merge(state: RowState, #[comptime] options: RowOptions) -> RowState {
    let cube_size = options.cube_size;
    let mut shared_max = Shared::<[f32]>::new_slice(cube_size);
    let mut shared_others = Shared::<[f32]>::new_slice(cube_size);
    let mut shared_best =
        Shared::<[f32]>::new_slice(comptime!(if options.argmax { cube_size } else { 1 }));
    let mut shared_col =
        Shared::<[u32]>::new_slice(comptime!(if options.argmax { cube_size } else { 1 }));
    let mut shared_smooth =
        Shared::<[f32]>::new_slice(comptime!(if options.smoothing { cube_size } else { 1 }));
    let mut shared_entropy =
        Shared::<[f32]>::new_slice(comptime!(if options.entropy { cube_size } else { 1 }));
    let unit = UNIT_POS as usize;
    shared_max[unit] = state.max;
    shared_others[unit] = state.others;
    if comptime!(options.argmax) {
        shared_best[unit] = state.best;
        shared_col[unit] = state.best_col;
    }
    if comptime!(options.smoothing) {
        shared_smooth[unit] = state.smooth;
    }
    if comptime!(options.entropy) {
        shared_entropy[unit] = state.entropy_sum;
    }
    sync_cube();

    let levels = comptime!(cube_size.trailing_zeros() as usize);
    #[unroll]
    for level in 0..levels {
        let half = comptime!(cube_size >> (level + 1));
        if unit < half {
            let max_a = shared_max[unit];
            let max_b = shared_max[unit + half];
            let merged_max = f32::max(max_a, max_b);
            let (rescale_a, rescale_b) =
                (f32::exp(max_a - merged_max), f32::exp(max_b - merged_max));
            let (others_a, others_b) = (shared_others[unit], shared_others[unit + half]);
            if comptime!(options.entropy) {
                shared_entropy[unit] = rescaled_entropy_sum(
                    shared_entropy[unit],
                    others_a,
                    max_a - merged_max,
                    rescale_a,
                ) + rescaled_entropy_sum(
                    shared_entropy[unit + half],
                    others_b,
                    max_b - merged_max,
                    rescale_b,
                );
            }
            shared_others[unit] = others_a * rescale_a + others_b * rescale_b;
            shared_max[unit] = merged_max;
            if comptime!(options.argmax) {
                let best_a = shared_best[unit];
                let best_b = shared_best[unit + half];
                let col_a = shared_col[unit];
                let col_b = shared_col[unit + half];
                let take_b = best_b > best_a || (best_b == best_a && col_b < col_a);
                shared_best[unit] = select(take_b, best_b, best_a);
                shared_col[unit] = select(take_b, col_b, col_a);
            }
            if comptime!(options.smoothing) {
                shared_smooth[unit] += shared_smooth[unit + half];
            }
        }
        sync_cube();
    }
    let mut merged = state;
    merged.max = shared_max[0];
    merged.others = shared_others[0];
    if comptime!(options.argmax) {
        merged.best = shared_best[0];
        merged.best_col = shared_col[0];
    }
    if comptime!(options.smoothing) {
        merged.smooth = shared_smooth[0];
    }
    if comptime!(options.entropy) {
        merged.entropy_sum = shared_entropy[0];
    }
    merged
}

// cubecl-opt 0.10's value numbering sometimes panics ("no entry found for key", varying
// with hash order) on a `let mut` reassigned inside a runtime `if`; these kernels use
// `select` for such values instead (comptime `if`s are fine: they leave no branch).
