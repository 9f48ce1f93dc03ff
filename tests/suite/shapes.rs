//! Logits as language models produce them: `[B, T, V]` with targets `[B, T]`, and rows
//! that are not packed: `big[:, :-1, :]` / `big[:, 1:, :]` of a `[B, T + 1, V]` tensor, a
//! `[N, V]` window of an `[N, V + pad]` tensor (row stride > V, start offset), a transposed
//! tensor (stride along the vocabulary), with shifted (strided) targets. Loss and gradient
//! against the f64 reference for every reduction; the gradient reaches the big tensor's
//! window and is 0 elsewhere.

use burn::{
    backend::Autodiff,
    tensor::{DType, Int, Tensor, TensorData},
};
use burn_fused_ce::{
    CrossEntropyOptions, FusedCrossEntropyBackend, Reduction, try_fused_cross_entropy,
};
use fused_ce_suite::DefaultBackend;

use crate::common::*;
use crate::contract::{Case, REDUCTIONS, check_case, check_grad, objective, poisoned, short_name};
use crate::options::{all_options, plans};

/// `[B, T, V]` logits through `check_case` (the None output is `[B, T]`, reduced ones
/// `[1, 1]`), plain and with every option.
fn check_three_d<B: FusedCrossEntropyBackend>(dtypes: &[DType])
where
    B::Device: Default,
{
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
                    check_case::<B>(Case {
                        options,
                        class_weights: options_on,
                        batch: Some(batch),
                        exclusive_logits: n % 2 == 0,
                        unit_grad: n % 3 == 0,
                        ..Case::new(rows, vocab, dtype, reduction)
                    });
                }
            }
        }
    }
}

#[test]
fn three_d_logits_on_the_cube_backend() {
    poisoned();
    check_three_d::<CubeBackend>(&float_dtypes());
}

#[test]
fn three_d_logits_on_the_default_fusion_backend() {
    poisoned();
    check_three_d::<DefaultBackend>(&[DType::F32, DType::F16]);
}

#[test]
fn three_d_logits_on_ndarray() {
    check_three_d::<NdArray>(&[DType::F32]);
}

use burn::backend::NdArray;

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
enum Logits<B: burn::tensor::backend::Backend> {
    Two(Tensor<B, 2>),
    Three(Tensor<B, 3>),
}

fn cut<B: burn::tensor::backend::Backend>(
    big: &BigTensor<B>,
    layout: Layout,
    b: usize,
    t: usize,
    v: usize,
) -> Logits<B> {
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

#[derive(Clone)]
enum BigTensor<B: burn::tensor::backend::Backend> {
    Two(Tensor<B, 2>),
    Three(Tensor<B, 3>),
}

impl<B: burn::tensor::backend::Backend> BigTensor<B> {
    fn from_values(values: Vec<f32>, dims: &[usize], dtype: DType, device: &B::Device) -> Self {
        match dims {
            [a, c] => Self::Two(
                Tensor::<B, 2>::from_data(TensorData::new(values, [*a, *c]), device).cast(dtype),
            ),
            [a, c, d] => Self::Three(
                Tensor::<B, 3>::from_data(TensorData::new(values, [*a, *c, *d]), device)
                    .cast(dtype),
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
}

/// The targets the loss sees for a layout: shifted windows of a `[b, t + 1]` tensor for
/// the 3-D layouts (strided), plain `[b * t]` otherwise. Returns the host values too.
fn cut_targets<B: burn::tensor::backend::Backend>(
    all: &[i64],
    layout: Layout,
    b: usize,
    t: usize,
    device: &B::Device,
) -> (TargetsWindow<B>, Vec<i64>) {
    match layout {
        Layout::DropLastStep | Layout::DropFirstStep => {
            let big =
                Tensor::<B, 2, Int>::from_data(TensorData::new(all.to_vec(), [b, t + 1]), device);
            // Next-token targets: logits at step s predict the token at s + 1.
            let (window, first) = if layout == Layout::DropLastStep {
                (big.slice([0..b, 1..t + 1]), 1)
            } else {
                (big.slice([0..b, 0..t]), 0)
            };
            let host = (0..b * t)
                .map(|r| all[(r / t) * (t + 1) + r % t + first])
                .collect();
            (TargetsWindow::Two(window), host)
        }
        _ => (
            TargetsWindow::One(targets_tensor::<B>(&all[..b * t], device)),
            all[..b * t].to_vec(),
        ),
    }
}

enum TargetsWindow<B: burn::tensor::backend::Backend> {
    One(Tensor<B, 1, Int>),
    Two(Tensor<B, 2, Int>),
}

/// The loss of a window, flattened to `[N]` (or `[1]`), with the shape it had.
fn loss_of<B: FusedCrossEntropyBackend>(
    logits: Logits<B>,
    targets: TargetsWindow<B>,
    weights: Option<&[f32]>,
    options: &CrossEntropyOptions,
) -> (Tensor<B, 1>, Vec<usize>) {
    let weights = |device: &B::Device| weights.map(|w| Tensor::<B, 1>::from_floats(w, device));
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

/// One layout x reduction x dtype x options x ownership: forward untracked and tracked,
/// backward to the big tensor.
#[allow(clippy::too_many_arguments)]
fn check_window<B: FusedCrossEntropyBackend>(
    layout: Layout,
    (b, t, v): (usize, usize, usize),
    dtype: DType,
    reduction: Reduction,
    options_on: bool,
    exclusive: bool,
    one_pass: bool,
) where
    B::Device: Default,
{
    let _backward = shared_device();
    let seed = fresh_seed();
    let device = B::Device::default();
    let mut rng = rng(seed);
    let context = format!(
        "{} {layout:?} b={b} t={t} v={v} {dtype:?} {reduction:?} options={options_on} exclusive={exclusive} one_pass={one_pass} seed={seed}",
        short_name::<B>()
    );
    let options = CrossEntropyOptions {
        gradient_plan: plan(one_pass),
        ..if options_on {
            all_options(reduction, v)
        } else {
            CrossEntropyOptions::new(reduction)
        }
    };
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

    let big = BigTensor::<B>::from_values(values, &w.big_dims, dtype, &device);
    let big_seen = big.values();
    let seen: Vec<f64> = (0..rows)
        .flat_map(|r| (0..v).map(move |c| (r, c)))
        .map(|(r, c)| big_seen[w.row_start[r] + c * w.class_stride])
        .collect();
    let (_, targets) = cut_targets::<B>(&all_targets, layout, b, t, &device);
    let ref_rows = reference_rows(&seen, v, &targets, &reference);
    let ref_loss = reference_loss(&ref_rows, reduction);
    let (loss_tol, _) = tolerance(dtype);
    let expected_dims = match (reduction, &big) {
        (Reduction::None, BigTensor::Three(_)) => vec![b, t],
        (Reduction::None, BigTensor::Two(_)) => vec![rows],
        (_, BigTensor::Three(_)) => vec![1, 1],
        (_, BigTensor::Two(_)) => vec![1],
    };

    // Untracked.
    let (y, _) = cut_targets::<B>(&all_targets, layout, b, t, &device);
    let (loss, dims) = loss_of(cut(&big, layout, b, t, v), y, weights.as_deref(), &options);
    assert_eq!(dims, expected_dims, "{context}: loss shape");
    let err = relative_l2(&to_f64(loss), &ref_loss);
    assert!(err <= loss_tol, "{context}: untracked loss error {err:e}");
    assert_eq!(
        big.values(),
        big_seen,
        "{context}: forward changed the big tensor"
    );

    // Tracked, backward to the big tensor.
    let (leaf, window_ad) = match &big {
        BigTensor::Two(x) => {
            let leaf = Tensor::<Autodiff<B>, 2>::from_inner(x.clone()).require_grad();
            let src = if exclusive {
                leaf.clone() * 1.0
            } else {
                leaf.clone()
            };
            (BigTensor::Two(leaf), BigTensor::Two(src))
        }
        BigTensor::Three(x) => {
            let leaf = Tensor::<Autodiff<B>, 3>::from_inner(x.clone()).require_grad();
            let src = if exclusive {
                leaf.clone() * 1.0
            } else {
                leaf.clone()
            };
            (BigTensor::Three(leaf), BigTensor::Three(src))
        }
    };
    let logits = cut(&window_ad, layout, b, t, v);
    drop(window_ad);
    let (y, _) = cut_targets::<Autodiff<B>>(&all_targets, layout, b, t, &device);
    let (loss, dims) = loss_of(logits, y, weights.as_deref(), &options);
    assert_eq!(dims, expected_dims, "{context}: tracked loss shape");
    let err = relative_l2(&to_f64(loss.clone().inner()), &ref_loss);
    assert!(err <= loss_tol, "{context}: tracked loss error {err:e}");
    let (objective, g) = objective(loss, reduction, dtype, &mut rng);
    let grads = objective.backward();
    let grad = match &leaf {
        BigTensor::Two(x) => {
            let g = x.grad(&grads).expect("gradient");
            assert_eq!(g.dtype(), dtype, "{context}: gradient dtype");
            to_f64(g)
        }
        BigTensor::Three(x) => {
            let g = x.grad(&grads).expect("gradient");
            assert_eq!(g.dtype(), dtype, "{context}: gradient dtype");
            to_f64(g)
        }
    };
    let ref_grad_rows = reference_grad(&seen, v, &targets, &reference, &g);
    let mut ref_grad = vec![0.0; big_len];
    for r in 0..rows {
        for c in 0..v {
            ref_grad[w.row_start[r] + c * w.class_stride] = ref_grad_rows[r * v + c];
        }
    }
    // Outside the window: exactly 0.
    let mut inside = vec![false; big_len];
    for r in 0..rows {
        for c in 0..v {
            inside[w.row_start[r] + c * w.class_stride] = true;
        }
    }
    for (i, (&got, &is_inside)) in grad.iter().zip(&inside).enumerate() {
        if !is_inside {
            assert_eq!(got, 0.0, "{context}: gradient at {i} outside the window");
        }
    }
    check_grad(&grad, &ref_grad, dtype, &context);
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

fn check_windows<B: FusedCrossEntropyBackend>(dtypes: &[DType])
where
    B::Device: Default,
{
    let mut n = 0;
    for (layout, dims) in LAYOUTS {
        for reduction in REDUCTIONS {
            for options_on in [false, true] {
                n += 1;
                let dtype = dtypes[n % dtypes.len()];
                for one_pass in plans(reduction) {
                    for exclusive in [false, true] {
                        check_window::<B>(
                            layout, dims, dtype, reduction, options_on, exclusive, one_pass,
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
    check_windows::<CubeBackend>(&float_dtypes());
}

#[test]
fn strided_rows_on_the_default_fusion_backend() {
    poisoned();
    check_windows::<DefaultBackend>(&float_dtypes());
}

#[test]
fn strided_rows_on_ndarray() {
    check_windows::<NdArray>(&[DType::F32]);
}
