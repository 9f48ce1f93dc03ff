//! The fused linear cross-entropy's products on [`CubeBackend`], every cube runtime: the
//! in-place matmul (`fused_ce_kernels::launch_matmul_accumulate`) for the weight
//! gradient's sum and the chunks' hidden-state gradients, and TMA-readable rows for the
//! head's weight. Where asked, each product first tries NVIDIA's cuBLASLt on CUDA devices
//! (`cublaslt/`). Where a kernel refuses, the product is formed by Burn's ops.

use burn::tensor::{DType, Shape};
use burn_cubecl::{CubeBackend, tensor::CubeTensor};
use cubecl::MemoryScope;
use cubecl::prelude::TensorBinding;
use cubecl::zspace::Strides;
use fused_ce_kernels::{
    PlaneRows, has_tma, launch_matmul_accumulate, split_k_slices, tma_readable_copy,
};

use crate::cube_tensors::{buffer, elem, has_separate_contiguous_rows, poison, view_of};
use crate::linear::cublaslt::{cublaslt_may_run, cublaslt_product};
use crate::linear::extension::LinearCrossEntropyBackend;
use crate::linear::products::{product, product_added};
use crate::primitive::FloatOf;
use crate::test_hooks;

/// Where the benches ask for it ([`test_hooks::set_probe_memory`]), the device's bytes in
/// use now, with a product's operands and output allocated.
fn probe_memory(tensor: &CubeTensor) {
    if test_hooks::probe_memory() {
        let usage = tensor.client.memory_report(MemoryScope::Device).usage();
        test_hooks::note_bytes_in_use(usage.bytes_in_use);
    }
}

/// `tensor` as an operand of `launch_matmul_accumulate`: its binding and element type.
fn matmul_operand(tensor: &CubeTensor) -> (TensorBinding, cubecl::ir::ElemType) {
    (tensor.clone().binding(), elem(tensor.dtype))
}

/// Whether `launch_matmul_accumulate` ran (`launched`), counted by `count` where it did;
/// where it refused, its error is noted for the tests and the caller forms the product
/// another way.
fn matmul_launched(launched: Result<(), impl core::fmt::Debug>, count: fn()) -> bool {
    match launched {
        Ok(()) => {
            count();
            true
        }
        Err(error) => {
            test_hooks::IN_PLACE_ACCUMULATE_REFUSAL.note(|| format!("{error:?}"));
            false
        }
    }
}

/// `lhs rhs` into a new buffer of `dtype` (the operands' or f32) through cuBLASLt, where
/// `cublaslt` asks for it and it runs (its refusal noted for the tests otherwise).
fn cublaslt_new_product(
    lhs: &CubeTensor,
    rhs: &CubeTensor,
    dtype: DType,
    cublaslt: bool,
) -> Option<CubeTensor> {
    if !cublaslt {
        return None;
    }
    if !cublaslt_may_run(lhs) {
        test_hooks::CUBLASLT_REFUSAL
            .note(|| "not a CUDA device, or the library did not load".into());
        return None;
    }
    let shape = Shape::new([lhs.meta.shape()[0], rhs.meta.shape()[1]]);
    let out = poison(buffer(lhs, shape, dtype));
    cublaslt_ran(cublaslt_product(lhs, rhs, &out, false)).then_some(out)
}

/// Whether cuBLASLt ran (counted for the tests); where it did not, why is noted.
fn cublaslt_ran(launched: Result<(), String>) -> bool {
    match launched {
        Ok(()) => {
            test_hooks::count_cublaslt_product();
            true
        }
        Err(why) => {
            test_hooks::CUBLASLT_REFUSAL.note(|| why);
            false
        }
    }
}

/// `[slices, ..]` views of the 2-D `tensor`, slice `s` starting `s * slice` columns along
/// its inner dimension `inner_dim` (of length `inner`), and the columns left over as one
/// matrix.
fn sliced(
    tensor: &CubeTensor,
    inner_dim: usize,
    inner: usize,
    (slices, slice): (usize, usize),
) -> (CubeTensor, CubeTensor) {
    let strides = tensor.meta.strides();
    let dims: Vec<usize> = tensor.meta.shape().iter().copied().collect();
    let mut shape = dims.clone();
    shape[inner_dim] = slice;
    shape.insert(0, slices);
    let batch = Strides::from(vec![slice * strides[inner_dim], strides[0], strides[1]]);
    let slices_view = view_of(tensor, tensor.handle.clone(), Shape::from(shape), batch);
    let used = (slices * slice * strides[inner_dim] * tensor.elem_size()) as u64;
    let mut shape = dims;
    shape[inner_dim] = inner - slices * slice;
    let rest = view_of(
        tensor,
        tensor.handle.clone().offset_start(used),
        Shape::from(shape),
        strides.clone(),
    );
    (slices_view, rest)
}

impl LinearCrossEntropyBackend for CubeBackend {
    fn with_matmul_aligned_rows(matrix: CubeTensor) -> CubeTensor {
        let dtype = matrix.dtype;
        match tma_readable_copy(&matrix.client, matrix.clone().binding(), elem(dtype)) {
            Some(copy) => CubeTensor::new(
                matrix.client.clone(),
                copy.handle,
                *copy.metadata,
                matrix.device.clone(),
                dtype,
            ),
            None => matrix,
        }
    }

    fn accumulate_product(
        sum: CubeTensor,
        lhs: CubeTensor,
        rhs: CubeTensor,
        cublaslt: bool,
    ) -> CubeTensor {
        let out = accumulated(sum, [lhs, rhs], cublaslt);
        probe_memory(&out);
        out
    }

    fn chunk_product(lhs: CubeTensor, rhs: CubeTensor, cublaslt: bool) -> CubeTensor {
        let out = match cublaslt_new_product(&lhs, &rhs, lhs.dtype, cublaslt) {
            Some(out) => out,
            None => product::<Self>(lhs, rhs),
        };
        probe_memory(&out);
        out
    }

    fn matmul_split_k(lhs: CubeTensor, rhs: CubeTensor, cublaslt: bool) -> CubeTensor {
        let out = split_k_product(lhs, rhs, cublaslt);
        probe_memory(&out);
        out
    }
}

/// [`LinearCrossEntropyBackend::accumulate_product`] on the cube backend.
fn accumulated(sum: CubeTensor, [lhs, rhs]: [CubeTensor; 2], cublaslt: bool) -> CubeTensor {
    // In place only where the kernel may write `sum` and nothing else reads it, and
    // only into rows that are each contiguous and apart (CUDA pads the rows of some
    // of Burn's matmul outputs, the first chunk's product among them).
    let in_place =
        sum.can_mut() && has_separate_contiguous_rows(&sum) && sum.meta.num_elements() > 0;
    if in_place && cublaslt && cublaslt_ran(cublaslt_product(&lhs, &rhs, &sum, true)) {
        test_hooks::count_in_place_accumulate();
        return sum;
    }
    if !in_place {
        test_hooks::IN_PLACE_ACCUMULATE_REFUSAL.note(|| {
            format!(
                "the sum is shared or its rows are not contiguous and apart \
                 ({:?}, can_mut {}, shape {:?}, strides {:?})",
                sum.dtype,
                sum.can_mut(),
                sum.meta.shape(),
                sum.meta.strides()
            )
        });
        // The product in the sum's dtype through cuBLASLt where it runs, then added.
        return match cublaslt_new_product(&lhs, &rhs, sum.dtype, cublaslt) {
            Some(product) => FloatOf::<CubeBackend, 2>::new(sum)
                .add(FloatOf::new(product))
                .into_primitive(),
            None => product_added::<CubeBackend>(sum, lhs, rhs),
        };
    }
    let launched = launch_matmul_accumulate(
        &sum.client,
        matmul_operand(&lhs),
        matmul_operand(&rhs),
        matmul_operand(&sum),
        PlaneRows::for_product(lhs.meta.shape()[0], lhs.meta.shape()[1]),
    );
    if matmul_launched(launched, test_hooks::count_in_place_accumulate) {
        sum
    } else {
        product_added::<CubeBackend>(sum, lhs, rhs)
    }
}

/// [`LinearCrossEntropyBackend::matmul_split_k`] on the cube backend.
fn split_k_product(lhs: CubeTensor, rhs: CubeTensor, cublaslt: bool) -> CubeTensor {
    if let Some(out) = cublaslt_new_product(&lhs, &rhs, lhs.dtype, cublaslt) {
        return out;
    }
    if lhs.dtype != rhs.dtype
        || lhs.meta.num_dims() != 2
        || rhs.meta.num_dims() != 2
        || !has_tma(&lhs.client)
    {
        return product::<CubeBackend>(lhs, rhs);
    }
    let (lhs_operand, rhs_operand) = (matmul_operand(&lhs), matmul_operand(&rhs));
    let (slices, slice) = split_k_slices(
        &lhs.client,
        (&lhs_operand.0, lhs_operand.1),
        (&rhs_operand.0, rhs_operand.1),
        elem(DType::F32),
    );
    let (m, inner, n) = (
        lhs.meta.shape()[0],
        lhs.meta.shape()[1],
        rhs.meta.shape()[1],
    );
    let client = &lhs.client;
    // Unsplit, the same kernel into zeros of the output's dtype: with two rows of
    // tiles per plane over the long inner dimension it outruns Burn's matmul, whose
    // kernels give planes two rows only on tall outputs (not on a chunk's).
    if slices < 2 {
        let out = FloatOf::<CubeBackend, 2>::zeros([m, n], &lhs.device, lhs.dtype).into_primitive();
        let launched = launch_matmul_accumulate(
            client,
            lhs_operand,
            rhs_operand,
            matmul_operand(&out),
            PlaneRows::for_product(m, inner),
        );
        return if matmul_launched(launched, test_hooks::count_unsplit_kernel_product) {
            out
        } else {
            product::<CubeBackend>(lhs, rhs)
        };
    }
    let partial =
        FloatOf::<CubeBackend, 3>::zeros([slices, m, n], &lhs.device, DType::F32).into_primitive();
    let cut = (slices, slice);
    let ((lhs_slices, lhs_rest), (rhs_slices, rhs_rest)) =
        (sliced(&lhs, 1, inner, cut), sliced(&rhs, 0, inner, cut));
    let first = view_of(
        &partial,
        partial.handle.clone(),
        Shape::new([m, n]),
        Strides::from(vec![n, 1]),
    );
    let launched = launch_matmul_accumulate(
        client,
        matmul_operand(&lhs_slices),
        matmul_operand(&rhs_slices),
        matmul_operand(&partial),
        PlaneRows::for_product(m, slice),
    )
    .and_then(|()| {
        let rest = inner - slices * slice;
        if rest > 0 {
            launch_matmul_accumulate(
                client,
                matmul_operand(&lhs_rest),
                matmul_operand(&rhs_rest),
                matmul_operand(&first),
                PlaneRows::for_product(m, rest),
            )
        } else {
            Ok(())
        }
    });
    if !matmul_launched(launched, test_hooks::count_split_k_product) {
        return product::<CubeBackend>(lhs, rhs);
    }
    FloatOf::<CubeBackend, 3>::new(partial)
        .sum_dim(0)
        .reshape([m, n])
        .cast(lhs.dtype)
        .into_primitive()
}
