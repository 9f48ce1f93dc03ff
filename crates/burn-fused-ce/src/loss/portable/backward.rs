//! The two-pass backward by Burn's tensor ops: the spec's gradient from forward's
//! statistics, the entropy's part included.

use burn::backend::{Backend, TensorMetadata, tensor::FloatTensor};
use burn::tensor::DType;

use super::inputs::{class_weights_f32, classify_targets, logits_f32, rows_and_vocab};
use crate::loss::entropy_incoming::entropy_incoming;
use crate::loss::types::TwoPassBackward;
use crate::options::CrossEntropyOptions;
use crate::primitive::FloatOf;
use crate::values::{CrossEntropyInputs, row_stat};

/// One statistic as a column `[N, 1]`.
fn stat_column<B: Backend>(stats: &FloatOf<B, 2>, stat: usize, rows: usize) -> FloatOf<B, 2> {
    stats
        .clone()
        .slice([stat..stat + 1, 0..rows])
        .reshape([rows, 1])
}

/// Gradient, as
/// [`FusedCrossEntropyBackend::cross_entropy_backward`](crate::backend::FusedCrossEntropyBackend::cross_entropy_backward):
/// the logits' shape and dtype; zero rows where the target is ignored or not a class.
///
/// With `g` the incoming gradient of the row (`grad_output [N]` under `Reduction::None`,
/// its one value otherwise), `sc = g / D` and `sz = g / n` (`D`, `n` from `denominators`,
/// or `sc = sz = g` without them), `C = sc (1 - ls) w_y`, `Bc = sc ls / V`,
/// `E = Bc W + 2 s sz lse`:
/// `grad_c = (C + E) p_c - Bc w_c` for `c != y` and `C (p_y - 1) + E p_y - Bc w_y` at the
/// target, with forward's `p_y - 1`; all times `1 - (x'_c / cap)^2` under a softcap.
/// With row weights `g` is `w_r g` and the entropy's part has the objective's `-c_r`.
pub fn cross_entropy_backward<B: Backend>(
    inputs: CrossEntropyInputs<B>,
    backward: TwoPassBackward<B>,
    options: &CrossEntropyOptions,
) -> FloatTensor<B> {
    let CrossEntropyInputs {
        logits,
        targets,
        class_weights,
        row_weights,
    } = inputs;
    let TwoPassBackward {
        stats,
        grad_output,
        denominators,
        entropy_grad_output,
    } = backward;
    let shape = logits.shape();
    let dtype = logits.dtype();
    let device = logits.device();
    let (rows, vocab) = rows_and_vocab(&shape);
    let denominators = denominators.into_option();
    let entropy_grad_output = entropy_incoming::<B>(
        entropy_grad_output.into_option(),
        row_weights.entropy.into_option(),
        &grad_output,
        denominators.as_ref(),
    );
    if rows == 0 || vocab == 0 {
        let zeros = FloatOf::<B, 1>::zeros([rows * vocab], &device, dtype);
        return B::float_reshape(zeros.into_primitive(), shape);
    }

    let x = logits_f32::<B>(logits, rows, vocab, options);
    let t = classify_targets::<B>(targets, rows, vocab, options.ignore_index);
    let weights = class_weights_f32::<B>(class_weights, &t, rows, vocab, &device);
    let not_counted = t.counted.clone().not();
    let stats = FloatOf::<B, 2>::new(stats);
    let lse = stat_column(&stats, row_stat::LSE, rows);
    let max = stat_column(&stats, row_stat::MAX, rows);
    let log_sum = stat_column(&stats, row_stat::LOG_SUM, rows);
    let target_grad = stat_column(&stats, row_stat::TARGET_GRAD, rows);

    // The incoming gradient per row, f32 `[N, 1]`, 0 on rows without a gradient.
    let incoming_len = grad_output.shape().num_elements();
    let incoming = FloatOf::<B, 1>::flat_f32(grad_output);
    let incoming = if incoming_len == rows {
        incoming.reshape([rows, 1])
    } else {
        // One value for every row (`Mean`, `Sum`), materialised so masking is plain.
        FloatOf::<B, 2>::zeros([rows, 1], &device, DType::F32).add(incoming.reshape([1, 1]))
    };
    let incoming = match row_weights.loss.into_option() {
        Some(weights) => incoming.mul(FloatOf::<B, 1>::flat_f32(weights).reshape([rows, 1])),
        None => incoming,
    };
    // A mask, not a product: an ignored row's gradient is 0 whatever its weight.
    let incoming = incoming.mask_fill(not_counted.clone(), 0.0);
    let (ce_scale, z_scale) = match denominators {
        Some(denominators) => {
            let denominators = FloatOf::<B, 1>::new(denominators).cast(DType::F32);
            let ce = denominators.clone().narrow(0, 0, 1).reshape([1, 1]);
            let z = denominators.narrow(0, 1, 1).reshape([1, 1]);
            (incoming.clone().div(ce), incoming.div(z))
        }
        None => (incoming.clone(), incoming),
    };

    let ls = options.label_smoothing;
    let s = options.z_loss_scale;
    // C: what multiplies `p_c - [c == y]`.
    let target_coef = ce_scale
        .clone()
        .mul_scalar(1.0 - ls as f64)
        .mul(weights.target.clone());
    // Bc and E (E: what multiplies `p_c` besides C).
    let mut smooth_coef = None;
    let mut extra = None;
    if ls > 0.0 {
        let coef = ce_scale.mul_scalar(ls as f64 / vocab as f64);
        extra = Some(coef.clone().mul(weights.total.clone()));
        smooth_coef = Some(coef);
    }
    if s > 0.0 {
        let z = z_scale.mul_scalar(2.0 * s as f64).mul(lse.clone());
        extra = Some(match extra {
            Some(extra) => extra.add(z),
            None => z,
        });
    }
    let mut target_value = target_coef.clone().mul(target_grad.clone());
    let mut prob_coef = target_coef;
    if let Some(extra) = extra {
        target_value = target_value.add(extra.clone().mul(target_grad.add_scalar(1.0)));
        prob_coef = prob_coef.add(extra);
    }
    if let Some(coef) = &smooth_coef {
        target_value = target_value.sub(coef.clone().mul(weights.target.clone()));
    }

    // `x - max` first: exact for the columns whose probability matters, where the
    // log-sum-exp rounded to f32 is off by up to its ulp.
    let log_probs = x.clone().sub(max).sub(log_sum);
    let probs = log_probs.clone().exp();
    let mut grad = probs.clone().mul(prob_coef);
    if let Some(coef) = smooth_coef {
        grad = match weights.row {
            Some(row) => grad.sub(coef.mul(row)),
            None => grad.sub(coef),
        };
    }
    let mut grad = grad.mask_where(t.one_hot, target_value.expand([rows, vocab]));
    if let Some(entropy_incoming) = entropy_grad_output {
        // g_H dH/dx'_c = -g_H p_c (ln p_c + H), at the target too; a -inf logit's term is
        // 0, not 0 * -inf.
        let entropy_incoming = FloatOf::<B, 1>::new(entropy_incoming)
            .cast(DType::F32)
            .reshape([rows, 1])
            .mask_fill(not_counted.clone(), 0.0);
        let entropy = stat_column(&stats, row_stat::ENTROPY, rows);
        let term = probs
            .clone()
            .mul(log_probs.add(entropy))
            .mask_fill(probs.equal_elem(0.0), 0.0)
            .mul(entropy_incoming.neg());
        grad = grad.add(term);
    }
    if let Some(cap) = options.softcap {
        // d/dx c tanh(x / c) = 1 - tanh^2 = 1 - (x' / c)^2
        let capped = x.div_scalar(cap as f64);
        grad = grad.mul(capped.clone().mul(capped).neg().add_scalar(1.0));
    }
    if let Some(temperature) = options.temperature {
        grad = grad.mul_scalar(1.0 / temperature as f64);
    }
    // Exact zeros on rows without a gradient, whatever their logits (NaN included).
    let grad = grad.mask_fill(not_counted.expand([rows, vocab]), 0.0);
    B::float_reshape(grad.cast(dtype).into_primitive(), shape)
}
