//! The op on `CubeBackend<R, ..>` for every cube runtime: Burn tensors in, kernel launch
//! arguments out. Launch details (cube shape, grid) stay in `fused-ce-kernels`.

use burn::tensor::{DType, Shape, TensorMetadata, ops::FloatTensor};
use burn_cubecl::{
    BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement,
    kernel::into_contiguous,
    ops::numeric::{empty_device_contiguous_dtype, empty_device_dtype, full_device_dtype},
    tensor::CubeTensor,
};
use cubecl::prelude::InputScalar;
use fused_ce_kernels::{GradientTarget, RowBuffers, RowLaunch, launch_backward, launch_forward};

use crate::{
    backend::{FusedCrossEntropyBackend, RowStats, SavedRows},
    diagnostics,
    options::{CrossEntropyOptions, Reduction},
};

/// Makes the logits readable by the row kernels: unit stride along the vocabulary (rows
/// may keep any stride, so a slice of a bigger tensor is not copied).
fn row_major_logits<R: CubeRuntime>(logits: CubeTensor<R>) -> CubeTensor<R> {
    let strides = logits.meta.strides();
    if strides[1] == 1 || logits.meta.shape()[1] <= 1 {
        logits
    } else {
        into_contiguous(logits)
    }
}

/// The widest vector load that divides the vocabulary and every row stride involved.
fn vector_size<R: CubeRuntime>(tensors: &[&CubeTensor<R>]) -> usize {
    let logits = tensors[0];
    let vocab = logits.meta.shape()[1];
    logits
        .client
        .io_optimized_vector_sizes(logits.dtype.size())
        .filter(|&size| {
            vocab % size == 0
                && tensors
                    .iter()
                    .all(|tensor| tensor.meta.strides()[0] % size == 0)
        })
        .max()
        .unwrap_or(1)
}

fn row_launch<R: CubeRuntime>(
    logits: &CubeTensor<R>,
    targets: &CubeTensor<R>,
    vector_size: usize,
    options: &CrossEntropyOptions,
) -> RowLaunch {
    let [rows, vocab] = logits.meta.shape().dims::<2>();
    RowLaunch {
        rows,
        vocab,
        vector_size,
        address_type: logits.required_address_type(),
        float_dtype: logits.dtype.into(),
        int_dtype: targets.dtype.into(),
        ignore_index: options.kernel_ignore_index(),
    }
}

fn check_shapes<R: CubeRuntime>(logits: &CubeTensor<R>, targets: &CubeTensor<R>) {
    let logits_shape = logits.meta.shape();
    let targets_shape = targets.meta.shape();
    assert!(
        logits_shape.num_dims() == 2 && targets_shape.num_dims() == 1,
        "fused cross-entropy: expected logits [N, V] and targets [N], got {logits_shape:?} and {targets_shape:?}"
    );
    assert_eq!(
        logits_shape[0], targets_shape[0],
        "fused cross-entropy: logits have {} rows but targets have {}",
        logits_shape[0], targets_shape[0]
    );
}

/// A new f32 `[rows]` buffer, poisoned with NaN under `poison-outputs`.
fn row_buffer<R: CubeRuntime>(like: &CubeTensor<R>, rows: usize) -> CubeTensor<R> {
    let buffer = empty_device_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        Shape::new([rows]),
        DType::F32,
    );
    poison(buffer)
}

/// Under [`diagnostics::set_poison_outputs`], a buffer the kernel must fully write is
/// first filled with NaN, so an element the kernel forgot shows up in tests.
fn poison<R: CubeRuntime>(tensor: CubeTensor<R>) -> CubeTensor<R> {
    if !diagnostics::poison_outputs() || tensor.meta.num_elements() == 0 {
        return tensor;
    }
    let dtype = tensor.dtype;
    full_device_dtype::<R>(
        tensor.client.clone(),
        tensor.shape(),
        tensor.device.clone(),
        InputScalar::new(f32::NAN, dtype),
        dtype,
    )
}

impl<R, F, I, BT> FusedCrossEntropyBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn cross_entropy_rows(
        logits: FloatTensor<Self>,
        targets: CubeTensor<R>,
        options: &CrossEntropyOptions,
    ) -> RowStats<Self> {
        check_shapes(&logits, &targets);
        let logits = row_major_logits(logits);
        let rows = logits.meta.shape()[0];
        let stats: RowStats<Self> = RowStats {
            loss: row_buffer(&logits, rows),
            valid: row_buffer(&logits, rows),
            saved: SavedRows {
                lse: row_buffer(&logits, rows),
                target_grad: row_buffer(&logits, rows),
            },
        };
        let shape = row_launch(&logits, &targets, vector_size(&[&logits]), options);
        launch_forward::<R>(
            &logits.client.clone(),
            shape,
            logits.into_tensor_arg(),
            targets.into_tensor_arg(),
            RowBuffers {
                loss: stats.loss.clone().into_tensor_arg(),
                lse: stats.saved.lse.clone().into_tensor_arg(),
                valid: stats.valid.clone().into_tensor_arg(),
                target_grad: stats.saved.target_grad.clone().into_tensor_arg(),
            },
        );
        stats
    }

    fn cross_entropy_rows_backward(
        logits: FloatTensor<Self>,
        targets: CubeTensor<R>,
        saved: SavedRows<Self>,
        grad_scale: FloatTensor<Self>,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        check_shapes(&logits, &targets);
        let logits = row_major_logits(logits);
        let client = logits.client.clone();
        let per_row_scale = options.reduction == Reduction::None;
        if logits.can_mut() {
            let shape = row_launch(&logits, &targets, vector_size(&[&logits]), options);
            launch_backward::<R>(
                &client,
                shape,
                GradientTarget::InPlace(logits.clone().into_tensor_arg()),
                targets.into_tensor_arg(),
                saved.lse.into_tensor_arg(),
                saved.target_grad.into_tensor_arg(),
                grad_scale.into_tensor_arg(),
                per_row_scale,
            );
            diagnostics::count_in_place_backward();
            return logits;
        }
        let grad = poison(empty_device_contiguous_dtype::<R>(
            client.clone(),
            logits.device.clone(),
            logits.shape(),
            logits.dtype,
        ));
        let shape = row_launch(&logits, &targets, vector_size(&[&logits, &grad]), options);
        launch_backward::<R>(
            &client,
            shape,
            GradientTarget::Separate {
                logits: logits.into_tensor_arg(),
                grad: grad.clone().into_tensor_arg(),
            },
            targets.into_tensor_arg(),
            saved.lse.into_tensor_arg(),
            saved.target_grad.into_tensor_arg(),
            grad_scale.into_tensor_arg(),
            per_row_scale,
        );
        grad
    }
}
