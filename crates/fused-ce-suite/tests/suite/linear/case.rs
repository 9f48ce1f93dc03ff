//! One case of the fused linear cross-entropy ([`LinearCase`]), its fresh inputs
//! ([`LinearValues`]) and the f64 reference of `hidden @ W + b` and the loss
//! ([`LinearReference`]): what every linear test of the suite draws and checks against.

use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_fused_ce::{ChunkProducts, CrossEntropyOptions, LinearChunking, Reduction};
use rand::{Rng, rngs::SmallRng};

use crate::common::*;
use crate::loss::contract::describe_grad_error;

/// One case: shapes, options and how the rows are cut.
#[derive(Debug, Clone)]
pub(crate) struct LinearCase {
    pub(crate) rows: usize,
    pub(crate) width: usize,
    pub(crate) vocab: usize,
    pub(crate) dtype: DType,
    pub(crate) options: CrossEntropyOptions,
    pub(crate) class_weights: bool,
    pub(crate) bias: bool,
    pub(crate) ignore: Ignore,
    /// Rows per chunk (the budget is set to hold exactly that many rows of logits).
    pub(crate) chunk_rows: usize,
    /// Columns per block of the weight-gradient product, else the whole product.
    pub(crate) block_columns: Option<usize>,
    /// The weight gradient summed in place over the chunks
    /// (`ChunkProducts::weight_gradient_in_place`).
    pub(crate) in_place: bool,
    /// Each chunk's hidden-state gradient split along the vocabulary where that fills
    /// more of the device (`ChunkProducts::hidden_gradient_split_k`).
    pub(crate) split_k: bool,
    /// The weight gradient summed in f32 (`ChunkProducts::f32_weight_gradient`).
    pub(crate) f32_weight_gradient: bool,
    /// The chunks' products through cuBLASLt on CUDA (`ChunkProducts::cublaslt`).
    pub(crate) cublaslt: bool,
    /// `[B, T, H]` hidden states with `B = 2` (rows must be even).
    pub(crate) three_d: bool,
    /// Through the module with an `nn::Linear`, else the function.
    pub(crate) via_module: bool,
}

impl LinearCase {
    pub(crate) fn new(
        rows: usize,
        width: usize,
        vocab: usize,
        dtype: DType,
        reduction: Reduction,
    ) -> Self {
        Self {
            rows,
            width,
            vocab,
            dtype,
            options: CrossEntropyOptions::new(reduction),
            class_weights: false,
            bias: true,
            ignore: Ignore::SomeRows,
            chunk_rows: 16,
            block_columns: None,
            in_place: false,
            split_k: ChunkProducts::default().hidden_gradient_split_k,
            f32_weight_gradient: false,
            cublaslt: ChunkProducts::default().cublaslt,
            three_d: false,
            via_module: false,
        }
    }

    pub(crate) fn chunking(&self) -> LinearChunking {
        LinearChunking {
            logits_bytes: Some(self.chunk_rows * self.vocab * self.dtype.size()),
            weight_gradient_block_bytes: self
                .block_columns
                .map(|columns| columns * self.width * self.dtype.size()),
            products: ChunkProducts {
                f32_weight_gradient: self.f32_weight_gradient,
                weight_gradient_in_place: self.in_place,
                hidden_gradient_split_k: self.split_k,
                cublaslt: self.cublaslt,
            },
        }
    }
}

pub(crate) fn matmul_f64(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p];
            for j in 0..n {
                out[i * n + j] += x * b[p * n + j];
            }
        }
    }
    out
}

pub(crate) fn transpose_f64(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; a.len()];
    for i in 0..rows {
        for j in 0..cols {
            out[j * rows + i] = a[i * cols + j];
        }
    }
    out
}

/// Relative L2 within `bound`, with the failure described.
pub(crate) fn check_close(got: &[f64], expected: &[f64], bound: f64, context: &str) {
    let err = relative_l2(got, expected);
    assert!(
        err <= bound,
        "{context}: error {err:e} > {bound:e}\n{}",
        describe_grad_error(got, expected)
    );
}

/// The bound for values that went through one matmul rounded to `dtype` on top of the
/// loss's own: the loss's table bound twice for half types; for f32, a matmul on tensor
/// cores (TF32 operands, relative error near 3e-4) as CUDA runs it.
/// The bound against the f64 reference for `case`: [`bound`], but for f32 products
/// through cuBLASLt on CUDA, exact f32 products, where the spec's f32 bound holds.
pub(crate) fn case_bound(case: &LinearCase) -> f64 {
    if case.dtype == DType::F32 && case.cublaslt && cfg!(feature = "cuda") {
        1e-4
    } else {
        bound(case.dtype)
    }
}

pub(crate) fn bound(dtype: DType) -> f64 {
    let (_, grad) = tolerance(dtype);
    if dtype == DType::F32 {
        1e-3
    } else {
        2.0 * grad
    }
}

pub(crate) fn loss_len(reduction: Reduction, rows: usize) -> usize {
    if reduction == Reduction::None {
        rows
    } else {
        1
    }
}

/// A case's fresh inputs (f32 on the host, before the cast to the case's dtype).
pub(crate) struct LinearValues {
    pub(crate) hidden: Vec<f32>,
    pub(crate) weight: Vec<f32>,
    pub(crate) bias: Vec<f32>,
    pub(crate) targets: Vec<i64>,
    pub(crate) class_weights: Option<Vec<f32>>,
    /// The incoming gradient per row of `None`.
    pub(crate) row_grad: Vec<f32>,
    /// The incoming gradient of `Mean` and `Sum`.
    pub(crate) loss_scale: f32,
}

impl LinearValues {
    pub(crate) fn draw(case: &LinearCase, rng: &mut SmallRng) -> Self {
        let LinearCase {
            rows, width, vocab, ..
        } = *case;
        // Logits of a few units: hidden states and weights around 1 / sqrt(width).
        let scale = 2.0 / (width as f32).sqrt();
        let hidden = (0..rows * width)
            .map(|_| rng.random_range(-1.5f32..1.5))
            .collect();
        let weight = (0..width * vocab)
            .map(|_| rng.random_range(-scale..scale) * 2.0)
            .collect();
        let bias = (0..vocab).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let targets = random_targets(rng, rows, vocab, case.ignore, case.options.ignore_index);
        let class_weights = case.class_weights.then(|| random_class_weights(rng, vocab));
        let row_grad = (0..rows).map(|_| rng.random_range(0.5f32..1.5)).collect();
        Self {
            hidden,
            weight,
            bias,
            targets,
            class_weights,
            row_grad,
            loss_scale: 0.375,
        }
    }

    /// The hidden states `[N, H]`, weight `[H, V]` and bias `[V]` on `device`, in `dtype`.
    pub(crate) fn tensors(
        &self,
        case: &LinearCase,
        dtype: DType,
        device: &Device,
    ) -> (Tensor<2>, Tensor<2>, Tensor<1>) {
        let (rows, width, vocab) = (case.rows, case.width, case.vocab);
        let matrix = |values: &[f32], dims: [usize; 2]| {
            Tensor::<2>::from_data(TensorData::new(values.to_vec(), dims), device).cast(dtype)
        };
        let bias = Tensor::<1>::from_data(TensorData::new(self.bias.clone(), [vocab]), device);
        (
            matrix(&self.hidden, [rows, width]),
            matrix(&self.weight, [width, vocab]),
            bias.cast(dtype),
        )
    }
}

/// The f64 reference of one case from the inputs as the kernels see them (`h`, `w`, `b`
/// read back after the cast): the loss and the three gradients.
pub(crate) struct LinearReference {
    pub(crate) loss: Vec<f64>,
    pub(crate) hidden: Vec<f64>,
    pub(crate) weight: Vec<f64>,
    pub(crate) bias: Vec<f64>,
}

pub(crate) fn linear_reference(
    case: &LinearCase,
    values: &LinearValues,
    (h64, w64, b64): (&[f64], &[f64], &[f64]),
) -> LinearReference {
    let LinearCase {
        rows, width, vocab, ..
    } = *case;
    let reduction = case.options.reduction;
    let dims = (rows, width, vocab);
    let logits64 = head_logits_f64((h64, w64, case.bias.then_some(b64)), dims);
    let ref_options = RefOptions::new(&case.options, values.class_weights.as_deref());
    let ref_rows = reference_rows(&logits64, vocab, &values.targets, &ref_options);
    let loss = reference_loss(&ref_rows, reduction);
    let incoming: Vec<f64> = match reduction {
        Reduction::None => values.row_grad.iter().map(|&g| g as f64).collect(),
        _ => vec![values.loss_scale as f64],
    };
    let dlogits = reference_grad(&logits64, vocab, &values.targets, &ref_options, &incoming);
    let [hidden, weight, bias] = head_gradients_f64((h64, w64), &dlogits, dims);
    LinearReference {
        loss,
        hidden,
        weight,
        bias,
    }
}

/// `hidden [rows, width] @ weight [width, vocab] + bias` in f64, `[rows, vocab]`.
fn head_logits_f64(
    (hidden, weight, bias): (&[f64], &[f64], Option<&[f64]>),
    (rows, width, vocab): (usize, usize, usize),
) -> Vec<f64> {
    let mut logits = matmul_f64(hidden, weight, rows, width, vocab);
    if let Some(bias) = bias {
        for row in 0..rows {
            for c in 0..vocab {
                logits[row * vocab + c] += bias[c];
            }
        }
    }
    logits
}

/// The gradients of the hidden states, the weight and the bias in f64 for the logits'
/// gradient `dlogits [rows, vocab]` of [`head_logits_f64`].
fn head_gradients_f64(
    (hidden, weight): (&[f64], &[f64]),
    dlogits: &[f64],
    (rows, width, vocab): (usize, usize, usize),
) -> [Vec<f64>; 3] {
    let grad_hidden = matmul_f64(
        dlogits,
        &transpose_f64(weight, width, vocab),
        rows,
        vocab,
        width,
    );
    let grad_weight = matmul_f64(
        &transpose_f64(hidden, rows, width),
        dlogits,
        width,
        rows,
        vocab,
    );
    let grad_bias = (0..vocab)
        .map(|c| (0..rows).map(|r| dlogits[r * vocab + c]).sum())
        .collect();
    [grad_hidden, grad_weight, grad_bias]
}

/// The gradients a case got, `(hidden, weight, bias)`, within `bound` of the reference's;
/// where the reference's is all 0 (no row counts), exactly 0.
#[allow(clippy::type_complexity)]
pub(crate) fn check_gradients(
    context: &str,
    bound: f64,
    (hidden, weight, bias): (&[f64], &[f64], Option<&[f64]>),
    (ref_hidden, ref_weight, ref_bias): (&[f64], &[f64], Option<&[f64]>),
) {
    let all_zero = |v: &[f64]| v.iter().all(|x| *x == 0.0);
    for (name, got, expected) in [
        ("hidden", hidden, ref_hidden),
        ("weight", weight, ref_weight),
    ] {
        if all_zero(expected) {
            assert!(all_zero(got), "{context}: the {name} gradient must be 0");
        } else {
            check_close(got, expected, bound, &format!("{context}: {name} gradient"));
        }
    }
    match (bias, ref_bias) {
        (Some(got), Some(expected)) if all_zero(expected) => {
            assert!(all_zero(got), "{context}: the bias gradient must be 0")
        }
        (Some(got), Some(expected)) => {
            check_close(got, expected, bound, &format!("{context}: bias gradient"))
        }
        (None, None) => {}
        _ => panic!("{context}: a bias gradient exactly when there is a bias"),
    }
}

/// [`linear_reference`] of the hidden states, weight and bias as the kernels see them:
/// read back after the cast to the case's dtype.
pub(crate) fn reference_as_seen(
    case: &LinearCase,
    values: &LinearValues,
    (hidden, weight, bias): (&Tensor<2>, &Tensor<2>, &Tensor<1>),
) -> LinearReference {
    let (h64, w64, b64) = (
        to_f64(hidden.clone()),
        to_f64(weight.clone()),
        to_f64(bias.clone()),
    );
    linear_reference(case, values, (&h64, &w64, &b64))
}

/// Random values in `[-1, 1)` scaled by `scale`.
pub(crate) fn uniform(rng: &mut SmallRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * scale)
        .collect()
}

/// A head drawn for a gradient check: `hidden [rows, width]` in `[-1.5, 1.5)`, `weight
/// [width, vocab]` scaled as a trained head's, `bias [vocab]` in `[-1, 1)`, all in `dtype`
/// on `device`, and the same values as the kernels see them (f64).
pub(crate) struct DrawnHead {
    pub hidden: Tensor<2>,
    pub weight: Tensor<2>,
    pub bias: Tensor<1>,
    pub h64: Vec<f64>,
    pub w64: Vec<f64>,
    pub b64: Vec<f64>,
}

impl DrawnHead {
    pub(crate) fn draw(
        rng: &mut SmallRng,
        (rows, width, vocab): (usize, usize, usize),
        dtype: DType,
        device: &Device,
    ) -> Self {
        let scale = 2.0 / (width as f32).sqrt();
        let mut uniform = |n: usize, range: f32| -> Vec<f32> {
            (0..n).map(|_| rng.random_range(-range..range)).collect()
        };
        let (hidden_values, weight_values, bias_values) = (
            uniform(rows * width, 1.5),
            uniform(width * vocab, 2.0 * scale),
            uniform(vocab, 1.0),
        );
        let tensor = |values: Vec<f32>, dims: [usize; 2]| {
            Tensor::<2>::from_data(TensorData::new(values, dims), device).cast(dtype)
        };
        let hidden = tensor(hidden_values, [rows, width]);
        let weight = tensor(weight_values, [width, vocab]);
        let bias =
            Tensor::<1>::from_data(TensorData::new(bias_values, [vocab]), device).cast(dtype);
        Self {
            h64: to_f64(hidden.clone()),
            w64: to_f64(weight.clone()),
            b64: to_f64(bias.clone()),
            hidden,
            weight,
            bias,
        }
    }

    /// The hidden states, the weight and the bias as autodiff leaves that take gradients.
    pub(crate) fn tracked(&self) -> (Tensor<2>, Tensor<2>, Tensor<1>) {
        (
            self.hidden.clone().autodiff().require_grad(),
            self.weight.clone().autodiff().require_grad(),
            self.bias.clone().autodiff().require_grad(),
        )
    }

    /// `hidden @ weight + bias` in f64, `[rows, vocab]`.
    pub(crate) fn logits_f64(&self, dims: (usize, usize, usize)) -> Vec<f64> {
        head_logits_f64((&self.h64, &self.w64, Some(&self.b64)), dims)
    }

    /// Checks the gradients that the head's [`Self::tracked`] tensors got, `(hidden,
    /// weight, bias)`, against the f64 ones for the logits' gradient `dlogits [rows,
    /// vocab]`, within `bound`.
    pub(crate) fn check_gradients(
        &self,
        context: &str,
        bound: f64,
        (hidden, weight, bias): (Option<Tensor<2>>, Option<Tensor<2>>, Option<Tensor<1>>),
        dlogits: &[f64],
        dims: (usize, usize, usize),
    ) {
        let got = |grad: Option<Vec<f64>>, name: &str| {
            grad.unwrap_or_else(|| panic!("{context}: no {name} gradient"))
        };
        let (hidden, weight, bias) = (
            got(hidden.map(to_f64), "hidden"),
            got(weight.map(to_f64), "weight"),
            got(bias.map(to_f64), "bias"),
        );
        let [ref_hidden, ref_weight, ref_bias] =
            head_gradients_f64((&self.h64, &self.w64), dlogits, dims);
        check_gradients(
            context,
            bound,
            (&hidden, &weight, Some(&bias)),
            (&ref_hidden, &ref_weight, Some(&ref_bias)),
        );
    }
}
