//! An empty batch on every backend, and bad input as an error, never a panic or a silent
//! result.

use burn::backend::TensorMetadata;
use burn::tensor::{DType, Tensor, TensorData};
use burn_fused_ce::backend::{
    IncomingGuess, LinearCrossEntropyBackend, LinearHead, LinearInputs, OptionalFloat,
};
use burn_fused_ce::{
    CrossEntropyOptions, LinearChunking, Reduction, TargetCheck, max_buffer_bytes,
    try_fused_linear_cross_entropy, wait_for_target_checks,
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
            hidden.clone(),
            weight.clone(),
            Some(bias.clone()),
            targets,
            None,
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
        };
        let parts = C::fused_linear_cross_entropy(
            inputs,
            CrossEntropyOptions::new(reduction),
            LinearChunking::default().within(max_buffer_bytes(&device())),
            IncomingGuess::new(),
        );
        if reduction == Reduction::None {
            assert_eq!(prim::dims_of(parts.loss.shape()), vec![0], "{reduction:?}");
        } else {
            assert_eq!(prim::read(parts.loss).values, vec![0.0], "{reduction:?}");
        }
    }
}

/// Bad input is an error, never a panic or a silent result: a head whose width is not
/// the hidden states', a bias or class weights of the wrong length, a head with no
/// classes, chunk budgets below one row of logits or one column of the weight gradient,
/// targets of another row count, an out-of-range target (at once under the immediate check, when waited
/// for under the default deferred one), and an invalid option.
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
        let refused = |result: Result<burn_fused_ce::CrossEntropyOutput<1>, _>, what: &str| {
            let error: burn_fused_ce::CrossEntropyError = result
                .err()
                .unwrap_or_else(|| panic!("{context}: {what} was accepted"));
            assert!(
                !error.to_string().is_empty(),
                "{context}: {what}: a message"
            );
        };
        refused(
            try_fused_linear_cross_entropy(
                hidden.clone(),
                floats(&mut rng, vec![width + 1, vocab]),
                None,
                targets_t.clone(),
                None,
                &options,
                &chunking,
            ),
            "a head of another width",
        );
        refused(
            try_fused_linear_cross_entropy(
                hidden.clone(),
                weight.clone(),
                Some(Tensor::<1>::ones([vocab + 1], &device)),
                targets_t.clone(),
                None,
                &options,
                &chunking,
            ),
            "a bias of another length",
        );
        refused(
            try_fused_linear_cross_entropy(
                hidden.clone(),
                weight.clone(),
                None,
                targets_t.clone(),
                Some(Tensor::<1>::ones([vocab - 1], &device)),
                &options,
                &chunking,
            ),
            "class weights of another length",
        );
        refused(
            try_fused_linear_cross_entropy(
                hidden.clone(),
                floats(&mut rng, vec![width, 0]),
                None,
                targets_t.clone(),
                None,
                &options,
                &chunking,
            ),
            "a head with no classes",
        );
        // One row of f32 logits is `vocab * 4` bytes, one column of the weight gradient
        // `width * 4`.
        for (small, what) in [
            (
                LinearChunking {
                    logits_bytes: Some(vocab * 4 - 1),
                    ..chunking
                },
                "a logits budget below one row",
            ),
            (
                LinearChunking {
                    weight_gradient_block_bytes: Some(width * 4 - 1),
                    ..chunking
                },
                "a weight-gradient block below one column",
            ),
        ] {
            refused(
                try_fused_linear_cross_entropy(
                    hidden.clone(),
                    weight.clone(),
                    None,
                    targets_t.clone(),
                    None,
                    &options,
                    &small,
                ),
                what,
            );
        }
        refused(
            try_fused_linear_cross_entropy(
                hidden.clone(),
                weight.clone(),
                None,
                targets_tensor(&targets[1..], &device),
                None,
                &options,
                &chunking,
            ),
            "targets of another row count",
        );
        let mut out_of_range = targets.clone();
        out_of_range[rows / 2] = vocab as i64;
        refused(
            try_fused_linear_cross_entropy(
                hidden.clone(),
                weight.clone(),
                None,
                targets_tensor(&out_of_range, &device),
                None,
                &CrossEntropyOptions {
                    target_check: TargetCheck::Immediate,
                    ..CrossEntropyOptions::default()
                },
                &chunking,
            ),
            "an out-of-range target under the immediate check",
        );
        // The default, deferred check: the call runs, and waiting for the checks reports
        // the target.
        wait_for_target_checks()
            .unwrap_or_else(|error| panic!("{context}: nothing pending yet: {error}"));
        try_fused_linear_cross_entropy(
            hidden.clone(),
            weight.clone(),
            None,
            targets_tensor(&out_of_range, &device),
            None,
            &options,
            &chunking,
        )
        .unwrap_or_else(|error| panic!("{context}: the deferred check refused at once: {error}"));
        assert!(
            wait_for_target_checks().is_err(),
            "{context}: the deferred check did not report an out-of-range target"
        );
        refused(
            try_fused_linear_cross_entropy(
                hidden.clone(),
                weight.clone(),
                None,
                targets_t.clone(),
                None,
                &CrossEntropyOptions {
                    label_smoothing: 1.5,
                    ..CrossEntropyOptions::default()
                },
                &chunking,
            ),
            "label smoothing of 1.5",
        );
    }
}
