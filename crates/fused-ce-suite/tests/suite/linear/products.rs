//! The chunks' products: the weight gradient summed in place, the hidden-state gradient
//! split along the vocabulary, the plain backend's product kernels against the f64
//! product, the in-place kernel alone, the weight's matmul-aligned rows.

use burn::backend::TensorMetadata;
use burn::backend::ops::FloatTensorOps;
use burn::tensor::{DType, Slice, Tensor, TensorData};
use burn_fused_ce::backend::LinearCrossEntropyBackend;
use burn_fused_ce::{Reduction, test_hooks};

use super::{LinearCase, check_close, check_linear_case, matmul_f64, transpose_f64, uniform};
use crate::common::*;
use crate::cube_primitives::{self as prim, C};
use crate::loss::contract::poisoned;

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
                let got = C::accumulate_product(sum, lhs.clone(), rhs.clone(), false);
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
                let got = prim::read(C::accumulate_product(sum, lhs.clone(), rhs.clone(), false));
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
