//! A row's online state: what one unit (then the whole cube) knows of a row after reading
//! it. Every unit streams a strided share of the row's vectors (`reduce_span`) and keeps
//! an online (max, sum of exp) state in f32; the cube then merges them (`cube_merge`).

use cubecl::prelude::*;

use crate::base::row::{
    RowOptions, RowScalars, fast_exp, fast_exp_scalar, lane_max, lane_sum, transformed,
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

// The online-softmax step (a new maximum; `others` and `entropy_sum` rescaled by
// `exp(old - new)`) is written out four times: `absorb` here, the tree merge
// (`cube_merge`), the chunk merge (`one_pass::exchange::merge_chunks`) and the staged
// path's rescale per step (`one_pass::staged_exps::reduce_rest`); only the entropy's
// rescale is shared (`rescaled_entropy_sum`). Each copy interleaves the step with its own
// loads, stores and terms; one helper, by value or as a `RowState` reassigned in a loop
// (`CubeTypeMut`, which also stores the fields that did not change), moves those loads
// and stores in the emitted kernels. The copies stay so that the kernels do not change.

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

// cubecl-opt 0.10's value numbering sometimes panics ("no entry found for key", varying
// with hash order) on a `let mut` reassigned inside a runtime `if`; these kernels use
// `select` for such values instead (comptime `if`s are fine: they leave no branch).
