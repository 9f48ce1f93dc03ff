//! Logits as language models produce them: `[B, T, V]` with targets `[B, T]`, and rows
//! that are not packed: `big[:, :-1, :]` / `big[:, 1:, :]` of a `[B, T + 1, V]` tensor, a
//! `[N, V]` window of an `[N, V + pad]` tensor (row stride > V, start offset), a transposed
//! tensor (stride along the vocabulary), with shifted (strided) targets. Loss and gradient
//! against the f64 reference for every reduction; through `Tensor<D>` the gradient reaches
//! the big tensor's window and is 0 elsewhere (Burn's slice backward), on the plain cube
//! backend's primitives the window's gradient is checked and a held big tensor unchanged.

use burn::tensor::{DType, Int, Tensor, TensorData};
use burn_fused_ce::backend::IncomingGuess;
use burn_fused_ce::{CrossEntropyOptions, Reduction, try_fused_cross_entropy};

use super::contract::{Case, REDUCTIONS, check_case, check_grad, poisoned};
use super::options::{all_options, plans};
use crate::call::*;
use crate::common::*;
use crate::cube_primitives::{self as cube, C, Float, Ints};
use burn::backend::ops::FloatTensorOps;
use burn_fused_ce::backend::FusedCrossEntropyBackend;

/// `[B, T, V]` logits through `check_case` (the None output is `[B, T]`, reduced ones
/// `[1, 1]`), plain and with every option.
fn check_three_d(backend: TestBackend, dtypes: &[DType]) {
    let mut n = 0;
    for &(batch, rows, vocab) in &[
        (3, 12, 41),
        (2, 14, 2000),
        (1, 1, 1),
        (4, 4 * 9, 130),
        (5, 5 * 31, 33),
    ] {
        for &dtype in dtypes {
            for reduction in REDUCTIONS {
                for options_on in [false, true] {
                    n += 1;
                    let mut options = if options_on {
                        all_options(reduction, vocab)
                    } else {
                        CrossEntropyOptions::new(reduction)
                    };
                    options.gradient_plan = plan(n % 4 < 2);
                    check_case(
                        backend,
                        Case {
                            options,
                            class_weights: options_on,
                            batch: Some(batch),
                            exclusive_logits: n % 2 == 0,
                            unit_grad: n % 3 == 0,
                            ..Case::new(rows, vocab, dtype, reduction)
                        },
                    );
                }
            }
        }
    }
}

#[test]
fn three_d_logits_on_the_cube_backend() {
    poisoned();
    check_three_d(TestBackend::Cube, &float_dtypes());
}

#[test]
fn three_d_logits_on_the_default_fusion_backend() {
    poisoned();
    check_three_d(TestBackend::Fusion, &[DType::F32, DType::F16]);
}

#[test]
fn three_d_logits_on_flex() {
    check_three_d(TestBackend::Flex, &[DType::F32]);
}

/// How the logits the loss sees sit in a bigger tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// `big[:, :-1, :]` of `[B, T + 1, V]`, targets `t[:, 1:]` of `[B, T + 1]`.
    DropLastStep,
    /// `big[:, 1:, :]` (a start offset of V elements), targets `t[:, :-1]`.
    DropFirstStep,
    /// `big[:, 0..V]` of `[N, V + pad]`: row stride V + pad.
    PaddedRows { pad: usize },
    /// `big[:, 1..V + 1]` of `[N, V + pad]`: row stride V + pad and an unaligned start.
    OffsetColumns { pad: usize },
    /// `big.transpose()` of `[V, N]`: stride N along the vocabulary.
    Transposed,
}

/// The shape of the big tensor, the window's ranges in it, and the targets' layout: the
/// loss sees `[b, t, v]` rows (b = 1 for 2-D layouts).
struct Window {
    big_dims: Vec<usize>,
    /// For each of the `b * t` rows the loss sees, its offset in the big tensor's
    /// row-major data and the distance between two classes.
    row_start: Vec<usize>,
    class_stride: usize,
}

fn window(layout: Layout, b: usize, t: usize, v: usize) -> Window {
    let rows = b * t;
    match layout {
        Layout::DropLastStep | Layout::DropFirstStep => {
            let first = usize::from(layout == Layout::DropFirstStep);
            Window {
                big_dims: vec![b, t + 1, v],
                row_start: (0..rows)
                    .map(|r| ((r / t) * (t + 1) + r % t + first) * v)
                    .collect(),
                class_stride: 1,
            }
        }
        Layout::PaddedRows { pad } => Window {
            big_dims: vec![rows, v + pad],
            row_start: (0..rows).map(|r| r * (v + pad)).collect(),
            class_stride: 1,
        },
        Layout::OffsetColumns { pad } => Window {
            big_dims: vec![rows, v + pad],
            row_start: (0..rows).map(|r| r * (v + pad) + 1).collect(),
            class_stride: 1,
        },
        Layout::Transposed => Window {
            big_dims: vec![v, rows],
            row_start: (0..rows).collect(),
            class_stride: rows,
        },
    }
}

/// The window of `big` the loss sees, as `[b, t, v]` (3-D layouts) or `[b * t, v]`.
enum Logits {
    Two(Tensor<2>),
    Three(Tensor<3>),
}

fn cut(big: &BigTensor, layout: Layout, b: usize, t: usize, v: usize) -> Logits {
    let rows = b * t;
    match (layout, big) {
        (Layout::DropLastStep, BigTensor::Three(x)) => {
            Logits::Three(x.clone().slice([0..b, 0..t, 0..v]))
        }
        (Layout::DropFirstStep, BigTensor::Three(x)) => {
            Logits::Three(x.clone().slice([0..b, 1..t + 1, 0..v]))
        }
        (Layout::PaddedRows { .. }, BigTensor::Two(x)) => {
            Logits::Two(x.clone().slice([0..rows, 0..v]))
        }
        (Layout::OffsetColumns { .. }, BigTensor::Two(x)) => {
            Logits::Two(x.clone().slice([0..rows, 1..v + 1]))
        }
        (Layout::Transposed, BigTensor::Two(x)) => Logits::Two(x.clone().transpose()),
        _ => unreachable!("layout and big tensor rank agree"),
    }
}

/// The same window of a plain cube backend primitive (`big` of `big_dims`).
fn cut_primitive(
    big: Float,
    big_dims: &[usize],
    layout: Layout,
    b: usize,
    t: usize,
    v: usize,
) -> Float {
    let rows = b * t;
    match layout {
        Layout::DropLastStep => cube::slice(big, &[0..b, 0..t, 0..v]),
        Layout::DropFirstStep => cube::slice(big, &[0..b, 1..t + 1, 0..v]),
        Layout::PaddedRows { .. } => cube::slice(big, &[0..rows, 0..v]),
        Layout::OffsetColumns { .. } => cube::slice(big, &[0..rows, 1..v + 1]),
        Layout::Transposed => {
            assert_eq!(
                big_dims,
                [v, rows],
                "a transposed window's big tensor is [V, N]"
            );
            C::float_transpose(big)
        }
    }
}

#[derive(Clone)]
enum BigTensor {
    Two(Tensor<2>),
    Three(Tensor<3>),
}

impl BigTensor {
    fn from_values(
        values: Vec<f32>,
        dims: &[usize],
        dtype: DType,
        device: &burn::tensor::Device,
    ) -> Self {
        match dims {
            [a, c] => Self::Two(
                Tensor::<2>::from_data(TensorData::new(values, [*a, *c]), device).cast(dtype),
            ),
            [a, c, d] => Self::Three(
                Tensor::<3>::from_data(TensorData::new(values, [*a, *c, *d]), device).cast(dtype),
            ),
            _ => unreachable!(),
        }
    }

    fn values(&self) -> Vec<f64> {
        match self {
            Self::Two(x) => to_f64(x.clone()),
            Self::Three(x) => to_f64(x.clone()),
        }
    }

    /// The same tensor under autodiff as a leaf that requires its gradient.
    fn leaf(&self) -> Self {
        match self {
            Self::Two(x) => Self::Two(x.clone().autodiff().require_grad()),
            Self::Three(x) => Self::Three(x.clone().autodiff().require_grad()),
        }
    }

    /// `self * 1.0`: an intermediate nobody else holds.
    fn times_one(&self) -> Self {
        match self {
            Self::Two(x) => Self::Two(x.clone() * 1.0),
            Self::Three(x) => Self::Three(x.clone() * 1.0),
        }
    }
}

/// The next-token targets of the 3-D layouts: `t[:, 1:]` or `t[:, :-1]` of `[b, t + 1]`.
fn target_window(layout: Layout, b: usize, t: usize) -> ([core::ops::Range<usize>; 2], usize) {
    if layout == Layout::DropLastStep {
        ([0..b, 1..t + 1], 1)
    } else {
        ([0..b, 0..t], 0)
    }
}

/// The targets the loss sees for a layout: shifted windows of a `[b, t + 1]` tensor for
/// the 3-D layouts (strided), plain `[b * t]` otherwise. Returns the host values too.
fn cut_targets(
    all: &[i64],
    layout: Layout,
    b: usize,
    t: usize,
    device: &burn::tensor::Device,
) -> (TargetsWindow, Vec<i64>) {
    match layout {
        Layout::DropLastStep | Layout::DropFirstStep => {
            let big =
                Tensor::<2, Int>::from_data(TensorData::new(all.to_vec(), [b, t + 1]), device);
            let (ranges, first) = target_window(layout, b, t);
            (
                TargetsWindow::Two(big.slice(ranges)),
                host_targets(all, layout, b, t, first),
            )
        }
        _ => (
            TargetsWindow::One(targets_tensor(&all[..b * t], device)),
            all[..b * t].to_vec(),
        ),
    }
}

/// The same targets as a plain cube backend primitive.
fn cut_targets_primitive(all: &[i64], layout: Layout, b: usize, t: usize) -> Ints {
    match layout {
        Layout::DropLastStep | Layout::DropFirstStep => {
            let (ranges, _) = target_window(layout, b, t);
            cube::int_slice(cube::ints(all, &[b, t + 1]), &ranges)
        }
        _ => cube::ints(&all[..b * t], &[b * t]),
    }
}

fn host_targets(all: &[i64], layout: Layout, b: usize, t: usize, first: usize) -> Vec<i64> {
    match layout {
        Layout::DropLastStep | Layout::DropFirstStep => (0..b * t)
            .map(|r| all[(r / t) * (t + 1) + r % t + first])
            .collect(),
        _ => all[..b * t].to_vec(),
    }
}

enum TargetsWindow {
    One(Tensor<1, Int>),
    Two(Tensor<2, Int>),
}

/// The loss of a window, flattened to `[N]` (or `[1]`), with the shape it had.
fn loss_of(
    logits: Logits,
    targets: TargetsWindow,
    weights: Option<&[f32]>,
    options: &CrossEntropyOptions,
) -> (Tensor<1>, Vec<usize>) {
    let weights =
        |device: &burn::tensor::Device| weights.map(|w| Tensor::<1>::from_floats(w, device));
    let flat = |dims: Vec<usize>| [dims.iter().product::<usize>()];
    match (logits, targets) {
        (Logits::Two(x), TargetsWindow::One(y)) => {
            let w = weights(&x.device());
            let loss = try_fused_cross_entropy(x, y, w, options)
                .unwrap_or_else(|e| panic!("refused: {e}"))
                .loss;
            let dims = loss.dims().to_vec();
            (loss.reshape(flat(dims.clone())), dims)
        }
        (Logits::Three(x), TargetsWindow::Two(y)) => {
            let w = weights(&x.device());
            let loss = try_fused_cross_entropy(x, y, w, options)
                .unwrap_or_else(|e| panic!("refused: {e}"))
                .loss;
            let dims = loss.dims().to_vec();
            (loss.reshape(flat(dims.clone())), dims)
        }
        _ => unreachable!("logits and targets ranks agree"),
    }
}

/// What one window's call gave: the untracked and the tracked loss (with their shapes),
/// the gradient (of the big tensor through `Tensor<D>`, of the window on primitives) and
/// the incoming gradient as the loss's dtype rounds it.
struct WindowRun {
    untracked: (Vec<f64>, Vec<usize>),
    tracked: (Vec<f64>, Vec<usize>),
    grad: HostTensor,
    g: Vec<f64>,
}

/// One layout x reduction x dtype x options x ownership: forward untracked and tracked,
/// backward to the big tensor (or the window, on primitives).
#[allow(clippy::too_many_arguments)]
fn check_window(
    backend: TestBackend,
    layout: Layout,
    (b, t, v): (usize, usize, usize),
    dtype: DType,
    reduction: Reduction,
    options_on: bool,
    exclusive: bool,
    one_pass: bool,
) {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let context = format!(
        "{} {layout:?} b={b} t={t} v={v} {dtype:?} {reduction:?} options={options_on} exclusive={exclusive} one_pass={one_pass} seed={seed}",
        backend.name()
    );
    let options = if options_on {
        all_options(reduction, v)
    } else {
        CrossEntropyOptions::new(reduction)
    }
    .with_gradient_plan(plan(one_pass));
    let rows = b * t;
    let w = window(layout, b, t, v);
    let big_len: usize = w.big_dims.iter().product();
    let values = random_logits(&mut rng, 1, big_len);
    let all_targets = random_targets(
        &mut rng,
        b * (t + 1),
        v,
        Ignore::SomeRows,
        options.ignore_index,
    );
    let weights = options_on.then(|| random_class_weights(&mut rng, v));
    let reference = RefOptions::new(&options, weights.as_deref());
    let first = usize::from(layout == Layout::DropLastStep);
    let targets = host_targets(&all_targets, layout, b, t, first);
    let incoming = Incoming::draw(reduction, rows, &mut rng);
    let three_d = w.big_dims.len() == 3;

    let (big_seen, run) = match backend {
        TestBackend::Cube => window_on_primitives(
            &w,
            values,
            dtype,
            layout,
            (b, t, v),
            &all_targets,
            weights.as_deref(),
            &options,
            &incoming,
            exclusive,
            &context,
        ),
        _ => window_through_tensors(
            backend,
            &w,
            values,
            dtype,
            layout,
            (b, t, v),
            &all_targets,
            weights.as_deref(),
            &options,
            &incoming,
            exclusive,
            &context,
        ),
    };
    let seen: Vec<f64> = (0..rows)
        .flat_map(|r| (0..v).map(move |c| (r, c)))
        .map(|(r, c)| big_seen[w.row_start[r] + c * w.class_stride])
        .collect();
    let ref_rows = reference_rows(&seen, v, &targets, &reference);
    let ref_loss = reference_loss(&ref_rows, reduction);
    let (loss_tol, _) = tolerance(dtype);
    // Through `Tensor<D>` the targets' shape; on primitives `[N]` or `[1]`.
    let expected_dims = match (reduction, three_d && backend != TestBackend::Cube) {
        (Reduction::None, true) => vec![b, t],
        (Reduction::None, false) => vec![rows],
        (_, true) => vec![1, 1],
        (_, false) => vec![1],
    };
    let (loss, dims) = &run.untracked;
    assert_eq!(dims, &expected_dims, "{context}: loss shape");
    let err = relative_l2(loss, &ref_loss);
    assert!(err <= loss_tol, "{context}: untracked loss error {err:e}");
    let (loss, dims) = &run.tracked;
    assert_eq!(dims, &expected_dims, "{context}: tracked loss shape");
    let err = relative_l2(loss, &ref_loss);
    assert!(err <= loss_tol, "{context}: tracked loss error {err:e}");

    assert_eq!(run.grad.dtype, dtype, "{context}: gradient dtype");
    let ref_grad_rows = reference_grad(&seen, v, &targets, &reference, &run.g);
    if backend == TestBackend::Cube {
        // The window's gradient, in the window's own row-major order.
        check_grad(&run.grad.values, &ref_grad_rows, dtype, &context);
        return;
    }
    let grad = &run.grad.values;
    let mut ref_grad = vec![0.0; big_len];
    let mut inside = vec![false; big_len];
    for r in 0..rows {
        for c in 0..v {
            ref_grad[w.row_start[r] + c * w.class_stride] = ref_grad_rows[r * v + c];
            inside[w.row_start[r] + c * w.class_stride] = true;
        }
    }
    // Outside the window: exactly 0.
    for (i, (&got, &is_inside)) in grad.iter().zip(&inside).enumerate() {
        if !is_inside {
            assert_eq!(got, 0.0, "{context}: gradient at {i} outside the window");
        }
    }
    check_grad(grad, &ref_grad, dtype, &context);
}

/// The window through `Tensor<D>`: untracked, then under autodiff from a big leaf (or
/// `leaf * 1.0` when `exclusive`) whose gradient comes back. Returns the big tensor as
/// the kernel saw it (f64) and the run.
#[allow(clippy::too_many_arguments)]
fn window_through_tensors(
    backend: TestBackend,
    w: &Window,
    values: Vec<f32>,
    dtype: DType,
    layout: Layout,
    (b, t, v): (usize, usize, usize),
    all_targets: &[i64],
    weights: Option<&[f32]>,
    options: &CrossEntropyOptions,
    incoming: &Incoming,
    exclusive: bool,
    context: &str,
) -> (Vec<f64>, WindowRun) {
    let device = backend.device();
    let big = BigTensor::from_values(values, &w.big_dims, dtype, &device);
    let big_seen = big.values();

    // Untracked.
    let (y, _) = cut_targets(all_targets, layout, b, t, &device);
    let (loss, dims) = loss_of(cut(&big, layout, b, t, v), y, weights, options);
    let untracked = (to_f64(loss), dims);
    assert_eq!(
        big.values(),
        big_seen,
        "{context}: forward changed the big tensor"
    );

    // Tracked, backward to the big tensor.
    let leaf = big.leaf();
    let source = if exclusive {
        leaf.times_one()
    } else {
        leaf.clone()
    };
    let logits = cut(&source, layout, b, t, v);
    drop(source);
    let ad_device = device.clone().autodiff();
    let (y, _) = cut_targets(all_targets, layout, b, t, &ad_device);
    let (loss, dims) = loss_of(logits, y, weights, options);
    let tracked = (to_f64(loss.clone().inner()), dims);
    let [len] = loss.dims();
    let g = incoming.rounded(len, dtype, &device);
    let grads = incoming.objective(loss).backward();
    let grad = match &leaf {
        BigTensor::Two(x) => HostTensor::read(&x.grad(&grads).expect("gradient")),
        BigTensor::Three(x) => HostTensor::read(&x.grad(&grads).expect("gradient")),
    };
    if !exclusive {
        let kept = match &leaf {
            BigTensor::Two(x) => to_f64(x.clone().inner()),
            BigTensor::Three(x) => to_f64(x.clone().inner()),
        };
        assert_eq!(
            kept, big_seen,
            "{context}: backward changed the held big tensor"
        );
    }
    (
        big_seen,
        WindowRun {
            untracked,
            tracked,
            grad,
            g,
        },
    )
}

/// The window of a plain cube backend primitive, as `Autodiff` calls the op on it: the
/// big tensor moved into the window when `exclusive` (the op may write over it), else
/// held and checked unchanged.
#[allow(clippy::too_many_arguments)]
fn window_on_primitives(
    w: &Window,
    values: Vec<f32>,
    dtype: DType,
    layout: Layout,
    (b, t, v): (usize, usize, usize),
    all_targets: &[i64],
    weights: Option<&[f32]>,
    options: &CrossEntropyOptions,
    incoming: &Incoming,
    exclusive: bool,
    context: &str,
) -> (Vec<f64>, WindowRun) {
    let big = cube::floats(values, &w.big_dims, dtype);
    let big_seen = cube::read(big.clone()).values;
    let window = |big: Float| cut_primitive(big, &w.big_dims, layout, b, t, v);
    let targets = || cut_targets_primitive(all_targets, layout, b, t);

    // Untracked.
    let parts = C::fused_cross_entropy(
        cube::inputs(window(big.clone()), targets(), weights),
        options.clone(),
        IncomingGuess::new(),
    );
    let loss = cube::read(parts.loss);
    let untracked = (loss.values, loss.dims);
    assert_eq!(
        cube::read(big.clone()).values,
        big_seen,
        "{context}: forward changed the big tensor"
    );

    // Tracked.
    let held = (!exclusive).then(|| big.clone());
    let (parts, pending) = cube::tracked_forward(
        cube::inputs(window(big), targets(), weights),
        options,
        cube::first_guess(),
    );
    let loss = cube::read(parts.loss);
    let len = loss.values.len();
    let tracked = (loss.values, loss.dims);
    let grad_output = cube::floats(incoming.values(len), &[len], dtype);
    let g = cube::read(grad_output.clone()).values;
    let (grad, _) = pending.backward(grad_output);
    let grad = cube::read(grad);
    if let Some(held) = held {
        assert_eq!(
            cube::read(held).values,
            big_seen,
            "{context}: backward changed the held big tensor"
        );
    }
    (
        big_seen,
        WindowRun {
            untracked,
            tracked,
            grad,
            g,
        },
    )
}

const LAYOUTS: [(Layout, (usize, usize, usize)); 9] = [
    (Layout::DropLastStep, (3, 5, 41)),
    // More rows than a launch has cubes.
    (Layout::DropLastStep, (8, 12, 33)),
    (Layout::PaddedRows { pad: 4 }, (1, 100, 36)),
    (Layout::DropLastStep, (2, 3, 128)),
    (Layout::DropFirstStep, (2, 4, 128)),
    (Layout::PaddedRows { pad: 3 }, (1, 9, 129)),
    (Layout::PaddedRows { pad: 4 }, (1, 9, 128)),
    (Layout::OffsetColumns { pad: 5 }, (1, 7, 128)),
    (Layout::Transposed, (1, 11, 37)),
];

fn check_windows(backend: TestBackend, dtypes: &[DType]) {
    let mut n = 0;
    for (layout, dims) in LAYOUTS {
        for reduction in REDUCTIONS {
            for options_on in [false, true] {
                n += 1;
                let dtype = dtypes[n % dtypes.len()];
                for one_pass in plans(reduction) {
                    for exclusive in [false, true] {
                        check_window(
                            backend, layout, dims, dtype, reduction, options_on, exclusive,
                            one_pass,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn strided_rows_on_the_cube_backend() {
    poisoned();
    check_windows(TestBackend::Cube, &float_dtypes());
}

#[test]
fn strided_rows_on_the_default_fusion_backend() {
    poisoned();
    check_windows(TestBackend::Fusion, &float_dtypes());
}

#[test]
fn strided_rows_on_flex() {
    check_windows(TestBackend::Flex, &[DType::F32]);
}
