//! Cube tensors as our kernels take them: views, new buffers, launch arguments. Shared by
//! every op family's cube implementation; launch details (cube shape, grid) stay in
//! `fused-ce-kernels`.

use burn::backend::TensorMetadata;
use burn::tensor::{DType, Shape};
use burn_cubecl::{
    kernel::{cast, into_contiguous},
    ops::numeric::{empty_device_contiguous_dtype, empty_device_dtype, full_device_dtype},
    tensor::CubeTensor,
};
use cubecl::prelude::{InputScalar, TensorArg};
use cubecl::zspace::{Strides, metadata::Metadata};
use fused_ce_kernels::{GradientTarget, WeightArgs};

use crate::test_hooks;

/// A Burn dtype as cubecl's element type.
pub(crate) fn elem(dtype: DType) -> cubecl::ir::ElemType {
    burn::backend::cubecl::dtype_to_elem_type(dtype)
}

/// Logits as the kernels read them: `[B, T, V]` (a 2-D `[N, V]` is bound as `[1, N, V]`,
/// metadata only), unit stride along the vocabulary. Rows keep any stride, so a slice of
/// a bigger tensor is not copied; a strided vocabulary is made contiguous first.
pub(crate) fn rows_view(tensor: CubeTensor) -> CubeTensor {
    let tensor = {
        let dims = tensor.meta.shape().num_dims();
        let strides = tensor.meta.strides();
        let last = tensor.meta.shape()[dims - 1];
        if strides[dims - 1] == 1 || last <= 1 {
            tensor
        } else {
            into_contiguous(tensor)
        }
    };
    with_leading_one(tensor, 3)
}

/// A 2-D tensor whose rows each have unit stride and do not overlap (padded rows
/// included): one that a kernel may write element by element.
pub(crate) fn has_separate_contiguous_rows(tensor: &CubeTensor) -> bool {
    let (shape, strides) = (tensor.meta.shape(), tensor.meta.strides());
    shape.num_dims() == 2 && strides[1] == 1 && strides[0] >= shape[1]
}

/// `[N, ..]` viewed as `[1, N, ..]` (no copy) when it has fewer than `rank` dimensions.
pub(crate) fn with_leading_one(tensor: CubeTensor, rank: usize) -> CubeTensor {
    let shape = tensor.meta.shape().clone();
    let strides = tensor.meta.strides().clone();
    if shape.num_dims() >= rank {
        return tensor;
    }
    let mut new_shape = vec![1usize];
    new_shape.extend(shape.iter().copied());
    let mut new_strides = vec![shape[0] * strides[0].max(1)];
    new_strides.extend(strides.iter().copied());
    view_of(
        &tensor,
        tensor.handle.clone(),
        Shape::from(new_shape),
        Strides::from(new_strides),
    )
}

/// The widest vector load that divides the vocabulary and every row stride involved
/// (`tensors[0]` is a `[B, T, V]` view).
pub(crate) fn vector_size(tensors: &[&CubeTensor]) -> usize {
    let logits = tensors[0];
    let vocab = logits.meta.shape()[2];
    logits
        .client
        .io_optimized_vector_sizes(logits.dtype.size())
        .filter(|&size| {
            vocab.is_multiple_of(size)
                && tensors.iter().all(|tensor| {
                    let strides = tensor.meta.strides();
                    strides[0].is_multiple_of(size) && strides[1].is_multiple_of(size)
                })
        })
        .max()
        .unwrap_or(1)
}

/// A new contiguous buffer of `shape` and `dtype` on `like`'s device (CUDA may pad the
/// rows of a plain allocation), not initialised.
pub(crate) fn contiguous_buffer(like: &CubeTensor, shape: Shape, dtype: DType) -> CubeTensor {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, dtype)
}

/// A new buffer of `shape` and `dtype` on `like`'s device, laid out as the allocator
/// likes, not initialised.
pub(crate) fn buffer(like: &CubeTensor, shape: Shape, dtype: DType) -> CubeTensor {
    empty_device_dtype(like.client.clone(), like.device.clone(), shape, dtype)
}

/// A new contiguous f32 buffer of `shape`, poisoned with NaN when the tests ask for it.
pub(crate) fn f32_buffer(like: &CubeTensor, shape: Shape) -> CubeTensor {
    poison(contiguous_buffer(like, shape, DType::F32))
}

/// When the tests ask for it (`test_hooks::set_poison_outputs`), a buffer the kernel must
/// fully write is first filled with NaN (floats) or a large sentinel (ints), so an element
/// the kernel forgot shows up.
pub(crate) fn poison(tensor: CubeTensor) -> CubeTensor {
    if !test_hooks::poison_outputs() || tensor.meta.num_elements() == 0 {
        return tensor;
    }
    let dtype = tensor.dtype;
    let value = if dtype.is_float() { f32::NAN } else { 77_777.0 };
    full_device_dtype(
        tensor.client.clone(),
        tensor.shape(),
        tensor.device.clone(),
        InputScalar::new(value, elem(dtype)),
        dtype,
    )
}

/// Weight arguments: the real ones (`weights`, `total`), or a one-element buffer bound in
/// their place (never read).
pub(crate) fn weight_args(
    weights: Option<(CubeTensor, CubeTensor)>,
    like: &CubeTensor,
) -> WeightArgs {
    match weights {
        Some((weights, total)) => WeightArgs {
            weights: as_f32(weights).into_tensor_arg(),
            total: as_f32(total).into_tensor_arg(),
        },
        None => {
            let unused = f32_buffer(like, Shape::new([1]));
            WeightArgs {
                weights: unused.clone().into_tensor_arg(),
                total: unused.into_tensor_arg(),
            }
        }
    }
}

/// `tensor` in f32, as the kernels read class weights: a backend caller may pass them in
/// another float dtype (the functions cast them already).
pub(crate) fn as_f32(tensor: CubeTensor) -> CubeTensor {
    if tensor.dtype == DType::F32 {
        tensor
    } else {
        cast(tensor, DType::F32)
    }
}

/// The launch argument of an optional per-row f32 input (row weights, the entropy's
/// incoming gradient), cast to f32 when given in another dtype.
pub(crate) fn optional_f32_arg(tensor: Option<CubeTensor>) -> Option<TensorArg> {
    tensor.map(|tensor| as_f32(tensor).into_tensor_arg())
}

/// The predictions `[rows]` (the targets' int type) when `tracked`, and the launch
/// argument for them (a one-element buffer, never written, otherwise).
pub(crate) fn predictions(
    targets: &CubeTensor,
    rows: usize,
    tracked: bool,
) -> (Option<CubeTensor>, TensorArg) {
    let int_buffer = |len: usize| buffer(targets, Shape::new([len]), targets.dtype);
    let predicted = tracked.then(|| poison(int_buffer(rows)));
    let predicted_arg = match &predicted {
        Some(predicted) => predicted.clone().into_tensor_arg(),
        None => int_buffer(1).into_tensor_arg(),
    };
    (predicted, predicted_arg)
}

/// Where a kernel writes the gradient of `logits` (a `[B, T, V]` view): over them when
/// this op holds the only handle (counted for the tests), else into a new contiguous
/// buffer. Returns the launch target and the gradient tensor.
pub(crate) fn gradient_buffer(logits: &CubeTensor) -> (GradientTarget, CubeTensor) {
    if logits.can_mut() {
        test_hooks::count_in_place_backward();
        let target = GradientTarget::InPlace(logits.clone().into_tensor_arg());
        return (target, logits.clone());
    }
    let grad = poison(contiguous_buffer(logits, logits.shape(), logits.dtype));
    let target = GradientTarget::Separate {
        logits: logits.clone().into_tensor_arg(),
        grad: grad.clone().into_tensor_arg(),
    };
    (target, grad)
}

/// The gradient with the logits' own rank: a `[1, N, V]` view back to `[N, V]`.
pub(crate) fn reshaped(tensor: CubeTensor, shape: Shape) -> CubeTensor {
    if tensor.meta.shape().num_dims() == shape.num_dims() {
        return tensor;
    }
    let strides = tensor.meta.strides();
    let dropped = strides.len() - shape.num_dims();
    let strides = Strides::from(strides[dropped..].to_vec());
    view_of(&tensor, tensor.handle.clone(), shape, strides)
}

/// `tensor`'s buffer from `handle` (its own, or a later start in it) seen with `shape` and
/// `strides`, no copy.
pub(crate) fn view_of(
    tensor: &CubeTensor,
    handle: cubecl::server::Handle,
    shape: Shape,
    strides: Strides,
) -> CubeTensor {
    CubeTensor::new(
        tensor.client.clone(),
        handle,
        Metadata::new(shape, strides),
        tensor.device.clone(),
        tensor.dtype,
    )
}
