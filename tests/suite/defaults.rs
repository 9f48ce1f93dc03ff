//! What the default config does: the one pass with a guessed incoming gradient (right,
//! wrong, 0, NaN, changing between steps), and the deferred target check (when its error
//! surfaces).

use burn::{
    backend::{Autodiff, NdArray},
    tensor::{DType, Tensor},
};
use burn_fused_ce::{
    CrossEntropyError, FusedCrossEntropyBackend, FusedCrossEntropyLossConfig, GradientPlan,
    Reduction, TargetCheck, wait_for_target_checks,
};
use fused_ce_suite::DefaultBackend;

use crate::bad_input::panic_message;
use crate::common::*;
use crate::contract::{check_grad, poisoned, short_name};

#[test]
fn the_default_config_takes_the_one_pass_and_the_deferred_check() {
    let config = FusedCrossEntropyLossConfig::new();
    assert_eq!(config.gradient_plan, GradientPlan::OnePass);
    assert_eq!(config.target_check, TargetCheck::Deferred);
    let options = burn_fused_ce::CrossEntropyOptions::default();
    assert_eq!(options.gradient_plan, GradientPlan::OnePass);
    assert_eq!(options.target_check, TargetCheck::Deferred);
}

/// The incoming gradients of successive training steps of one loss: the first guess (1)
/// right, then a new scale (miss), the same again (hit), another (miss), 0 (the gradient
/// is 0; the guess stays), the scale before it (hit), NaN (a NaN gradient; the guess
/// stays), and back.
const STEP_SCALES: [f32; 9] = [1.0, 0.25, 0.25, 2.0, 0.0, 2.0, f32::NAN, 2.0, 1.0];

/// Steps of one loss module (default config) under autodiff, each with fresh logits and
/// `(loss * s).backward()`: every gradient against the f64 reference for its `s`.
fn check_guessed_scales<B: FusedCrossEntropyBackend>(dtypes: &[DType])
where
    B::Device: Default,
{
    let _backward = shared_device();
    let device = B::Device::default();
    let (rows, vocab) = (37, 129);
    for &dtype in dtypes {
        for reduction in [Reduction::Mean, Reduction::Sum] {
            let seed = fresh_seed();
            let mut rng = rng(seed);
            let loss_fn = FusedCrossEntropyLossConfig::new()
                .with_reduction(reduction)
                .with_label_smoothing(0.05)
                .init::<Autodiff<B>>(&device);
            let reference_options = RefOptions::new(loss_fn.options(), None);
            for (step, &scale) in STEP_SCALES.iter().enumerate() {
                let context = format!(
                    "{} {dtype:?} {reduction:?} step {step} scale {scale} seed={seed}",
                    short_name::<B>()
                );
                let values = random_logits(&mut rng, rows, vocab);
                let ignore = if scale.is_nan() {
                    Ignore::NoRows
                } else {
                    Ignore::SomeRows
                };
                let targets = random_targets(&mut rng, rows, vocab, ignore, -100);
                let (logits, seen) = logits_tensor::<B>(values, rows, vocab, dtype, &device);
                let logits = Tensor::<Autodiff<B>, 2>::from_inner(logits).require_grad();
                let loss = loss_fn.forward(logits.clone(), targets_tensor(&targets, &device));
                let grads = (loss * scale).backward();
                let grad = to_f64(logits.grad(&grads).expect("a gradient for the logits"));
                if scale.is_nan() {
                    assert!(
                        grad.iter().all(|v| v.is_nan()),
                        "{context}: a NaN incoming gradient gives a NaN gradient"
                    );
                    continue;
                }
                let expected =
                    reference_grad(&seen, vocab, &targets, &reference_options, &[scale as f64]);
                check_grad(&grad, &expected, dtype, &context);
            }
        }
    }
}

#[test]
fn guessed_incoming_gradient_on_the_cube_backend() {
    poisoned();
    check_guessed_scales::<CubeBackend>(&float_dtypes());
}

#[test]
fn guessed_incoming_gradient_on_the_default_fusion_backend() {
    poisoned();
    check_guessed_scales::<DefaultBackend>(&float_dtypes());
}

#[test]
fn guessed_incoming_gradient_on_ndarray_through_the_portable_path() {
    check_guessed_scales::<NdArray>(&[DType::F32]);
}

/// A loss of the default config on `[rows, vocab]` logits: one call's result.
fn call<B: FusedCrossEntropyBackend>(
    loss_fn: &burn_fused_ce::FusedCrossEntropyLoss<B>,
    targets: &[i64],
    vocab: usize,
    device: &B::Device,
) -> Result<Tensor<B, 1>, CrossEntropyError> {
    let rows = targets.len();
    let values: Vec<f32> = (0..rows * vocab).map(|i| (i % 7) as f32 * 0.5).collect();
    let (logits, _) = logits_tensor::<B>(values, rows, vocab, DType::F32, device);
    loss_fn.try_forward(logits, targets_tensor(targets, device))
}

/// The deferred check: the call with a bad target runs (its loss is NaN); the error
/// surfaces at the second call after it, or at `wait_for_target_checks`, naming the
/// earlier call's row.
fn check_deferred_check<B: FusedCrossEntropyBackend>()
where
    B::Device: Default,
{
    let _backward = shared_device();
    let device = B::Device::default();
    let name = short_name::<B>();
    let vocab = 50;
    let good: Vec<i64> = (0..8).map(|i| (i * 7) % vocab as i64).collect();
    let mut bad = good.clone();
    bad[3] = vocab as i64 + 2;
    let expected = CrossEntropyError::TargetOutOfRange {
        row: 3,
        value: vocab as i64 + 2,
        vocab,
        earlier_call: true,
    };
    let loss_fn = FusedCrossEntropyLossConfig::new().init::<B>(&device);
    assert_eq!(wait_for_target_checks(), Ok(()), "{name}: nothing pending");

    // Waiting surfaces it at once.
    call(&loss_fn, &good, vocab, &device).expect("good targets");
    let loss = call(&loss_fn, &bad, vocab, &device).expect("the bad call itself runs");
    assert!(
        to_f64(loss)[0].is_nan(),
        "{name}: the bad row makes the mean NaN, as with the check off"
    );
    assert_eq!(wait_for_target_checks(), Err(expected.clone()), "{name}");
    assert_eq!(wait_for_target_checks(), Ok(()), "{name}: reported once");
    call(&loss_fn, &good, vocab, &device).expect("good targets after the error");

    // The second call after it surfaces it, before computing anything: the first one
    // runs, even with a device that has long run the check.
    call(&loss_fn, &bad, vocab, &device).expect("the bad call itself runs");
    B::sync(&device).expect("device sync");
    call(&loss_fn, &good, vocab, &device).expect("the next call runs");
    let error = call(&loss_fn, &good, vocab, &device).expect_err("the second call reports");
    assert_eq!(error, expected, "{name}");
    assert_eq!(wait_for_target_checks(), Ok(()), "{name}: reported once");
    // `forward` panics with the message.
    call(&loss_fn, &bad, vocab, &device).expect("the bad call itself runs");
    call(&loss_fn, &good, vocab, &device).expect("the next call runs");
    let message = panic_message(|| {
        let values = vec![0.5f32; good.len() * vocab];
        let (logits, _) = logits_tensor::<B>(values, good.len(), vocab, DType::F32, &device);
        loss_fn.forward(logits, targets_tensor(&good, &device));
    });
    assert_eq!(message, expected.to_string(), "{name}: forward panics");
    assert!(message.contains("earlier call"), "{name}: {message}");
    assert_eq!(wait_for_target_checks(), Ok(()), "{name}: nothing left");
}

#[test]
fn deferred_target_check_on_the_cube_backend() {
    check_deferred_check::<CubeBackend>();
}

#[test]
fn deferred_target_check_on_the_default_fusion_backend() {
    check_deferred_check::<DefaultBackend>();
}

#[test]
fn deferred_target_check_on_ndarray() {
    check_deferred_check::<NdArray>();
}

/// Under autodiff the check is the same, and the gradient of the bad call is still
/// formed (zero on the bad row).
#[test]
fn deferred_target_check_under_autodiff() {
    type B = Autodiff<CubeBackend>;
    let _backward = shared_device();
    let device = Device::default();
    let vocab = 40;
    let mut targets: Vec<i64> = (0..6).map(|i| i * 5).collect();
    targets[2] = -7;
    let loss_fn = FusedCrossEntropyLossConfig::new()
        .with_reduction(Reduction::Sum)
        .init::<B>(&device);
    let values: Vec<f32> = (0..6 * vocab).map(|i| (i % 11) as f32 * 0.3).collect();
    let (logits, _) = logits_tensor::<CubeBackend>(values, 6, vocab, DType::F32, &device);
    let logits = Tensor::<B, 2>::from_inner(logits).require_grad();
    let loss = loss_fn
        .try_forward(logits.clone(), targets_tensor(&targets, &device))
        .expect("the bad call itself runs");
    let grads = loss.backward();
    let grad = to_f64(logits.grad(&grads).expect("a gradient"));
    assert!(
        grad[2 * vocab..3 * vocab].iter().all(|v| *v == 0.0),
        "the bad row's gradient is 0"
    );
    assert_eq!(
        wait_for_target_checks(),
        Err(CrossEntropyError::TargetOutOfRange {
            row: 2,
            value: -7,
            vocab,
            earlier_call: true,
        })
    );
}
