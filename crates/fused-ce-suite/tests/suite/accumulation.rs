//! Gradient accumulation: a batch passed in four parts, one call each, with `Mean` over
//! the whole batch's denominators (`MeanDenominators`), gives the whole batch's loss (the
//! parts' losses summed) and gradients (each part's rows of them; the head's weight and
//! bias gradients summed over the parts) against the f64 reference of the whole batch,
//! whatever each part's count of ignored rows (one part is all ignored). Class weights,
//! label smoothing and z-loss on, both gradient plans, a non-uniform incoming gradient.

use burn::tensor::{DType, Tensor};
use burn_fused_ce::{
    CrossEntropyError, CrossEntropyOptions, FusedCrossEntropyLossConfig, GradientPlan,
    LinearCrossEntropyInputs, LmHead, MeanDenominators, Reduction, try_fused_cross_entropy,
    try_fused_linear_cross_entropy,
};
use rand::rngs::SmallRng;

use crate::common::*;
use crate::linear::{LinearCase, LinearValues, bound, check_close, linear_reference};

/// Rows of the four parts, and how many of each part's targets are ignored.
const PARTS: [(usize, Ignore); 4] = [
    (5, Ignore::NoRows),
    (9, Ignore::SomeRows),
    (3, Ignore::AllRows),
    (7, Ignore::SomeRows),
];
const VOCAB: usize = 37;
/// The incoming gradient of every part's loss.
const SCALE: f32 = 0.7;

/// The parts' targets, each part drawn with its own ignored rows.
fn part_targets(rng: &mut SmallRng) -> Vec<Vec<i64>> {
    PARTS
        .iter()
        .map(|&(rows, ignore)| random_targets(rng, rows, VOCAB, ignore, -100))
        .collect()
}

/// The whole batch's denominators: the parts' summed.
fn whole_denominators(targets: &[Vec<i64>], weights: Option<&[f32]>) -> MeanDenominators {
    targets
        .iter()
        .map(|part| MeanDenominators::of_targets(part, -100, weights))
        .reduce(|sum, part| sum + part)
        .expect("parts")
}

fn options(plan: GradientPlan) -> CrossEntropyOptions {
    CrossEntropyOptions::new(Reduction::Mean)
        .with_label_smoothing(0.1)
        .with_z_loss_scale(1e-3)
        .with_gradient_plan(plan)
}

/// The loss module over the parts: the sum of their losses and their gradients, row
/// after row, against the whole batch's reference.
fn check_loss_parts(backend: TestBackend, plan: GradientPlan) {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let context = format!("{} {plan:?} seed={seed}", backend.name());
    let device = backend.device().autodiff();
    let rows: usize = PARTS.iter().map(|&(rows, _)| rows).sum();
    let values = random_logits(&mut rng, rows, VOCAB);
    let targets = part_targets(&mut rng);
    let weights = random_class_weights(&mut rng, VOCAB);
    let options = options(plan);
    let loss_fn = FusedCrossEntropyLossConfig::new()
        .with_label_smoothing(options.label_smoothing)
        .with_z_loss_scale(options.z_loss_scale)
        .with_gradient_plan(plan)
        .with_class_weights(Some(weights.clone()))
        .init(&device)
        .with_mean_denominators(Some(whole_denominators(&targets, Some(&weights))));

    let (mut loss, mut grad) = (0.0, Vec::new());
    let mut start = 0;
    for (part, &(part_rows, _)) in targets.iter().zip(&PARTS) {
        let part_values = values[start * VOCAB..(start + part_rows) * VOCAB].to_vec();
        start += part_rows;
        let logits = Tensor::<2>::from_data(
            burn::tensor::TensorData::new(part_values, [part_rows, VOCAB]),
            &device,
        )
        .require_grad();
        let part_loss = loss_fn.forward(logits.clone(), targets_tensor(part, &device));
        let grads = (part_loss.clone() * SCALE).backward();
        loss += to_f64(part_loss)[0];
        grad.extend(to_f64(
            logits.grad(&grads).expect("a gradient for the logits"),
        ));
    }

    let seen: Vec<f64> = values.iter().map(|&v| v as f64).collect();
    let all_targets = targets.concat();
    let reference = RefOptions::new(&options, Some(&weights));
    let expected_loss = reference_loss(
        &reference_rows(&seen, VOCAB, &all_targets, &reference),
        Reduction::Mean,
    )[0];
    let expected_grad = reference_grad(&seen, VOCAB, &all_targets, &reference, &[SCALE as f64]);
    let (loss_tol, grad_tol) = tolerance(DType::F32);
    assert!(
        (loss - expected_loss).abs() <= loss_tol * (1.0 + expected_loss.abs()),
        "{context}: the parts' losses sum to {loss}, the whole batch's is {expected_loss}"
    );
    check_close(
        &grad,
        &expected_grad,
        grad_tol,
        &format!("{context}: gradient"),
    );
}

#[test]
fn loss_parts_add_up_to_the_whole_batch_on_the_default_fusion_backend() {
    for plan in [GradientPlan::OnePass, GradientPlan::TwoPass] {
        check_loss_parts(TestBackend::Fusion, plan);
    }
}

#[test]
fn loss_parts_add_up_to_the_whole_batch_on_flex() {
    for plan in [GradientPlan::OnePass, GradientPlan::TwoPass] {
        check_loss_parts(TestBackend::Flex, plan);
    }
}

/// The fused linear cross-entropy over the parts (chunks of 4 rows within each): the
/// sum of their losses, each part's rows of the hidden-state gradient, and the weight and
/// bias gradients summed over the parts, against the whole batch's reference.
fn check_linear_parts(backend: TestBackend) {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let context = format!("{} seed={seed}", backend.name());
    let plain = backend.device();
    let device = plain.clone().autodiff();
    let rows: usize = PARTS.iter().map(|&(rows, _)| rows).sum();
    let width = 12;
    let mut case = LinearCase::new(rows, width, VOCAB, DType::F32, Reduction::Mean);
    case.options = options(GradientPlan::OnePass);
    case.class_weights = true;
    case.chunk_rows = 4;
    let mut values = LinearValues::draw(&case, &mut rng);
    let targets = part_targets(&mut rng);
    values.targets = targets.concat();
    let weights = values.class_weights.clone().expect("class weights");
    let options = case
        .options
        .clone()
        .with_mean_denominators(Some(whole_denominators(&targets, Some(&weights))));

    let (hidden, weight, bias) = values.tensors(&case, DType::F32, &plain);
    let weight_ad = weight.clone().autodiff().require_grad();
    let bias_ad = bias.clone().autodiff().require_grad();
    let class_weights = Tensor::<1>::from_floats(weights.as_slice(), &device);
    let (mut loss, mut grad_hidden) = (0.0, Vec::new());
    let (mut grad_weight, mut grad_bias) = (vec![0.0; width * VOCAB], vec![0.0; VOCAB]);
    let mut start = 0;
    for (part, &(part_rows, _)) in targets.iter().zip(&PARTS) {
        let hidden_part = hidden
            .clone()
            .narrow(0, start, part_rows)
            .autodiff()
            .require_grad();
        start += part_rows;
        let part_loss = try_fused_linear_cross_entropy(
            LinearCrossEntropyInputs::new(
                hidden_part.clone(),
                LmHead::new(weight_ad.clone()).with_bias(Some(bias_ad.clone())),
                targets_tensor(part, &device),
            )
            .with_class_weights(Some(class_weights.clone())),
            &options,
            &case.chunking(),
        )
        .unwrap_or_else(|error| panic!("{context}: refused: {error}"))
        .loss;
        let grads = (part_loss.clone() * values.loss_scale).backward();
        loss += to_f64(part_loss)[0];
        grad_hidden.extend(to_f64(hidden_part.grad(&grads).expect("grad_h")));
        let add = |sum: &mut Vec<f64>, part: Vec<f64>| {
            sum.iter_mut()
                .zip(part)
                .for_each(|(sum, value)| *sum += value);
        };
        add(
            &mut grad_weight,
            to_f64(weight_ad.grad(&grads).expect("grad_W")),
        );
        add(
            &mut grad_bias,
            to_f64(bias_ad.grad(&grads).expect("grad_b")),
        );
    }

    let (h64, w64, b64) = (to_f64(hidden), to_f64(weight), to_f64(bias));
    let reference = linear_reference(&case, &values, (&h64, &w64, &b64));
    let tol = bound(DType::F32);
    let expected_loss = reference.loss[0];
    assert!(
        (loss - expected_loss).abs() <= tol * (1.0 + expected_loss.abs()),
        "{context}: the parts' losses sum to {loss}, the whole batch's is {expected_loss}"
    );
    check_close(
        &grad_hidden,
        &reference.hidden,
        tol,
        &format!("{context}: grad_h"),
    );
    check_close(
        &grad_weight,
        &reference.weight,
        tol,
        &format!("{context}: grad_W"),
    );
    check_close(
        &grad_bias,
        &reference.bias,
        tol,
        &format!("{context}: grad_b"),
    );
}

#[test]
fn linear_parts_add_up_to_the_whole_batch_on_the_default_fusion_backend() {
    check_linear_parts(TestBackend::Fusion);
}

#[test]
fn linear_parts_add_up_to_the_whole_batch_on_flex() {
    check_linear_parts(TestBackend::Flex);
}

/// Denominators of the host's targets as the loss counts them: ignored rows left out, a
/// class's weight, 1 for a target that is no class.
#[test]
fn denominators_of_targets_count_as_the_loss_does() {
    let weights = [0.5f32, 2.0, 3.0];
    let targets = [0, 2, -100, 2, 7];
    assert_eq!(
        MeanDenominators::of_targets(&targets, -100, Some(&weights)),
        MeanDenominators {
            weight_total: 0.5 + 3.0 + 3.0 + 1.0,
            rows: 4.0,
        }
    );
    assert_eq!(
        MeanDenominators::of_targets(&targets, 2, None),
        MeanDenominators::rows(3)
    );
    assert_eq!(
        MeanDenominators::rows(2) + MeanDenominators::rows(3),
        MeanDenominators::rows(5)
    );
}

/// Given denominators that are negative, not finite or given to another reduction are
/// refused before any kernel runs (the vocabulary-parallel loss refuses any: see
/// `vocab_parallel/mod.rs`).
#[test]
fn bad_mean_denominators_are_an_error() {
    let device = TestBackend::Flex.device();
    let seed = fresh_seed();
    let rng = rng(seed);
    let logits = || {
        Tensor::<2>::from_data(
            burn::tensor::TensorData::new(random_logits(&mut rng.clone(), 4, VOCAB), [4, VOCAB]),
            &device,
        )
    };
    let targets = targets_tensor(&[1, 2, 3, 4], &device);
    let refused = |options: CrossEntropyOptions| {
        matches!(
            try_fused_cross_entropy(logits(), targets.clone(), None, &options),
            Err(CrossEntropyError::InvalidOption {
                name: "mean_denominators",
                ..
            })
        )
    };
    let given = |weight_total: f64, rows: f64| {
        CrossEntropyOptions::default()
            .with_mean_denominators(Some(MeanDenominators { weight_total, rows }))
    };
    assert!(refused(given(-1.0, 4.0)), "seed {seed}: a negative total");
    assert!(refused(given(4.0, f64::NAN)), "seed {seed}: a NaN count");
    assert!(
        refused(given(f64::INFINITY, 4.0)),
        "seed {seed}: an infinite total"
    );
    assert!(
        refused(given(4.0, 4.0).with_reduction(Reduction::Sum)),
        "seed {seed}: with Sum"
    );
    assert!(
        !refused(given(0.0, 0.0)),
        "seed {seed}: zeros are clamped, not refused"
    );
}
