//! The fused linear cross-entropy's products through NVIDIA's cuBLASLt
//! (`ChunkProducts::cublaslt`). On CUDA every product asked for must run through it (the
//! test hooks count them; the library must be on the loader's path) and match the f64
//! product of the same inputs, f32 ones as exact f32 products (not TF32); the whole op
//! with it matches the f64 reference. Each kind of product takes the algorithm measured
//! fastest the first time the kind runs: it agrees with the heuristic's first, is measured
//! once, and its timing writes nothing the product does not. Elsewhere nothing runs
//! through it and the same calls take the CubeCL path.

use burn::backend::ops::FloatTensorOps;
use burn::tensor::DType;
use burn_fused_ce::backend::LinearCrossEntropyBackend;
use burn_fused_ce::{Reduction, test_hooks};

use crate::common::*;
use crate::cube_primitives::{self as prim, C};
use crate::linear::{
    LinearCase, check_close, check_linear_case, matmul_f64, transpose_f64, uniform,
};
use crate::loss::contract::poisoned;

/// Whether this build's products must run through cuBLASLt.
const ON_CUDA: bool = cfg!(feature = "cuda");

/// Checks that the product just formed ran through cuBLASLt on CUDA (`before`: the
/// count ahead of it), and through nothing of it elsewhere.
fn check_cublaslt_ran(before: usize, context: &str) {
    let count = test_hooks::cublaslt_product_count();
    if ON_CUDA {
        assert!(
            count > before,
            "{context}: did not run through cuBLASLt: {:?} (cuBLASLt: {})",
            test_hooks::cublaslt_refusal(),
            library_state(),
        );
    } else {
        assert_eq!(count, 0, "{context}: cuBLASLt ran without CUDA");
    }
}

fn library_state() -> String {
    #[cfg(feature = "cuda")]
    {
        format!("{:?}", burn_fused_ce::linear::cublaslt_version())
    }
    #[cfg(not(feature = "cuda"))]
    {
        "not built".into()
    }
}

/// The bound on a product's relative L2 error in `dtype`: f32 as an exact f32 product
/// (TF32 operands would be near 3e-4), half types rounded once.
fn product_bound(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        _ => 8e-3,
    }
}

/// The chunk product (`h_c W`, and `dlogits W^T` through a transposed view), the split-K
/// op asked for cuBLASLt (unsplit there), and the in-place sum (`sum += h_c^T dlogits`,
/// the sum of the operands' dtype or f32; one held elsewhere too gets the product in its
/// dtype added, and must stay unchanged), on the plain backend's
/// primitives, in every dtype, on shapes with odd sizes and a single row.
#[test]
fn cublaslt_products_on_the_cube_backend_primitives() {
    poisoned();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    for dtype in float_dtypes() {
        let bound = product_bound(dtype);
        for (m, k, n) in [(64, 200, 384), (24, 40, 67), (1, 33, 5), (130, 1000, 64)] {
            let context = format!("{dtype:?} {m}x{k}x{n} seed={seed}");
            let lhs = prim::floats(uniform(&mut rng, m * k, 1.0), &[m, k], dtype);
            let rhs = prim::floats(uniform(&mut rng, k * n, 1.0), &[k, n], dtype);
            // `rhs` also as the transpose of `[n, k]` rows, as `W^T` is.
            let rhs_rows = prim::floats(uniform(&mut rng, n * k, 1.0), &[n, k], dtype);
            let rhs_t = C::float_transpose(rhs_rows.clone());
            let lhs64 = prim::read(lhs.clone()).values;
            let rhs64 = prim::read(rhs.clone()).values;
            let rhs_t64 = transpose_f64(&prim::read(rhs_rows).values, n, k);
            for (name, right, right64) in
                [("lhs rhs", &rhs, &rhs64), ("lhs rhs^T", &rhs_t, &rhs_t64)]
            {
                let expected = matmul_f64(&lhs64, right64, m, k, n);
                let before = test_hooks::cublaslt_product_count();
                let got = prim::read(C::chunk_product(lhs.clone(), right.clone(), true));
                let context = format!("{context}: chunk_product {name}");
                check_cublaslt_ran(before, &context);
                assert_eq!(
                    (got.dims.clone(), got.dtype),
                    (vec![m, n], dtype),
                    "{context}"
                );
                check_close(&got.values, &expected, bound, &context);

                let before = test_hooks::cublaslt_product_count();
                let got = prim::read(C::matmul_split_k(lhs.clone(), right.clone(), true));
                let context = format!("{context} (split-K op)");
                check_cublaslt_ran(before, &context);
                check_close(&got.values, &expected, bound, &context);
            }
            // `sum += lhs^T rhs` with `lhs^T` a transposed view, as the weight gradient's.
            let lhs_rows = prim::floats(uniform(&mut rng, m * k, 1.0), &[m, k], dtype);
            let lhs_t = C::float_transpose(lhs_rows.clone());
            let lhs_t64 = transpose_f64(&prim::read(lhs_rows).values, m, k);
            let grad = prim::floats(uniform(&mut rng, m * n, 1.0), &[m, n], dtype);
            let grad64 = prim::read(grad.clone()).values;
            let product64 = matmul_f64(&lhs_t64, &grad64, k, m, n);
            let scale = (m as f64).sqrt() as f32;
            let sum_dtypes = if dtype == DType::F32 {
                vec![dtype]
            } else {
                vec![dtype, DType::F32]
            };
            for sum_dtype in sum_dtypes {
                // cuBLASLt adds the f32 product to an f32 sum; the fallback rounds
                // the product to the operands' dtype first.
                let sum_bound = if ON_CUDA && sum_dtype == DType::F32 {
                    1e-5
                } else {
                    bound
                };
                for held in [false, true] {
                    let context =
                        format!("{context}: accumulate_product into {sum_dtype:?} held={held}");
                    let sum = prim::floats(uniform(&mut rng, k * n, scale), &[k, n], sum_dtype);
                    let start64 = prim::read(sum.clone()).values;
                    let kept = held.then(|| sum.clone());
                    let before = test_hooks::cublaslt_product_count();
                    let got = prim::read(C::accumulate_product(
                        sum,
                        lhs_t.clone(),
                        grad.clone(),
                        true,
                    ));
                    check_cublaslt_ran(before, &context);
                    assert_eq!(got.dtype, sum_dtype, "{context}: the sum keeps its dtype");
                    let expected: Vec<f64> =
                        start64.iter().zip(&product64).map(|(s, p)| s + p).collect();
                    check_close(&got.values, &expected, sum_bound, &context);
                    if let Some(kept) = kept {
                        let context = format!("{context}: a held sum changed");
                        crate::call::assert_same_values(
                            &prim::read(kept).values,
                            &start64,
                            &context,
                        );
                    }
                }
            }
        }
    }
}

/// The fused linear cross-entropy with its products through cuBLASLt against the f64
/// reference (loss and every gradient), through `Fusion<CubeBackend>` under autodiff:
/// each dtype and reduction, with a bias, 3-D input, an f32 weight-gradient sum, the
/// split-K option on and off, chunks of 48 rows and a last partial one.
#[test]
fn fused_linear_cross_entropy_through_cublaslt() {
    poisoned();
    let reductions = [Reduction::Mean, Reduction::Sum, Reduction::None];
    for (n, dtype) in float_dtypes().into_iter().enumerate() {
        for (r, reduction) in reductions.into_iter().enumerate() {
            let mut case = LinearCase::new(200, 96, 520, dtype, reduction);
            case.cublaslt = true;
            case.chunk_rows = 48;
            case.in_place = true;
            case.bias = (n + r) % 2 == 0;
            case.three_d = r == 1;
            case.split_k = r != 2;
            case.f32_weight_gradient = dtype != DType::F32 && r == 0;
            let context = format!("{case:?}");
            let before = test_hooks::cublaslt_product_count();
            let sums_before = test_hooks::in_place_accumulate_count();
            check_linear_case(crate::common::TestBackend::Fusion, case);
            check_cublaslt_ran(before, &context);
            // 200 rows in chunks of 48: the four chunks after the first add into the sum
            // in place (a count other tests may only raise).
            if cfg!(feature = "cuda") {
                let sums = test_hooks::in_place_accumulate_count() - sums_before;
                assert!(
                    sums >= 4,
                    "{context}: {sums} in-place weight-gradient sums, at least 4 expected"
                );
            }
        }
    }
}

/// On CUDA: the algorithm measured for each kind of product (`linear/cublaslt/measure.rs`)
/// gives the chunk products (`h_c W`, and `dlogits W^T` through a transposed view) and the
/// weight gradient's sum (`sum += h_c^T dlogits`, into a sum of the operands' dtype and of
/// f32) within the bounds above of the f64 product and of the same product with the
/// algorithm cuBLASLt's heuristic lists first (`burn_fused_ce::linear::cublaslt_listed_product`), in
/// every dtype.
#[cfg(feature = "cuda")]
#[test]
fn measured_algorithms_agree_with_the_heuristics_first() {
    poisoned();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let (m, k, n) = (256, 384, 1000);
    for dtype in float_dtypes() {
        let bound = product_bound(dtype);
        let context = format!("{dtype:?} {m}x{k}x{n} seed={seed}");
        let lhs = prim::floats(uniform(&mut rng, m * k, 1.0), &[m, k], dtype);
        let rhs = prim::floats(uniform(&mut rng, k * n, 1.0), &[k, n], dtype);
        let rhs_rows = prim::floats(uniform(&mut rng, n * k, 1.0), &[n, k], dtype);
        let rhs_t = C::float_transpose(rhs_rows.clone());
        let lhs64 = prim::read(lhs.clone()).values;
        let rhs64 = prim::read(rhs.clone()).values;
        let rhs_t64 = transpose_f64(&prim::read(rhs_rows).values, n, k);
        for (name, right, right64) in [("lhs rhs", &rhs, &rhs64), ("lhs rhs^T", &rhs_t, &rhs_t64)] {
            let context = format!("{context}: {name}");
            let expected = matmul_f64(&lhs64, right64, m, k, n);
            let before = test_hooks::cublaslt_product_count();
            let measured = prim::read(C::chunk_product(lhs.clone(), right.clone(), true));
            check_cublaslt_ran(before, &context);
            let first = prim::floats(vec![0.0; m * n], &[m, n], dtype);
            burn_fused_ce::linear::cublaslt_listed_product(&lhs, right, &first, false, 0)
                .unwrap_or_else(|why| panic!("{context}: the heuristic's first: {why}"));
            let first = prim::read(first).values;
            check_close(
                &measured.values,
                &expected,
                bound,
                &format!("{context}: measured"),
            );
            check_close(
                &first,
                &expected,
                bound,
                &format!("{context}: heuristic's first"),
            );
            check_close(
                &measured.values,
                &first,
                bound,
                &format!("{context}: measured against the heuristic's first"),
            );
        }
        // `sum += lhs^T grad` with `lhs^T` a transposed view, as the weight gradient's.
        let lhs_rows = prim::floats(uniform(&mut rng, m * k, 1.0), &[m, k], dtype);
        let lhs_t = C::float_transpose(lhs_rows.clone());
        let lhs_t64 = transpose_f64(&prim::read(lhs_rows).values, m, k);
        let grad = prim::floats(uniform(&mut rng, m * n, 1.0), &[m, n], dtype);
        let product64 = matmul_f64(&lhs_t64, &prim::read(grad.clone()).values, k, m, n);
        let sum_dtypes = if dtype == DType::F32 {
            vec![dtype]
        } else {
            vec![dtype, DType::F32]
        };
        for sum_dtype in sum_dtypes {
            let context = format!("{context}: accumulate_product into {sum_dtype:?}");
            let sum_bound = if sum_dtype == DType::F32 { 1e-5 } else { bound };
            let start = uniform(&mut rng, k * n, (m as f32).sqrt());
            let start64 = prim::read(prim::floats(start.clone(), &[k, n], sum_dtype)).values;
            let expected: Vec<f64> = start64.iter().zip(&product64).map(|(s, p)| s + p).collect();
            let before = test_hooks::cublaslt_product_count();
            let measured = prim::read(C::accumulate_product(
                prim::floats(start.clone(), &[k, n], sum_dtype),
                lhs_t.clone(),
                grad.clone(),
                true,
            ));
            check_cublaslt_ran(before, &context);
            let first = prim::floats(start, &[k, n], sum_dtype);
            burn_fused_ce::linear::cublaslt_listed_product(&lhs_t, &grad, &first, true, 0)
                .unwrap_or_else(|why| panic!("{context}: the heuristic's first: {why}"));
            let first = prim::read(first).values;
            check_close(
                &measured.values,
                &expected,
                sum_bound,
                &format!("{context}: measured"),
            );
            check_close(
                &first,
                &expected,
                sum_bound,
                &format!("{context}: heuristic's first"),
            );
            check_close(
                &measured.values,
                &first,
                sum_bound,
                &format!("{context}: measured against the heuristic's first"),
            );
        }
    }
}

/// On CUDA: each kind of product is measured once per process. The first product of a
/// kind (shapes of this run's own, from its seed, so that no store on disk holds the
/// kind yet) times cuBLASLt's candidates; a second of the kind times nothing; both give
/// the same values bit for bit and the f64 product's within the bounds above, so the
/// timing left the first one's output as the product alone writes it: the chunk
/// products', and the weight gradient's sum, which a timed launch summing into it
/// several times would have left far off. The counts are this thread's
/// (`test_hooks::cublaslt_measurement_count`).
#[cfg(feature = "cuda")]
#[test]
fn each_kind_is_measured_once_and_its_timing_leaves_the_output_alone() {
    use rand::Rng;
    type Run<'a> = Box<dyn Fn() -> prim::Float + 'a>;
    poisoned();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let m = 128 + 8 * rng.random_range(0..48usize);
    let k = 256 + 8 * rng.random_range(0..96usize);
    let n = 512 + 8 * rng.random_range(0..192usize);
    for dtype in float_dtypes() {
        let bound = product_bound(dtype);
        let context = format!("{dtype:?} {m}x{k}x{n} seed={seed}");
        let lhs = prim::floats(uniform(&mut rng, m * k, 1.0), &[m, k], dtype);
        let rhs = prim::floats(uniform(&mut rng, k * n, 1.0), &[k, n], dtype);
        let rhs_rows = prim::floats(uniform(&mut rng, n * k, 1.0), &[n, k], dtype);
        let rhs_t = C::float_transpose(rhs_rows.clone());
        let lhs64 = prim::read(lhs.clone()).values;
        let rhs64 = prim::read(rhs.clone()).values;
        let rhs_t64 = transpose_f64(&prim::read(rhs_rows).values, n, k);
        // The weight gradient's operands: `h_c^T` as a transposed view, `dlogits`.
        let lhs_t = C::float_transpose(lhs.clone());
        let grad = prim::floats(uniform(&mut rng, m * n, 1.0), &[m, n], dtype);
        let product64 = matmul_f64(
            &transpose_f64(&lhs64, m, k),
            &prim::read(grad.clone()).values,
            k,
            m,
            n,
        );
        let start = uniform(&mut rng, k * n, (m as f32).sqrt());
        let mut runs: Vec<(String, Run, Vec<f64>, f64)> = vec![
            (
                "chunk_product lhs rhs".into(),
                Box::new(|| C::chunk_product(lhs.clone(), rhs.clone(), true)),
                matmul_f64(&lhs64, &rhs64, m, k, n),
                bound,
            ),
            (
                "matmul_split_k lhs rhs^T".into(),
                Box::new(|| C::matmul_split_k(lhs.clone(), rhs_t.clone(), true)),
                matmul_f64(&lhs64, &rhs_t64, m, k, n),
                bound,
            ),
        ];
        let sum_dtypes = if dtype == DType::F32 {
            vec![dtype]
        } else {
            vec![dtype, DType::F32]
        };
        for sum_dtype in sum_dtypes {
            let start64 = prim::read(prim::floats(start.clone(), &[k, n], sum_dtype)).values;
            let expected = start64.iter().zip(&product64).map(|(s, p)| s + p).collect();
            let (lhs_t, grad, start) = (&lhs_t, &grad, &start);
            // A sum of its own each time, held by nothing else: summed in place.
            let run: Run = Box::new(move || {
                C::accumulate_product(
                    prim::floats(start.clone(), &[k, n], sum_dtype),
                    lhs_t.clone(),
                    grad.clone(),
                    true,
                )
            });
            let sum_bound = if sum_dtype == DType::F32 { 1e-5 } else { bound };
            runs.push((
                format!("accumulate_product into {sum_dtype:?}"),
                run,
                expected,
                sum_bound,
            ));
        }
        for (name, run, expected, bound) in runs {
            let context = format!("{context}: {name}");
            let measured_before = test_hooks::cublaslt_measurement_count();
            let before = test_hooks::cublaslt_product_count();
            let first = prim::read(run()).values;
            check_cublaslt_ran(before, &context);
            assert_eq!(
                test_hooks::cublaslt_measurement_count() - measured_before,
                1,
                "{context}: the first product of a new kind must time cuBLASLt's candidates \
                 (was its algorithm on disk already? {:?})",
                test_hooks::cublaslt_refusal()
            );
            let before = test_hooks::cublaslt_product_count();
            let again = prim::read(run()).values;
            check_cublaslt_ran(before, &context);
            assert_eq!(
                test_hooks::cublaslt_measurement_count() - measured_before,
                1,
                "{context}: a second product of the kind was measured again"
            );
            crate::call::assert_same_values(
                &first,
                &again,
                &format!("{context}: the measured product against the next of its kind"),
            );
            check_close(&first, &expected, bound, &context);
        }
    }
}
