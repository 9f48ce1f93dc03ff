//! The core contract on the plain cube backend and under autodiff: every reduction with a
//! non-uniform incoming gradient, ignore patterns none/some/all, the spec's small and odd
//! shapes plus (512, 32000), every dtype the runtime has. Outputs are poisoned with NaN
//! before each kernel, so an unwritten element fails.

use crate::common::*;
use burn::{
    backend::Autodiff,
    tensor::{DType, Tensor},
};
use burn_fused_ce::{
    CrossEntropyOptions, FusedCrossEntropyBackend, Reduction, diagnostics, fused_cross_entropy,
};

pub(crate) const REDUCTIONS: [Reduction; 3] = [Reduction::None, Reduction::Mean, Reduction::Sum];

#[derive(Debug, Clone, Copy)]
pub(crate) struct Case {
    pub(crate) rows: usize,
    pub(crate) vocab: usize,
    pub(crate) dtype: DType,
    pub(crate) reduction: Reduction,
    pub(crate) ignore: Ignore,
    pub(crate) ignore_index: i64,
    /// Logits are an intermediate nobody else holds (backward may write over them), or a
    /// leaf the test keeps (backward must write a new buffer).
    pub(crate) exclusive_logits: bool,
}

/// Runs forward (untracked and tracked) and backward for one case against the f64
/// reference; panics with the seed on any miss.
pub(crate) fn check_case<B: FusedCrossEntropyBackend>(case: Case)
where
    B::Device: Default,
{
    let _backward = shared_device();
    let seed = fresh_seed();
    let device = B::Device::default();
    let mut rng = rng(seed);
    let Case {
        rows,
        vocab,
        dtype,
        reduction,
        ignore,
        ignore_index,
        ..
    } = case;
    let context = format!("{case:?} seed={seed}");

    let values = random_logits(&mut rng, rows, vocab);
    let targets = random_targets(&mut rng, rows, vocab, ignore, ignore_index);
    let options = CrossEntropyOptions {
        reduction,
        ignore_index,
    };
    let (loss_tol, grad_tol) = tolerance(dtype);

    let (logits, seen) = logits_tensor::<B>(values, rows, vocab, dtype, &device);
    let ref_rows = reference_rows(&seen, vocab, &targets, ignore_index);
    let ref_loss = reference_loss(&ref_rows, reduction);

    // Forward only, on the plain backend.
    let loss = fused_cross_entropy(
        logits.clone(),
        targets_tensor::<B>(&targets, &device),
        &options,
    );
    let expected_len = if reduction == Reduction::None {
        rows
    } else {
        1
    };
    assert_eq!(loss.dims(), [expected_len], "{context}: output shape");
    assert_eq!(loss.dtype(), dtype, "{context}: output dtype");
    let err = relative_l2(&to_f64(loss), &ref_loss);
    assert!(
        err <= loss_tol,
        "{context}: forward loss error {err:e} > {loss_tol:e}"
    );

    // Forward and backward under autodiff, with a non-uniform incoming gradient.
    let leaf = Tensor::<Autodiff<B>, 2>::from_inner(logits).require_grad();
    let logits_ad = if case.exclusive_logits {
        leaf.clone() * 1.0
    } else {
        leaf.clone()
    };
    let loss = fused_cross_entropy(
        logits_ad,
        targets_tensor::<Autodiff<B>>(&targets, &device),
        &options,
    );
    let err = relative_l2(&to_f64(loss.clone().inner()), &ref_loss);
    assert!(
        err <= loss_tol,
        "{context}: tracked loss error {err:e} > {loss_tol:e}"
    );

    let (objective, g) = match reduction {
        Reduction::None => {
            let weights: Vec<f32> = (0..rows).map(|_| rng.random_range(0.25..4.0)).collect();
            let (weights, g) = logits_tensor::<Autodiff<B>>(weights, 1, rows, dtype, &device);
            (((loss * weights.reshape([rows])).sum()), g)
        }
        _ => {
            let g = to_f64(Tensor::<B, 1>::from_floats([3.7], &device).cast(dtype));
            ((loss * 3.7).sum(), g)
        }
    };
    let grads = objective.backward();
    let grad = leaf.grad(&grads).expect("logits get a gradient");
    assert_eq!(grad.dtype(), dtype, "{context}: gradient dtype");
    let grad = to_f64(grad);
    let ref_grad = reference_grad(&seen, vocab, &targets, ignore_index, reduction, &g);
    if ref_grad.iter().all(|v| *v == 0.0) {
        assert!(
            grad.iter().all(|v| *v == 0.0),
            "{context}: gradient must be exactly 0"
        );
    } else {
        let err = relative_l2(&grad, &ref_grad);
        assert!(
            err <= grad_tol,
            "{context}: gradient error {err:e} > {grad_tol:e}"
        );
    }
}

use rand::Rng;

/// Every shape x dtype x reduction x ignore pattern (none, some, all), alternating
/// between exclusive and held logits.
pub(crate) fn check_matrix<B: FusedCrossEntropyBackend>(shapes: &[(usize, usize)], dtypes: &[DType])
where
    B::Device: Default,
{
    let mut n = 0;
    for &(rows, vocab) in shapes {
        for &dtype in dtypes {
            for reduction in REDUCTIONS {
                for ignore in [Ignore::NoRows, Ignore::SomeRows, Ignore::AllRows] {
                    n += 1;
                    check_case::<B>(Case {
                        rows,
                        vocab,
                        dtype,
                        reduction,
                        ignore,
                        ignore_index: -100,
                        exclusive_logits: n % 2 == 0,
                    });
                }
            }
        }
    }
}

pub(crate) fn poisoned() {
    diagnostics::set_poison_outputs(true);
}

/// Spec's small and odd shapes: every reduction, ignore pattern and dtype.
#[test]
fn small_and_odd_shapes_every_reduction_ignore_and_dtype() {
    poisoned();
    // (7, 2000) and (3, 1531) make units take two vectors per step and a tail, with and
    // without vectorised loads.
    let shapes = [
        (2 * 8, 41),
        (9 * 7, 41),
        (3 * 423, 123),
        (1, 1),
        (5, 2),
        (7, 2000),
        (3, 1531),
    ];
    check_matrix::<CubeBackend>(&shapes, &float_dtypes());
}

/// An ignore index inside `[0, V)`: that class is ignored as a target, never as a column.
#[test]
fn ignore_index_inside_the_vocabulary() {
    poisoned();
    for reduction in REDUCTIONS {
        for exclusive_logits in [false, true] {
            check_case::<CubeBackend>(Case {
                rows: 37,
                vocab: 64,
                dtype: DType::F32,
                reduction,
                ignore: Ignore::SomeRows,
                ignore_index: 3,
                exclusive_logits,
            });
        }
    }
}

/// A large vocabulary (vectorised loads, many strides per unit).
#[test]
fn rows_512_vocab_32000() {
    poisoned();
    for (reduction, dtype) in [
        (Reduction::None, DType::F32),
        (Reduction::Mean, DType::F16),
        (Reduction::Sum, DType::F32),
    ] {
        check_case::<CubeBackend>(Case {
            rows: 512,
            vocab: 32000,
            dtype,
            reduction,
            ignore: Ignore::SomeRows,
            ignore_index: -100,
            exclusive_logits: reduction != Reduction::Sum,
        });
    }
}

/// N = 0: 0 for Mean and Sum, an empty vector for None, and backward still runs.
#[test]
fn empty_batch() {
    poisoned();
    let _backward = shared_device();
    let device = Device::default();
    for reduction in REDUCTIONS {
        let leaf = Tensor::<AutodiffCube, 2>::empty([0, 41], &device).require_grad();
        let targets = targets_tensor::<AutodiffCube>(&[], &device);
        let options = CrossEntropyOptions {
            reduction,
            ignore_index: -100,
        };
        let loss = fused_cross_entropy(leaf.clone(), targets, &options);
        match reduction {
            // Not read back: Burn 0.21 on CUDA cannot read an empty tensor (alignment).
            Reduction::None => assert_eq!(loss.dims(), [0], "{reduction:?}"),
            _ => assert_eq!(to_f64(loss.clone().inner()), vec![0.0], "{reduction:?}"),
        }
        // Burn's own `sum` backward cannot broadcast onto a [0] tensor, so None's backward
        // at N = 0 is Burn's to handle; Mean and Sum go through ours.
        if reduction != Reduction::None {
            let grads = loss.sum().backward();
            let grad = leaf.grad(&grads).expect("logits get a gradient");
            assert_eq!(grad.dims(), [0, 41]);
        }
    }
}

/// A confident prediction (target logit = row max + 10): `p_y - 1` is formed in f32, so
/// the target column's gradient keeps its digits in low precision.
#[test]
fn confident_prediction_keeps_target_gradient() {
    poisoned();
    let device = Device::default();
    for dtype in float_dtypes() {
        let _backward = shared_device();
        let seed = fresh_seed();
        let mut rng = rng(seed);
        let (rows, vocab) = (64, 1000);
        let mut values = random_logits(&mut rng, rows, vocab);
        let targets = random_targets(&mut rng, rows, vocab, Ignore::NoRows, -100);
        for (row, &y) in targets.iter().enumerate() {
            let x = &mut values[row * vocab..(row + 1) * vocab];
            let max = x.iter().cloned().fold(f32::MIN, f32::max);
            x[y as usize] = max + 10.0;
        }
        let (logits, seen) = logits_tensor::<AutodiffCube>(values, rows, vocab, dtype, &device);
        let logits = logits.require_grad();
        // Sum, so the target column (about -4e-3) stays a normal f16 number: under Mean
        // over 64 rows it would be an f16 subnormal, imprecise in any implementation.
        let options = CrossEntropyOptions {
            reduction: Reduction::Sum,
            ignore_index: -100,
        };
        let loss = fused_cross_entropy(logits.clone(), targets_tensor(&targets, &device), &options);
        let grads = loss.sum().backward();
        let grad = to_f64(logits.grad(&grads).expect("gradient"));
        let ref_grad = reference_grad(&seen, vocab, &targets, -100, Reduction::Sum, &[1.0]);
        let target_cols = |g: &[f64]| -> Vec<f64> {
            targets
                .iter()
                .enumerate()
                .map(|(r, &y)| g[r * vocab + y as usize])
                .collect()
        };
        let (_, grad_tol) = tolerance(dtype);
        let err = relative_l2(&target_cols(&grad), &target_cols(&ref_grad));
        assert!(
            err <= grad_tol,
            "{dtype:?} seed={seed}: target column error {err:e}"
        );
        eprintln!("{dtype:?}: confident target-column gradient error {err:e}");
        let err = relative_l2(&grad, &ref_grad);
        assert!(
            err <= grad_tol,
            "{dtype:?} seed={seed}: gradient error {err:e}"
        );
    }
}

/// A target outside `[0, V)` that is not the ignore index: that row's loss is NaN and its
/// gradient row zero; other rows are unaffected and nothing is read out of bounds.
#[test]
fn out_of_range_target_poisons_only_its_row() {
    poisoned();
    let _backward = shared_device();
    let seed = fresh_seed();
    let device = Device::default();
    let mut rng = rng(seed);
    let (rows, vocab) = (6, 50);
    let values = random_logits(&mut rng, rows, vocab);
    let mut targets = random_targets(&mut rng, rows, vocab, Ignore::NoRows, -100);
    targets[1] = vocab as i64 + 5;
    targets[4] = -3;
    let (logits, seen) = logits_tensor::<AutodiffCube>(values, rows, vocab, DType::F32, &device);
    let logits = logits.require_grad();
    let options = CrossEntropyOptions {
        reduction: Reduction::None,
        ignore_index: -100,
    };
    let loss = fused_cross_entropy(logits.clone(), targets_tensor(&targets, &device), &options);
    let losses = to_f64(loss.clone().inner());
    let grads = loss.sum().backward();
    let grad = to_f64(logits.grad(&grads).expect("gradient"));
    for row in 0..rows {
        let bad = row == 1 || row == 4;
        let grad_row = &grad[row * vocab..(row + 1) * vocab];
        if bad {
            assert!(
                losses[row].is_nan(),
                "seed={seed}: row {row} loss {}",
                losses[row]
            );
            assert!(
                grad_row.iter().all(|v| *v == 0.0),
                "seed={seed}: row {row} gradient"
            );
        } else {
            let x = &seen[row * vocab..(row + 1) * vocab];
            let expected = lse(x) - x[targets[row] as usize];
            assert!(
                (losses[row] - expected).abs() <= 1e-5 * expected.abs().max(1.0),
                "seed={seed}: row {row}"
            );
            assert!(
                grad_row.iter().all(|v| v.is_finite()),
                "seed={seed}: row {row} gradient"
            );
        }
    }
}
