//! A row's gradient: its coefficients, from what forward knows of the row and the
//! incoming gradient, and the gradient of one vector of it.

use cubecl::prelude::*;

use crate::base::row::{RowOptions, RowScalars, fast_exp, transformed};
use crate::rows::row_state::entropy_term;

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
        grad = with_entropy_term::<N>(
            grad,
            probs,
            logits - Vector::new(row.max),
            row.entropy_coef,
            row.entropy_offset,
        );
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

/// `grad` plus the entropy's part `coef * exp * shifted + offset * exp` per lane, with
/// [`entropy_term`]'s clamp (a 0 exponential whose `shifted` is -inf adds 0): every lane,
/// the target's too, whose value in `grad` holds the loss's part alone.
#[cube]
pub(crate) fn with_entropy_term<N: Size>(
    grad: Vector<f32, N>,
    exps: Vector<f32, N>,
    shifted: Vector<f32, N>,
    coef: f32,
    offset: f32,
) -> Vector<f32, N> {
    let mut grad = grad;
    #[unroll]
    for lane in 0..grad.vector_size() {
        let exp = exps.extract(lane);
        let term = entropy_term(exp, shifted.extract(lane));
        grad.insert(lane, grad.extract(lane) + coef * term + offset * exp);
    }
    grad
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
