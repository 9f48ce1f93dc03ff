//! The `#[cube]` kernels. One cube reduces one row: every unit streams a strided share of
//! the row's vectors, keeps an online (max, sum of exp) pair in f32, and the cube then
//! merges the pairs in shared memory. Shared memory rather than plane (warp) operations,
//! so the very same kernel runs on lavapipe, which has no plane ops.
//!
//! Logits are seen as `[B, T, V]` (2-D inputs as `[1, N, V]`) with any stride on the two
//! row dimensions, so a slice of a bigger tensor is read where it lies. Every option is a
//! comptime flag: the plain loss compiles to the plain loop.

use cubecl::prelude::*;

use crate::row_stat;

/// Start value of a running maximum. Finite on purpose: `exp(m_old - m_new)` with both at
/// `-inf` would be NaN for a row whose logits are all `-inf` so far (masked vocabulary).
pub(crate) const RUNNING_MAX_START: f32 = -3.0e38;

/// Which options a launch uses (each one compiles its own kernel).
#[derive_cube_comptime]
pub struct RowOptions {
    /// Logits become `c * tanh(x / c)`.
    pub softcap: bool,
    /// Label smoothing > 0.
    pub smoothing: bool,
    /// Class weights given.
    pub weighted: bool,
    /// z-loss scale > 0.
    pub z_loss: bool,
    /// Track the argmax (accuracy, predictions).
    pub argmax: bool,
    /// Units per cube, a power of two.
    pub cube_size: usize,
    /// Vectors each unit loads before using any (bytes in flight per unit).
    pub loads_per_step: usize,
    /// CUDA only: the fast exponential as `ex2.approx.ftz.f32` (see `redefine_cuda_fast_exp`).
    pub cuda_ftz_exp: bool,
    /// Softcap's `tanh` as the hardware's approximation (`soft_cap`).
    pub fast_tanh: bool,
}

/// How backward reads the incoming gradient.
#[derive_cube_comptime]
pub struct GradOptions {
    /// One incoming gradient per row (`Reduction::None`), else one for all rows.
    pub per_row: bool,
    /// Divide by the mean's denominators.
    pub mean: bool,
}

/// The options' values (runtime scalars: changing them does not recompile).
#[derive(CubeLaunch, CubeType, Clone, Copy)]
pub struct RowScalars {
    pub ignore_index: i32,
    pub label_smoothing: f32,
    pub z_loss_scale: f32,
    pub softcap: f32,
}

/// Row index of this cube. The grid is 2-D because wgpu caps each grid dimension at 65535.
#[cube]
pub(crate) fn row_of_cube() -> usize {
    (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize
}

/// Element offset of row `row` in a tensor whose first two dimensions are the rows
/// (`[B, T, ..]`, row `b * T + t`), whatever their strides.
#[cube]
pub(crate) fn row_offset<T: CubePrimitive>(tensor: &Tensor<T>, row: usize) -> usize {
    let inner_rows = tensor.shape(1);
    (row / inner_rows) * tensor.stride(0) + (row % inner_rows) * tensor.stride(1)
}

/// Where statistic `stat` of row `row` lives in `stats [COUNT, rows]`, whatever its
/// strides (a CUDA allocation may pad rows). The runtime stride is the left operand on
/// purpose: cubecl 0.10 types `CONST * x` as the constant's 32-bit type even when the
/// kernel indexes with 64 bits.
#[cube]
pub(crate) fn stat_index(stats: &Tensor<f32>, #[comptime] stat: usize, row: usize) -> usize {
    stats.stride(0) * stat + row * stats.stride(1)
}

/// The class index of a row as i32.
#[cube]
pub(crate) fn read_target<I: Int>(targets: &Tensor<I>, row: usize) -> i32 {
    i32::cast_from(targets[row_offset::<I>(targets, row)])
}

#[cube]
pub(crate) fn is_class(target: i32, vocab: usize) -> bool {
    target >= 0 && usize::cast_from(target) < vocab
}

/// Largest lane of a vector.
#[cube]
pub(crate) fn lane_max<N: Size>(values: Vector<f32, N>) -> f32 {
    let mut max = values[0];
    #[unroll]
    for lane in 1..values.size() {
        max = f32::max(max, values[lane]);
    }
    max
}

/// Sum of the lanes.
#[cube]
pub(crate) fn lane_sum<N: Size>(values: Vector<f32, N>) -> f32 {
    let mut sum = values[0];
    #[unroll]
    for lane in 1..values.size() {
        sum += values[lane];
    }
    sum
}

/// `exp(values - shift)` per lane, as the hardware's fast exponential where there is one
/// (`__expf` on CUDA: a few ulp, and still inf/NaN-correct, at a fraction of `expf`'s
/// instructions; the accurate `expf` made the forward pass instruction-bound on the H200).
/// Used only where the argument is <= 0 or a logit minus its row's log-sum-exp.
#[cube(fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
pub(crate) fn fast_exp<N: Size>(values: Vector<f32, N>, shift: f32) -> Vector<f32, N> {
    Vector::exp(values - Vector::new(shift))
}

/// On CUDA, makes the rest of the kernel's `__expf` (the fast exponential above) two
/// instructions instead of six: a multiply by log2(e) and `ex2.approx.ftz.f32`. Without
/// `-ftz` (cubecl 0.10 passes NVRTC fixed options) `__expf` also scales denormal results
/// (a range test and two predicated multiplies); flushing them to zero changes only
/// results below 2^-126 (probabilities under 1.2e-38) and the hot loops are near
/// issue-bound on the H200. cubecl has no such intrinsic, so the definition travels as a
/// comment that closes itself and leaves a preprocessor macro in the CUDA C++ source
/// (the CUDA compiler emits comments as they are); the SPIR-V compiler drops comments,
/// and the launch enables this only on the CUDA runtime. Call it first in a kernel.
#[cube]
pub(crate) fn redefine_cuda_fast_exp(#[comptime] enabled: bool) {
    if comptime!(enabled) {
        comment!(
            "fast exponential:\n*/\n#define __expf(x) ([](float fce_x) { float fce_y; asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(fce_y) : \"f\"(fce_x * 1.44269504088896341f)); return fce_y; }(x))\n/*"
        );
    }
}

/// `exp(x)` as the hardware's fast exponential, for a rescaling factor (`x <= 0`).
#[cube(fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
pub(crate) fn fast_exp_scalar(x: f32) -> f32 {
    f32::exp(x)
}

/// `ln(1 + x)`, accurate for small `x`: a Taylor polynomial below 0.05 (error under
/// 1e-10 relative), `ln(1 + x)` above (rounding `1 + x` costs at most 1.2e-6 relative
/// there). Written out because `log1p` is not accurate on every runtime, and compilers
/// may fold Goldberg's `(1 + x) - 1` correction away.
#[cube]
fn ln_one_plus(x: f32) -> f32 {
    let series = x
        * (f32::new(1.0)
            + x * (f32::new(-0.5)
                + x * (f32::new(1.0 / 3.0)
                    + x * (f32::new(-0.25)
                        + x * (f32::new(0.2)
                            + x * (f32::new(-1.0 / 6.0) + x * f32::new(1.0 / 7.0)))))));
    select(
        f32::abs(x) < f32::new(0.05),
        series,
        f32::ln(f32::new(1.0) + x),
    )
}

/// `c * tanh(x / c)`, the division as a multiply by `1 / c` (loop-invariant, so one
/// division per launch instead of one per element; at most an ulp from `x / c`). With
/// `fast` the hardware's `tanh.approx.f32` (`__tanhf` on CUDA: one instruction, relative
/// error about 2^-11) instead of `tanhf`; the launch asks for it only for bf16 logits,
/// whose own rounding (2^-8) is coarser.
#[cube]
pub(crate) fn soft_cap<N: Size>(
    values: Vector<f32, N>,
    cap: f32,
    #[comptime] fast: bool,
) -> Vector<f32, N> {
    let scaled = values * Vector::new(f32::new(1.0) / cap);
    let capped = if comptime!(fast) {
        fast_tanh::<N>(scaled)
    } else {
        Vector::tanh(scaled)
    };
    Vector::new(cap) * capped
}

/// `tanh` as the hardware's approximation where there is one (see `soft_cap`).
#[cube(fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
fn fast_tanh<N: Size>(values: Vector<f32, N>) -> Vector<f32, N> {
    Vector::tanh(values)
}

/// The class weights of one vector's columns.
#[cube]
pub(crate) fn weights_vector<N: Size>(
    class_weights: &Tensor<f32>,
    first_col: usize,
) -> Vector<f32, N> {
    let mut weights = Vector::<f32, N>::new(0.0);
    #[unroll]
    for lane in 0..weights.size() {
        weights[lane] = class_weights[first_col + lane];
    }
    weights
}

/// What one unit (then the whole cube) knows of a row after reading it.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct RowState {
    pub(crate) max: f32,
    /// `sum exp(x_c - max)` over the classes other than the target.
    pub(crate) others: f32,
    pub(crate) target_logit: f32,
    /// Argmax so far (value, column; column `vocab` until a value is seen).
    pub(crate) best: f32,
    pub(crate) best_col: u32,
    /// `sum_c w_c x'_c` (label smoothing).
    pub(crate) smooth: f32,
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
    let new_max = f32::max(state.max, lane_max::<N>(values));
    let exps = fast_exp::<N>(values, new_max);
    let mut exp_sum = f32::new(0.0);
    let mut target_logit = state.target_logit;
    let mut best = state.best;
    let mut best_col = state.best_col;
    if comptime!(with_target) {
        // The target's lane in this vector, compared in 32 bits; a target before
        // `first_col` wraps to a huge value, never a lane.
        let target_lane = u32::cast_from(target_col - first_col);
        #[unroll]
        for lane in 0..values.size() {
            let is_target = target_lane == lane as u32;
            exp_sum += select(is_target, f32::new(0.0), exps[lane]);
            target_logit = select(is_target, values[lane], target_logit);
        }
    } else {
        exp_sum = lane_sum::<N>(exps);
    }
    if comptime!(options.argmax) {
        #[unroll]
        for lane in 0..values.size() {
            // Strictly greater: the first column wins ties, as in `argmax`.
            let better = values[lane] > best;
            best = select(better, values[lane], best);
            best_col = select(better, u32::cast_from(first_col + lane), best_col);
        }
    }
    let mut smooth = state.smooth;
    if comptime!(options.smoothing) {
        smooth += lane_sum::<N>(values * weights);
    }
    RowState {
        max: new_max,
        // The fast exponential here too (its argument is <= 0): the accurate `expf` per
        // vector cost about 2.5 instructions per element.
        others: state.others * fast_exp_scalar(state.max - new_max) + exp_sum,
        target_logit,
        best,
        best_col,
        smooth,
    }
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
    softcap: f32,
    #[comptime] options: RowOptions,
    #[comptime] with_target: bool,
) -> RowState {
    let mut values = Vector::<f32, N>::cast_from(raw);
    if comptime!(options.softcap) {
        values = soft_cap::<N>(values, softcap, options.fast_tanh);
    }
    let mut weights = Vector::<f32, N>::new(1.0);
    if comptime!(options.smoothing && options.weighted) {
        weights = weights_vector::<N>(class_weights, first_col);
    }
    absorb::<N>(
        state,
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
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce_span<F: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    row_start: usize,
    first: usize,
    len: usize,
    target_col: usize,
    class_weights: &Tensor<f32>,
    staged: &mut SharedMemory<Vector<F, N>>,
    softcap: f32,
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
            };
            let next = absorb_vector::<F, N>(
                state,
                raw,
                (first + safe) * vector_size,
                vocab,
                class_weights,
                softcap,
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
        }
        local += options.loads_per_step * cube_size;
    }
    let state = RowState {
        max,
        others,
        target_logit,
        best,
        best_col,
        smooth,
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
        state,
        holds,
        raw,
        (first + at) * vector_size,
        target_col,
        class_weights,
        softcap,
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
    softcap: f32,
    #[comptime] options: RowOptions,
) -> RowState {
    let next = absorb_vector::<F, N>(
        state,
        raw,
        first_col,
        target_col,
        class_weights,
        softcap,
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
    }
}

/// Merges the units' states as a tree in shared memory; every unit gets the row's state.
/// (A plane-op merge, one barrier instead of one per level, timed the same on the H200:
/// the merge is not on the critical path. The tree runs everywhere; lavapipe has no plane
/// ops.)
#[cube]
pub(crate) fn cube_merge(state: RowState, #[comptime] options: RowOptions) -> RowState {
    let cube_size = options.cube_size;
    let mut shared_max = SharedMemory::<f32>::new(cube_size);
    let mut shared_others = SharedMemory::<f32>::new(cube_size);
    let mut shared_best =
        SharedMemory::<f32>::new(comptime!(if options.argmax { cube_size } else { 1 }));
    let mut shared_col =
        SharedMemory::<u32>::new(comptime!(if options.argmax { cube_size } else { 1 }));
    let mut shared_smooth =
        SharedMemory::<f32>::new(comptime!(if options.smoothing { cube_size } else { 1 }));
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
    sync_cube();

    let levels = comptime!(cube_size.trailing_zeros() as usize);
    #[unroll]
    for level in 0..levels {
        let half = comptime!(cube_size >> (level + 1));
        if unit < half {
            let max_a = shared_max[unit];
            let max_b = shared_max[unit + half];
            let merged_max = f32::max(max_a, max_b);
            shared_others[unit] = shared_others[unit] * f32::exp(max_a - merged_max)
                + shared_others[unit + half] * f32::exp(max_b - merged_max);
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
    merged
}

// cubecl-opt 0.10's value numbering sometimes panics ("no entry found for key", varying
// with hash order) on a `let mut` reassigned inside a runtime `if`; these kernels use
// `select` for such values instead (comptime `if`s are fine: they leave no branch).

/// What the rest of the cube needs of a row after [`forward_row`].
#[derive(CubeType, Clone, Copy)]
pub(crate) struct RowForward {
    pub(crate) lse: f32,
    /// `p_y - 1`.
    pub(crate) target_grad: f32,
}

/// Reads one row and writes its statistics of [`row_stat`] into `stats [COUNT, rows]`:
/// the loss `ce + z`, the z-loss, the target's class weight and a 1 (the mean's
/// denominators sum these), whether the argmax is the target, the log-sum-exp and
/// `p_y - 1` (backward's needs besides the logits); and the argmax into `predicted` when
/// `options.argmax`. Returns the log-sum-exp and `p_y - 1` to every unit.
///
/// The target's own exp is kept out of the running sum: with `others = sum_{c != y}
/// exp(x_c - max)`, `p_y - 1 = -others / (others + exp(x_y - max))` keeps its relative
/// precision when the model is confident (`p_y` near 1), where `exp(x_y - lse) - 1` would
/// cancel. Likewise `lse - x_y = (max - x_y) + ln(sum)`, exact in its first term.
///
/// Ignored rows are not read at all. A target outside `[0, vocab)` gives a NaN loss and is
/// never used as an address.
#[cube]
#[allow(clippy::too_many_arguments)]
fn forward_row<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    row: usize,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) -> RowForward {
    let target = read_target::<I>(targets, row);

    let mut shared_row = SharedMemory::<f32>::new(2usize);
    if target == scalars.ignore_index {
        if UNIT_POS == 0 {
            write_ignored_row::<I>(stats, predicted, row, options);
            shared_row[0] = f32::new(0.0);
            shared_row[1] = f32::new(0.0);
        }
    } else {
        read_row::<F, I, N>(
            logits,
            class_weights,
            weight_total,
            stats,
            predicted,
            row,
            target,
            &mut shared_row,
            scalars,
            options,
        );
    }
    // Publishes `shared_row`; the second barrier keeps a unit that moves on to another
    // row (the forward-gradient kernel walks rows) from overwriting it before every unit
    // has read it.
    sync_cube();
    let result = RowForward {
        lse: shared_row[0],
        target_grad: shared_row[1],
    };
    sync_cube();
    result
}

/// An ignored row's statistics (all 0) and prediction (-1).
#[cube]
pub(crate) fn write_ignored_row<I: Int>(
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    row: usize,
    #[comptime] options: RowOptions,
) {
    #[unroll]
    for stat in 0..row_stat::COUNT {
        stats[stat_index(stats, stat, row)] = f32::new(0.0);
    }
    if comptime!(options.argmax) {
        predicted[row] = I::new(-1);
    }
}

/// The work of [`forward_row`] for a row that is not ignored.
#[cube]
#[allow(clippy::too_many_arguments)]
fn read_row<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    row: usize,
    target: i32,
    shared_row: &mut SharedMemory<f32>,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) {
    let cube_size = options.cube_size;
    let vector_size = logits.vector_size();
    let vocab = logits.shape(2);

    let target_is_class = is_class(target, vocab);
    // When the target is not a class, `target_col` is one no unit reaches.
    let vectors_per_row = vocab / vector_size;
    let target_col = select(target_is_class, usize::cast_from(target), vocab);
    let row_start = row_offset::<Vector<F, N>>(logits, row) / vector_size;
    let mut shared_target_logit = SharedMemory::<f32>::new(1usize);
    let mut unstaged = SharedMemory::<Vector<F, N>>::new(1usize);
    let state = reduce_span::<F, N>(
        logits,
        row_start,
        0usize,
        vectors_per_row,
        target_col,
        class_weights,
        &mut unstaged,
        scalars.softcap,
        options,
        0usize,
    );
    let target_vector = target_col / vector_size;
    let holds_target =
        target_vector % cube_size == UNIT_POS as usize && target_vector < vectors_per_row;
    if holds_target {
        shared_target_logit[0] = state.target_logit;
    }
    // The merge's barriers also publish `shared_target_logit`.
    let merged = cube_merge(state, options);

    if UNIT_POS == 0 {
        // A target that is not a class reads a zero logit and gets a NaN loss.
        let target_logit = select(target_is_class, shared_target_logit[0], f32::new(0.0));
        let forward = finish_row::<I>(
            merged,
            target_logit,
            target,
            vocab,
            class_weights,
            weight_total,
            stats,
            predicted,
            row,
            true,
            scalars,
            options,
        );
        shared_row[0] = forward.lse;
        shared_row[1] = forward.target_grad;
    }
}

/// A row's loss and statistics from its merged state (one unit calls it): writes them to
/// `stats` (and the argmax to `predicted`) when `write`, and returns the log-sum-exp and
/// `p_y - 1`. `target_logit` is 0 when the target is not a class (the loss is then NaN).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish_row<I: Int>(
    merged: RowState,
    target_logit: f32,
    target: i32,
    vocab: usize,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    row: usize,
    write: bool,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) -> RowForward {
    let target_is_class = is_class(target, vocab);
    let target_col = select(target_is_class, usize::cast_from(target), vocab);
    let target_exp = select(
        target_is_class,
        f32::exp(target_logit - merged.max),
        f32::new(0.0),
    );
    let sum = merged.others + target_exp;
    // `ln(sum)` from `sum - 1`, formed without rounding when the target is the max
    // (`target_exp` is then exactly 1): a confident row's loss is `ln(1 + others)`
    // with `others` tiny, where `ln` of the rounded sum would keep few digits.
    let log_sum = ln_one_plus(merged.others + (target_exp - f32::new(1.0)));
    let lse = merged.max + log_sum;
    let nll = (merged.max - target_logit) + log_sum;
    let safe_col = select(target_is_class, target_col, 0usize);
    let mut target_weight = f32::new(1.0);
    if comptime!(options.weighted) {
        target_weight = select(target_is_class, class_weights[safe_col], f32::new(1.0));
    }
    let mut loss = target_weight * nll;
    if comptime!(options.smoothing) {
        // (1 - ls) w_y (lse - x_y) + (ls / V) sum_c w_c (lse - x_c)
        let mut weight_sum = f32::cast_from(vocab);
        if comptime!(options.weighted) {
            weight_sum = weight_total[0];
        }
        let ls = scalars.label_smoothing;
        loss = (f32::new(1.0) - ls) * loss
            + ls / f32::cast_from(vocab) * (weight_sum * lse - merged.smooth);
    }
    let mut z_loss = f32::new(0.0);
    if comptime!(options.z_loss) {
        z_loss = scalars.z_loss_scale * lse * lse;
    }
    // NaN made at run time: CUDA C has no NaN literal for the compiler to print.
    let not_a_number = f32::sqrt(f32::new(-1.0) - f32::abs(f32::cast_from(target)));
    let mut correct = f32::new(0.0);
    let mut best_col = 0usize;
    if comptime!(options.argmax) {
        // An all -inf (or NaN) row never beat the start value: `argmax` says 0.
        best_col = usize::cast_from(merged.best_col);
        best_col = select(best_col < vocab, best_col, 0usize);
        correct = select(best_col == target_col, f32::new(1.0), f32::new(0.0));
    }
    let target_grad = -merged.others / sum;
    if write {
        stats[stat_index(stats, row_stat::LOSS, row)] =
            select(target_is_class, loss + z_loss, not_a_number);
        stats[stat_index(stats, row_stat::Z_LOSS, row)] = z_loss;
        stats[stat_index(stats, row_stat::WEIGHT, row)] = target_weight;
        stats[stat_index(stats, row_stat::VALID, row)] = f32::new(1.0);
        stats[stat_index(stats, row_stat::CORRECT, row)] = correct;
        stats[stat_index(stats, row_stat::LSE, row)] = lse;
        stats[stat_index(stats, row_stat::TARGET_GRAD, row)] = target_grad;
        if comptime!(options.argmax) {
            predicted[row] = I::cast_from(best_col);
        }
    }
    RowForward { lse, target_grad }
}

/// Forward: one cube per row, see [`forward_row`].
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_forward_kernel<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    redefine_cuda_fast_exp(options.cuda_ftz_exp);
    let row = row_of_cube();
    if row >= stats.shape(1) {
        terminate!();
    }
    forward_row::<F, I, N>(
        logits,
        targets,
        class_weights,
        weight_total,
        stats,
        predicted,
        row,
        scalars,
        options,
    );
}

/// What backward knows of a row before streaming it: `grad_c = prob_coef * p_c -
/// smooth_coef * w_c` for every column but the target, `target_value` there, all times
/// the softcap's derivative.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct RowGradient {
    /// `vocab` when the row's gradient is zero (ignored, or not a class).
    pub(crate) target_col: usize,
    pub(crate) lse: f32,
    pub(crate) prob_coef: f32,
    pub(crate) smooth_coef: f32,
    pub(crate) target_value: f32,
}

/// `(sc, sz)` of [`gradient_coefficients`] for a row's incoming gradient `g`: `g / D` and
/// `g / n` with the mean's denominators `[D, n]` when `mean`, else `g` for both.
#[cube]
pub(crate) fn incoming_scales(
    incoming: f32,
    denominators: &Tensor<f32>,
    #[comptime] mean: bool,
) -> (f32, f32) {
    let mut ce_scale = incoming;
    let mut z_scale = incoming;
    if comptime!(mean) {
        ce_scale = incoming / denominators[0];
        z_scale = incoming / denominators[1];
    }
    (ce_scale, z_scale)
}

/// A row's gradient coefficients (spec, "Gradient"): with `sc = g / N_ce`, `sz = g / N_z`,
/// `grad_c = sc ((1 - ls) w_y (p_c - [c = y]) + (ls / V)(W p_c - w_c)) + 2 s sz lse p_c`.
/// At the target, `(1 - ls) w_y sc (p_y - 1)` uses forward's cancellation-free `p_y - 1`.
/// `target_col` is `vocab` for a row whose gradient is zero; `ce_scale` and `z_scale` are
/// then 0.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gradient_coefficients(
    target_col: usize,
    ce_scale: f32,
    z_scale: f32,
    lse: f32,
    target_grad: f32,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    vocab: usize,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) -> RowGradient {
    let mut target_weight = f32::new(1.0);
    if comptime!(options.weighted) {
        target_weight = class_weights[select(target_col < vocab, target_col, 0usize)];
    }
    let mut one_minus_ls = f32::new(1.0);
    let mut smooth_coef = f32::new(0.0);
    // `prob_coef` minus the target coefficient: what multiplies `p_y` beyond `p_y - 1`.
    let mut extra = f32::new(0.0);
    if comptime!(options.smoothing) {
        let ls = scalars.label_smoothing;
        one_minus_ls = f32::new(1.0) - ls;
        let mut weight_sum = f32::cast_from(vocab);
        if comptime!(options.weighted) {
            weight_sum = weight_total[0];
        }
        smooth_coef = ce_scale * ls / f32::cast_from(vocab);
        extra = smooth_coef * weight_sum;
    }
    if comptime!(options.z_loss) {
        extra += z_scale * f32::new(2.0) * scalars.z_loss_scale * lse;
    }
    let target_coef = ce_scale * one_minus_ls * target_weight;
    let target_prob = target_grad + f32::new(1.0);
    RowGradient {
        target_col,
        lse,
        prob_coef: target_coef + extra,
        smooth_coef,
        target_value: target_coef * target_grad + extra * target_prob - smooth_coef * target_weight,
    }
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
    let incoming = select(counted, incoming, f32::new(0.0));
    let (ce_scale, z_scale) = incoming_scales(incoming, denominators, grad_options.mean);
    gradient_coefficients(
        target_col,
        ce_scale,
        z_scale,
        stats[stat_index(stats, row_stat::LSE, row)],
        stats[stat_index(stats, row_stat::TARGET_GRAD, row)],
        class_weights,
        weight_total,
        vocab,
        scalars,
        options,
    )
}

/// One vector of the gradient, in f32, rounded to `F` once.
#[cube]
pub(crate) fn gradient_vector<F: Float, N: Size>(
    values: Vector<F, N>,
    weights: Vector<f32, N>,
    first_col: usize,
    row: RowGradient,
    softcap: f32,
    #[comptime] options: RowOptions,
    #[comptime] with_target: bool,
) -> Vector<F, N> {
    let mut logits = Vector::<f32, N>::cast_from(values);
    if comptime!(options.softcap) {
        logits = soft_cap::<N>(logits, softcap, options.fast_tanh);
    }
    let probs = fast_exp::<N>(logits, row.lse);
    let mut grad = gradient_from_probs::<N>(
        probs,
        row.prob_coef,
        weights,
        first_col,
        row,
        options,
        with_target,
    );
    if comptime!(options.softcap) {
        // d/dx c tanh(x / c) = 1 - tanh^2 = 1 - (x' / c)^2
        let capped = logits * Vector::new(f32::new(1.0) / softcap);
        grad *= Vector::new(1.0) - capped * capped;
    }
    Vector::cast_from(grad)
}

/// The gradient of one vector (before softcap's derivative) from its `probs` scaled by
/// `prob_coef` (the row's, or the row's times a factor the probabilities still lack):
/// label smoothing's term subtracted, and with `with_target` the target's lane set.
#[cube]
pub(crate) fn gradient_from_probs<N: Size>(
    probs: Vector<f32, N>,
    prob_coef: f32,
    weights: Vector<f32, N>,
    first_col: usize,
    row: RowGradient,
    #[comptime] options: RowOptions,
    #[comptime] with_target: bool,
) -> Vector<f32, N> {
    let mut grad = probs * Vector::new(prob_coef);
    if comptime!(options.smoothing) {
        grad -= weights * Vector::new(row.smooth_coef);
    }
    if comptime!(with_target) {
        // As in `absorb`: the target's lane, compared in 32 bits.
        let target_lane = u32::cast_from(row.target_col - first_col);
        #[unroll]
        for lane in 0..grad.size() {
            let is_target = target_lane == lane as u32;
            grad[lane] = select(is_target, row.target_value, grad[lane]);
        }
    }
    grad
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
    grad: &mut Tensor<Vector<F, N>>,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] grad_options: GradOptions,
    #[define(F, I, G)] _dtypes: [StorageType; 3],
) {
    redefine_cuda_fast_exp(options.cuda_ftz_exp);
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
        row,
        vocab,
        scalars,
        options,
        grad_options,
    );
    write_gradient_row::<F, N>(
        logits,
        grad,
        row,
        row_grad,
        class_weights,
        scalars.softcap,
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
    softcap: f32,
    #[comptime] options: RowOptions,
) {
    let cube_size = options.cube_size;
    let vector_size = logits.vector_size();
    let vocab = logits.shape(2);
    let in_start = row_offset::<Vector<F, N>>(logits, row) / vector_size;
    let out_start = row_offset::<Vector<F, N>>(grad, row) / vector_size;
    let vectors_per_row = vocab / vector_size;
    if row_grad.target_col == vocab {
        // Zero row: the logits are not read (they may be anything, NaN included).
        zero_vectors::<F, N>(grad, out_start, vectors_per_row, cube_size);
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
            row_grad,
            class_weights,
            softcap,
            options,
            4usize,
        );
        if holds {
            store_gradient_vector::<F, N>(
                grad,
                out_start,
                target_at,
                target_values,
                class_weights,
                row_grad,
                softcap,
                options,
                true,
            );
        }
    }
}

/// Writes the gradient of vectors `first..first + len` of a row (`in_start`/`out_start`:
/// the row's first vector in `logits`/`grad`) as if none held the target: unit `u` takes
/// vectors `first + u, first + u + cube_size, ..`.
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
    softcap: f32,
    #[comptime] options: RowOptions,
    #[comptime] loads: usize,
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
            loaded[step] = logits[in_row + index + step * cube_size];
        }
        #[unroll]
        for step in 0..loads {
            store_gradient_vector::<F, N>(
                grad,
                out_start,
                first + index + step * cube_size,
                loaded[step],
                class_weights,
                row_grad,
                softcap,
                options,
                false,
            );
        }
        index += loads * cube_size;
    }
    while index < len {
        let values = logits[in_row + index];
        store_gradient_vector::<F, N>(
            grad,
            out_start,
            first + index,
            values,
            class_weights,
            row_grad,
            softcap,
            options,
            false,
        );
        index += cube_size;
    }
}

/// Writes the gradient of vector `index` of a row (`values`: its logits; `out_start`:
/// the row's first vector in `grad`) at `out_start + index`; without `with_target` as if
/// it held no target (see `write_gradient_row`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_gradient_vector<F: Float, N: Size>(
    grad: &mut Tensor<Vector<F, N>>,
    out_start: usize,
    index: usize,
    values: Vector<F, N>,
    class_weights: &Tensor<f32>,
    row_grad: RowGradient,
    softcap: f32,
    #[comptime] options: RowOptions,
    #[comptime] with_target: bool,
) {
    let vector_size = grad.vector_size();
    let mut weights = Vector::<f32, N>::new(1.0);
    if comptime!(options.smoothing && options.weighted) {
        weights = weights_vector::<N>(class_weights, index * vector_size);
    }
    grad[out_start + index] = gradient_vector::<F, N>(
        values,
        weights,
        index * vector_size,
        row_grad,
        softcap,
        options,
        with_target,
    );
}

/// Zeros over `len` vectors of a row's gradient from `out_start` (unit `u` writes
/// `out_start + u, out_start + u + cube_size, ..`).
#[cube]
pub(crate) fn zero_vectors<F: Float, N: Size>(
    grad: &mut Tensor<Vector<F, N>>,
    out_start: usize,
    len: usize,
    #[comptime] cube_size: usize,
) {
    let mut local = UNIT_POS as usize;
    while local < len {
        grad[out_start + local] = Vector::new(F::new(0.0));
        local += cube_size;
    }
}

/// The mean's denominators from the targets alone, as forward's statistics would sum
/// them: `D` (the targets' class weights over non-ignored rows; 1 for a target that is not
/// a class) and `n` (non-ignored rows), clamped like `reduce_stats` clamps them. Every
/// cube computes them (reading `rows` targets is cheap next to one row of logits).
#[cube]
pub(crate) fn mean_denominators<I: Int>(
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    rows: usize,
    vocab: usize,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) -> (f32, f32) {
    let cube_size = options.cube_size;
    let mut weight_sum = f32::new(0.0);
    let mut count = f32::new(0.0);
    let mut row = UNIT_POS as usize;
    while row < rows {
        let target = read_target::<I>(targets, row);
        let counted = target != scalars.ignore_index;
        let class = is_class(target, vocab);
        let mut weight = f32::new(1.0);
        if comptime!(options.weighted) {
            weight = select(
                class,
                class_weights[select(class, usize::cast_from(target), 0usize)],
                f32::new(1.0),
            );
        }
        weight_sum += select(counted, weight, f32::new(0.0));
        count += select(counted, f32::new(1.0), f32::new(0.0));
        row += cube_size;
    }
    let mut shared = SharedMemory::<f32>::new(comptime!(2 * cube_size));
    let unit = UNIT_POS as usize;
    shared[unit] = weight_sum;
    shared[cube_size + unit] = count;
    sum_stacked(&mut shared, 2usize, cube_size);
    (
        f32::max(shared[0], f32::new(f32::MIN_POSITIVE)),
        f32::max(shared[cube_size], f32::new(1.0)),
    )
}

/// Sums `sums` stacked arrays of `cube_size` f32 in `shared` (unit `u` has stored its
/// values at `u`, `cube_size + u`, ..) by a tree over the units: array `k`'s total ends
/// at `k * cube_size`. Every unit of the cube calls it (it holds the barriers).
#[cube]
pub(crate) fn sum_stacked(
    shared: &mut SharedMemory<f32>,
    #[comptime] sums: usize,
    #[comptime] cube_size: usize,
) {
    let unit = UNIT_POS as usize;
    sync_cube();
    let levels = comptime!(cube_size.trailing_zeros() as usize);
    #[unroll]
    for level in 0..levels {
        let half = comptime!(cube_size >> (level + 1));
        if unit < half {
            #[unroll]
            for sum in 0..sums {
                let at = comptime!(sum * cube_size);
                shared[at + unit] += shared[at + unit + half];
            }
        }
        sync_cube();
    }
}

/// Backward of the forward-formed gradient: `grad *= g` in place for a scalar incoming
/// gradient `g`, each cube taking rows in turn; every cube returns at once when `g` is 1
/// (the usual `loss.backward()`), so that case costs one near-empty launch and no host
/// read.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn scale_gradient_kernel<F: Float, G: Float, N: Size>(
    grad: &mut Tensor<Vector<F, N>>,
    grad_output: &Tensor<G>,
    #[comptime] cube_size: usize,
    #[define(F, G)] _dtypes: [StorageType; 2],
) {
    let scale = f32::cast_from(grad_output[0]);
    if scale == f32::new(1.0) {
        terminate!();
    }
    // The grid may hold fewer cubes than rows: each cube takes every `cubes`-th row.
    let cubes = (CUBE_COUNT_X * CUBE_COUNT_Y) as usize;
    let rows = grad.shape(0) * grad.shape(1);
    let vector_size = grad.vector_size();
    let vectors_per_row = grad.shape(2) / vector_size;
    let mut row = row_of_cube();
    while row < rows {
        let start = row_offset::<Vector<F, N>>(grad, row) / vector_size;
        let mut index = UNIT_POS as usize;
        while index < vectors_per_row {
            let values = Vector::<f32, N>::cast_from(grad[start + index]);
            grad[start + index] = Vector::cast_from(values * Vector::new(scale));
            index += cube_size;
        }
        row += cubes;
    }
}

/// The input check: the first row whose target is neither a class in `[0, vocab)` nor
/// `ignore_index` (compared as i32, as the loss kernels read targets: 64-bit integer
/// casts were not reliable on lavapipe), and that target. One cube walks
/// all the rows (`[B, T]`, any strides) and writes `result = [row, target]`, with `row`
/// the number of rows when every target is fine. One launch and a two-element read, in
/// place of a chain of tensor ops.
#[cube(launch)]
pub fn first_bad_target_kernel<I: Int>(
    targets: &Tensor<I>,
    result: &mut Tensor<I>,
    vocab: i32,
    ignore_index: i32,
    #[comptime] cube_size: usize,
    #[define(I)] _dtype: StorageType,
) {
    let rows = targets.shape(0) * targets.shape(1);
    let mut first = rows;
    let mut row = UNIT_POS as usize;
    // Rows are visited in increasing order: a unit's first bad row is its smallest.
    while row < rows {
        let target = read_target::<I>(targets, row);
        let bad = target != ignore_index && (target < 0 || target >= vocab);
        first = select(bad && first == rows, row, first);
        row += cube_size;
    }
    let mut shared_first = SharedMemory::<u32>::new(cube_size);
    let unit = UNIT_POS as usize;
    shared_first[unit] = u32::cast_from(first);
    sync_cube();
    let levels = comptime!(cube_size.trailing_zeros() as usize);
    #[unroll]
    for level in 0..levels {
        let half = comptime!(cube_size >> (level + 1));
        if unit < half {
            shared_first[unit] = u32::min(shared_first[unit], shared_first[unit + half]);
        }
        sync_cube();
    }
    if unit == 0 {
        let first = usize::cast_from(shared_first[0]);
        let found = first < rows;
        let at = row_offset::<I>(targets, select(found, first, 0usize));
        result[0] = I::cast_from(first);
        result[1] = select(found, targets[at], I::new(0));
    }
}
