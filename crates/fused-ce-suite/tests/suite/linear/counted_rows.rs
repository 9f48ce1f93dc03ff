//! `CountedRows`: the fused linear cross-entropy on only the rows whose targets count
//! gives the whole batch's loss and gradients. Against the f64 reference of the whole
//! batch (ignored rows included): every reduction with non-uniform incoming gradients
//! (`None` spread back to the batch's rows), padded sequences `[B, T, H]`, rows ignored
//! here and there, none and all ignored, an ignore index inside the vocabulary, class
//! weights and label smoothing, built from host targets and from device targets, through
//! the module and the function; the ignored rows' hidden-state gradient exactly 0; shape
//! errors. On fusion and Flex.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{DType, Int, Tensor};
use burn_fused_ce::linear::CountedRows;
use burn_fused_ce::{
    CrossEntropyError, Input, LinearCrossEntropyInputs, LmHead, Reduction,
    try_fused_linear_cross_entropy,
};
use rand::Rng;

use crate::common::*;
use crate::linear::{
    LinearCase, LinearValues, bound, check_close, module_config, objective_of, reference_as_seen,
};
use crate::loss::contract::{REDUCTIONS, poisoned};

/// Which rows a case ignores.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pattern {
    /// Each of `B = 2` sequences ends in padding from a random length on (3-D input).
    PaddedSequences,
    /// About a third of the rows, anywhere.
    Scattered,
    NoRows,
    AllRows,
}

/// Where the `CountedRows` come from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Source {
    HostTargets,
    DeviceTargets,
}

fn targets_with(
    pattern: Pattern,
    values: &mut LinearValues,
    case: &LinearCase,
    rng: &mut impl Rng,
) {
    let (ignore_index, rows) = (case.options.ignore_index, case.rows);
    let seq = rows / 2;
    // Each padded sequence has its own length.
    let lengths = [rng.random_range(1..seq), rng.random_range(1..seq)];
    for row in 0..rows {
        let ignored = match pattern {
            Pattern::PaddedSequences => row % seq >= lengths[row / seq],
            Pattern::Scattered => rng.random_range(0..3) == 0,
            Pattern::NoRows => false,
            Pattern::AllRows => true,
        };
        if ignored {
            values.targets[row] = ignore_index;
        } else if values.targets[row] == ignore_index {
            // A counted row whose draw was ignored: a class that is not the ignore index.
            values.targets[row] = (ignore_index + 1).rem_euclid(case.vocab as i64);
        }
    }
}

fn check_counted_case(
    backend: TestBackend,
    case: LinearCase,
    pattern: Pattern,
    source: Source,
    via_module: bool,
) {
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let context = format!(
        "{} {pattern:?} {source:?} module={via_module} {case:?} seed={seed}",
        backend.name()
    );
    let plain = backend.device();
    let device = plain.clone().autodiff();
    let LinearCase {
        rows, width, dtype, ..
    } = case;
    let reduction = case.options.reduction;
    let mut values = LinearValues::draw(&case, &mut rng);
    targets_with(pattern, &mut values, &case, &mut rng);
    let (hidden, weight, bias) = values.tensors(&case, dtype, &plain);
    let reference = reference_as_seen(&case, &values, (&hidden, &weight, &bias));

    let hidden_ad = hidden.autodiff().require_grad();
    let weight_ad = weight.autodiff().require_grad();
    let bias_ad = bias.autodiff().require_grad();
    let three_d = pattern == Pattern::PaddedSequences;
    let targets = targets_tensor(&values.targets, &device);
    let counted = match source {
        Source::HostTargets => {
            CountedRows::from_host_targets(&values.targets, case.options.ignore_index, &device)
        }
        Source::DeviceTargets => {
            CountedRows::read_from_targets(&targets, case.options.ignore_index)
        }
    };
    let expected_counted = values
        .targets
        .iter()
        .filter(|&&t| t != case.options.ignore_index)
        .count();
    assert_eq!(counted.rows(), rows, "{context}");
    assert_eq!(counted.counted(), expected_counted, "{context}");
    assert_eq!(
        counted.selected(),
        expected_counted.max(1),
        "{context}: the first row goes on when none counts"
    );
    let (hidden_in, targets_in) = if three_d {
        (
            counted.hidden(hidden_ad.clone().reshape([2, rows / 2, width])),
            counted.targets(targets.reshape([2, rows / 2])),
        )
    } else {
        (counted.hidden(hidden_ad.clone()), counted.targets(targets))
    };
    let (hidden_in, targets_in) = (
        hidden_in.unwrap_or_else(|e| panic!("{context}: {e}")),
        targets_in.unwrap_or_else(|e| panic!("{context}: {e}")),
    );
    assert_eq!(hidden_in.dims(), [counted.selected(), width], "{context}");
    let class_weights = values.class_weights.clone();
    let loss = if via_module {
        let loss_fn = module_config(&case, class_weights).init(&device);
        let head = Linear {
            weight: Param::from_tensor(weight_ad.clone()),
            bias: Some(Param::from_tensor(bias_ad.clone())),
        };
        loss_fn
            .try_forward(hidden_in, &head, targets_in)
            .unwrap_or_else(|e| panic!("{context}: {e}"))
    } else {
        try_fused_linear_cross_entropy(
            LinearCrossEntropyInputs::new(
                hidden_in,
                LmHead::new(weight_ad.clone()).with_bias(Some(bias_ad.clone())),
                targets_in,
            )
            .with_class_weights(
                class_weights.map(|w| Tensor::<1>::from_floats(w.as_slice(), &device)),
            ),
            &case.options,
            &case.chunking(),
        )
        .unwrap_or_else(|e| panic!("{context}: {e}"))
        .loss
    };
    let loss = match reduction {
        Reduction::None => counted
            .spread(loss)
            .unwrap_or_else(|e| panic!("{context}: {e}")),
        _ => loss,
    };
    let grads =
        objective_of(loss.clone(), reduction, &values.row_grad, values.loss_scale).backward();
    // The module's `Linear` holds the leaves themselves: their gradients are the same.
    let (weight_grad, bias_grad) = (weight_ad.grad(&grads), bias_ad.grad(&grads));
    let grad_hidden = to_f64(hidden_ad.grad(&grads).expect("a hidden-state gradient"));
    let grad_weight = to_f64(weight_grad.expect("a weight gradient"));
    let grad_bias = to_f64(bias_grad.expect("a bias gradient"));

    let (loss_tol, _) = tolerance(dtype);
    check_close(
        &to_f64(loss.inner()),
        &reference.loss,
        loss_tol.max(bound(dtype) / 2.0),
        &format!("{context}: loss"),
    );
    for (row, &target) in values.targets.iter().enumerate() {
        if target == case.options.ignore_index {
            let grad_row = &grad_hidden[row * width..(row + 1) * width];
            assert!(
                grad_row.iter().all(|g| *g == 0.0),
                "{context}: ignored row {row} must get an exactly 0 hidden-state gradient"
            );
        }
    }
    if expected_counted == 0 {
        for (name, grad) in [
            ("hidden", &grad_hidden),
            ("weight", &grad_weight),
            ("bias", &grad_bias),
        ] {
            assert!(
                grad.iter().all(|g| *g == 0.0),
                "{context}: no row counts, the {name} gradient must be 0"
            );
        }
        return;
    }
    for (name, got, expected) in [
        ("hidden", &grad_hidden, &reference.hidden),
        ("weight", &grad_weight, &reference.weight),
        ("bias", &grad_bias, &reference.bias),
    ] {
        check_close(
            got,
            expected,
            bound(dtype),
            &format!("{context}: {name} gradient"),
        );
    }
}

fn check_counted_matrix(backend: TestBackend, dtypes: &[DType]) {
    let patterns = [
        Pattern::PaddedSequences,
        Pattern::Scattered,
        Pattern::NoRows,
        Pattern::AllRows,
    ];
    let mut n = 0;
    for &dtype in dtypes {
        for reduction in REDUCTIONS {
            for pattern in patterns {
                n += 1;
                // 40 rows in chunks of 16: the counted rows rarely fill the last chunk.
                let mut case = LinearCase::new(40, 24, 67, dtype, reduction);
                case.chunk_rows = 16;
                if n % 3 == 0 {
                    case.options.label_smoothing = 0.1;
                    case.class_weights = true;
                }
                if n % 4 == 1 {
                    // An ignore index that is also a class.
                    case.options.ignore_index = 5;
                }
                let source = if n % 2 == 0 {
                    Source::HostTargets
                } else {
                    Source::DeviceTargets
                };
                check_counted_case(backend, case, pattern, source, n % 3 != 1);
            }
        }
    }
}

#[test]
fn counted_rows_give_the_whole_batch_on_the_default_fusion_backend() {
    poisoned();
    let _backward = shared_device();
    check_counted_matrix(TestBackend::Fusion, &float_dtypes());
}

#[test]
fn counted_rows_give_the_whole_batch_on_flex() {
    let _backward = shared_device();
    check_counted_matrix(TestBackend::Flex, &[DType::F32]);
}

#[test]
fn counted_rows_refuse_other_shapes() {
    let device = TestBackend::Fusion.device();
    let targets = [3, -100, 4, 7, -100, 1];
    let counted = CountedRows::from_host_targets(&targets, -100, &device);
    assert_eq!(
        (counted.rows(), counted.counted(), counted.selected()),
        (6, 4, 4)
    );
    let mismatch =
        |result: Result<(), CrossEntropyError>, input: Input, found: &[usize], what: &str| {
            match result {
                Err(CrossEntropyError::ShapeMismatch {
                    input: got,
                    found: got_found,
                    ..
                }) => assert_eq!((got, got_found.as_slice()), (input, found), "{what}"),
                other => panic!("{what}: expected a shape mismatch, got {other:?}"),
            }
        };
    let hidden = Tensor::<2>::ones([5, 8], &device);
    mismatch(
        counted.hidden(hidden).map(drop),
        Input::Hidden,
        &[5, 8],
        "5 hidden rows",
    );
    let hidden = Tensor::<3>::ones([2, 2, 8], &device);
    mismatch(
        counted.hidden(hidden).map(drop),
        Input::Hidden,
        &[2, 2, 8],
        "2 x 2 hidden rows",
    );
    mismatch(
        counted.hidden(Tensor::<1>::ones([6], &device)).map(drop),
        Input::Hidden,
        &[6],
        "1-D hidden states",
    );
    let targets_5 = Tensor::<1, Int>::from_ints([1, 2, 3, 4, 5], &device);
    mismatch(
        counted.targets(targets_5).map(drop),
        Input::Targets,
        &[5],
        "5 targets",
    );
    mismatch(
        counted.spread(Tensor::<1>::ones([6], &device)).map(drop),
        Input::PerRow,
        &[6],
        "6 values for 4 rows",
    );
    // An empty batch passes through.
    let empty = CountedRows::from_host_targets(&[], -100, &device);
    assert_eq!((empty.rows(), empty.counted(), empty.selected()), (0, 0, 0));
    assert!(empty.indices().is_none());
    let hidden = empty
        .hidden(Tensor::<2>::empty([0, 8], &device))
        .expect("an empty batch");
    assert_eq!(hidden.dims(), [0, 8]);
}
