//! What the default config does: the one pass with a guessed incoming gradient (right,
//! wrong, 0, NaN, changing between steps), and the deferred target check (when its error
//! surfaces).

use burn::tensor::{DType, Device, Tensor};
use burn_fused_ce::target_check::wait_for_target_checks;
use burn_fused_ce::{
    CrossEntropyError, FusedCrossEntropyLossConfig, GradientPlan, Reduction, TargetCheck,
};

use super::bad_input::panic_message;
use super::contract::{check_grad, poisoned};
use crate::common::*;
use crate::cube_primitives as cube;

/// The default plan, `Auto`, is the one pass for `Mean` (the fused linear op's products
/// show it: no logits formed again in backward); the default check is deferred.
#[test]
fn the_default_config_takes_the_one_pass_and_the_deferred_check() {
    let config = FusedCrossEntropyLossConfig::new();
    assert_eq!(config.gradient_plan, GradientPlan::Auto);
    assert_eq!(config.target_check, TargetCheck::Deferred);
    let options = burn_fused_ce::CrossEntropyOptions::default();
    assert_eq!(options.gradient_plan, GradientPlan::Auto);
    assert_eq!(options.target_check, TargetCheck::Deferred);
    let _backward = shared_device();
    let device = TestBackend::Fusion.device().autodiff();
    let hidden = Tensor::<2>::ones([4, 8], &device).require_grad();
    let weight = Tensor::<2>::ones([8, 16], &device).require_grad();
    let loss_fn = burn_fused_ce::FusedLinearCrossEntropyLossConfig::new().init(&device);
    let before = burn_fused_ce::test_hooks::linear_product_counts().logits;
    let loss = loss_fn.forward(
        hidden.clone(),
        burn_fused_ce::LmHead::new(weight),
        targets_tensor(&[1, 2, 3, 4], &device),
    );
    let _ = loss.backward();
    let formed = burn_fused_ce::test_hooks::linear_product_counts().logits - before;
    assert_eq!(formed, 1, "the logits are formed once: the one pass");
}

/// The incoming gradients of successive training steps of one loss: the first guess (1)
/// right, then a new scale (miss), the same again (hit), another (miss), 0 (the gradient
/// is 0; the guess stays), the scale before it (hit), NaN (a NaN gradient; the guess
/// stays), and back.
const STEP_SCALES: [f32; 9] = [1.0, 0.25, 0.25, 2.0, 0.0, 2.0, f32::NAN, 2.0, 1.0];

/// Steps of one loss module (default config) under autodiff, each with fresh logits and
/// `(loss * s).backward()`: every gradient against the f64 reference for its `s`. On the
/// plain cube backend's primitives, the one pass and its rescale with the guess each
/// step's rescale gives for the next (what the module remembers).
fn check_guessed_scales(backend: TestBackend, dtypes: &[DType]) {
    let _backward = shared_device();
    let device = backend.device().autodiff();
    let (rows, vocab) = (37, 129);
    for &dtype in dtypes {
        for reduction in [Reduction::Mean, Reduction::Sum] {
            let seed = fresh_seed();
            let mut rng = rng(seed);
            let loss_fn = FusedCrossEntropyLossConfig::new()
                .with_reduction(reduction)
                .with_label_smoothing(0.05)
                .init(&device);
            let reference_options = RefOptions::new(loss_fn.options(), None);
            let mut guess = cube::first_guess();
            for (step, &scale) in STEP_SCALES.iter().enumerate() {
                let context = format!(
                    "{} {dtype:?} {reduction:?} step {step} scale {scale} seed={seed}",
                    backend.name()
                );
                let values = random_logits(&mut rng, rows, vocab);
                let ignore = if scale.is_nan() {
                    Ignore::NoRows
                } else {
                    Ignore::SomeRows
                };
                let targets = random_targets(&mut rng, rows, vocab, ignore, -100);
                let (seen, grad) = if backend == TestBackend::Cube {
                    let logits = cube::floats(values, &[rows, vocab], dtype);
                    let seen = cube::read(logits.clone()).values;
                    let inputs = cube::inputs(logits, cube::ints(&targets, &[rows]), None);
                    let (_, pending) = cube::tracked_forward(inputs, loss_fn.options(), guess);
                    let (grad, next) = pending.backward(cube::floats(vec![scale], &[1], dtype));
                    guess = next.expect("the one pass gives the next guess");
                    (seen, cube::read(grad).values)
                } else {
                    let (logits, seen) = logits_tensor(values, rows, vocab, dtype, &device);
                    let logits = logits.require_grad();
                    let loss = loss_fn.forward(logits.clone(), targets_tensor(&targets, &device));
                    let grads = (loss * scale).backward();
                    let grad = to_f64(logits.grad(&grads).expect("a gradient for the logits"));
                    (seen, grad)
                };
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
    check_guessed_scales(TestBackend::Cube, &float_dtypes());
}

#[test]
fn guessed_incoming_gradient_on_the_default_fusion_backend() {
    poisoned();
    check_guessed_scales(TestBackend::Fusion, &float_dtypes());
}

#[test]
fn guessed_incoming_gradient_on_flex_through_the_portable_path() {
    check_guessed_scales(TestBackend::Flex, &[DType::F32]);
}

/// A loss of the default config on `[rows, vocab]` logits: one call's result.
fn call(
    loss_fn: &burn_fused_ce::FusedCrossEntropyLoss,
    targets: &[i64],
    vocab: usize,
    device: &Device,
) -> Result<Tensor<1>, CrossEntropyError> {
    let rows = targets.len();
    let values: Vec<f32> = (0..rows * vocab).map(|i| (i % 7) as f32 * 0.5).collect();
    let (logits, _) = logits_tensor(values, rows, vocab, DType::F32, device);
    loss_fn.try_forward(logits, targets_tensor(targets, device))
}

/// The deferred check: the call with a bad target runs (its loss is NaN); the error
/// surfaces at the second call after it, or at `wait_for_target_checks`, naming the
/// earlier call's row. The function layer's (`Tensor<D>`): on a cube device and Flex
/// (the plain cube backend's part, its target check op, is in `bad_input.rs`).
fn check_deferred_check(backend: TestBackend) {
    let _backward = shared_device();
    let device = backend.device();
    let name = backend.name();
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
    let loss_fn = FusedCrossEntropyLossConfig::new().init(&device);
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
    device.sync().expect("device sync");
    call(&loss_fn, &good, vocab, &device).expect("the next call runs");
    let error = call(&loss_fn, &good, vocab, &device).expect_err("the second call reports");
    assert_eq!(error, expected, "{name}");
    assert_eq!(wait_for_target_checks(), Ok(()), "{name}: reported once");
    // `forward` panics with the message.
    call(&loss_fn, &bad, vocab, &device).expect("the bad call itself runs");
    call(&loss_fn, &good, vocab, &device).expect("the next call runs");
    let message = panic_message(|| {
        let values = vec![0.5f32; good.len() * vocab];
        let (logits, _) = logits_tensor(values, good.len(), vocab, DType::F32, &device);
        loss_fn.forward(logits, targets_tensor(&good, &device));
    });
    assert_eq!(message, expected.to_string(), "{name}: forward panics");
    assert!(message.contains("earlier call"), "{name}: {message}");
    assert_eq!(wait_for_target_checks(), Ok(()), "{name}: nothing left");
}

#[test]
fn deferred_target_check_on_the_default_fusion_backend() {
    check_deferred_check(TestBackend::Fusion);
}

#[test]
fn deferred_target_check_on_flex() {
    check_deferred_check(TestBackend::Flex);
}

/// Under autodiff the check is the same, and the gradient of the bad call is still
/// formed (zero on the bad row). On a cube device under autodiff:
/// `Autodiff<Fusion<CubeBackend>>` in this build.
#[test]
fn deferred_target_check_under_autodiff() {
    let _backward = shared_device();
    let device = device().autodiff();
    let vocab = 40;
    let mut targets: Vec<i64> = (0..6).map(|i| i * 5).collect();
    targets[2] = -7;
    let loss_fn = FusedCrossEntropyLossConfig::new()
        .with_reduction(Reduction::Sum)
        .init(&device);
    let values: Vec<f32> = (0..6 * vocab).map(|i| (i % 11) as f32 * 0.3).collect();
    let (logits, _) = logits_tensor(values, 6, vocab, DType::F32, &device);
    let logits = logits.require_grad();
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
