//! Backward: the gradient of each row from forward's statistics (one more read of the
//! logits), and the rescaling of a gradient the one pass wrote.

use cubecl::prelude::*;

use crate::ptx::{load_vector, store_vector};
use crate::row::{
    RowOptions, RowScalars, fast_exp, is_class, read_target, row_of_cube, row_offset, stat_index,
    transformed, weights_vector,
};
use crate::row_stat;
use crate::row_state::{entropy_term, target_share};

/// How backward reads the incoming gradient.
#[derive_cube_comptime]
pub struct GradOptions {
    /// One incoming gradient per row (`Reduction::None`), else one for all rows.
    pub per_row: bool,
    /// Divide by the mean's denominators.
    pub mean: bool,
}

/// What backward knows of a row before streaming it: `grad_c = prob_coef * p_c -
/// smooth_coef * w_c` for every column but the target, `target_value` there, all times
/// the softcap's derivative.
#[derive(CubeType, Clone, Copy)]
#[expand(derive(Clone))]
pub(crate) struct RowGradient {
    /// `vocab` when the row's gradient is zero (ignored, or not a class).
    pub(crate) target_col: usize,
    /// The row's maximum: the loops form `exp(x' - max)`, which `prob_coef` turns into
    /// `p`.
    pub(crate) max: f32,
    pub(crate) prob_coef: f32,
    pub(crate) smooth_coef: f32,
    pub(crate) target_value: f32,
    /// The entropy's part (`RowOptions::entropy_gradient`), `g_H dH/dx'_c =
    /// entropy_coef exp(x'_c - max) (x'_c - max) + entropy_offset exp(x'_c - max)`; 0
    /// otherwise.
    pub(crate) entropy_coef: f32,
    pub(crate) entropy_offset: f32,
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
/// `lse = max + log_sum`. The loops form `exp(x' - max)`; `prob_coef` carries the
/// `exp(-log_sum)` that makes it `p_c` (`exp(x' - lse)` from the log-sum-exp rounded to
/// f32 would be off by up to its ulp, 5e-4 relative near 1e4).
/// `target_col` is `vocab` for a row whose gradient is zero; `ce_scale` and `z_scale` are
/// then 0.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gradient_coefficients(
    target_col: usize,
    ce_scale: f32,
    z_scale: f32,
    max: f32,
    log_sum: f32,
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
    let target_prob = target_grad + f32::new(1.0);
    let mut one_minus_ls = f32::new(1.0);
    let mut smooth_coef = f32::new(0.0);
    // Smoothing's part of `prob_coef` and of the target's value.
    let mut smooth_extra = f32::new(0.0);
    let mut smooth_target = f32::new(0.0);
    if comptime!(options.smoothing) {
        let ls = scalars.label_smoothing;
        one_minus_ls = f32::new(1.0) - ls;
        let mut weight_sum = f32::cast_from(vocab);
        if comptime!(options.weighted) {
            weight_sum = weight_total[0];
        }
        smooth_coef = ce_scale * ls / f32::cast_from(vocab);
        smooth_extra = smooth_coef * weight_sum;
        // `sc (W p_y - w_y)`, not `sc W p_y - sc w_y`: with one class `W p_y - w_y` is an
        // exact 0, where a fused multiply-add of the two products leaves one's rounding.
        smooth_target = smooth_coef * (weight_sum * target_prob - target_weight);
    }
    let mut z_extra = f32::new(0.0);
    if comptime!(options.z_loss) {
        z_extra = z_scale * f32::new(2.0) * scalars.z_loss_scale * (max + log_sum);
    }
    let target_coef = ce_scale * one_minus_ls * target_weight;
    RowGradient {
        target_col,
        max,
        prob_coef: (target_coef + smooth_extra + z_extra) * f32::exp(-log_sum),
        smooth_coef,
        target_value: target_coef * target_grad + z_extra * target_prob + smooth_target,
        entropy_coef: f32::new(0.0),
        entropy_offset: f32::new(0.0),
    }
}

/// `row` with the entropy's part for its incoming gradient `entropy_incoming`: with `p_c
/// = exp(x'_c - max - log_sum)`, `dH/dx'_c = -p_c (ln p_c + H) = -p_c ((x'_c - max) -
/// log_sum + H)`.
#[cube]
pub(crate) fn with_entropy_gradient(
    row: RowGradient,
    entropy_incoming: f32,
    entropy: f32,
    log_sum: f32,
) -> RowGradient {
    let coef = -entropy_incoming * f32::exp(-log_sum);
    RowGradient {
        target_col: row.target_col,
        max: row.max,
        prob_coef: row.prob_coef,
        smooth_coef: row.smooth_coef,
        target_value: row.target_value,
        entropy_coef: coef,
        entropy_offset: coef * (entropy - log_sum),
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
    entropy_grad_output: &Tensor<f32>,
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
    let log_sum = stats[stat_index(stats, row_stat::LOG_SUM, row)];
    let row_grad = gradient_coefficients(
        target_col,
        ce_scale,
        z_scale,
        stats[stat_index(stats, row_stat::MAX, row)],
        log_sum,
        stats[stat_index(stats, row_stat::TARGET_GRAD, row)],
        class_weights,
        weight_total,
        vocab,
        scalars.clone(),
        options,
    );
    if comptime!(options.entropy_gradient) {
        let entropy_incoming = select(
            counted,
            entropy_grad_output[row * entropy_grad_output.stride(0)],
            f32::new(0.0),
        );
        with_entropy_gradient(
            row_grad,
            entropy_incoming,
            stats[stat_index(stats, row_stat::ENTROPY, row)],
            log_sum,
        )
    } else {
        row_grad
    }
}

/// One vector of the gradient, in f32, rounded to `F` once.
#[cube]
pub(crate) fn gradient_vector<F: Float, N: Size>(
    values: Vector<F, N>,
    weights: Vector<f32, N>,
    first_col: usize,
    row: RowGradient,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] with_target: bool,
) -> Vector<F, N> {
    let logits = transformed::<N>(
        Vector::<f32, N>::cast_from(values),
        scalars.clone(),
        options,
    );
    let probs = fast_exp::<N>(logits, row.max, options.exp_flush_to_zero);
    let mut grad = gradient_from_probs::<N>(
        probs,
        row.prob_coef,
        weights,
        first_col,
        row.clone(),
        options,
        with_target,
    );
    if comptime!(options.entropy_gradient) {
        // Every lane, the target's too: its value above holds the loss's part alone.
        #[unroll]
        for lane in 0..grad.vector_size() {
            let exp = probs.extract(lane);
            let term = entropy_term(exp, logits.extract(lane) - row.max);
            grad.insert(
                lane,
                grad.extract(lane) + row.entropy_coef * term + row.entropy_offset * exp,
            );
        }
    }
    if comptime!(options.softcap) {
        // d/dx c tanh(x / c) = 1 - tanh^2 = 1 - (x' / c)^2
        let capped = logits * Vector::new(f32::new(1.0) / scalars.softcap);
        grad *= Vector::new(1.0) - capped * capped;
    }
    if comptime!(options.temperature) {
        grad *= Vector::new(scalars.inv_temperature);
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
        for lane in 0..grad.vector_size() {
            let is_target = target_lane == lane as u32;
            grad.insert(
                lane,
                select(is_target, row.target_value, grad.extract(lane)),
            );
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
    entropy_grad_output: &Tensor<f32>,
    grad: &mut Tensor<Vector<F, N>>,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] grad_options: GradOptions,
    #[define(F, I, G)] _dtypes: [ElemType; 3],
) {
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
        entropy_grad_output,
        row.clone(),
        vocab,
        scalars.clone(),
        options,
        grad_options,
    );
    write_gradient_row::<F, N>(
        logits,
        grad,
        row.clone(),
        row_grad.clone(),
        class_weights,
        scalars.clone(),
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
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) {
    let cube_size = options.cube_size;
    let vector_size = logits.vector_size();
    let vocab = logits.shape(2);
    let in_start = row_offset::<Vector<F, N>>(logits, row) / vector_size;
    let out_start = row_offset::<Vector<F, N>>(&*grad, row) / vector_size;
    let vectors_per_row = vocab / vector_size;
    if row_grad.target_col == vocab {
        // Zero row: the logits are not read (they may be anything, NaN included).
        zero_vectors::<F, N>(grad, out_start, vectors_per_row, cube_size, false);
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
            row_grad.clone(),
            class_weights,
            scalars.clone(),
            options,
            4usize,
            false,
            false,
        );
        if holds {
            store_gradient_vector::<F, N>(
                grad,
                out_start,
                target_at,
                target_values,
                class_weights,
                row_grad.clone(),
                scalars.clone(),
                options,
                true,
                false,
            );
        }
    }
}

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
