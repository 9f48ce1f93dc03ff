//! The spec's option matrix: temperature, label smoothing, z-loss, softcap, class weights, an ignore
//! index inside `[0, V)` and the extra outputs, each alone and all together, x every
//! reduction x every dtype x exclusive/held logits (x 2-D/3-D, x function/module), against
//! the f64 reference with the spec's tolerances. On the plain cube backend (its
//! primitives), on Burn's default fusion backend (a cube device's `Tensor<D>`), and
//! (smaller) on Flex through the portable path.

use burn::tensor::DType;
use burn_fused_ce::{CrossEntropyOptions, EntropyOutput, ExtraOutputs, Reduction};

use super::contract::{Case, REDUCTIONS, check_case, check_confident, poisoned};
use crate::common::*;

/// The ignore index "inside the vocabulary" for a shape: 42 when `V > 42`.
fn inside_ignore(vocab: usize) -> i64 {
    if vocab > 42 {
        42
    } else if vocab > 1 {
        vocab as i64 / 2
    } else {
        -100
    }
}

/// One option at a time (named, for messages): `(name, options change, class weights)`.
fn single_options(vocab: usize) -> Vec<(&'static str, CrossEntropyOptions, bool)> {
    let base = CrossEntropyOptions::default();
    vec![
        (
            "label_smoothing 0.1",
            base.clone().with_label_smoothing(0.1),
            false,
        ),
        (
            "label_smoothing 1",
            base.clone().with_label_smoothing(1.0),
            false,
        ),
        ("z_loss 1e-4", base.clone().with_z_loss_scale(1e-4), false),
        // Large enough that a wrong z-loss gradient or denominator shows in f16 too.
        ("z_loss 0.05", base.clone().with_z_loss_scale(0.05), false),
        ("softcap 30", base.clone().with_softcap(Some(30.0)), false),
        ("softcap 4", base.clone().with_softcap(Some(4.0)), false),
        (
            "temperature 0.7",
            base.clone().with_temperature(Some(0.7)),
            false,
        ),
        (
            "temperature 2.5 + softcap 4",
            base.clone()
                .with_temperature(Some(2.5))
                .with_softcap(Some(4.0)),
            false,
        ),
        ("class weights", base.clone(), true),
        (
            "ignore inside",
            base.clone().with_ignore_index(inside_ignore(vocab)),
            false,
        ),
        (
            "all outputs",
            base.clone().with_outputs(ExtraOutputs::all()),
            false,
        ),
        // The z-loss under Mean has its own denominator n, the cross-entropy D: with
        // weights they differ.
        (
            "z_loss 0.05 + class weights",
            base.clone()
                .with_z_loss_scale(0.05)
                .with_outputs(ExtraOutputs {
                    z_loss: true,
                    ..ExtraOutputs::default()
                }),
            true,
        ),
        (
            "label_smoothing 0.2 + class weights",
            base.clone().with_label_smoothing(0.2),
            true,
        ),
        (
            "softcap 4 + z_loss 0.05",
            base.clone().with_softcap(Some(4.0)).with_z_loss_scale(0.05),
            false,
        ),
    ]
}

/// Every option at once: temperature 1.3, ls 0.1, z 1e-4, softcap 30, weights in
/// [0.2, 3], ignore 42 (inside `[0, V)`), every extra output.
///
/// Except label smoothing and z-loss when `V = 1`: with one class `p = 1`, the
/// cross-entropy and its gradient are 0 exactly, and what is left is the z-loss alone,
/// `s * x'^2`, often far below 1e-4: an f16 subnormal when the loss is f16, and in f32
/// dominated by the rounding residue of terms that cancel exactly (`ls * (W p - w)`) or
/// by `tanh`'s absolute (not relative) error near 0 on Vulkan. An ill-conditioned
/// measure, not a wrong result; with both off the loss and gradient must be exactly 0.
pub(crate) fn all_options(reduction: Reduction, vocab: usize) -> CrossEntropyOptions {
    let one_class = vocab == 1;
    CrossEntropyOptions::default()
        .with_reduction(reduction)
        .with_ignore_index(inside_ignore(vocab))
        .with_label_smoothing(if one_class { 0.0 } else { 0.1 })
        .with_z_loss_scale(if one_class { 0.0 } else { 1e-4 })
        .with_temperature(Some(1.3))
        .with_softcap(Some(30.0))
        .with_outputs(ExtraOutputs::all())
}

/// The two autodiff plans for `Mean`/`Sum` (gradient formed in forward, or statistics
/// and a backward kernel); `None` has one plan.
pub(crate) fn plans(reduction: Reduction) -> Vec<bool> {
    if reduction == Reduction::None {
        vec![true]
    } else {
        vec![true, false]
    }
}

/// Each option alone x reduction x dtype, on one shape, alternating exclusive/held logits
/// and function/module.
fn check_singles(backend: TestBackend, rows: usize, vocab: usize, dtypes: &[DType]) {
    let mut n = 0;
    for (_name, options, class_weights) in single_options(vocab) {
        for &dtype in dtypes {
            for reduction in REDUCTIONS {
                for one_pass in plans(reduction) {
                    n += 1;
                    check_case(
                        backend,
                        Case {
                            options: options
                                .clone()
                                .with_reduction(reduction)
                                .with_gradient_plan(plan(one_pass)),
                            class_weights,
                            exclusive_logits: n % 2 == 0,
                            via_module: n % 3 == 0,
                            unit_grad: n % 5 == 0,
                            ..Case::new(rows, vocab, dtype, reduction)
                        },
                    );
                }
            }
        }
    }
}

/// Every option on: shapes (2-D, or 3-D `(batch, rows, vocab)`) x reduction x dtype x
/// exclusive/held logits; the module path on every other case.
fn check_combined(
    backend: TestBackend,
    shapes: &[(Option<usize>, usize, usize)],
    dtypes: &[DType],
) {
    let mut n = 0;
    for &(batch, rows, vocab) in shapes {
        for &dtype in dtypes {
            for reduction in REDUCTIONS {
                for (exclusive_logits, one_pass) in
                    [(false, true), (true, true), (false, false), (true, false)]
                {
                    if reduction == Reduction::None && !one_pass {
                        continue;
                    }
                    n += 1;
                    let options = all_options(reduction, vocab).with_gradient_plan(plan(one_pass));
                    check_case(
                        backend,
                        Case {
                            options,
                            class_weights: true,
                            exclusive_logits,
                            batch,
                            via_module: n % 2 == 0,
                            unit_grad: n % 3 == 0,
                            ..Case::new(rows, vocab, dtype, reduction)
                        },
                    );
                }
            }
        }
    }
    for reduction in REDUCTIONS {
        for one_pass in plans(reduction) {
            let options = all_options(reduction, 129).with_gradient_plan(plan(one_pass));
            // Every row ignored, every option on: 0 loss, 0 gradient for Mean (no NaN).
            for exclusive_logits in [false, true] {
                check_case(
                    backend,
                    Case {
                        options: options.clone(),
                        class_weights: true,
                        ignore: Ignore::AllRows,
                        exclusive_logits,
                        unit_grad: exclusive_logits,
                        ..Case::new(37, 129, DType::F32, reduction)
                    },
                );
            }
            // No row ignored.
            check_case(
                backend,
                Case {
                    options,
                    class_weights: true,
                    ignore: Ignore::NoRows,
                    ..Case::new(37, 129, DType::F32, reduction)
                },
            );
        }
    }
}

/// Small for lavapipe; (300, 67) has more rows than a launch has cubes, so cubes walk
/// several rows.
const COMBINED_SHAPES: [(Option<usize>, usize, usize); 5] = [
    (None, 37, 129),
    (None, 5, 2000),
    (None, 1, 1),
    (Some(3), 3 * 4, 41),
    (None, 300, 67),
];

#[test]
fn each_option_alone_on_the_cube_backend() {
    poisoned();
    check_singles(TestBackend::Cube, 37, 129, &float_dtypes());
}

#[test]
fn all_options_together_on_the_cube_backend() {
    poisoned();
    check_combined(TestBackend::Cube, &COMBINED_SHAPES, &float_dtypes());
}

#[test]
fn each_option_alone_on_the_default_fusion_backend() {
    poisoned();
    check_singles(TestBackend::Fusion, 37, 129, &float_dtypes());
}

#[test]
fn all_options_together_on_the_default_fusion_backend() {
    poisoned();
    check_combined(TestBackend::Fusion, &COMBINED_SHAPES, &float_dtypes());
}

#[test]
fn options_on_flex_through_the_portable_path() {
    check_singles(TestBackend::Flex, 37, 129, &[DType::F32]);
    check_combined(
        TestBackend::Flex,
        &[(None, 37, 129), (Some(3), 3 * 4, 41)],
        &[DType::F32],
    );
}

/// Every extra output asked for, with `reduction` and the gradient plan `one_pass` picks.
fn every_output(reduction: Reduction, one_pass: bool) -> CrossEntropyOptions {
    CrossEntropyOptions::new(reduction)
        .with_outputs(ExtraOutputs::all())
        .with_gradient_plan(plan(one_pass))
}

/// Each extra output alone (the others absent) x reduction, with logits rounded to
/// integers so rows have exact ties (argmax: the first of them).
fn check_extra_outputs(backend: TestBackend, dtypes: &[DType], one_pass: bool) {
    let singles = [
        ExtraOutputs {
            z_loss: true,
            ..ExtraOutputs::default()
        },
        ExtraOutputs {
            accuracy: true,
            ..ExtraOutputs::default()
        },
        ExtraOutputs {
            predicted: true,
            ..ExtraOutputs::default()
        },
        ExtraOutputs {
            lse: true,
            ..ExtraOutputs::default()
        },
        ExtraOutputs {
            entropy: EntropyOutput::Metric,
            ..ExtraOutputs::default()
        },
        ExtraOutputs::all(),
    ];
    let mut n = 0;
    for outputs in singles {
        for &dtype in dtypes {
            for reduction in REDUCTIONS {
                for ties in [false, true] {
                    n += 1;
                    check_case(
                        backend,
                        Case {
                            options: CrossEntropyOptions::new(reduction)
                                .with_outputs(outputs)
                                .with_z_loss_scale(if n % 2 == 0 { 1e-3 } else { 0.0 })
                                .with_softcap((n % 3 == 0).then_some(10.0))
                                // The entropy (and the rest) after the temperature too.
                                .with_temperature((n % 5 == 0).then_some(0.7))
                                .with_gradient_plan(plan(one_pass)),
                            ties,
                            exclusive_logits: n % 2 == 1,
                            // With class weights the mean divides by their sum, the accuracy
                            // still by the row count.
                            class_weights: n % 4 < 2,
                            ..Case::new(37, 129, dtype, reduction)
                        },
                    );
                }
            }
        }
    }
    // Accuracy of a batch where every prediction is right (target = row max + 1), and of
    // one with every row ignored (0).
    for reduction in REDUCTIONS {
        check_case(
            backend,
            Case {
                options: every_output(reduction, one_pass),
                confident: Some(1.0),
                ..Case::new(37, 129, DType::F32, reduction)
            },
        );
        check_case(
            backend,
            Case {
                options: CrossEntropyOptions::new(reduction)
                    .with_outputs(ExtraOutputs::all())
                    .with_z_loss_scale(1e-3)
                    .with_gradient_plan(plan(one_pass)),
                ignore: Ignore::AllRows,
                ..Case::new(37, 129, DType::F32, reduction)
            },
        );
    }
    // Rows wider than the one pass stages: the argmax and the entropy of the part that
    // streams by (each step's maximum, the column looked for after the loop), ties
    // included, in vectors of several lanes (the vocabulary is a multiple of 8).
    for &dtype in dtypes {
        for ties in [false, true] {
            check_case(
                backend,
                Case {
                    options: every_output(Reduction::Mean, one_pass),
                    ties,
                    ..Case::new(6, 20480, dtype, Reduction::Mean)
                },
            );
        }
        // The target the first of the row's maxima, tied by every later column: those
        // of its own unit come first, the target's vector last; the argmax is the target.
        check_case(
            backend,
            Case {
                options: every_output(Reduction::Mean, one_pass),
                target_first_of_ties: true,
                ..Case::new(6, 20480, dtype, Reduction::Mean)
            },
        );
        // -inf logits (probability 0, adding 0 to the entropy) among the staged columns
        // and those that stream by, with every output and with the entropy alone (the
        // one pass, taken for `Mean`, then sums its terms unclamped and sums a share
        // again where a -inf made that NaN).
        for reduction in [Reduction::None, Reduction::Mean] {
            let entropy = ExtraOutputs {
                entropy: EntropyOutput::Metric,
                ..ExtraOutputs::default()
            };
            for outputs in [ExtraOutputs::all(), entropy] {
                check_case(
                    backend,
                    Case {
                        options: CrossEntropyOptions::new(reduction)
                            .with_outputs(outputs)
                            .with_gradient_plan(plan(one_pass)),
                        negative_infinities: 40,
                        ..Case::new(6, 20480, dtype, reduction)
                    },
                );
            }
        }
    }
}

#[test]
fn extra_outputs_on_the_cube_backend() {
    poisoned();
    for one_pass in [false, true] {
        check_extra_outputs(TestBackend::Cube, &float_dtypes(), one_pass);
    }
}

#[test]
fn extra_outputs_on_the_default_fusion_backend() {
    poisoned();
    check_extra_outputs(TestBackend::Fusion, &[DType::F32], true);
}

#[test]
fn extra_outputs_on_flex() {
    check_extra_outputs(TestBackend::Flex, &[DType::F32], false);
}

/// Confident predictions (target = row max + 10) in f16 (and bf16 where the runtime has
/// it) with every option on: the target column's gradient within the precision table.
fn check_confident_with_options(backend: TestBackend) {
    for dtype in float_dtypes()
        .into_iter()
        .filter(|&dtype| dtype != DType::F32)
    {
        let all = all_options(Reduction::Sum, 1000).with_outputs(ExtraOutputs::default());
        check_confident(backend, dtype, &all, true);
        // One option at a time as well: smoothing and weights otherwise dominate the
        // target column, hiding the `p_y - 1` cancellation.
        for options in [
            CrossEntropyOptions::new(Reduction::Sum).with_z_loss_scale(1e-4),
            CrossEntropyOptions::new(Reduction::Sum).with_softcap(Some(30.0)),
        ] {
            check_confident(backend, dtype, &options, false);
        }
        check_confident(
            backend,
            dtype,
            &CrossEntropyOptions::new(Reduction::Sum),
            true,
        );
    }
}

#[test]
fn confident_prediction_with_options_on_the_cube_backend() {
    poisoned();
    check_confident_with_options(TestBackend::Cube);
}

#[test]
fn confident_prediction_with_options_on_the_default_fusion_backend() {
    poisoned();
    check_confident_with_options(TestBackend::Fusion);
}

/// The one-pass kernel with rows cut into several chunks whose cubes exchange their
/// partial states: every option together, and the extra outputs with exact ties (the
/// argmax's first column must win across chunks too). CUDA's plan cuts only rows longer
/// than a chunk (16K bf16), so this forces small rows into 2, 3 and 7 chunks. Not on
/// lavapipe: it runs fewer workgroups at once than a row has chunks (and bounds loops), so
/// a cube there could never see its row's other chunks.
#[cfg(feature = "cuda")]
#[test]
fn rows_cut_into_exchanging_chunks() {
    poisoned();
    for chunks in [2, 3, 7] {
        forcing_chunks(chunks, || {
            check_combined(
                TestBackend::Cube,
                &[
                    (None, 37, 129),
                    (Some(3), 3 * 4, 41),
                    (None, 300, 67),
                    (None, 16, 4096),
                ],
                &float_dtypes(),
            );
            check_extra_outputs(TestBackend::Cube, &float_dtypes(), true);
        });
    }
}
