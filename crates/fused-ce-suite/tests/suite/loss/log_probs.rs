//! The target's log-probability is `-loss` under `Reduction::None` with no label
//! smoothing, z-loss or class weights (the spec's Extra outputs): checked against
//! `x'_y - lse(x')` formed in f64 here, with and without softcap, ignored rows 0, and its
//! gradient under autodiff through per-row weights.

use burn::tensor::{DType, Tensor, TensorData};
use burn_fused_ce::{CrossEntropyOptions, Reduction, try_fused_cross_entropy};
use rand::Rng;

use crate::common::*;

/// `log p_y` of each row of `logits [rows, vocab]` as `reference` transforms them
/// (softcap), in f64; 0 where the target is the ignore index.
fn log_probs(logits: &[f64], vocab: usize, targets: &[i64], reference: &RefOptions) -> Vec<f64> {
    targets
        .iter()
        .enumerate()
        .map(|(row, &target)| {
            if target == reference.ignore_index {
                return 0.0;
            }
            let x = reference.capped(&logits[row * vocab..(row + 1) * vocab]);
            x[target as usize] - lse(&x)
        })
        .collect()
}

fn check_log_probs(backend: TestBackend) {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let device = backend.device().autodiff();
    let (rows, vocab) = (13, 300);
    for softcap in [None, Some(7.5f32)] {
        let context = format!("{} softcap {softcap:?} seed={seed}", backend.name());
        let values = random_logits(&mut rng, rows, vocab);
        let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
        let row_weights: Vec<f32> = (0..rows).map(|_| rng.random_range(0.2..2.0)).collect();
        let options = CrossEntropyOptions::new(Reduction::None).with_softcap(softcap);
        let logits =
            Tensor::<2>::from_data(TensorData::new(values.clone(), [rows, vocab]), &device)
                .require_grad();
        let loss = try_fused_cross_entropy(
            logits.clone(),
            targets_tensor(&targets, &device),
            None,
            &options,
        )
        .unwrap_or_else(|error| panic!("{context}: refused: {error}"))
        .loss;
        let log_prob = loss.neg();
        let weights = Tensor::<1>::from_floats(row_weights.as_slice(), &device);
        let grads = (log_prob.clone() * weights).sum().backward();

        let seen: Vec<f64> = values.iter().map(|&v| v as f64).collect();
        let reference = RefOptions::new(&options, None);
        let expected = log_probs(&seen, vocab, &targets, &reference);
        let (loss_tol, grad_tol) = tolerance(DType::F32);
        for (row, (got, want)) in to_f64(log_prob).iter().zip(&expected).enumerate() {
            assert!(
                (got - want).abs() <= loss_tol * (1.0 + want.abs()),
                "{context}: row {row}: -loss {got}, log p_y {want}"
            );
        }
        // d(sum_i g_i log p_y_i)/dx is minus the loss's gradient for the incoming `g`.
        let g: Vec<f64> = row_weights.iter().map(|&v| -(v as f64)).collect();
        let expected_grad = reference_grad(&seen, vocab, &targets, &reference, &g);
        let grad = to_f64(logits.grad(&grads).expect("a gradient for the logits"));
        let error = relative_l2(&grad, &expected_grad);
        assert!(
            error <= grad_tol,
            "{context}: gradient relative L2 {error:.3e}"
        );
    }
}

#[test]
fn target_log_probability_is_minus_the_per_row_loss_on_the_default_fusion_backend() {
    check_log_probs(TestBackend::Fusion);
}

#[test]
fn target_log_probability_is_minus_the_per_row_loss_on_flex() {
    check_log_probs(TestBackend::Flex);
}
