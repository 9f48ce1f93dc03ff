//! The correctness matrix: every reduction x dtype with the options, the bias, the
//! chunking, 3-D input and the module in turn, on fusion, Flex and the plain backend's
//! primitives; the guess across steps; the extra outputs.

use burn::nn::LinearConfig;
use burn::tensor::{DType, Tensor, TensorData};
use burn_fused_ce::backend::{
    IncomingGuess, LinearCrossEntropyBackend, LinearHead, LinearInputs, OptionalFloat, RowWeights,
};
use burn_fused_ce::linear::max_buffer_bytes;
use burn_fused_ce::{
    ChunkProducts, CrossEntropyOptions, ExtraOutputs, FusedLinearCrossEntropyLossConfig,
    LinearChunking, LinearCrossEntropyInputs, LmHead, fused_cross_entropy,
    try_fused_linear_cross_entropy,
};

use super::{
    LinearCase, LinearValues, bound, check_close, check_linear_case, linear_reference, loss_len,
    uniform,
};
use crate::common::*;
use crate::cube_primitives::{self as prim, C};
use crate::loss::contract::{REDUCTIONS, poisoned};

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
            row_weights: RowWeights::none(),
        };
        let parts = C::fused_linear_cross_entropy(
            inputs,
            case.options.clone(),
            case.chunking().within(most, case.vocab, case.dtype),
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
            // f32 blocks of 7 of the 50 columns.
            weight_gradient_block_bytes: Some(7 * width * 4),
            products: ChunkProducts {
                f32_weight_gradient: true,
                weight_gradient_in_place: false,
                hidden_gradient_split_k: true,
                cublaslt: true,
            },
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
        let options = CrossEntropyOptions::default()
            .with_z_loss_scale(1e-3)
            .with_outputs(ExtraOutputs::all());
        let chunking = LinearChunking {
            logits_bytes: Some(16 * vocab * 4),
            weight_gradient_block_bytes: None,
            products: ChunkProducts {
                f32_weight_gradient: false,
                weight_gradient_in_place: false,
                hidden_gradient_split_k: true,
                cublaslt: true,
            },
        };
        let fused = try_fused_linear_cross_entropy(
            LinearCrossEntropyInputs::new(
                hidden.clone(),
                LmHead::new(weight.clone()),
                targets_t.clone(),
            ),
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
