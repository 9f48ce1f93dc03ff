//! An empty batch on every backend, and bad input as an error, never a panic or a silent
//! result.

use burn::backend::TensorMetadata;
use burn::tensor::{DType, Int, Tensor, TensorData};
use burn_fused_ce::backend::{
    IncomingGuess, LinearCrossEntropyBackend, LinearHead, LinearInputs, OptionalFloat, RowWeights,
};
use burn_fused_ce::linear::max_buffer_bytes;
use burn_fused_ce::target_check::wait_for_target_checks;
use burn_fused_ce::{
    CrossEntropyError, CrossEntropyOptions, Input, LinearChunking, LinearCrossEntropyInputs,
    LmHead, Reduction, TargetCheck, try_fused_linear_cross_entropy,
};
use rand::rngs::SmallRng;

use super::uniform;
use crate::common::*;
use crate::cube_primitives::{self as prim, C};
use crate::loss::contract::{REDUCTIONS, poisoned};

/// An empty batch: the loss's `N = 0` results (0 for `Mean` and `Sum`, an empty tensor for
/// `None`), and for `Mean` and `Sum` a backward that gives an empty hidden-state gradient
/// and a zero weight and bias gradient.
fn check_empty_batch(backend: TestBackend) {
    let device = backend.device().autodiff();
    let (width, vocab) = (8, 41);
    for reduction in REDUCTIONS {
        let context = format!("{} {reduction:?}", backend.name());
        let hidden = Tensor::<2>::empty([0, width], &device).require_grad();
        let weight = Tensor::<2>::ones([width, vocab], &device).require_grad();
        let bias = Tensor::<1>::ones([vocab], &device).require_grad();
        let targets = targets_tensor(&[], &device);
        let out = try_fused_linear_cross_entropy(
            LinearCrossEntropyInputs::new(
                hidden.clone(),
                LmHead::new(weight.clone()).with_bias(Some(bias.clone())),
                targets,
            ),
            &CrossEntropyOptions::new(reduction),
            &LinearChunking::default(),
        )
        .unwrap_or_else(|e| panic!("{context}: refused: {e}"));
        if reduction == Reduction::None {
            // Not read back: an empty tensor cannot be read on every runtime.
            assert_eq!(out.loss.dims(), [0], "{context}");
            continue;
        }
        assert_eq!(to_f64(out.loss.clone().inner()), vec![0.0], "{context}");
        let grads = out.loss.backward();
        let grad_hidden = hidden.grad(&grads).expect("a hidden-state gradient");
        assert_eq!(grad_hidden.dims(), [0, width], "{context}");
        let grad_weight = to_f64(weight.grad(&grads).expect("a weight gradient"));
        assert!(grad_weight.iter().all(|v| *v == 0.0), "{context}: weight");
        let grad_bias = to_f64(bias.grad(&grads).expect("a bias gradient"));
        assert!(grad_bias.iter().all(|v| *v == 0.0), "{context}: bias");
    }
}

/// On `Fusion<CubeBackend>` and Flex under autodiff (the plain backend's forward of an
/// empty batch: below).
#[test]
fn empty_batch() {
    poisoned();
    let _backward = shared_device();
    check_empty_batch(TestBackend::Fusion);
    check_empty_batch(TestBackend::Flex);
}

/// The plain `CubeBackend`'s forward of an empty batch, on its primitives: 0 for `Mean`
/// and `Sum`, `[0]` for `None`.
#[test]
fn empty_batch_on_the_cube_backend_primitives() {
    poisoned();
    let _backward = shared_device();
    let (width, vocab) = (8, 41);
    for reduction in REDUCTIONS {
        let inputs = LinearInputs {
            hidden: prim::floats(Vec::new(), &[0, width], DType::F32),
            head: LinearHead {
                weight: prim::floats(vec![1.0; width * vocab], &[width, vocab], DType::F32),
                bias: OptionalFloat::from_option(Some(prim::floats(
                    vec![1.0; vocab],
                    &[vocab],
                    DType::F32,
                ))),
            },
            targets: prim::ints(&[], &[0]),
            class_weights: prim::class_weights(None),
            row_weights: RowWeights::none(),
        };
        let parts = C::fused_linear_cross_entropy(
            inputs,
            CrossEntropyOptions::new(reduction),
            LinearChunking::default().within(max_buffer_bytes(&device()), vocab, DType::F32),
            IncomingGuess::new(),
        );
        if reduction == Reduction::None {
            assert_eq!(prim::dims_of(parts.loss.shape()), vec![0], "{reduction:?}");
        } else {
            assert_eq!(prim::read(parts.loss).values, vec![0.0], "{reduction:?}");
        }
    }
}

/// The plain `CubeBackend`'s op handed a bias of another dtype than the weight's, as a
/// backend caller may (the functions refuse one): the bias is cast to the logits' dtype,
/// and the loss is that of the same bias in the weight's dtype.
#[test]
fn a_bias_of_another_dtype_is_cast_by_the_cube_op() {
    poisoned();
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let (rows, width, vocab) = (9, 8, 37);
    let hidden = uniform(&mut rng, rows * width, 1.0);
    let weight = uniform(&mut rng, width * vocab, 1.0);
    // Values f16 holds exactly.
    let bias: Vec<f32> = uniform(&mut rng, vocab, 2.0)
        .iter()
        .map(|b| (b * 16.0).round() / 16.0)
        .collect();
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    let loss = |bias_dtype: DType| {
        let inputs = LinearInputs {
            hidden: prim::floats(hidden.clone(), &[rows, width], DType::F32),
            head: LinearHead {
                weight: prim::floats(weight.clone(), &[width, vocab], DType::F32),
                bias: OptionalFloat::from_option(Some(prim::floats(
                    bias.clone(),
                    &[vocab],
                    bias_dtype,
                ))),
            },
            targets: prim::ints(&targets, &[rows]),
            class_weights: prim::class_weights(None),
            row_weights: RowWeights::none(),
        };
        let parts = C::fused_linear_cross_entropy(
            inputs,
            CrossEntropyOptions::new(Reduction::None),
            LinearChunking::default().within(max_buffer_bytes(&device()), vocab, DType::F32),
            IncomingGuess::new(),
        );
        prim::read(parts.loss).values
    };
    assert_eq!(loss(DType::F16), loss(DType::F32), "seed={seed}");
}

/// Bad input is an error, never a panic or a silent result, and the error's variant
/// names what was wrong: a head whose width is not the hidden states', a bias or class
/// weights of the wrong length, a head with no classes, a weight or bias of another dtype
/// than the hidden states', hidden states of a dtype the ops do not compute in, targets
/// of a dtype the kernels do not read, chunk budgets below one row of logits or one
/// column of the weight gradient, targets of another row count, an out-of-range target
/// (at once under the immediate check, when waited for under the default deferred one),
/// and an invalid option.
#[test]
fn linear_bad_input_is_an_error() {
    let _backward = shared_device();
    for backend in [TestBackend::Fusion, TestBackend::Flex] {
        let device = backend.device();
        let seed = fresh_seed();
        let mut rng = rng(seed);
        let (rows, width, vocab) = (20, 8, 30);
        let floats = |rng: &mut SmallRng, dims: Vec<usize>| {
            let n = dims.iter().product();
            Tensor::<2>::from_data(TensorData::new(uniform(rng, n, 1.0), dims), &device)
        };
        let hidden = floats(&mut rng, vec![rows, width]);
        let weight = floats(&mut rng, vec![width, vocab]);
        let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
        let targets_t = targets_tensor(&targets, &device);
        let chunking = LinearChunking::default();
        let options = CrossEntropyOptions::default();
        let context = format!("{} seed={seed}", backend.name());
        let call = |inputs, options: &CrossEntropyOptions, chunking: &LinearChunking| {
            try_fused_linear_cross_entropy::<2, 1>(inputs, options, chunking)
                .map(drop)
                .err()
        };
        let refused = |error: Option<CrossEntropyError>, expected: CrossEntropyError| {
            let what = expected.to_string();
            let error = error.unwrap_or_else(|| panic!("{context}: accepted: {what}"));
            assert_eq!(error, expected, "{context}");
        };
        let shape = |input, found: &[usize], error: Option<CrossEntropyError>| match error {
            Some(CrossEntropyError::ShapeMismatch {
                input: got,
                found: got_found,
                ..
            }) => assert_eq!((got, got_found.as_slice()), (input, found), "{context}"),
            other => panic!("{context}: expected a shape mismatch of the {input}, got {other:?}"),
        };
        let inputs = |hidden: &Tensor<2>, head: LmHead| {
            LinearCrossEntropyInputs::new(hidden.clone(), head, targets_t.clone())
        };
        shape(
            Input::Weight,
            &[width + 1, vocab],
            call(
                inputs(
                    &hidden,
                    LmHead::new(floats(&mut rng, vec![width + 1, vocab])),
                ),
                &options,
                &chunking,
            ),
        );
        let long_bias = Tensor::<1>::ones([vocab + 1], &device);
        shape(
            Input::Bias,
            &[vocab + 1],
            call(
                inputs(
                    &hidden,
                    LmHead::new(weight.clone()).with_bias(Some(long_bias)),
                ),
                &options,
                &chunking,
            ),
        );
        shape(
            Input::ClassWeights,
            &[vocab - 1],
            call(
                inputs(&hidden, LmHead::new(weight.clone()))
                    .with_class_weights(Some(Tensor::<1>::ones([vocab - 1], &device))),
                &options,
                &chunking,
            ),
        );
        shape(
            Input::Weight,
            &[width, 0],
            call(
                inputs(&hidden, LmHead::new(floats(&mut rng, vec![width, 0]))),
                &options,
                &chunking,
            ),
        );
        shape(
            Input::Targets,
            &[rows - 1],
            call(
                LinearCrossEntropyInputs::new(
                    hidden.clone(),
                    LmHead::new(weight.clone()),
                    targets_tensor(&targets[1..], &device),
                ),
                &options,
                &chunking,
            ),
        );
        // Dtypes: the head in the hidden states' dtype, those of one the ops compute in,
        // targets of one the kernels read.
        let half_weight = weight.clone().cast(DType::F16);
        refused(
            call(
                inputs(&hidden, LmHead::new(half_weight)),
                &options,
                &chunking,
            ),
            CrossEntropyError::DTypeMismatch {
                input: Input::Weight,
                expected: vec![DType::F32],
                found: DType::F16,
            },
        );
        let half_bias = Tensor::<1>::ones([vocab], &device).cast(DType::F16);
        refused(
            call(
                inputs(
                    &hidden,
                    LmHead::new(weight.clone()).with_bias(Some(half_bias)),
                ),
                &options,
                &chunking,
            ),
            CrossEntropyError::DTypeMismatch {
                input: Input::Bias,
                expected: vec![DType::F32],
                found: DType::F16,
            },
        );
        let u32_targets = Tensor::<1, Int>::from_data(
            TensorData::new(vec![1u32; rows], [rows]),
            (&device, DType::U32),
        );
        refused(
            call(
                LinearCrossEntropyInputs::new(
                    hidden.clone(),
                    LmHead::new(weight.clone()),
                    u32_targets,
                ),
                &options,
                &chunking,
            ),
            CrossEntropyError::DTypeMismatch {
                input: Input::Targets,
                expected: vec![DType::I64, DType::I32],
                found: DType::U32,
            },
        );
        if backend == TestBackend::Flex {
            // Flex holds f64; the ops compute in f32, f16 and bf16 only.
            let wide = |t: &Tensor<2>| t.clone().cast(DType::F64);
            refused(
                call(
                    inputs(&wide(&hidden), LmHead::new(wide(&weight))),
                    &options,
                    &chunking,
                ),
                CrossEntropyError::DTypeMismatch {
                    input: Input::Hidden,
                    expected: vec![DType::F32, DType::F16, DType::BF16],
                    found: DType::F64,
                },
            );
        }
        // One row of f32 logits is `vocab * 4` bytes, one column of the weight gradient
        // `width * 4`.
        for (small, name) in [
            (
                LinearChunking {
                    logits_bytes: Some(vocab * 4 - 1),
                    ..chunking
                },
                "LinearChunking::logits_bytes",
            ),
            (
                LinearChunking {
                    weight_gradient_block_bytes: Some(width * 4 - 1),
                    ..chunking
                },
                "LinearChunking::weight_gradient_block_bytes",
            ),
        ] {
            match call(
                inputs(&hidden, LmHead::new(weight.clone())),
                &options,
                &small,
            ) {
                Some(CrossEntropyError::InvalidOption { name: got, .. }) => {
                    assert_eq!(got, name, "{context}")
                }
                other => panic!("{context}: expected {name} refused, got {other:?}"),
            }
        }
        let mut out_of_range = targets.clone();
        out_of_range[rows / 2] = vocab as i64;
        let out_of_range_inputs = || {
            LinearCrossEntropyInputs::new(
                hidden.clone(),
                LmHead::new(weight.clone()),
                targets_tensor(&out_of_range, &device),
            )
        };
        let bad_target = |earlier_call| CrossEntropyError::TargetOutOfRange {
            row: rows / 2,
            value: vocab as i64,
            vocab,
            earlier_call,
        };
        refused(
            call(
                out_of_range_inputs(),
                &CrossEntropyOptions::default().with_target_check(TargetCheck::Immediate),
                &chunking,
            ),
            bad_target(false),
        );
        // The default, deferred check: the call runs, and waiting for the checks reports
        // the target.
        wait_for_target_checks()
            .unwrap_or_else(|error| panic!("{context}: nothing pending yet: {error}"));
        try_fused_linear_cross_entropy(out_of_range_inputs(), &options, &chunking).unwrap_or_else(
            |error| panic!("{context}: the deferred check refused at once: {error}"),
        );
        assert_eq!(
            wait_for_target_checks(),
            Err(bad_target(true)),
            "{context}: the deferred check reports the target"
        );
        match call(
            inputs(&hidden, LmHead::new(weight.clone())),
            &CrossEntropyOptions::default().with_label_smoothing(1.5),
            &chunking,
        ) {
            Some(CrossEntropyError::InvalidOption { name, .. }) => {
                assert_eq!(name, "label_smoothing", "{context}")
            }
            other => panic!("{context}: expected label smoothing refused, got {other:?}"),
        }
    }
}
