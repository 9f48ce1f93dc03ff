//! Bad input: every refusal the spec lists, through every entry point (`try_` functions
//! return the error, `forward` / `init` panic with its message), non-finite logits (only
//! their rows are affected) and the empty batch on every backend. Refusals are the
//! function layer's (`Tensor<D>`, on a cube device and Flex); the plain cube backend's
//! part of them, the target check op, runs on its primitives.

use std::panic::{AssertUnwindSafe, catch_unwind};

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_fused_ce::backend::FusedCrossEntropyBackend;
use burn_fused_ce::{
    CrossEntropyError, CrossEntropyOptions, ExtraOutputs, FusedCrossEntropyLossConfig,
    GradientPlan, Input, Reduction, TargetCheck, fused_cross_entropy, try_fused_cross_entropy,
};

use super::contract::{Case, REDUCTIONS, check_bad_targets, check_case, check_grad, poisoned};
use crate::call::*;
use crate::common::*;
use crate::cube_primitives::{self as cube, C};
use crate::run_call::tracked_call;

/// Runs `f`, which must panic, and returns its panic message.
pub(crate) fn panic_message(f: impl FnOnce()) -> String {
    let payload = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(()) => panic!("expected a panic"),
        Err(payload) => payload,
    };
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "<non-string panic>".to_string()
    }
}

fn logits<const D: usize>(dims: [usize; D], device: &Device) -> Tensor<D> {
    let len: usize = dims.iter().product();
    let values: Vec<f32> = (0..len)
        .map(|i| ((i * 37) % 23) as f32 * 0.25 - 2.0)
        .collect();
    Tensor::from_data(TensorData::new(values, dims), device)
}

fn targets<const D: usize>(values: &[i64], dims: [usize; D], device: &Device) -> Tensor<D, Int> {
    Tensor::from_data(TensorData::new(values.to_vec(), dims), device)
}

/// The error `try_fused_cross_entropy` gives for `[rows, vocab]` logits on `device`.
fn error_2d(
    device: &Device,
    logits_dims: [usize; 2],
    target_values: &[i64],
    weights: Option<&[f32]>,
    options: &CrossEntropyOptions,
) -> CrossEntropyError {
    let x = logits::<2>(logits_dims, device);
    let y = targets::<1>(target_values, [target_values.len()], device);
    let w = weights.map(|w| Tensor::<1>::from_floats(w, device));
    match try_fused_cross_entropy(x, y, w, options) {
        Ok(_) => panic!(
            "{device:?}: logits {logits_dims:?}, targets {target_values:?}, weights {weights:?}, {options:?} must be refused"
        ),
        Err(e) => e,
    }
}

/// `fused_cross_entropy` (no weights) panics with exactly `error`'s message.
fn assert_forward_panics<const DL: usize, const DT: usize>(
    x: Tensor<DL>,
    y: Tensor<DT, Int>,
    options: &CrossEntropyOptions,
    error: &CrossEntropyError,
) {
    let message = panic_message(|| {
        fused_cross_entropy(x, y, options);
    });
    assert_eq!(
        message,
        error.to_string(),
        "forward panics with the error's message"
    );
}

#[test]
fn out_of_range_targets_name_row_and_value() {
    for backend in [TestBackend::Cube, TestBackend::Fusion, TestBackend::Flex] {
        check_out_of_range(backend);
    }
}

fn check_out_of_range(backend: TestBackend) {
    let _backward = shared_device();
    let device = backend.device();
    let name = backend.name();
    let (rows, vocab) = (8, 10);
    // Reported by the call itself (the deferred default is tested in `defaults.rs`).
    let plain = CrossEntropyOptions::new(Reduction::None).with_target_check(TargetCheck::Immediate);
    let cases: Vec<(Vec<i64>, CrossEntropyOptions, usize, i64)> = vec![
        // Too large: V itself, far past it.
        (vec![0, 1, 2, 10, 4, 5, 6, 7], plain.clone(), 3, 10),
        (
            vec![0, 1, 2, 3, 4, 5, 6, 1_000_000],
            plain.clone(),
            7,
            1_000_000,
        ),
        // Negative but not the ignore index; the first bad row is reported.
        (vec![0, -100, -1, 3, 99, 5, 6, 7], plain.clone(), 2, -1),
        // -100 is a bad target when the ignore index is another value.
        (
            vec![0, 1, 3, 3, 4, -100, 6, 7],
            plain.clone().with_ignore_index(3),
            5,
            -100,
        ),
        // An ignore index past V: that value is ignored, the next is an error.
        (
            vec![0, 1000, 2, 3, 1001, 5, 6, 7],
            plain.clone().with_ignore_index(1000),
            4,
            1001,
        ),
        // Every option and reduction: still the same error.
        (
            vec![0, 1, 2, 3, 4, 5, -7, 7],
            plain
                .clone()
                .with_reduction(Reduction::Mean)
                .with_label_smoothing(0.1)
                .with_z_loss_scale(1e-4)
                .with_softcap(Some(30.0))
                .with_outputs(ExtraOutputs::all()),
            6,
            -7,
        ),
    ];
    for (values, options, row, value) in cases {
        let context = format!("{name} targets {values:?} {options:?}");
        if backend == TestBackend::Cube {
            // The plain backend's part: its target check op, `[first bad row, target]`.
            let found = cube::read_int(C::first_bad_target(
                cube::ints(&values, &[rows]),
                vocab,
                options.ignore_index,
            ));
            assert_eq!(found.values, [row as f64, value as f64], "{context}");
            let mut good = values.clone();
            good[row] = 0;
            let found = cube::read_int(C::first_bad_target(
                cube::ints(&good, &[rows]),
                vocab,
                options.ignore_index,
            ));
            if !good
                .iter()
                .any(|&y| (y < 0 || y >= vocab as i64) && y != options.ignore_index)
            {
                assert_eq!(
                    found.values[0], rows as f64,
                    "{context}: no bad target left"
                );
            }
            continue;
        }
        let expected = CrossEntropyError::TargetOutOfRange {
            row,
            value,
            vocab,
            earlier_call: false,
        };
        for weights in [None, Some(vec![1.5f32; vocab])] {
            let err = error_2d(
                &device,
                [rows, vocab],
                &values,
                weights.as_deref(),
                &options,
            );
            assert_eq!(err, expected, "{context} weights={}", weights.is_some());
        }
        let message = expected.to_string();
        assert!(
            message.contains(&format!("row {row}")) && message.contains(&value.to_string()),
            "{context}: the message names row and value: {message}"
        );
        assert_forward_panics(
            logits::<2>([rows, vocab], &device),
            targets::<1>(&values, [rows], &device),
            &options,
            &expected,
        );
        // The module.
        let module = FusedCrossEntropyLossConfig::new()
            .with_reduction(options.reduction)
            .with_ignore_index(options.ignore_index)
            .with_class_weights(Some(vec![0.5; vocab]))
            .with_target_check(TargetCheck::Immediate)
            .init(&device);
        let err = module
            .try_forward(
                logits::<2>([rows, vocab], &device),
                targets::<1>(&values, [rows], &device),
            )
            .expect_err("the module refuses too");
        assert_eq!(err, expected, "{context}: module");
        let message = panic_message(|| {
            module.forward(
                logits::<2>([rows, vocab], &device),
                targets::<1>(&values, [rows], &device),
            );
        });
        assert_eq!(
            message,
            expected.to_string(),
            "{context}: module forward panics"
        );
        // Under autodiff, before anything is recorded.
        let ad_device = device.clone().autodiff();
        let x = logits::<2>([rows, vocab], &ad_device).require_grad();
        let err =
            try_fused_cross_entropy(x, targets::<1>(&values, [rows], &ad_device), None, &options)
                .err()
                .unwrap_or_else(|| panic!("{context}: autodiff must refuse"));
        assert_eq!(err, expected, "{context}: autodiff");
        // 3-D: the row is counted in row-major order over [B, T].
        let x = logits::<3>([2, 4, vocab], &device);
        let y = targets::<2>(&values, [2, 4], &device);
        let err = try_fused_cross_entropy(x, y, None, &options)
            .err()
            .unwrap_or_else(|| panic!("{context}: 3-D must refuse"));
        assert_eq!(err, expected, "{context}: 3-D");
    }
}

/// `err` is a shape mismatch of `input`, whose shape was `found`.
fn assert_shape(err: &CrossEntropyError, input: Input, found: &[usize], context: &str) {
    match err {
        CrossEntropyError::ShapeMismatch {
            input: got,
            found: got_found,
            expected,
        } => {
            assert_eq!(
                (*got, got_found.as_slice()),
                (input, found),
                "{context}: {err}"
            );
            assert!(!expected.is_empty(), "{context}: says what it expected");
        }
        other => panic!("{context}: expected a shape mismatch of the {input}, got {other:?}"),
    }
}

/// Host checks of the function layer, before anything runs, by variant: on a cube device
/// (`Fusion<CubeBackend>`; the plain backend has no `Tensor<D>` in this build) and on
/// Flex.
#[test]
fn shape_mismatches_are_refused() {
    for backend in [TestBackend::Fusion, TestBackend::Flex] {
        check_shape_mismatches(&backend.device(), backend.name());
    }
}

fn check_shape_mismatches(device: &Device, name: &str) {
    let options = CrossEntropyOptions::default();

    // Rows differ: the targets do not fit the logits.
    let err = error_2d(device, [5, 9], &[1, 2, 3, 4], None, &options);
    assert_shape(&err, Input::Targets, &[4], &format!("{name}: rows differ"));
    assert_forward_panics(
        logits::<2>([5, 9], device),
        targets::<1>(&[1, 2, 3, 4], [4], device),
        &options,
        &err,
    );
    // 3-D logits with 1-D targets (rank).
    let err = try_fused_cross_entropy(
        logits::<3>([2, 3, 9], device),
        targets::<1>(&[1, 2, 3, 4, 5, 6], [6], device),
        None,
        &options,
    )
    .expect_err("rank mismatch refused");
    assert_shape(&err, Input::Targets, &[6], &format!("{name}: rank"));
    assert_forward_panics(
        logits::<3>([2, 3, 9], device),
        targets::<1>(&[1, 2, 3, 4, 5, 6], [6], device),
        &options,
        &err,
    );
    // 2-D logits with 2-D targets.
    let err = try_fused_cross_entropy(
        logits::<2>([6, 9], device),
        targets::<2>(&[1, 2, 3, 4, 5, 6], [2, 3], device),
        None,
        &options,
    )
    .expect_err("rank mismatch refused");
    assert_shape(
        &err,
        Input::Targets,
        &[2, 3],
        &format!("{name}: 2-D targets"),
    );
    // 3-D with the batch and time swapped.
    let err = try_fused_cross_entropy(
        logits::<3>([2, 3, 9], device),
        targets::<2>(&[1, 2, 3, 4, 5, 6], [3, 2], device),
        None,
        &options,
    )
    .expect_err("[2, 3, V] with [3, 2] refused");
    assert_shape(&err, Input::Targets, &[3, 2], &format!("{name}: 3-D dims"));
    // 4-D logits.
    let err = try_fused_cross_entropy(
        logits::<4>([2, 3, 1, 9], device),
        targets::<3>(&[1, 2, 3, 4, 5, 6], [2, 3, 1], device),
        None,
        &options,
    )
    .expect_err("4-D refused");
    assert_shape(&err, Input::Logits, &[2, 3, 1, 9], &format!("{name}: 4-D"));
    // No classes.
    let err = error_2d(device, [3, 0], &[0, 0, 0], None, &options);
    assert_shape(&err, Input::Logits, &[3, 0], &format!("{name}: V = 0"));
    // Weights of the wrong length, through the function and the module.
    for len in [8, 10, 1] {
        let weights = vec![1.0f32; len];
        let context = format!("{name}: weights [{len}] for V = 9");
        let err = error_2d(device, [4, 9], &[1, 2, 3, 4], Some(&weights), &options);
        assert_shape(&err, Input::ClassWeights, &[len], &context);
        let module = FusedCrossEntropyLossConfig::new()
            .with_class_weights(Some(weights))
            .init(device);
        let err = module
            .try_forward(
                logits::<2>([4, 9], device),
                targets::<1>(&[1, 2, 3, 4], [4], device),
            )
            .expect_err("module refuses weights of the wrong length");
        assert_shape(
            &err,
            Input::ClassWeights,
            &[len],
            &format!("{context}: module"),
        );
        let message = panic_message(|| {
            module.forward(
                logits::<2>([4, 9], device),
                targets::<1>(&[1, 2, 3, 4], [4], device),
            );
        });
        assert_eq!(message, err.to_string());
    }
}

/// Every invalid option value, through the function, `try_init`, `init` and `forward` (on
/// a cube device, as `shape_mismatches_are_refused`).
#[test]
fn invalid_options_are_refused() {
    let device = device();
    let base = CrossEntropyOptions::default();
    let cases: Vec<(&str, CrossEntropyOptions)> = [-0.1, 1.5, f32::NAN, f32::INFINITY]
        .into_iter()
        .map(|ls| ("label_smoothing", base.clone().with_label_smoothing(ls)))
        .chain(
            [0.0, -1.0, f32::INFINITY, f32::NAN]
                .into_iter()
                .map(|c| ("softcap", base.clone().with_softcap(Some(c)))),
        )
        .chain(
            [0.0, -1.0, f32::INFINITY, f32::NAN, 1e-40]
                .into_iter()
                .map(|t| ("temperature", base.clone().with_temperature(Some(t)))),
        )
        .chain(
            [-1.0, f32::NAN, f32::INFINITY]
                .into_iter()
                .map(|s| ("z_loss_scale", base.clone().with_z_loss_scale(s))),
        )
        .collect();
    for (name, options) in cases {
        let context = format!("{options:?}");
        let err = options.validate().expect_err(&context);
        assert!(
            matches!(err, CrossEntropyError::InvalidOption { name: n, .. } if n == name),
            "{context}: {err:?}"
        );
        assert!(err.to_string().contains(name), "{context}: {err}");
        // The function, with valid inputs otherwise; also with bad targets (options come
        // first, before anything runs on the device).
        let got = error_2d(&device, [4, 9], &[1, 2, 3, 4], None, &options);
        assert_eq!(got, err, "{context}");
        let got = error_2d(&device, [4, 9], &[1, 2, 3, 40], None, &options);
        assert_eq!(got, err, "{context}: with a bad target too");
        assert_forward_panics(
            logits::<2>([4, 9], &device),
            targets::<1>(&[1, 2, 3, 4], [4], &device),
            &options,
            &err,
        );
        // The module.
        let config = FusedCrossEntropyLossConfig::new()
            .with_label_smoothing(options.label_smoothing)
            .with_temperature(options.temperature)
            .with_softcap(options.softcap)
            .with_z_loss_scale(options.z_loss_scale);
        let got = config.try_init(&device).expect_err(&context);
        assert_eq!(got, err, "{context}: try_init");
        let message = panic_message(|| {
            config.init(&device);
        });
        assert_eq!(message, err.to_string(), "{context}: init panics");
    }
    // The edges of the domains are valid.
    for options in [
        base.clone().with_label_smoothing(0.0),
        base.clone()
            .with_label_smoothing(1.0)
            .with_z_loss_scale(0.0)
            .with_softcap(Some(1e-3))
            .with_temperature(Some(1e-3)),
    ] {
        options.validate().expect("valid");
    }
}

/// A negative or non-finite class weight: checked on the device by the function (on
/// every call, whatever the target check; Burn's tensor ops on a cube device, so
/// `Fusion<CubeBackend>`), on the host by `try_init`.
#[test]
fn invalid_class_weights_are_refused() {
    let device = device();
    let vocab = 9;
    for (class, bad) in [(0, -1.0f32), (4, -1e-6), (8, f32::NAN), (3, f32::INFINITY)] {
        let mut weights = vec![0.7f32; vocab];
        weights[class] = bad;
        let context = format!("weight {bad} at {class}");
        let check = |err: CrossEntropyError, how: &str| match err {
            CrossEntropyError::InvalidClassWeight { class: c, value } => {
                assert_eq!(c, class, "{context} {how}");
                assert!(
                    value == bad || (value.is_nan() && bad.is_nan()),
                    "{context} {how}: value {value}"
                );
            }
            other => panic!("{context} {how}: {other:?}"),
        };
        for reduction in REDUCTIONS {
            let options = CrossEntropyOptions::new(reduction);
            check(
                error_2d(&device, [4, vocab], &[1, 2, 3, 4], Some(&weights), &options),
                "function",
            );
        }
        // Two bad weights: the first is reported.
        let mut two = weights.clone();
        two[vocab - 1] = -5.0;
        if class != vocab - 1 {
            check(
                error_2d(
                    &device,
                    [4, vocab],
                    &[1, 2, 3, 4],
                    Some(&two),
                    &Default::default(),
                ),
                "function, first of two",
            );
        }
        let config = FusedCrossEntropyLossConfig::new().with_class_weights(Some(weights.clone()));
        let err = config.try_init(&device).expect_err(&context);
        let message = err.to_string();
        assert!(message.contains(&class.to_string()), "{context}: {message}");
        check(err.clone(), "try_init");
        let panicked = panic_message(|| {
            config.init(&device);
        });
        assert_eq!(panicked, message, "{context}: init panics");
    }
    // Zero weights are valid (a class that never counts).
    let mut zeros = vec![0.7f32; vocab];
    zeros[2] = 0.0;
    FusedCrossEntropyLossConfig::new()
        .with_class_weights(Some(zeros))
        .try_init(&device)
        .expect("weight 0 is valid");
}

/// NaN and +inf logits poison only their own rows: the other rows' losses and gradients
/// match the reference, nothing crashes.
fn check_non_finite(backend: TestBackend, reduction: Reduction, options_on: bool) {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let context = format!(
        "{} {reduction:?} options={options_on} seed={seed}",
        backend.name()
    );
    let (rows, vocab) = (9, 67);
    let mut values = random_logits(&mut rng, rows, vocab);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::NoRows, -100);
    // Row 1: NaN in another column; row 3: NaN at the target; row 5: +inf in another
    // column; row 7: +inf at the target.
    let other = |row: usize| (targets[row] as usize + 1) % vocab;
    values[vocab + other(1)] = f32::NAN;
    values[3 * vocab + targets[3] as usize] = f32::NAN;
    values[5 * vocab + other(5)] = f32::INFINITY;
    values[7 * vocab + targets[7] as usize] = f32::INFINITY;
    let bad = [1, 3, 5, 7];
    // Softcap turns +inf into c (finite): only NaN rows stay bad then.
    let options = if options_on {
        CrossEntropyOptions::new(reduction)
            .with_label_smoothing(0.1)
            .with_z_loss_scale(1e-4)
    } else {
        CrossEntropyOptions::new(reduction)
    };
    let weights = options_on.then(|| random_class_weights(&mut rng, vocab));
    let reference = RefOptions::new(&options, weights.as_deref());
    // Backward from `loss.sum()`.
    let call = Call::new(
        values,
        (rows, vocab),
        DType::F32,
        &targets,
        weights.as_deref(),
        &options,
    );
    let tracked =
        tracked_call(backend, &call).unwrap_or_else(|e| panic!("{context}: refused: {e}"));
    let seen = &tracked.seen;
    let losses = &tracked.out.loss.values;
    let ref_rows = reference_rows(seen, vocab, &targets, &reference);
    match reduction {
        Reduction::None => {
            for row in 0..rows {
                if bad.contains(&row) {
                    assert!(
                        !losses[row].is_finite(),
                        "{context}: row {row} loss {} must be NaN/inf",
                        losses[row]
                    );
                } else {
                    let expected = ref_rows[row].loss();
                    assert!(
                        (losses[row] - expected).abs() <= 1e-5 * expected.abs().max(1.0),
                        "{context}: row {row} loss {} expected {expected}",
                        losses[row]
                    );
                }
            }
        }
        _ => assert!(
            !losses[0].is_finite(),
            "{context}: reduced loss {}",
            losses[0]
        ),
    }
    let grad = &tracked.grad.values;
    let ref_grad = reference_grad(seen, vocab, &targets, &reference, &tracked.g);
    let good = |v: &[f64]| -> Vec<f64> {
        (0..rows)
            .filter(|r| !bad.contains(r))
            .flat_map(|r| v[r * vocab..(r + 1) * vocab].to_vec())
            .collect()
    };
    check_grad(
        &good(grad),
        &good(&ref_grad),
        DType::F32,
        &format!("{context}: finite rows"),
    );
}

#[test]
fn non_finite_logits_poison_only_their_rows() {
    poisoned();
    for reduction in REDUCTIONS {
        for options_on in [false, true] {
            for backend in [TestBackend::Cube, TestBackend::Fusion, TestBackend::Flex] {
                check_non_finite(backend, reduction, options_on);
            }
        }
    }
}

/// -inf in a column that is not the target is an ordinary logit (probability 0), as in
/// PyTorch: finite loss, finite gradient, 0 in that column.
#[test]
fn negative_infinite_logit_is_a_zero_probability() {
    poisoned();
    let _backward = shared_device();
    for backend in [TestBackend::Cube, TestBackend::Fusion] {
        let seed = fresh_seed();
        let context = format!("{} seed={seed}", backend.name());
        let mut rng = rng(seed);
        let (rows, vocab) = (4, 33);
        let mut values = random_logits(&mut rng, rows, vocab);
        let targets = random_targets(&mut rng, rows, vocab, Ignore::NoRows, -100);
        for row in 0..rows {
            values[row * vocab + (targets[row] as usize + 1 + row) % vocab] = f32::NEG_INFINITY;
        }
        let options = CrossEntropyOptions::new(Reduction::None);
        let reference = RefOptions::new(&options, None);
        // Backward from `loss.sum()`.
        let call = Call::new(values, (rows, vocab), DType::F32, &targets, None, &options);
        let tracked =
            tracked_call(backend, &call).unwrap_or_else(|e| panic!("{context}: refused: {e}"));
        let losses = &tracked.out.loss.values;
        let ref_rows = reference_rows(&tracked.seen, vocab, &targets, &reference);
        let ref_loss = reference_loss(&ref_rows, Reduction::None);
        let err = relative_l2(losses, &ref_loss);
        assert!(
            err <= 1e-5,
            "{context}: loss {losses:?} expected {ref_loss:?}"
        );
        let ref_grad = reference_grad(&tracked.seen, vocab, &targets, &reference, &tracked.g);
        check_grad(&tracked.grad.values, &ref_grad, DType::F32, &context);
    }
}

/// The empty batch's config: every option and extra output on.
fn empty_config(reduction: Reduction) -> FusedCrossEntropyLossConfig {
    FusedCrossEntropyLossConfig::new()
        .with_reduction(reduction)
        .with_label_smoothing(0.1)
        .with_z_loss_scale(1e-4)
        .with_softcap(Some(30.0))
        .with_class_weights(Some(vec![0.5; 41]))
        .with_outputs(ExtraOutputs::all())
}

/// N = 0 on every backend, every option on: 0 for Mean/Sum (and their gradient runs),
/// an empty `[0]` for None (not read back: see contract.rs `empty_batch`).
fn check_empty(backend: TestBackend) {
    let _backward = shared_device();
    if backend == TestBackend::Cube {
        return check_empty_on_primitives();
    }
    let device = backend.device().autodiff();
    for reduction in REDUCTIONS {
        let context = format!("{} {reduction:?}", backend.name());
        let module = empty_config(reduction).init(&device);
        let leaf = Tensor::<2>::empty([0, 41], &device).require_grad();
        let out = module
            .try_forward_with_outputs(leaf.clone(), targets_tensor(&[], &device))
            .unwrap_or_else(|e| panic!("{context}: refused: {e}"));
        if reduction == Reduction::None {
            assert_eq!(out.loss.dims(), [0], "{context}");
            continue;
        }
        assert_eq!(to_f64(out.loss.clone().inner()), vec![0.0], "{context}");
        assert_eq!(
            to_f64(out.accuracy.clone().expect("accuracy").inner()),
            vec![0.0],
            "{context}"
        );
        let grads = out.loss.sum().backward();
        assert_eq!(
            leaf.grad(&grads).expect("gradient").dims(),
            [0, 41],
            "{context}"
        );
    }
}

/// The plain cube backend at N = 0, as `Autodiff` calls it (the two-pass plan: the one
/// pass needs rows).
fn check_empty_on_primitives() {
    for reduction in REDUCTIONS {
        let context = format!("CubeBackend {reduction:?}");
        let options = empty_config(reduction).options();
        let weights = vec![0.5f32; 41];
        let inputs = cube::inputs(
            cube::floats(Vec::new(), &[0, 41], DType::F32),
            cube::ints(&[], &[0]),
            Some(&weights),
        );
        let (parts, pending) = cube::tracked_forward(inputs, &options, cube::first_guess());
        if reduction == Reduction::None {
            assert_eq!(
                cube::dims_of(burn::backend::TensorMetadata::shape(&parts.loss)),
                [0],
                "{context}"
            );
            continue;
        }
        assert_eq!(cube::read(parts.loss).values, vec![0.0], "{context}");
        let accuracy = parts.accuracy.into_option().expect("accuracy");
        assert_eq!(cube::read(accuracy).values, vec![0.0], "{context}");
        let (grad, _) = pending.backward(cube::floats(vec![1.0], &[1], DType::F32));
        assert_eq!(
            cube::dims_of(burn::backend::TensorMetadata::shape(&grad)),
            [0, 41],
            "{context}"
        );
    }
}

#[test]
fn empty_batch_on_every_backend() {
    poisoned();
    for backend in [TestBackend::Cube, TestBackend::Fusion, TestBackend::Flex] {
        check_empty(backend);
    }
}

/// `TargetCheck::Off` on the fusion backend and Flex too: a NaN loss and a zero gradient
/// row for the bad rows only (the plain backend is in contract.rs).
#[test]
fn unchecked_out_of_range_target_on_other_backends() {
    poisoned();
    for reduction in [Reduction::None, Reduction::Sum] {
        let options = CrossEntropyOptions::new(reduction)
            .with_target_check(TargetCheck::Off)
            .with_label_smoothing(0.1);
        check_bad_targets(TestBackend::Fusion, &options, true);
        check_bad_targets(TestBackend::Flex, &options, true);
    }
}

/// Logits far from the few units models produce: f32 of up to 1e4 (where the f32
/// log-sum-exp's own rounding is 5e-4: the gradient must carry its low part), f16 of up
/// to 3e4 and bf16 of up to 1e38 (CUDA), per row and both gradient plans. Where PyTorch's
/// loss is finite (each row's loss, up to twice the largest logit, fits the dtype), ours
/// is, within the spec's precision table.
#[test]
fn extreme_logits_stay_finite_and_precise() {
    poisoned();
    let mut cases = vec![
        (
            DType::F32,
            Some(1e4),
            0.0,
            Reduction::None,
            GradientPlan::TwoPass,
        ),
        (
            DType::F32,
            Some(1e4),
            0.0,
            Reduction::Mean,
            GradientPlan::OnePass,
        ),
        // A few units apart, so that many columns' probabilities count (the second with
        // label smoothing and class weights below).
        (DType::F32, None, 1e4, Reduction::Sum, GradientPlan::TwoPass),
        (
            DType::F32,
            None,
            -1e4,
            Reduction::Mean,
            GradientPlan::OnePass,
        ),
        (
            DType::F32,
            None,
            1e4,
            Reduction::None,
            GradientPlan::OnePass,
        ),
        (
            DType::F16,
            Some(3e4),
            0.0,
            Reduction::None,
            GradientPlan::TwoPass,
        ),
        (
            DType::F16,
            Some(3e4),
            0.0,
            Reduction::Mean,
            GradientPlan::OnePass,
        ),
    ];
    if SUPPORTS_BF16 {
        // A row sum of such losses would overflow f32, PyTorch's too: per row only.
        cases.push((
            DType::BF16,
            Some(1e38),
            0.0,
            Reduction::None,
            GradientPlan::TwoPass,
        ));
    }
    for (dtype, magnitude, shift, reduction, plan) in cases {
        let mut case = Case {
            magnitude,
            shift,
            exclusive_logits: true,
            ..Case::new(64, 1000, dtype, reduction)
        };
        case.options.gradient_plan = plan;
        if shift != 0.0 && reduction != Reduction::Sum {
            // Smoothing's `sum_c w_c (lse - x_c)` from two large sums would cancel.
            case.options.label_smoothing = 0.1;
            case.class_weights = reduction == Reduction::None;
        }
        if dtype == DType::F32 {
            // The portable path forms the same statistics with Burn's ops.
            check_case(TestBackend::Flex, case.clone());
        }
        check_case(TestBackend::Fusion, case);
    }
}
