//! Dtypes where the loss receives its inputs: logits of a dtype the ops compute in,
//! targets of one the kernels read (refused by variant otherwise), class weights of any
//! float dtype (cast to f32, by the functions and by the cube ops alike), and 64-bit
//! targets that 32 bits cannot hold read as bad classes, never as their low bits.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_fused_ce::backend::{ClassWeights, FusedCrossEntropyBackend, IncomingGuess};
use burn_fused_ce::target_check::wait_for_target_checks;
use burn_fused_ce::vocab_parallel::{
    InProcessExchange, VocabShard, try_vocab_parallel_cross_entropy,
};
use burn_fused_ce::{
    CrossEntropyError, CrossEntropyOptions, GradientPlan, Input, Reduction, TargetCheck,
    try_fused_cross_entropy,
};

use super::contract::check_grad;
use crate::common::*;
use crate::cube_primitives::{self as prim, C};

/// `try_fused_cross_entropy`'s error for these logits and targets, without class weights.
fn refusal<const DL: usize>(
    logits: Tensor<DL>,
    targets: Tensor<1, Int>,
    options: &CrossEntropyOptions,
) -> CrossEntropyError {
    match try_fused_cross_entropy(logits, targets, None, options) {
        Ok(_) => panic!("accepted"),
        Err(error) => error,
    }
}

/// Logits of f64 (where the backend holds them) and targets of u32 are refused by
/// variant, through the loss and the vocabulary-parallel loss, on the cube device and on
/// Flex.
#[test]
fn logits_and_targets_of_other_dtypes_are_refused() {
    for backend in [TestBackend::Fusion, TestBackend::Flex] {
        let device = backend.device();
        let seed = fresh_seed();
        let mut rng = rng(seed);
        let context = format!("{} seed={seed}", backend.name());
        let (rows, vocab) = (6, 11);
        let (logits, _) = logits_tensor(
            random_logits(&mut rng, rows, vocab),
            rows,
            vocab,
            DType::F32,
            &device,
        );
        let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
        let options = CrossEntropyOptions::default();
        let u32_targets = Tensor::<1, Int>::from_data(
            TensorData::new(vec![1u32; rows], [rows]),
            (&device, DType::U32),
        );
        let wrong_targets = CrossEntropyError::DTypeMismatch {
            input: Input::Targets,
            expected: vec![DType::I64, DType::I32],
            found: DType::U32,
        };
        assert_eq!(
            refusal(logits.clone(), u32_targets.clone(), &options),
            wrong_targets,
            "{context}"
        );
        let shard = VocabShard::new(0, 1, vocab).expect("one shard");
        let exchange = InProcessExchange::new(1);
        let vocab_parallel = |logits: Tensor<2>, targets: Tensor<1, Int>| {
            try_vocab_parallel_cross_entropy(logits, targets, None, &shard, &options, &exchange)
                .map(drop)
                .expect_err("refused")
        };
        assert_eq!(
            vocab_parallel(logits.clone(), u32_targets),
            wrong_targets,
            "{context}: vocabulary-parallel"
        );
        if backend == TestBackend::Flex {
            // Flex holds f64; the ops compute in f32, f16 and bf16.
            let wrong_logits = CrossEntropyError::DTypeMismatch {
                input: Input::Logits,
                expected: vec![DType::F32, DType::F16, DType::BF16],
                found: DType::F64,
            };
            let wide = logits.clone().cast(DType::F64);
            let targets = targets_tensor(&targets, &device);
            assert_eq!(
                refusal(wide.clone(), targets.clone(), &options),
                wrong_logits,
                "{context}"
            );
            assert_eq!(
                vocab_parallel(wide, targets),
                wrong_logits,
                "{context}: vocabulary-parallel"
            );
        }
    }
}

/// Class weights of f16 are cast to f32: the loss and its gradient are those of the same
/// weights in f32, through the function on the cube device and Flex, and through the
/// plain cube backend's op handed f16 weights directly.
#[test]
fn class_weights_of_any_float_dtype_are_cast() {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let (rows, vocab) = (7, 13);
    let values = random_logits(&mut rng, rows, vocab);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    // Weights that f16 holds exactly, so that both runs see the same numbers.
    let weights: Vec<f32> = random_class_weights(&mut rng, vocab)
        .iter()
        .map(|w| (w * 8.0).round() / 8.0 + 0.125)
        .collect();
    let options =
        CrossEntropyOptions::new(Reduction::Mean).with_gradient_plan(GradientPlan::TwoPass);
    for backend in [TestBackend::Fusion, TestBackend::Flex] {
        let device = backend.device().autodiff();
        let context = format!("{} seed={seed}", backend.name());
        let run = |dtype: DType| {
            let (logits, seen) = logits_tensor(values.clone(), rows, vocab, DType::F32, &device);
            let logits = logits.require_grad();
            let weights = Tensor::<1>::from_floats(weights.as_slice(), &device).cast(dtype);
            let out = try_fused_cross_entropy(
                logits.clone(),
                targets_tensor(&targets, &device),
                Some(weights),
                &options,
            )
            .unwrap_or_else(|error| panic!("{context}: {dtype:?} weights refused: {error}"));
            let loss = to_f64(out.loss.clone());
            let grad = to_f64(logits.grad(&out.loss.backward()).expect("tracked"));
            (loss, grad, seen)
        };
        let (loss, grad, seen) = run(DType::F32);
        let (half_loss, half_grad, _) = run(DType::F16);
        assert_eq!(half_loss, loss, "{context}: the loss");
        assert_eq!(half_grad, grad, "{context}: the gradient");
        let reference = RefOptions::new(&options, Some(&weights));
        let ref_grad = reference_grad(&seen, vocab, &targets, &reference, &[1.0]);
        check_grad(&grad, &ref_grad, DType::F32, &context);
    }
    // The plain cube backend's op, handed the weights in f16 as a backend caller may.
    let stats = |dtype: DType| {
        let weights = prim::floats(weights.clone(), &[vocab], dtype);
        let inputs = burn_fused_ce::backend::CrossEntropyInputs {
            logits: prim::floats(values.clone(), &[rows, vocab], DType::F32),
            targets: prim::ints(&targets, &[rows]),
            class_weights: ClassWeights::Weighted {
                total: prim::cast(
                    <C as burn::backend::ops::FloatTensorOps<C>>::float_sum(prim::cast(
                        weights.clone(),
                        DType::F32,
                    )),
                    dtype,
                ),
                weights,
            },
            row_weights: burn_fused_ce::backend::RowWeights::none(),
        };
        let parts = C::fused_cross_entropy(
            inputs,
            CrossEntropyOptions::new(Reduction::None),
            IncomingGuess::new(),
        );
        prim::read(parts.loss).values
    };
    assert_eq!(
        stats(DType::F16),
        stats(DType::F32),
        "seed={seed}: the cube op casts f16 class weights"
    );
}

/// Targets that 32 bits cannot hold: `2^32 + 5` (whose low bits are class 5) and
/// `-2^32 - 100` (whose low bits are the ignore index -100). Each is a bad class: the
/// immediate check reports the first with its whole value, the deferred check reports it
/// when waited for, and with the check off their rows get a NaN loss and a zero
/// gradient while the other rows are the reference's. On every backend with 64-bit
/// ints: Flex, and on CUDA the cube device and the plain cube backend's check op.
#[test]
fn wide_targets_are_bad_classes_not_their_low_bits() {
    let _backward = shared_device();
    let mut backends = vec![TestBackend::Flex];
    if fused_ce_suite::SUPPORTS_I64 {
        backends.push(TestBackend::Fusion);
        check_wide_targets_on_the_cube_check_op();
    }
    for backend in backends {
        check_wide_targets(&backend.device(), backend.name());
    }
}

const WIDE: i64 = (1 << 32) + 5;
const WIDE_NEGATIVE: i64 = -(1 << 32) - 100;

fn wide_targets(device: &Device, targets: &[i64]) -> Tensor<1, Int> {
    Tensor::<1, Int>::from_data(
        TensorData::new(targets.to_vec(), [targets.len()]),
        (device, DType::I64),
    )
}

fn check_wide_targets(device: &Device, name: &str) {
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let context = format!("{name} seed={seed}");
    let (rows, vocab) = (6, 9);
    let values = random_logits(&mut rng, rows, vocab);
    let targets = [1, 3, WIDE, 0, WIDE_NEGATIVE, -100];
    let bad = |earlier_call| CrossEntropyError::TargetOutOfRange {
        row: 2,
        value: WIDE,
        vocab,
        earlier_call,
    };
    let immediate = CrossEntropyOptions::default().with_target_check(TargetCheck::Immediate);
    let (logits, _) = logits_tensor(values.clone(), rows, vocab, DType::F32, device);
    assert_eq!(
        refusal(logits.clone(), wide_targets(device, &targets), &immediate),
        bad(false),
        "{context}: immediate"
    );
    wait_for_target_checks().unwrap_or_else(|error| panic!("{context}: pending: {error}"));
    try_fused_cross_entropy(
        logits,
        wide_targets(device, &targets),
        None,
        &CrossEntropyOptions::default(),
    )
    .unwrap_or_else(|error| panic!("{context}: deferred refused at once: {error}"));
    assert_eq!(
        wait_for_target_checks(),
        Err(bad(true)),
        "{context}: deferred"
    );

    // With the check off, per row, with a non-uniform incoming gradient.
    let ad = device.clone().autodiff();
    let (logits, seen) = logits_tensor(values, rows, vocab, DType::F32, &ad);
    let logits = logits.require_grad();
    let options = CrossEntropyOptions::new(Reduction::None).with_target_check(TargetCheck::Off);
    let out = try_fused_cross_entropy(logits.clone(), wide_targets(&ad, &targets), None, &options)
        .unwrap_or_else(|error| panic!("{context}: refused: {error}"));
    let incoming: Vec<f32> = (0..rows).map(|row| 0.5 + row as f32 * 0.25).collect();
    let loss = to_f64(out.loss.clone());
    let objective = (out.loss * Tensor::<1>::from_floats(incoming.as_slice(), &ad)).sum();
    let grad = to_f64(logits.grad(&objective.backward()).expect("tracked"));
    let reference = RefOptions::new(&options, None);
    let ref_rows = reference_rows(&seen, vocab, &targets, &reference);
    for (row, (got, want)) in loss
        .iter()
        .zip(reference_loss(&ref_rows, Reduction::None))
        .enumerate()
    {
        if targets[row] == WIDE || targets[row] == WIDE_NEGATIVE {
            assert!(
                got.is_nan(),
                "{context}: row {row} is a bad class, loss {got}"
            );
        } else {
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{context}: row {row}: {got} against {want}"
            );
        }
    }
    let g: Vec<f64> = incoming.iter().map(|&g| g as f64).collect();
    let ref_grad = reference_grad(&seen, vocab, &targets, &reference, &g);
    check_grad(&grad, &ref_grad, DType::F32, &context);
    for row in [2, 4] {
        assert!(
            grad[row * vocab..(row + 1) * vocab]
                .iter()
                .all(|&g| g == 0.0),
            "{context}: row {row} has a zero gradient"
        );
    }
}

/// The plain cube backend's target check, handed 64-bit targets: the first wide one,
/// with its whole value.
fn check_wide_targets_on_the_cube_check_op() {
    let (rows, vocab) = (6, 9);
    let targets = [1, 3, WIDE_NEGATIVE, 0, WIDE, -100];
    let ints = <C as burn::backend::ops::IntTensorOps<C>>::int_from_data(
        TensorData::new(targets.to_vec(), [rows]),
        &prim::cube(),
    );
    assert_eq!(burn::backend::TensorMetadata::dtype(&ints), DType::I64);
    let found = prim::read_int(C::first_bad_target(ints, vocab, -100));
    assert_eq!(found.values, [2.0, WIDE_NEGATIVE as f64]);
}
