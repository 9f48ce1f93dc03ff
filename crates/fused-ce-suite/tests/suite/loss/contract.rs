//! The core contract on the plain cube backend (its primitives: see
//! `cube_primitives.rs`) and under autodiff: every reduction with a non-uniform incoming
//! gradient, ignore patterns none/some/all, the spec's small and odd shapes plus
//! (512, 32000), every dtype the runtime has. Outputs are poisoned with NaN before each
//! kernel, so an unwritten element fails.

use crate::call::*;
use crate::common::*;
use crate::run_call::{tracked_call, untracked_call};
use burn::tensor::{DType, Int, Tensor};
use burn_fused_ce::{
    CrossEntropyError, CrossEntropyOptions, EntropyOutput, ExtraOutputs, Reduction, TargetCheck,
    fused_cross_entropy, test_hooks, try_fused_cross_entropy,
};
use rand::Rng;

pub(crate) const REDUCTIONS: [Reduction; 3] = [Reduction::None, Reduction::Mean, Reduction::Sum];

/// One checked configuration: shape, dtype, options, class weights, buffer ownership.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub(crate) rows: usize,
    pub(crate) vocab: usize,
    pub(crate) dtype: DType,
    pub(crate) ignore: Ignore,
    /// Every option but the class weights (drawn per run when `class_weights` is set).
    pub(crate) options: CrossEntropyOptions,
    /// Random class weights in [0.2, 3].
    pub(crate) class_weights: bool,
    /// Logits nobody else holds (backward may write over them), or a leaf the test keeps
    /// (backward must write a new buffer).
    pub(crate) exclusive_logits: bool,
    /// `Some(b)`: logits `[b, rows / b, V]` with targets `[b, rows / b]`.
    pub(crate) batch: Option<usize>,
    /// Through `FusedCrossEntropyLossConfig::try_init(..).try_forward_with_outputs`
    /// instead of `try_fused_cross_entropy`.
    pub(crate) via_module: bool,
    /// `Some(m)`: target logit = row max + m on every row.
    pub(crate) confident: Option<f32>,
    /// Logits rounded to integers: rows with exact ties (argmax: the first).
    pub(crate) ties: bool,
    /// Backward from `loss.sum()` (an incoming gradient of exactly 1, which the
    /// forward-formed plan does not rescale) instead of a non-uniform one.
    pub(crate) unit_grad: bool,
    /// `Some(m)`: logits uniform in `[-m, m)` instead of a few units.
    pub(crate) magnitude: Option<f32>,
    /// Added to every logit last: rows far from 0 whose probabilities are spread.
    pub(crate) shift: f32,
    /// This many random columns (never the target's) of every other row set to -inf:
    /// classes of probability 0.
    pub(crate) negative_infinities: usize,
    /// Each counted row's target logit set above the row's others, and every later
    /// column of the row to the same value: the target is the first of the ties, so the
    /// argmax (and the accuracy) is the target, whichever column a kernel meets first.
    pub(crate) target_first_of_ties: bool,
}

impl Case {
    /// Defaults: some rows ignored (-100), no other option, held logits, 2-D, function.
    pub(crate) fn new(rows: usize, vocab: usize, dtype: DType, reduction: Reduction) -> Self {
        Self {
            rows,
            vocab,
            dtype,
            ignore: Ignore::SomeRows,
            options: CrossEntropyOptions::new(reduction),
            class_weights: false,
            exclusive_logits: false,
            batch: None,
            via_module: false,
            confident: None,
            ties: false,
            unit_grad: false,
            magnitude: None,
            shift: 0.0,
            negative_infinities: 0,
            target_first_of_ties: false,
        }
    }

    pub(crate) fn reduction(&self) -> Reduction {
        self.options.reduction
    }
}

/// Whether the kernel's argmax `got` is right against the reference `expected` (first
/// index of the maximum of the capped f64 logits): equal, or with softcap a near-tie that
/// the f32 `tanh` may order differently.
pub(crate) fn argmax_ok(capped_row: &[f64], got: i64, expected: i64, softcap: bool) -> bool {
    if got == expected {
        return true;
    }
    if !softcap || got < 0 || got as usize >= capped_row.len() || expected < 0 {
        return false;
    }
    let (a, b) = (capped_row[got as usize], capped_row[expected as usize]);
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0)
}

/// Checks every output against the f64 reference (an untracked or a tracked call's).
pub(crate) fn check_outputs(
    out: &HostOutput,
    case: &Case,
    seen: &[f64],
    targets: &[i64],
    reference: &RefOptions,
    context: &str,
) {
    let (loss_tol, _) = tolerance(case.dtype);
    let rows = reference_rows(seen, case.vocab, targets, reference);
    let reduction = case.reduction();
    let per_row = reduction == Reduction::None;
    // Through `Tensor<D>` the targets' shape; on primitives `[N]`.
    let target_dims = out.target_dims.clone();
    let loss_dims = if per_row {
        target_dims.clone()
    } else {
        vec![1; target_dims.len()]
    };
    assert_eq!(out.loss.dims, loss_dims, "{context}: loss shape");
    assert_eq!(out.loss.dtype, case.dtype, "{context}: loss dtype");
    let loss = out.loss.values.clone();
    let ref_loss = reference_loss(&rows, reduction);
    let err = relative_l2(&loss, &ref_loss);
    assert!(
        err <= loss_tol,
        "{context}: loss error {err:e} > {loss_tol:e}\n got {:?}\n expected {:?}",
        &loss[..loss.len().min(8)],
        &ref_loss[..ref_loss.len().min(8)]
    );
    if per_row {
        for (row, r) in rows.iter().enumerate() {
            if !r.counted {
                assert_eq!(loss[row], 0.0, "{context}: ignored row {row} loss");
            }
        }
    }
    let wanted = case.options.outputs;
    assert_eq!(
        out.z_loss.is_some(),
        wanted.z_loss,
        "{context}: z_loss present"
    );
    assert_eq!(
        out.accuracy.is_some(),
        wanted.accuracy,
        "{context}: accuracy present"
    );
    assert_eq!(
        out.predicted.is_some(),
        wanted.predicted,
        "{context}: predicted present"
    );
    assert_eq!(out.lse.is_some(), wanted.lse, "{context}: lse present");
    assert_eq!(
        out.entropy.is_some(),
        wanted.entropy.is_on(),
        "{context}: entropy present"
    );
    if let Some(z) = &out.z_loss {
        assert_eq!(z.dims, loss_dims, "{context}: z_loss shape");
        assert_eq!(z.dtype, DType::F32, "{context}: z_loss dtype");
        let got = z.values.clone();
        let expected = reference_z_loss(&rows, reduction);
        let err = relative_l2(&got, &expected);
        assert!(
            err <= loss_tol,
            "{context}: z_loss error {err:e}\n got {:?}\n expected {:?}",
            &got[..got.len().min(8)],
            &expected[..expected.len().min(8)]
        );
    }
    // The kernel's argmax, checked against the reference near-tie-aware; accuracy is then
    // judged against the predictions that passed.
    let softcap = reference.softcap.is_some();
    let capped = |row: usize| reference.capped(&seen[row * case.vocab..(row + 1) * case.vocab]);
    let mut accepted = reference_predicted(&rows);
    let mut near_ties = 0usize;
    for (row, r) in rows.iter().enumerate() {
        if r.counted && softcap {
            let x = capped(row);
            let max = x[r.argmax as usize];
            if x.iter()
                .enumerate()
                .any(|(c, &v)| c as i64 != r.argmax && (v - max).abs() <= 1e-5 * max.abs().max(1.0))
            {
                near_ties += 1;
            }
        }
    }
    if let Some(predicted) = &out.predicted {
        assert_eq!(predicted.dims, target_dims, "{context}: predicted shape");
        let got: Vec<i64> = predicted.values.iter().map(|&v| v as i64).collect();
        for (row, r) in rows.iter().enumerate() {
            if !r.counted {
                assert_eq!(got[row], -1, "{context}: predicted on ignored row {row}");
                continue;
            }
            assert!(
                argmax_ok(&capped(row), got[row], r.argmax, softcap),
                "{context}: row {row} predicted {} expected {} (first on ties)",
                got[row],
                r.argmax
            );
            accepted[row] = got[row];
        }
        near_ties = 0;
    }
    if let Some(accuracy) = &out.accuracy {
        assert_eq!(accuracy.dims, vec![1], "{context}: accuracy shape");
        assert_eq!(accuracy.dtype, DType::F32, "{context}: accuracy dtype");
        let got = accuracy.values[0];
        let n = rows.iter().filter(|r| r.counted).count();
        let correct = rows
            .iter()
            .zip(&accepted)
            .zip(targets)
            .filter(|((r, p), y)| r.counted && **p == **y)
            .count();
        let expected = if n == 0 {
            0.0
        } else {
            correct as f64 / n as f64
        };
        let slack = if n == 0 {
            0.0
        } else {
            near_ties as f64 / n as f64
        };
        assert!(
            (got - expected).abs() <= 1e-6 + slack,
            "{context}: accuracy {got} expected {expected} ({correct}/{n})"
        );
    }
    for (name, host, expected) in [
        ("lse", &out.lse, reference_lse(&rows)),
        ("entropy", &out.entropy, reference_entropy(&rows)),
    ] {
        if let Some(host) = host {
            check_per_row_stat(
                name,
                host,
                &expected,
                &rows,
                &target_dims,
                loss_tol,
                context,
            );
        }
    }
}

/// A per-row f32 output (`lse`, `entropy`) against its f64 reference: the targets'
/// shape, relative L2 to `max(|value|, 1)` per element (a value near 0, such as the
/// log-sum-exp of one class or the entropy of a confident row, carries the absolute error
/// of the logits' scale, not a relative one; `tanh` on Vulkan has an absolute error bound
/// near 0), and exactly 0 on ignored rows.
fn check_per_row_stat(
    name: &str,
    host: &HostTensor,
    expected: &[f64],
    rows: &[RefRow],
    target_dims: &[usize],
    tolerance: f64,
    context: &str,
) {
    assert_eq!(host.dims, target_dims, "{context}: {name} shape");
    assert_eq!(host.dtype, DType::F32, "{context}: {name} dtype");
    let got = &host.values;
    let err = if got.iter().any(|v| !v.is_finite()) {
        f64::INFINITY
    } else {
        let diff: f64 = got.iter().zip(expected).map(|(a, e)| (a - e).powi(2)).sum();
        let norm: f64 = expected.iter().map(|e| e.abs().max(1.0).powi(2)).sum();
        if norm == 0.0 {
            diff.sqrt()
        } else {
            (diff / norm).sqrt()
        }
    };
    assert!(
        err <= tolerance,
        "{context}: {name} error {err:e}\n got {:?}\n expected {:?}",
        &got[..got.len().min(8)],
        &expected[..expected.len().min(8)]
    );
    for (row, r) in rows.iter().enumerate() {
        if !r.counted {
            assert_eq!(got[row], 0.0, "{context}: {name} on ignored row {row}");
        }
    }
}

/// Checks a gradient against the reference: exactly 0 where the whole reference is 0,
/// the dtype's relative-L2 bound otherwise.
pub(crate) fn check_grad(grad: &[f64], ref_grad: &[f64], dtype: DType, context: &str) {
    let (_, grad_tol) = tolerance(dtype);
    if ref_grad.iter().all(|v| *v == 0.0) {
        let nonzero: Vec<(usize, f64)> = grad
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, v)| *v != 0.0)
            .take(4)
            .collect();
        assert!(
            nonzero.is_empty(),
            "{context}: gradient must be exactly 0, got (index, value) {nonzero:?}"
        );
    } else {
        let err = relative_l2(grad, ref_grad);
        assert!(
            err <= grad_tol,
            "{context}: gradient error {err:e} > {grad_tol:e}\n{}",
            describe_grad_error(grad, ref_grad)
        );
    }
}

/// What a wrong gradient looks like, for the failure message: how many elements are not
/// finite, the best single scale `grad ~ k * ref`, the largest errors.
pub(crate) fn describe_grad_error(grad: &[f64], ref_grad: &[f64]) -> String {
    let non_finite = grad.iter().filter(|v| !v.is_finite()).count();
    let (dot, norm): (f64, f64) = grad
        .iter()
        .zip(ref_grad)
        .filter(|(g, _)| g.is_finite())
        .fold((0.0, 0.0), |(d, n), (g, r)| (d + g * r, n + r * r));
    let mut worst: Vec<(usize, f64, f64)> = grad
        .iter()
        .zip(ref_grad)
        .enumerate()
        .map(|(i, (&g, &r))| (i, g, r))
        .collect();
    worst.sort_by(|a, b| {
        let ea = if a.1.is_finite() {
            (a.1 - a.2).abs()
        } else {
            f64::INFINITY
        };
        let eb = if b.1.is_finite() {
            (b.1 - b.2).abs()
        } else {
            f64::INFINITY
        };
        eb.total_cmp(&ea)
    });
    let worst: Vec<String> = worst
        .iter()
        .take(4)
        .map(|(i, g, r)| format!("[{i}] got {g:e} expected {r:e}"))
        .collect();
    format!(
        "  {non_finite} of {} not finite; best fit grad = {:e} * reference; largest errors: {}",
        grad.len(),
        if norm > 0.0 { dot / norm } else { f64::NAN },
        worst.join(", ")
    )
}

/// Runs forward (untracked and tracked) and backward for one case against the f64
/// reference, every extra output asked for included; panics with the seed on any miss.
pub(crate) fn check_case(backend: TestBackend, case: Case) {
    check_case_seeded(backend, case, fresh_seed());
}

/// [`check_case`] on the inputs `seed` draws.
pub(crate) fn check_case_seeded(backend: TestBackend, case: Case, seed: u64) {
    let _backward = shared_device();
    let mut rng = rng(seed);
    let (rows, vocab, dtype) = (case.rows, case.vocab, case.dtype);
    let options = with_forced_chunks(case.options.clone());
    let reduction = options.reduction;
    let context = format!("{} {case:?} seed={seed}", backend.name());

    let mut values = random_logits(&mut rng, rows, vocab);
    let targets = random_targets(&mut rng, rows, vocab, case.ignore, options.ignore_index);
    let weights = case
        .class_weights
        .then(|| random_class_weights(&mut rng, vocab));
    if case.ties {
        values.iter_mut().for_each(|v| *v = v.round());
    }
    if let Some(m) = case.magnitude {
        values.iter_mut().for_each(|v| *v = rng.random_range(-m..m));
    }
    if let Some(margin) = case.confident {
        make_confident(&mut values, vocab, &targets, margin);
    }
    if case.target_first_of_ties {
        for (row, &target) in targets.iter().enumerate() {
            let Some(target) = usize::try_from(target).ok().filter(|&t| t < vocab) else {
                continue;
            };
            let row_values = &mut values[row * vocab..(row + 1) * vocab];
            // An integer: exact in every dtype.
            let top = row_values.iter().copied().fold(f32::MIN, f32::max).ceil() + 1.0;
            row_values[target..].iter_mut().for_each(|v| *v = top);
        }
    }
    values.iter_mut().for_each(|v| *v += case.shift);
    for row in (0..rows).step_by(2) {
        for _ in 0..case.negative_infinities {
            let col = rng.random_range(0..vocab);
            if col as i64 != targets[row] {
                values[row * vocab + col] = f32::NEG_INFINITY;
            }
        }
    }
    let reference = RefOptions::new(&options, weights.as_deref());
    let mut call = Call {
        exclusive: case.exclusive_logits,
        batch: case.batch,
        via_module: case.via_module,
        ..Call::new(
            values,
            (rows, vocab),
            dtype,
            &targets,
            weights.as_deref(),
            &options,
        )
    };

    // Forward only, on the backend itself.
    let (seen, out) =
        untracked_call(backend, &call).unwrap_or_else(|e| panic!("{context}: refused: {e}"));
    check_outputs(
        &out,
        &case,
        &seen,
        &targets,
        &reference,
        &format!("{context} (untracked)"),
    );

    // Forward and backward under autodiff, with a non-uniform incoming gradient (or
    // `loss.sum()`'s, exactly 1, which the one pass does not rescale).
    if !case.unit_grad {
        call.incoming = Incoming::draw(reduction, rows, &mut rng);
    }
    let tracked =
        tracked_call(backend, &call).unwrap_or_else(|e| panic!("{context}: refused: {e}"));
    check_outputs(
        &tracked.out,
        &case,
        &tracked.seen,
        &targets,
        &reference,
        &format!("{context} (tracked)"),
    );
    // The leaf through `Tensor<D>` is `[N, V]` (3-D logits are its reshape); a primitive's
    // gradient has the shape of the logits the op was given.
    let grad_dims = match backend {
        TestBackend::Cube => call.logits_dims(),
        _ => vec![rows, vocab],
    };
    assert_eq!(tracked.grad.dtype, dtype, "{context}: gradient dtype");
    assert_eq!(tracked.grad.dims, grad_dims, "{context}: gradient shape");
    let ref_grad = reference_grad(&tracked.seen, vocab, &targets, &reference, &tracked.g);
    check_grad(&tracked.grad.values, &ref_grad, dtype, &context);
}

/// Every shape x dtype x reduction x ignore pattern (none, some, all), alternating
/// between exclusive and held logits, with the given options otherwise.
pub(crate) fn check_matrix(backend: TestBackend, shapes: &[(usize, usize)], dtypes: &[DType]) {
    let mut n = 0;
    for &(rows, vocab) in shapes {
        for &dtype in dtypes {
            for reduction in REDUCTIONS {
                for ignore in [Ignore::NoRows, Ignore::SomeRows, Ignore::AllRows] {
                    n += 1;
                    let mut case = Case {
                        ignore,
                        exclusive_logits: n % 2 == 0,
                        unit_grad: n % 3 == 0,
                        ..Case::new(rows, vocab, dtype, reduction)
                    };
                    // Both autodiff plans, each with exclusive and held logits.
                    case.options.gradient_plan = plan((n / 2) % 2 == 0);
                    check_case(backend, case);
                }
            }
        }
    }
}

pub(crate) fn poisoned() {
    test_hooks::set_poison_outputs(true);
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
    check_matrix(TestBackend::Cube, &shapes, &float_dtypes());
}

/// An ignore index inside `[0, V)`: that class is ignored as a target, never as a column.
#[test]
fn ignore_index_inside_the_vocabulary() {
    poisoned();
    for reduction in REDUCTIONS {
        for exclusive_logits in [false, true] {
            let mut case = Case::new(37, 64, DType::F32, reduction);
            case.options.ignore_index = 3;
            case.exclusive_logits = exclusive_logits;
            check_case(TestBackend::Cube, case);
        }
    }
}

/// A large vocabulary (vectorised loads, many strides per unit).
#[test]
fn rows_512_vocab_32000() {
    poisoned();
    for (reduction, dtype, one_pass, ties, entropy) in [
        (Reduction::None, DType::F32, false, false, false),
        (Reduction::Mean, DType::F16, false, false, false),
        (Reduction::Sum, DType::F32, false, false, false),
        // The one-pass plan on rows longer than the part of a chunk it stages (16 KB on
        // wgpu, 32 KB of 64 KB chunks on CUDA): the rest is re-read from global memory.
        // With the argmax: a row's maximum is mostly in the rest, and with integer logits
        // its first tie mostly in the staged part; with the entropy too, whose sums share
        // the loop with the argmax's.
        (Reduction::Mean, DType::F32, true, false, false),
        (Reduction::Sum, DType::F16, true, false, true),
        (Reduction::Mean, DType::F16, true, true, false),
        (Reduction::Sum, DType::F32, true, true, true),
    ] {
        let mut case = Case {
            exclusive_logits: reduction != Reduction::Sum,
            ties,
            ..Case::new(512, 32000, dtype, reduction)
        };
        case.options.gradient_plan = plan(one_pass);
        if one_pass {
            case.options.outputs = ExtraOutputs {
                accuracy: true,
                predicted: true,
                entropy: if entropy {
                    EntropyOutput::Metric
                } else {
                    EntropyOutput::Off
                },
                ..ExtraOutputs::default()
            };
        }
        check_case(TestBackend::Cube, case);
    }
}

/// N = 0: 0 for Mean and Sum, an empty vector for None, and backward still runs; with
/// every option and extra output on, and for 3-D logits `[0, T, V]` too. Through
/// `Tensor<D>` under autodiff, which in Burn 0.22 runs on `Fusion<CubeBackend>` here (the
/// plain backend's empty batch is `bad_input.rs`'s `empty_batch_on_every_backend`).
#[test]
fn empty_batch() {
    poisoned();
    let _backward = shared_device();
    let device = device().autodiff();
    for all_options in [false, true] {
        for reduction in REDUCTIONS {
            let context = format!("{reduction:?} all_options={all_options}");
            let options = if all_options {
                CrossEntropyOptions::new(reduction)
                    .with_label_smoothing(0.1)
                    .with_z_loss_scale(1e-4)
                    .with_softcap(Some(30.0))
                    .with_ignore_index(3)
                    .with_outputs(ExtraOutputs::all())
            } else {
                CrossEntropyOptions::new(reduction)
            };
            let weights =
                all_options.then(|| Tensor::<1>::from_floats([0.5; 41].as_slice(), &device));
            let leaf = Tensor::<2>::empty([0, 41], &device).require_grad();
            let targets = targets_tensor(&[], &device);
            let out = try_fused_cross_entropy(leaf.clone(), targets, weights.clone(), &options)
                .unwrap_or_else(|e| panic!("{context}: refused: {e}"));
            match reduction {
                // Not read back: an empty tensor cannot be read on every runtime.
                Reduction::None => assert_eq!(out.loss.dims(), [0], "{context}"),
                _ => assert_eq!(to_f64(out.loss.clone().inner()), vec![0.0], "{context}"),
            }
            if all_options {
                let z = out.z_loss.clone().expect("z_loss asked for");
                match reduction {
                    Reduction::None => assert_eq!(z.dims(), [0], "{context}: z"),
                    _ => assert_eq!(to_f64(z.inner()), vec![0.0], "{context}: z"),
                }
                let accuracy = out.accuracy.clone().expect("accuracy asked for");
                assert_eq!(to_f64(accuracy.inner()), vec![0.0], "{context}: accuracy");
                assert_eq!(out.predicted.as_ref().expect("predicted").dims(), [0]);
                assert_eq!(out.lse.as_ref().expect("lse").dims(), [0]);
            }
            // Burn's own `sum` backward cannot broadcast onto a [0] tensor, so None's
            // backward at N = 0 is Burn's to handle; Mean and Sum go through ours.
            if reduction != Reduction::None {
                let grads = out.loss.sum().backward();
                let grad = leaf.grad(&grads).expect("logits get a gradient");
                assert_eq!(grad.dims(), [0, 41], "{context}");
            }

            // 3-D: [0, 5, 41] logits, [0, 5] targets.
            let leaf = Tensor::<3>::empty([0, 5, 41], &device).require_grad();
            let targets = Tensor::<2, Int>::empty([0, 5], &device);
            let out = try_fused_cross_entropy(leaf.clone(), targets, weights, &options)
                .unwrap_or_else(|e| panic!("{context} 3-D: refused: {e}"));
            match reduction {
                Reduction::None => assert_eq!(out.loss.dims(), [0, 5], "{context} 3-D"),
                _ => {
                    assert_eq!(out.loss.dims(), [1, 1], "{context} 3-D");
                    assert_eq!(to_f64(out.loss.clone().inner()), vec![0.0], "{context} 3-D");
                    let grads = out.loss.sum().backward();
                    let grad = leaf.grad(&grads).expect("logits get a gradient");
                    assert_eq!(grad.dims(), [0, 5, 41], "{context} 3-D");
                }
            }
        }
    }
}

/// A confident prediction (target logit = row max + 10): `p_y - 1` is formed in f32, so
/// the target column's gradient keeps its digits in low precision. `Sum`, so the target
/// column (about -4e-3) stays a normal f16 number: under Mean over 64 rows it would be an
/// f16 subnormal, imprecise in any implementation.
pub(crate) fn check_confident(
    backend: TestBackend,
    dtype: DType,
    options: &CrossEntropyOptions,
    class_weights: bool,
) {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let context = format!(
        "{} {dtype:?} {options:?} weights={class_weights} seed={seed}",
        backend.name()
    );
    let (rows, vocab) = (64, 1000);
    let mut values = random_logits(&mut rng, rows, vocab);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::NoRows, options.ignore_index);
    let weights = class_weights.then(|| random_class_weights(&mut rng, vocab));
    make_confident(&mut values, vocab, &targets, 10.0);
    let reference = RefOptions::new(options, weights.as_deref());
    // Backward from `loss.sum()`.
    let call = Call::new(
        values,
        (rows, vocab),
        dtype,
        &targets,
        weights.as_deref(),
        options,
    );
    let tracked =
        tracked_call(backend, &call).unwrap_or_else(|e| panic!("{context}: refused: {e}"));
    let seen = &tracked.seen;
    let ref_rows = reference_rows(seen, vocab, &targets, &reference);
    let (loss_tol, grad_tol) = tolerance(dtype);
    // The f32 loss of confident rows has its own test
    // (`confident_prediction_f32_loss_meets_the_table`).
    if dtype != DType::F32 {
        let err = relative_l2(
            &tracked.out.loss.values,
            &reference_loss(&ref_rows, options.reduction),
        );
        assert!(err <= loss_tol, "{context}: loss error {err:e}");
    }
    let grad = &tracked.grad.values;
    let ref_grad = reference_grad(seen, vocab, &targets, &reference, &tracked.g);
    let target_cols = |g: &[f64]| -> Vec<f64> {
        targets
            .iter()
            .enumerate()
            .map(|(r, &y)| g[r * vocab + y as usize])
            .collect()
    };
    let err = relative_l2(&target_cols(grad), &target_cols(&ref_grad));
    assert!(
        err <= grad_tol,
        "{context}: target column error {err:e} > {grad_tol:e}"
    );
    eprintln!("{context}: confident target-column gradient error {err:e}");
    let err = relative_l2(grad, &ref_grad);
    assert!(err <= grad_tol, "{context}: gradient error {err:e}");
}

#[test]
fn confident_prediction_keeps_target_gradient() {
    poisoned();
    for dtype in float_dtypes() {
        check_confident(
            TestBackend::Cube,
            dtype,
            &CrossEntropyOptions::new(Reduction::Sum),
            false,
        );
    }
}

/// With `TargetCheck::Off`, a target outside `[0, V)` that is not the ignore index:
/// that row's loss is NaN and its gradient row zero; other rows are unaffected and
/// nothing is read out of bounds (with class weights too, which the kernel indexes by
/// target).
#[test]
fn unchecked_out_of_range_target_poisons_only_its_row() {
    poisoned();
    for class_weights in [false, true] {
        for reduction in [Reduction::None, Reduction::Sum] {
            let options = CrossEntropyOptions::new(reduction).with_target_check(TargetCheck::Off);
            check_bad_targets(TestBackend::Cube, &options, class_weights);
        }
    }
    let all = CrossEntropyOptions::new(Reduction::None)
        .with_target_check(TargetCheck::Off)
        .with_label_smoothing(0.1)
        .with_z_loss_scale(1e-4)
        .with_softcap(Some(30.0));
    check_bad_targets(TestBackend::Cube, &all, true);
}

/// Rows 1 and 4 get targets `V + 5` and `-3`.
pub(crate) fn check_bad_targets(
    backend: TestBackend,
    options: &CrossEntropyOptions,
    class_weights: bool,
) {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let context = format!(
        "{} {options:?} weights={class_weights} seed={seed}",
        backend.name()
    );
    let (rows, vocab) = (6, 50);
    let values = random_logits(&mut rng, rows, vocab);
    let mut targets = random_targets(&mut rng, rows, vocab, Ignore::NoRows, -100);
    targets[1] = vocab as i64 + 5;
    targets[4] = -3;
    let weights = class_weights.then(|| random_class_weights(&mut rng, vocab));
    let reference = RefOptions::new(options, weights.as_deref());
    // Backward from `loss.sum()`.
    let call = Call::new(
        values,
        (rows, vocab),
        DType::F32,
        &targets,
        weights.as_deref(),
        options,
    );
    let tracked = tracked_call(backend, &call)
        .unwrap_or_else(|e| panic!("{context}: refused with the check off: {e}"));
    let seen = &tracked.seen;
    let losses = &tracked.out.loss.values;
    let grad = &tracked.grad.values;
    let ref_rows = reference_rows(seen, vocab, &targets, &reference);
    let ref_grad = reference_grad(seen, vocab, &targets, &reference, &tracked.g);
    if options.reduction != Reduction::None {
        assert!(
            losses[0].is_nan(),
            "{context}: reduced loss {} with a bad row",
            losses[0]
        );
    }
    for row in 0..rows {
        let bad = row == 1 || row == 4;
        let grad_row = &grad[row * vocab..(row + 1) * vocab];
        if bad {
            if options.reduction == Reduction::None {
                assert!(
                    losses[row].is_nan(),
                    "{context}: row {row} loss {}",
                    losses[row]
                );
            }
            assert!(
                grad_row.iter().all(|v| *v == 0.0),
                "{context}: row {row} gradient not zero"
            );
        } else {
            if options.reduction == Reduction::None {
                let expected = ref_rows[row].loss();
                assert!(
                    (losses[row] - expected).abs() <= 1e-5 * expected.abs().max(1.0),
                    "{context}: row {row} loss {} expected {expected}",
                    losses[row]
                );
            }
            let err = relative_l2(grad_row, &ref_grad[row * vocab..(row + 1) * vocab]);
            assert!(err <= 1e-5, "{context}: row {row} gradient error {err:e}");
        }
    }
}

/// With `TargetCheck::Immediate`, the same targets are an error of the call itself naming
/// the first bad row, and `forward` panics with that message. A check of the function
/// layer (`Tensor<D>`): on a cube device, so `Fusion<CubeBackend>` (the plain backend's
/// target check is `bad_input.rs`'s `out_of_range_targets_name_row_and_value`).
#[test]
fn checked_out_of_range_target_is_an_error() {
    let device = device();
    let (rows, vocab) = (6, 50);
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let values = random_logits(&mut rng, rows, vocab);
    let mut targets = random_targets(&mut rng, rows, vocab, Ignore::NoRows, -100);
    targets[1] = vocab as i64 + 5;
    targets[4] = -3;
    let (logits, _) = logits_tensor(values, rows, vocab, DType::F32, &device);
    let options =
        CrossEntropyOptions::new(Reduction::None).with_target_check(TargetCheck::Immediate);
    let err = try_fused_cross_entropy(
        logits.clone(),
        targets_tensor(&targets, &device),
        None,
        &options,
    )
    .err()
    .unwrap_or_else(|| panic!("seed={seed}: a target of {} must be refused", vocab + 5));
    assert_eq!(
        err,
        CrossEntropyError::TargetOutOfRange {
            row: 1,
            value: vocab as i64 + 5,
            vocab,
            earlier_call: false,
        },
        "seed={seed}"
    );
    let message = super::bad_input::panic_message(|| {
        fused_cross_entropy(logits, targets_tensor(&targets, &device), &options);
    });
    assert_eq!(
        message,
        err.to_string(),
        "seed={seed}: forward panics with the error"
    );
}

/// The confident case (target = row max + 10) is one of the spec's inputs for the
/// precision table, f32 included: each row's loss is about 5e-5, so `lse - x_y` formed
/// from two numbers near 16 loses about two digits in f32 (ulp 2e-6); a loss formed as
/// `log1p(sum_{c != y} exp(x_c - x_y))` (the same sum that gives `p_y - 1`) keeps them.
#[test]
fn confident_prediction_f32_loss_meets_the_table() {
    poisoned();
    for reduction in REDUCTIONS {
        check_case(
            TestBackend::Cube,
            Case {
                confident: Some(10.0),
                ignore: Ignore::NoRows,
                ..Case::new(64, 1000, DType::F32, reduction)
            },
        );
    }
}
