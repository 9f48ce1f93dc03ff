//! The fused linear cross-entropy against an f64 reference of `hidden @ W + b` and the
//! loss (the spec's formulas) and against the unfused composition (Burn's matmul, then our
//! loss): every reduction with non-uniform incoming gradients, every option, class
//! weights, ignored and all-ignored rows, 3-D input, with and without a bias, the chunk
//! boundaries (one chunk, a partial last one, many), through the module with Burn's
//! `Linear` and through the function, on every backend.
//!
//! Burn 0.22 picks the backend by the device, and this build has Burn's fusion on: a cube
//! device's `Tensor<D>` runs on `Fusion<CubeBackend>`, whose custom ops run the plain
//! `CubeBackend`'s products. The plain backend has no `Tensor<D>` and no autodiff of its
//! own here, so it is tested on its primitives: its forward against the reference, and
//! each product it runs by kernels of its own (`accumulate_product`, `matmul_split_k`,
//! `add_into_columns`, `with_matmul_aligned_rows`) against the f64 product. Gradients on
//! a cube device are checked through `Fusion<CubeBackend>`.

use burn::backend::TensorMetadata;
use burn::backend::ops::FloatTensorOps;
use burn::module::Param;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{DType, Device, Slice, Tensor, TensorData};
use burn_fused_ce::backend::{
    IncomingGuess, LinearCrossEntropyBackend, LinearHead, LinearInputs, OptionalFloat,
};
use burn_fused_ce::{
    CrossEntropyOptions, ExtraOutputs, FusedCrossEntropyLossConfig,
    FusedLinearCrossEntropyLossConfig, LinearChunking, Reduction, TargetCheck,
    WeightGradientStream, fused_cross_entropy, max_buffer_bytes, test_hooks,
    try_fused_linear_cross_entropy, wait_for_target_checks,
};
use rand::{Rng, rngs::SmallRng};

use crate::common::*;
use crate::contract::{REDUCTIONS, describe_grad_error, poisoned};
use crate::cube_primitives::{self as prim, C};

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
    /// (`LinearChunking::weight_gradient_in_place`).
    pub(crate) in_place: bool,
    /// Each chunk's hidden-state gradient split along the vocabulary where that fills
    /// more of the device (`LinearChunking::hidden_gradient_split_k`).
    pub(crate) split_k: bool,
    /// The weight gradient summed in f32 (`LinearChunking::f32_weight_gradient`).
    pub(crate) f32_weight_gradient: bool,
    /// The chunks' products through cuBLASLt on CUDA (`LinearChunking::cublaslt`).
    pub(crate) cublaslt: bool,
    /// Where the weight gradient's sums run (`LinearChunking::weight_gradient_stream`).
    pub(crate) weight_gradient_stream: WeightGradientStream,
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
            split_k: LinearChunking::default().hidden_gradient_split_k,
            f32_weight_gradient: false,
            cublaslt: LinearChunking::default().cublaslt,
            weight_gradient_stream: LinearChunking::default().weight_gradient_stream,
            three_d: false,
            via_module: false,
        }
    }

    pub(crate) fn chunking(&self) -> LinearChunking {
        LinearChunking {
            logits_bytes: Some(self.chunk_rows * self.vocab * self.dtype.size()),
            f32_weight_gradient: self.f32_weight_gradient,
            weight_gradient_block_bytes: self
                .block_columns
                .map(|columns| columns * self.width * self.dtype.size()),
            weight_gradient_in_place: self.in_place,
            hidden_gradient_split_k: self.split_k,
            cublaslt: self.cublaslt,
            weight_gradient_stream: self.weight_gradient_stream,
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
fn case_bound(case: &LinearCase) -> f64 {
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

fn loss_len(reduction: Reduction, rows: usize) -> usize {
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
    let mut logits64 = matmul_f64(h64, w64, rows, width, vocab);
    if case.bias {
        for row in 0..rows {
            for c in 0..vocab {
                logits64[row * vocab + c] += b64[c];
            }
        }
    }
    let ref_options = RefOptions::new(&case.options, values.class_weights.as_deref());
    let ref_rows = reference_rows(&logits64, vocab, &values.targets, &ref_options);
    let loss = reference_loss(&ref_rows, reduction);
    let incoming: Vec<f64> = match reduction {
        Reduction::None => values.row_grad.iter().map(|&g| g as f64).collect(),
        _ => vec![values.loss_scale as f64],
    };
    let dlogits = reference_grad(&logits64, vocab, &values.targets, &ref_options, &incoming);
    let hidden = matmul_f64(
        &dlogits,
        &transpose_f64(w64, width, vocab),
        rows,
        vocab,
        width,
    );
    let weight = matmul_f64(
        &transpose_f64(h64, rows, width),
        &dlogits,
        width,
        rows,
        vocab,
    );
    let bias = (0..vocab)
        .map(|c| (0..rows).map(|r| dlogits[r * vocab + c]).sum())
        .collect();
    LinearReference {
        loss,
        hidden,
        weight,
        bias,
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

/// The module's config for `case`: its options, `class_weights` and chunking.
pub(crate) fn module_config(
    case: &LinearCase,
    class_weights: Option<Vec<f32>>,
) -> FusedLinearCrossEntropyLossConfig {
    let options = &case.options;
    FusedLinearCrossEntropyLossConfig::new()
        .with_loss(
            FusedCrossEntropyLossConfig::new()
                .with_reduction(options.reduction)
                .with_ignore_index(options.ignore_index)
                .with_label_smoothing(options.label_smoothing)
                .with_z_loss_scale(options.z_loss_scale)
                .with_temperature(options.temperature)
                .with_softcap(options.softcap)
                .with_class_weights(class_weights),
        )
        .with_chunking(case.chunking())
}

/// Checks one case through `Tensor<D>` on `backend` (`Fusion` or `Flex`) under autodiff:
/// the loss and the gradients of the hidden states, the weight and the bias against the
/// f64 reference, and the loss against the unfused composition.
pub(crate) fn check_linear_case(backend: TestBackend, case: LinearCase) {
    check_linear_case_seeded(backend, case, fresh_seed());
}

/// [`check_linear_case`] on the inputs `seed` draws.
pub(crate) fn check_linear_case_seeded(backend: TestBackend, case: LinearCase, seed: u64) {
    assert_ne!(
        backend,
        TestBackend::Cube,
        "the plain backend runs on primitives"
    );
    let _backward = shared_device();
    let mut rng = rng(seed);
    let plain = backend.device();
    let device = plain.clone().autodiff();
    let LinearCase {
        rows, width, dtype, ..
    } = case;
    let context = format!("{} {case:?} seed={seed}", backend.name());
    let reduction = case.options.reduction;
    let values = LinearValues::draw(&case, &mut rng);

    let (hidden, weight, bias) = values.tensors(&case, dtype, &plain);
    let reference = reference_as_seen(&case, &values, (&hidden, &weight, &bias));
    let row_grad = values.row_grad.as_slice();

    // Ours under autodiff.
    let hidden_ad = hidden.clone().autodiff().require_grad();
    let weight_ad = weight.clone().autodiff().require_grad();
    let bias_ad = bias.clone().autodiff().require_grad();
    let targets_ad = targets_tensor(&values.targets, &device);
    let weights_ad = values
        .class_weights
        .as_ref()
        .map(|w| Tensor::<1>::from_floats(w.as_slice(), &device));
    let (loss, grads) = if case.via_module {
        let loss_fn = module_config(&case, values.class_weights.clone()).init(&device);
        let head = Linear {
            weight: Param::from_tensor(weight_ad.clone()),
            bias: case.bias.then(|| Param::from_tensor(bias_ad.clone())),
        };
        let loss = if case.three_d {
            loss_fn
                .forward(
                    hidden_ad.clone().reshape([2, rows / 2, width]),
                    &head,
                    targets_ad.reshape([2, rows / 2]),
                )
                .reshape([loss_len(reduction, rows)])
        } else {
            loss_fn.forward(hidden_ad.clone(), &head, targets_ad)
        };
        let grads = objective_of(loss.clone(), reduction, row_grad, values.loss_scale).backward();
        // The parameters are new leaves: read their gradients from the module.
        let grad_weight = to_f64(head.weight.val().grad(&grads).expect("weight gradient"));
        let grad_bias = head
            .bias
            .as_ref()
            .map(|b| to_f64(b.val().grad(&grads).expect("bias gradient")));
        let grad_hidden = to_f64(hidden_ad.grad(&grads).expect("hidden gradient"));
        (loss, (grad_hidden, grad_weight, grad_bias))
    } else {
        let bias_in = case.bias.then(|| bias_ad.clone());
        let loss = if case.three_d {
            try_fused_linear_cross_entropy(
                hidden_ad.clone().reshape([2, rows / 2, width]),
                weight_ad.clone(),
                bias_in,
                targets_ad.reshape([2, rows / 2]),
                weights_ad,
                &case.options,
                &case.chunking(),
            )
            .unwrap_or_else(|e| panic!("{context}: {e}"))
            .loss
            .reshape([loss_len(reduction, rows)])
        } else {
            try_fused_linear_cross_entropy(
                hidden_ad.clone(),
                weight_ad.clone(),
                bias_in,
                targets_ad,
                weights_ad,
                &case.options,
                &case.chunking(),
            )
            .unwrap_or_else(|e| panic!("{context}: {e}"))
            .loss
        };
        let grads = objective_of(loss.clone(), reduction, row_grad, values.loss_scale).backward();
        let grad_hidden = to_f64(hidden_ad.grad(&grads).expect("hidden gradient"));
        let grad_weight = to_f64(weight_ad.grad(&grads).expect("weight gradient"));
        let grad_bias = case
            .bias
            .then(|| to_f64(bias_ad.grad(&grads).expect("bias gradient")));
        (loss, (grad_hidden, grad_weight, grad_bias))
    };
    let (grad_hidden, grad_weight, grad_bias) = grads;
    check_gradients(
        &context,
        case_bound(&case),
        (&grad_hidden, &grad_weight, grad_bias.as_deref()),
        (
            &reference.hidden,
            &reference.weight,
            case.bias.then_some(reference.bias.as_slice()),
        ),
    );
    let (loss_tol, _) = tolerance(dtype);
    let got = to_f64(loss.inner());
    check_close(
        &got,
        &reference.loss,
        loss_tol.max(case_bound(&case) / 2.0),
        &format!("{context}: loss"),
    );

    // The unfused composition on the same inputs, in the same dtype: Burn's matmul, then
    // our loss.
    let logits = match case.bias {
        true => hidden.matmul(weight) + bias.unsqueeze_dim(0),
        false => hidden.matmul(weight),
    };
    let weights = values
        .class_weights
        .as_ref()
        .map(|w| Tensor::<1>::from_floats(w.as_slice(), &plain));
    let unfused = burn_fused_ce::try_fused_cross_entropy(
        logits,
        targets_tensor(&values.targets, &plain),
        weights,
        &case.options,
    )
    .unwrap_or_else(|e| panic!("{context}: unfused: {e}"))
    .loss;
    check_close(
        &got,
        &to_f64(unfused),
        bound(dtype),
        &format!("{context}: against the unfused loss"),
    );
}

/// The training objective: `sum(loss * g)` with a non-uniform `g` per row for `None`,
/// `loss * s` otherwise.
pub(crate) fn objective_of(
    loss: Tensor<1>,
    reduction: Reduction,
    row_grad: &[f32],
    scale: f32,
) -> Tensor<1> {
    match reduction {
        Reduction::None => {
            let g = Tensor::<1>::from_floats(row_grad, &loss.device()).cast(loss.dtype());
            (loss * g).sum()
        }
        _ => loss * scale,
    }
}

#[allow(clippy::type_complexity)]
fn check_gradients(
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

/// The matrix's cases: every reduction x dtype, alternating the options, the bias, the
/// chunking, 3-D input and the module; then all rows ignored (loss 0 for Mean, gradients
/// exactly 0).
fn linear_matrix(dtypes: &[DType]) -> Vec<LinearCase> {
    let mut cases = Vec::new();
    let mut n = 0;
    for &dtype in dtypes {
        for reduction in REDUCTIONS {
            for (rows, chunk_rows) in [(37, 16), (32, 1000), (100, 16), (40, 24)] {
                n += 1;
                let mut case = LinearCase::new(rows, 24, 67, dtype, reduction);
                case.chunk_rows = chunk_rows;
                // Blocks of the weight-gradient product: 10 columns (the last 7 of 67),
                // or 30.
                case.block_columns = match (rows, n % 2) {
                    (100, _) => Some(10),
                    (37, 0) => Some(30),
                    _ => None,
                };
                case.bias = n % 3 != 0;
                case.three_d = rows % 2 == 0 && n % 2 == 0;
                case.via_module = n % 4 < 2;
                if n % 2 == 1 {
                    case.options.label_smoothing = 0.1;
                    case.options.z_loss_scale = 1e-3;
                    case.options.softcap = Some(12.0);
                }
                case.class_weights = n % 5 < 2;
                // The split off in a third of the cases (67 classes are too few to split).
                case.split_k = n % 3 != 2;
                cases.push(case);
            }
        }
    }
    for reduction in REDUCTIONS {
        let mut case = LinearCase::new(20, 16, 33, DType::F32, reduction);
        case.ignore = Ignore::AllRows;
        cases.push(case);
    }
    cases
}

fn check_linear_matrix(backend: TestBackend, dtypes: &[DType]) {
    for case in linear_matrix(dtypes) {
        check_linear_case(backend, case);
    }
}

#[test]
fn linear_on_the_default_fusion_backend() {
    poisoned();
    check_linear_matrix(TestBackend::Fusion, &float_dtypes());
}

#[test]
fn linear_on_flex_through_the_portable_path() {
    check_linear_matrix(TestBackend::Flex, &[DType::F32]);
}

/// The plain `CubeBackend` on its primitives: the forward of every case of the matrix
/// (its op's default body, chunk by chunk, as `Autodiff` and `Fusion` run it on the inner
/// backend), the loss against the f64 reference. Its gradients are not reachable without
/// `Autodiff<CubeBackend>`, which Burn 0.22 does not build in a fusion build: they are
/// checked through `Fusion<CubeBackend>` (whose custom ops run this backend's products)
/// and the products themselves below.
#[test]
fn linear_forward_on_the_cube_backend_primitives() {
    poisoned();
    let _backward = shared_device();
    let most = max_buffer_bytes(&device());
    for case in linear_matrix(&float_dtypes()) {
        let seed = fresh_seed();
        let mut rng = rng(seed);
        let context = format!("CubeBackend {case:?} seed={seed}");
        let values = LinearValues::draw(&case, &mut rng);
        let LinearCase {
            rows,
            width,
            vocab,
            dtype,
            ..
        } = case;
        let hidden = prim::floats(values.hidden.clone(), &[rows, width], dtype);
        let weight = prim::floats(values.weight.clone(), &[width, vocab], dtype);
        let bias = prim::floats(values.bias.clone(), &[vocab], dtype);
        let (h64, w64, b64) = (
            prim::read(hidden.clone()).values,
            prim::read(weight.clone()).values,
            prim::read(bias.clone()).values,
        );
        let reference = linear_reference(&case, &values, (&h64, &w64, &b64));
        let inputs = LinearInputs {
            hidden,
            head: LinearHead {
                weight,
                bias: OptionalFloat::from_option(case.bias.then_some(bias)),
            },
            targets: prim::ints(&values.targets, &[rows]),
            class_weights: prim::class_weights(values.class_weights.as_deref()),
        };
        let parts = C::fused_linear_cross_entropy(
            inputs,
            case.options.clone(),
            case.chunking().within(most),
            IncomingGuess::new(),
        );
        let loss = prim::read(parts.loss);
        assert_eq!(
            loss.dims,
            vec![loss_len(case.options.reduction, rows)],
            "{context}: loss shape"
        );
        assert_eq!(loss.dtype, dtype, "{context}: loss dtype");
        let (loss_tol, _) = tolerance(dtype);
        check_close(
            &loss.values,
            &reference.loss,
            loss_tol.max(bound(dtype) / 2.0),
            &format!("{context}: loss"),
        );
    }
}

/// Whether the device has TMA, which the in-place weight-gradient sum needs.
fn device_has_tma() -> bool {
    fused_ce_kernels::has_tma(&fused_ce_suite::client(&device()))
}

/// Checks `case` (through `Fusion<CubeBackend>`), which must have moved the test-hook
/// counter `count` at least once where the device has TMA (`missing` says what did not
/// happen otherwise).
fn check_ran(tma: bool, case: LinearCase, count: fn() -> usize, missing: &str) {
    let context = format!("{case:?}");
    let before = count();
    check_linear_case(TestBackend::Fusion, case);
    if tma {
        assert!(
            count() > before,
            "{context}: the device has TMA, yet {missing} (the last refusal: {:?})",
            test_hooks::in_place_accumulate_refusal(),
        );
    }
}

/// The weight gradient summed in place over the chunks, on shapes whose rows TMA can read
/// (64 hidden units, 512 or 384 classes, chunks of 64 rows and a last one of 8; half
/// types summed in f32 and in their own dtype) and on one it cannot (67 classes: the
/// product is formed and added). Where the device has TMA, every aligned case must have
/// summed in place. 384 classes: CUDA pads the rows of Burn's matmul outputs to a
/// multiple of 512 bytes (384 half classes come out with a row stride of 512), and the
/// first chunk's product starts the sum. Through `Fusion<CubeBackend>`, whose custom op
/// runs the plain backend's `accumulate_product` (tested on primitives below).
#[test]
fn weight_gradient_in_place_on_the_default_fusion_backend() {
    poisoned();
    let tma = device_has_tma();
    for (n, dtype) in float_dtypes().into_iter().enumerate() {
        for reduction in [Reduction::Mean, Reduction::None] {
            let classes = if reduction == Reduction::Mean {
                512
            } else {
                384
            };
            let mut case = LinearCase::new(200, 64, classes, dtype, reduction);
            case.chunk_rows = 64;
            case.in_place = true;
            case.cublaslt = false;
            case.bias = n % 2 == 0;
            case.f32_weight_gradient = dtype != DType::F32 && reduction == Reduction::Mean;
            check_ran(
                tma,
                case,
                test_hooks::in_place_accumulate_count,
                "no chunk's product was summed in place",
            );
        }
    }
    let mut unaligned = LinearCase::new(40, 24, 67, DType::F32, Reduction::Sum);
    unaligned.in_place = true;
    check_linear_case(TestBackend::Fusion, unaligned);
}

/// Each chunk's hidden-state gradient split along the vocabulary
/// (`hidden_gradient_split_k`): 1000 classes in 3 slices of 320 and 40 left over, chunks
/// of 64 rows (an output of one tile) and a last one of 8, in f32 and in the widest half
/// type; 448 classes (too few to cut) formed unsplit by the same kernel; 1000 classes of
/// 96 rows with the option off beside it. Where the device has TMA, the split and the
/// unsplit kernel must have run. Through `Fusion<CubeBackend>` (its custom op runs the
/// plain backend's `matmul_split_k`, tested on primitives below).
#[test]
fn hidden_gradient_split_k_on_the_default_fusion_backend() {
    poisoned();
    let tma = device_has_tma();
    let half = if SUPPORTS_BF16 {
        DType::BF16
    } else {
        DType::F16
    };
    // Chunks of 64 rows, width 64, with the option on.
    let split_k_case = |rows, classes, dtype, reduction| {
        let mut case = LinearCase::new(rows, 64, classes, dtype, reduction);
        case.chunk_rows = 64;
        case.split_k = true;
        case.cublaslt = false;
        case
    };
    for (dtype, reduction) in [(DType::F32, Reduction::Sum), (half, Reduction::None)] {
        check_ran(
            tma,
            split_k_case(200, 1000, dtype, reduction),
            test_hooks::split_k_product_count,
            "no chunk's hidden-state gradient was split",
        );
    }
    check_ran(
        tma,
        split_k_case(136, 448, half, Reduction::Mean),
        test_hooks::unsplit_kernel_product_count,
        "no chunk's hidden-state gradient was formed by the unsplit kernel",
    );
    // Off: the backend's matmul (the counter is the process's, shared with tests
    // running beside this one, so only the values are checked).
    let mut unsplit = LinearCase::new(96, 64, 1000, DType::F32, Reduction::Mean);
    unsplit.split_k = false;
    check_linear_case(TestBackend::Fusion, unsplit);
}

/// Random values in `[-1, 1)` scaled by `scale`.
pub(crate) fn uniform(rng: &mut SmallRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * scale)
        .collect()
}

/// The plain backend's products, which it runs by kernels of its own where the device
/// allows (and by Burn's ops elsewhere; cuBLASLt is off here, see `cublaslt.rs`), against the f64 product of the same inputs:
/// `accumulate_product` (`sum + lhs rhs`, a transposed `lhs` as the weight gradient has
/// it, a sum held elsewhere too, which must stay unchanged), `matmul_split_k` (split and
/// unsplit sizes) and `add_into_columns` (a block inside and one at the end), in each
/// dtype.
#[test]
fn products_on_the_cube_backend_primitives() {
    poisoned();
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    for dtype in float_dtypes() {
        let bound = match dtype {
            DType::F32 => 1e-3,
            DType::F16 => 2e-3,
            _ => 8e-3,
        };
        for (m, k, n) in [(64, 200, 384), (24, 40, 67), (64, 1000, 64)] {
            let context = format!("{dtype:?} {m}x{k}x{n} seed={seed}");
            // `lhs` as the weight gradient's: the transpose of `[k, m]` rows.
            let lhs_rows = prim::floats(uniform(&mut rng, k * m, 1.0), &[k, m], dtype);
            let lhs = C::float_transpose(lhs_rows.clone());
            let rhs = prim::floats(uniform(&mut rng, k * n, 1.0), &[k, n], dtype);
            let lhs64 = transpose_f64(&prim::read(lhs_rows).values, k, m);
            let rhs64 = prim::read(rhs.clone()).values;
            let product64 = matmul_f64(&lhs64, &rhs64, m, k, n);
            let scale = (k as f64).sqrt() as f32;
            for held in [false, true] {
                let sum = prim::floats(uniform(&mut rng, m * n, scale), &[m, n], dtype);
                let start64 = prim::read(sum.clone()).values;
                let kept = held.then(|| sum.clone());
                let got = C::accumulate_product(sum, lhs.clone(), rhs.clone(), false, false);
                let expected: Vec<f64> =
                    start64.iter().zip(&product64).map(|(s, p)| s + p).collect();
                let got = prim::read(got);
                assert_eq!(got.dims, vec![m, n], "{context}: accumulate_product shape");
                check_close(
                    &got.values,
                    &expected,
                    bound,
                    &format!("{context} held={held}: accumulate_product"),
                );
                if let Some(kept) = kept {
                    let context = format!("{context}: a held sum changed");
                    crate::call::assert_same_values(&prim::read(kept).values, &start64, &context);
                }
            }
            // An f32 sum of `dtype` operands (`f32_weight_gradient`).
            if dtype != DType::F32 {
                let sum = prim::floats(uniform(&mut rng, m * n, scale), &[m, n], DType::F32);
                let start64 = prim::read(sum.clone()).values;
                let got = prim::read(C::accumulate_product(
                    sum,
                    lhs.clone(),
                    rhs.clone(),
                    false,
                    false,
                ));
                assert_eq!(got.dtype, DType::F32, "{context}: an f32 sum stays f32");
                let expected: Vec<f64> =
                    start64.iter().zip(&product64).map(|(s, p)| s + p).collect();
                check_close(
                    &got.values,
                    &expected,
                    1e-3,
                    &format!("{context}: accumulate_product into f32"),
                );
            }
            // `lhs [m, k]` contiguous times `rhs [k, n]`, as a chunk's hidden-state
            // gradient.
            let lhs = prim::floats(uniform(&mut rng, m * k, 1.0), &[m, k], dtype);
            let lhs64 = prim::read(lhs.clone()).values;
            let got = prim::read(C::matmul_split_k(lhs, rhs.clone(), false));
            assert_eq!(got.dims, vec![m, n], "{context}: matmul_split_k shape");
            assert_eq!(got.dtype, dtype, "{context}: matmul_split_k dtype");
            check_close(
                &got.values,
                &matmul_f64(&lhs64, &rhs64, m, k, n),
                bound,
                &format!("{context}: matmul_split_k"),
            );
            // A block of columns added into the sum: inside, and the last ones.
            for (start, width) in [(1, n / 3), (n - 7, 7)] {
                let sum = prim::floats(uniform(&mut rng, m * n, 1.0), &[m, n], dtype);
                let block = prim::floats(uniform(&mut rng, m * width, 1.0), &[m, width], dtype);
                let (sum64, block64) = (
                    prim::read(sum.clone()).values,
                    prim::read(block.clone()).values,
                );
                let mut expected = sum64.clone();
                for r in 0..m {
                    for c in 0..width {
                        expected[r * n + start + c] += block64[r * width + c];
                    }
                }
                let got = prim::read(C::add_into_columns(sum, block, start));
                check_close(
                    &got.values,
                    &expected,
                    bound,
                    &format!("{context}: add_into_columns at {start} of {width}"),
                );
            }
        }
    }
}

/// The in-place kernel itself, `sum += lhs rhs`, against an f64 reference from the same
/// inputs: sums of each dtype (and f32 sums of half inputs), contiguous and with padded
/// rows, a transposed `lhs` as the weight gradient has it, one row of tiles per plane and
/// two, and shapes past the sizes where cubek-matmul's tiling changes (narrow and wide
/// stages). With TMA the kernel must launch; without it, cubecl 0.11's port launches the
/// double-buffered kernel where the device has tile instructions for the dtypes, and
/// refuses elsewhere (lavapipe), when callers form the product and add it: a launch is
/// checked against the reference either way.
#[test]
fn matmul_accumulate_adds_the_product_to_the_sum() {
    use fused_ce_kernels::PlaneRows;
    use fused_ce_suite::kernel_operand;
    let _only_us = exclusive_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let client = fused_ce_suite::client(&device());
    let tma = device_has_tma();
    let mut cases = vec![(DType::F32, DType::F32), (DType::F16, DType::F16)];
    if SUPPORTS_BF16 {
        cases.extend([(DType::BF16, DType::BF16), (DType::BF16, DType::F32)]);
    }
    let shapes = [(64, 384, 64), (256, 1024, 96), (2048, 1024, 128)];
    let mut launches = 0;
    for (n, (&(m, cols, k), &(input, sum_dtype))) in shapes
        .iter()
        .cycle()
        .zip(cases.iter().cycle())
        .take(shapes.len() * cases.len())
        .enumerate()
    {
        // Every dtype case tiled both ways, over different shapes.
        let plane_rows = if (n / cases.len()) % 2 == 1 {
            PlaneRows::Two
        } else {
            PlaneRows::One
        };
        let context = format!(
            "{m}x{cols}x{k}, {input:?} inputs, {sum_dtype:?} sum, {plane_rows:?} rows per plane, \
             seed={seed}"
        );
        // The product and the sum of the same size, so that neither hides the other.
        let scale = 1.0 / (k as f32).sqrt();
        let rows = prim::floats(uniform(&mut rng, k * m, scale), &[k, m], input);
        let rhs = prim::floats(uniform(&mut rng, k * cols, 1.0), &[k, cols], input);
        let start = prim::floats(uniform(&mut rng, m * cols, 1.0), &[m, cols], sum_dtype);
        let (rows64, rhs64, start64) = (
            prim::read(rows.clone()).values,
            prim::read(rhs.clone()).values,
            prim::read(start.clone()).values,
        );
        // The second half of the cases (every sum dtype among them) sums into rows
        // padded to a longer stride, as CUDA pads the rows of Burn's matmul outputs: the
        // window of a wider tensor.
        let sum = if n >= shapes.len() * cases.len() / 2 {
            let padded = prim::floats(
                uniform(&mut rng, m * (cols + 64), 1.0),
                &[m, cols + 64],
                sum_dtype,
            );
            let window = [Slice::from(0..m), Slice::from(0..cols)];
            let padded = C::float_slice_assign(padded, &window, start);
            prim::slice(padded, &[0..m, 0..cols])
        } else {
            start
        };
        let launched = fused_ce_kernels::launch_matmul_accumulate(
            &client,
            kernel_operand(C::float_transpose(rows)),
            kernel_operand(rhs),
            kernel_operand(sum.clone()),
            plane_rows,
        );
        match launched {
            Ok(()) => launches += 1,
            Err(error) if !tma => {
                eprintln!("{context}: no TMA, the kernel refused: {error:?}");
                continue;
            }
            Err(error) => panic!("{context}: did not launch: {error:?}"),
        }
        let product = matmul_f64(&transpose_f64(&rows64, k, m), &rhs64, m, k, cols);
        let expected: Vec<f64> = start64.iter().zip(&product).map(|(s, p)| s + p).collect();
        // One rounding to the sum's dtype (and TF32 operands for f32 inputs).
        let bound = match sum_dtype {
            DType::F32 => 1e-3,
            DType::F16 => 2e-3,
            _ => 8e-3,
        };
        assert_eq!(sum.shape().num_elements(), m * cols, "{context}");
        check_close(&prim::read(sum).values, &expected, bound, &context);
    }
    if tma {
        assert_eq!(launches, shapes.len() * cases.len(), "every case launched");
    }
}

/// A config saved before `weight_gradient_in_place`, `hidden_gradient_split_k` and
/// `cublaslt` existed still loads, with each at its default (on), as a new config has
/// them; one
/// saved with the split's earlier name (`hidden_gradient_in_place`) keeps its value.
#[test]
fn configs_saved_without_the_in_place_matmuls_load() {
    use burn::config::Config;
    assert!(LinearChunking::default().weight_gradient_in_place);
    assert!(LinearChunking::default().hidden_gradient_split_k);
    assert!(LinearChunking::default().cublaslt);
    let config = FusedLinearCrossEntropyLossConfig::new().with_chunking(LinearChunking {
        logits_bytes: Some(1 << 20),
        weight_gradient_in_place: false,
        hidden_gradient_split_k: false,
        cublaslt: false,
        ..LinearChunking::default()
    });
    let json = config.to_string();
    let renamed = json.replace("hidden_gradient_split_k", "hidden_gradient_in_place");
    let loaded = FusedLinearCrossEntropyLossConfig::load_binary(renamed.as_bytes())
        .unwrap_or_else(|error| panic!("a config with the earlier name loads: {error:?}"));
    assert_eq!(loaded, config, "the earlier name keeps its value");
    let fields = [
        "\"weight_gradient_in_place\": false",
        "\"hidden_gradient_split_k\": false",
        "\"cublaslt\": false",
    ];
    for field in fields {
        assert!(
            json.contains(field),
            "{field} is in the saved config: {json}"
        );
    }
    // Drop both fields' lines, then the comma left before a closing brace.
    let mut lines: Vec<String> = json
        .lines()
        .filter(|line| !fields.iter().any(|field| line.contains(field)))
        .map(str::to_string)
        .collect();
    for at in 1..lines.len() {
        if lines[at].trim_start().starts_with('}') {
            let before = lines[at - 1].trim_end().trim_end_matches(',').to_string();
            lines[at - 1] = before;
        }
    }
    let older = lines.join("\n");
    let loaded = FusedLinearCrossEntropyLossConfig::load_binary(older.as_bytes())
        .unwrap_or_else(|error| panic!("an older config loads: {error:?}\n{older}"));
    assert_eq!(
        loaded,
        config.with_chunking(LinearChunking {
            logits_bytes: Some(1 << 20),
            ..LinearChunking::default()
        })
    );
}

/// The head's weight as the chunks' matmuls read it (`with_matmul_aligned_rows`), for
/// rows that TMA cannot read as they are (67 f32 or 101 half classes, laid out without
/// padding) and rows it can (64 f32 classes): the values come back unchanged, and on the
/// cube backend of a device with TMA every row stride comes back 16-byte aligned. On the
/// plain backend's primitives (its kernel) and on `Fusion<CubeBackend>` (its custom op),
/// through the extension trait.
#[test]
fn matmul_aligned_rows() {
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let tma = device_has_tma();
    let mut cases = vec![(DType::F32, 67), (DType::F32, 64), (DType::F16, 101)];
    if SUPPORTS_BF16 {
        cases.push((DType::BF16, 101));
    }
    for (dtype, vocab) in cases {
        let context = format!("{dtype:?} [24, {vocab}] seed={seed}");
        let values = uniform(&mut rng, 24 * vocab, 1.0);
        // One flat buffer viewed as rows: no padding between them.
        let weight = prim::reshape(
            prim::floats(values.clone(), &[24 * vocab], dtype),
            &[24, vocab],
        );
        let expected = prim::read(weight.clone()).values;
        let aligned = C::with_matmul_aligned_rows(weight);
        let row_bytes = aligned.meta.strides()[0] * dtype.size();
        let shape = aligned.meta.shape().clone();
        let got = prim::read(aligned);
        assert_eq!(got.dims, vec![24, vocab], "{context}: CubeBackend shape");
        crate::call::assert_same_values(&got.values, &expected, &format!("{context}: CubeBackend"));
        assert!(
            !tma || row_bytes.is_multiple_of(16),
            "{context}: the device has TMA, yet rows of {row_bytes} bytes ({shape:?})"
        );

        let weight = Tensor::<1>::from_data(TensorData::new(values, [24 * vocab]), &device())
            .cast(dtype)
            .reshape([24, vocab]);
        let aligned = Tensor::<2>::from_dispatch(
            <burn::backend::Dispatch as LinearCrossEntropyBackend>::with_matmul_aligned_rows(
                weight.clone().into_dispatch(),
            ),
        );
        assert_eq!(
            aligned.to_data(),
            weight.to_data(),
            "{context}: Fusion<CubeBackend>: the values changed"
        );
    }
}

/// The guess of the one pass carries over between steps of one module: a changing scale.
#[test]
fn linear_guess_across_steps() {
    let _backward = shared_device();
    let device = device().autodiff();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let (rows, width, vocab) = (33, 16, 50);
    let loss_fn = FusedLinearCrossEntropyLossConfig::new()
        .with_chunking(LinearChunking {
            logits_bytes: Some(16 * vocab * 4),
            f32_weight_gradient: true,
            // f32 blocks of 7 of the 50 columns.
            weight_gradient_block_bytes: Some(7 * width * 4),
            weight_gradient_in_place: false,
            hidden_gradient_split_k: true,
            cublaslt: true,
            weight_gradient_stream: WeightGradientStream::Backend,
        })
        .init(&device);
    let head = LinearConfig::new(width, vocab).init(&device);
    for (step, scale) in [1.0f32, 0.5, 0.5, 2.0, 0.0, 2.0].into_iter().enumerate() {
        let hidden_values = uniform(&mut rng, rows * width, 1.0);
        let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
        let hidden = Tensor::<2>::from_data(TensorData::new(hidden_values, [rows, width]), &device)
            .require_grad();
        let targets = targets_tensor(&targets, &device);
        let loss = loss_fn.forward(hidden.clone(), &head, targets.clone());
        let grads = (loss * scale).backward();
        let got = to_f64(head.weight.val().grad(&grads).expect("weight gradient"));
        // The unfused composition with a scale of its own, on a new leaf of the weight.
        let hidden2 = hidden.inner();
        let weight2 = head.weight.val().inner().autodiff().require_grad();
        let bias2 = head.bias.as_ref().expect("a bias").val().inner();
        let logits = hidden2.matmul(weight2.clone()) + bias2.unsqueeze_dim(0);
        let unfused = fused_cross_entropy(logits, targets, &CrossEntropyOptions::default());
        let grads2 = (unfused * scale).backward();
        let expected = to_f64(weight2.grad(&grads2).expect("weight gradient"));
        let context = format!("step {step} scale {scale} seed={seed}");
        if scale == 0.0 {
            assert!(got.iter().all(|v| *v == 0.0), "{context}: zero gradient");
        } else {
            // The expected gradient comes from Burn's matmul: TF32 for f32 on CUDA.
            check_close(&got, &expected, bound(DType::F32), &context);
        }
    }
}

/// The extra outputs come from the same chunks. On `Fusion<CubeBackend>` (the old suite's
/// plain `CubeBackend` has no `Tensor<D>` in a fusion build) and on Flex.
#[test]
fn linear_extra_outputs() {
    let _backward = shared_device();
    for backend in [TestBackend::Fusion, TestBackend::Flex] {
        let device = backend.device();
        let seed = fresh_seed();
        let mut rng = rng(seed);
        let (rows, width, vocab) = (45, 12, 40);
        let hidden_values = uniform(&mut rng, rows * width, 1.0);
        let weight_values = uniform(&mut rng, width * vocab, 1.0);
        let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
        let hidden = Tensor::<2>::from_data(TensorData::new(hidden_values, [rows, width]), &device);
        let weight =
            Tensor::<2>::from_data(TensorData::new(weight_values, [width, vocab]), &device);
        let targets_t = targets_tensor(&targets, &device);
        let options = CrossEntropyOptions {
            z_loss_scale: 1e-3,
            outputs: ExtraOutputs::all(),
            ..CrossEntropyOptions::default()
        };
        let chunking = LinearChunking {
            logits_bytes: Some(16 * vocab * 4),
            f32_weight_gradient: false,
            weight_gradient_block_bytes: None,
            weight_gradient_in_place: false,
            hidden_gradient_split_k: true,
            cublaslt: true,
            weight_gradient_stream: WeightGradientStream::Backend,
        };
        let fused = try_fused_linear_cross_entropy(
            hidden.clone(),
            weight.clone(),
            None,
            targets_t.clone(),
            None,
            &options,
            &chunking,
        )
        .expect("valid input");
        let unfused = burn_fused_ce::try_fused_cross_entropy(
            hidden.matmul(weight),
            targets_t,
            None,
            &options,
        )
        .expect("valid input");
        let name = backend.name();
        let close = |a: Tensor<1>, b: Tensor<1>, what: &str| {
            check_close(
                &to_f64(a),
                &to_f64(b),
                1e-4,
                &format!("{name} seed={seed}: {what}"),
            )
        };
        close(fused.loss, unfused.loss, "loss");
        close(
            fused.z_loss.expect("z-loss"),
            unfused.z_loss.expect("z-loss"),
            "z-loss",
        );
        close(
            fused.accuracy.expect("accuracy"),
            unfused.accuracy.expect("accuracy"),
            "accuracy",
        );
        close(fused.lse.expect("lse"), unfused.lse.expect("lse"), "lse");
        close(
            fused.entropy.expect("entropy"),
            unfused.entropy.expect("entropy"),
            "entropy",
        );
        assert_eq!(
            int_to_i64(fused.predicted.expect("predicted")),
            int_to_i64(unfused.predicted.expect("predicted")),
            "{name} seed={seed}: predictions"
        );
    }
}

#[test]
fn chunk_rows_follow_the_budget() {
    let chunking = LinearChunking::default();
    // 1 GiB of bf16 logits of 128256 classes holds 4185 rows, 4096 in whole tiles of
    // 128 (cuBLASLt's, on by default): 8192 rows take 2 chunks, of 4096 rows each.
    assert_eq!(chunking.rows_per_chunk(8192, 128_256, DType::BF16), 4096);
    // 151936 classes: 3533 rows fit, 3456 in whole tiles; 16384 rows take 5 chunks: 3277
    // rounded up to 3328, the last of 3072.
    assert_eq!(chunking.rows_per_chunk(16384, 151_936, DType::BF16), 3328);
    assert_eq!(chunking.rows_per_chunk(4000, 128_256, DType::BF16), 4000);
    // 5000 rows: two chunks, of 2560 (2500 rounded up to a multiple of 128) and 2440.
    assert_eq!(chunking.rows_per_chunk(5000, 128_256, DType::BF16), 2560);
    // 200 rows a chunk fit: a multiple of 128 below 256 rows.
    let small_budget = LinearChunking {
        logits_bytes: Some(200 * 1000 * 4),
        ..LinearChunking::default()
    };
    assert_eq!(small_budget.rows_per_chunk(1000, 1000, DType::F32), 128);
    // 256 MiB: 1046 rows fit; 8192 rows take 8 chunks of 1024, not seven of 1040 and
    // one of 912.
    let quarter_gib = LinearChunking {
        logits_bytes: Some(256 << 20),
        ..LinearChunking::default()
    };
    assert_eq!(quarter_gib.rows_per_chunk(8192, 128_256, DType::BF16), 1024);
    // 157 MiB holds 641 rows: 13 chunks of 640 with cuBLASLt's tiles of 128 rows, 16 of
    // 512 in cubek-matmul's stages of 256 without it.
    let between_stages = LinearChunking {
        logits_bytes: Some(157 << 20),
        ..LinearChunking::default()
    };
    assert_eq!(
        between_stages.rows_per_chunk(8192, 128_256, DType::BF16),
        640
    );
    let cubecl_only = LinearChunking {
        cublaslt: false,
        ..between_stages
    };
    assert_eq!(cubecl_only.rows_per_chunk(8192, 128_256, DType::BF16), 512);
    // Within a device's largest buffer: 128 MiB of f32 logits of 50257 classes hold 667
    // rows, 640 in whole tiles; 2000 rows take 4 chunks of 512 (500 rounded up).
    let lavapipe = chunking.within(Some(128 << 20));
    assert_eq!(lavapipe.rows_per_chunk(2000, 50_257, DType::F32), 512);
    assert_eq!(lavapipe.logits_bytes, Some(128 << 20));
    // A larger buffer, or none known, leaves the budget as it is.
    assert_eq!(chunking.within(Some(1 << 40)), chunking.within(None));
    assert_eq!(
        chunking.within(None).logits_bytes,
        Some(LinearChunking::DEFAULT_LOGITS_BYTES)
    );
    assert_eq!(quarter_gib.within(Some(1 << 40)), quarter_gib);
    assert_eq!(chunking.rows_per_chunk(100, 128_256, DType::BF16), 100);
    let small = LinearChunking {
        logits_bytes: Some(1),
        f32_weight_gradient: false,
        weight_gradient_block_bytes: None,
        weight_gradient_in_place: false,
        hidden_gradient_split_k: true,
        cublaslt: true,
        weight_gradient_stream: WeightGradientStream::Backend,
    };
    assert_eq!(small.rows_per_chunk(100, 50, DType::F32), 16);
    assert_eq!(small.rows_per_chunk(5, 50, DType::F32), 5);
    // Weight-gradient blocks: 64 MiB of bf16 columns of 4096 rows hold 8192 columns.
    let blocks = LinearChunking {
        weight_gradient_block_bytes: Some(64 << 20),
        ..LinearChunking::default()
    };
    assert_eq!(
        blocks.weight_gradient_block_columns(4096, 128_256, DType::BF16),
        Some(8192)
    );
    assert_eq!(
        blocks.weight_gradient_block_columns(4096, 8192, DType::BF16),
        None
    );
    assert_eq!(
        blocks.weight_gradient_block_columns(1 << 30, 100, DType::F32),
        Some(1)
    );
    assert_eq!(
        chunking.weight_gradient_block_columns(4096, 128_256, DType::BF16),
        None
    );
    // Below a tile, multiples of 16: 64 rows fit, 130 rows go in three chunks of 48.
    let below_a_tile = LinearChunking {
        logits_bytes: Some(64 * 50 * 4),
        f32_weight_gradient: false,
        weight_gradient_block_bytes: None,
        weight_gradient_in_place: false,
        hidden_gradient_split_k: true,
        cublaslt: true,
        weight_gradient_stream: WeightGradientStream::Backend,
    };
    assert_eq!(below_a_tile.rows_per_chunk(130, 50, DType::F32), 48);
    // Never more than the budget holds, whatever the rows.
    for rows in 1..2000 {
        for fit in [16, 20, 100, 128, 200, 1046] {
            let budget = LinearChunking {
                logits_bytes: Some(fit * 50 * 4),
                f32_weight_gradient: false,
                weight_gradient_block_bytes: None,
                weight_gradient_in_place: false,
                hidden_gradient_split_k: true,
                cublaslt: true,
                weight_gradient_stream: WeightGradientStream::Backend,
            };
            let per = budget.rows_per_chunk(rows, 50, DType::F32);
            assert!(
                per >= 1 && per <= rows.max(1),
                "rows {rows} fit {fit}: {per}"
            );
            assert!(per <= fit.max(16), "rows {rows} fit {fit}: {per}");
            assert!(
                per == rows || per.is_multiple_of(16),
                "rows {rows} fit {fit}: {per}"
            );
        }
    }
}

/// The default chunk budget (`LinearChunking::DEFAULT_LOGITS_BYTES`) stays within the
/// device's largest buffer: where that buffer holds fewer rows of logits than the batch
/// (lavapipe's 128 MiB), the rows go in several chunks, and the loss and gradients equal
/// those of small explicit chunks, for `Mean` (scaled) and for `None` with non-uniform
/// per-row gradients. On `Fusion<CubeBackend>` (a cube device's `Tensor<D>`).
#[test]
fn default_chunks_fit_the_largest_buffer() {
    let _backward = shared_device();
    let device = device().autodiff();
    let largest = max_buffer_bytes(&device).expect("a cube device knows its largest buffer");
    let (width, vocab) = (8, 50_257);
    let row_bytes = vocab * DType::F32.size();
    if largest >= LinearChunking::DEFAULT_LOGITS_BYTES {
        eprintln!("the largest buffer ({largest} bytes) holds a default chunk: nothing to check");
        return;
    }
    let rows = largest / row_bytes + 16;
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let hidden_values = uniform(&mut rng, rows * width, 1.0);
    let weight_values = uniform(&mut rng, width * vocab, 0.5);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    let row_weights = uniform(&mut rng, rows, 1.0);
    let small = LinearChunking {
        logits_bytes: Some((rows / 5) * row_bytes),
        ..LinearChunking::default()
    };
    for reduction in [Reduction::Mean, Reduction::None] {
        let run = |chunking: &LinearChunking| {
            let hidden = Tensor::<2>::from_data(
                TensorData::new(hidden_values.clone(), [rows, width]),
                &device,
            )
            .require_grad();
            let weight = Tensor::<2>::from_data(
                TensorData::new(weight_values.clone(), [width, vocab]),
                &device,
            )
            .require_grad();
            let loss = try_fused_linear_cross_entropy(
                hidden.clone(),
                weight.clone(),
                None,
                targets_tensor(&targets, &device),
                None,
                &CrossEntropyOptions::new(reduction),
                chunking,
            )
            .unwrap_or_else(|e| panic!("seed={seed}: refused: {e}"))
            .loss;
            let objective = match reduction {
                Reduction::None => (loss.clone()
                    * Tensor::<1>::from_data(
                        TensorData::new(row_weights.clone(), [rows]),
                        &device,
                    ))
                .sum(),
                _ => loss.clone() * 0.75,
            };
            let grads = objective.backward();
            [
                to_f64(loss.inner()),
                to_f64(hidden.grad(&grads).expect("a hidden-state gradient")),
                to_f64(weight.grad(&grads).expect("a weight gradient")),
            ]
        };
        let default = run(&LinearChunking::default());
        let explicit = run(&small);
        for (name, (got, expected)) in ["loss", "hidden gradient", "weight gradient"]
            .iter()
            .zip(default.iter().zip(&explicit))
        {
            check_close(
                got,
                expected,
                1e-5,
                &format!("{reduction:?} {name} seed={seed}"),
            );
        }
    }
}

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
