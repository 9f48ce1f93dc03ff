//! The op on `CubeBackend<R, ..>` for every cube runtime: Burn tensors in, kernel launch
//! arguments out. Launch details (cube shape, grid) stay in `fused-ce-kernels`.

use std::any::{Any, TypeId};
use std::sync::{Mutex, OnceLock};

use burn::tensor::{
    DType, Shape, Tensor, TensorData, TensorMetadata, backend::ExecutionError, ops::FloatTensor,
};
use burn_cubecl::{
    BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement,
    kernel::into_contiguous,
    ops::numeric::{empty_device_contiguous_dtype, empty_device_dtype, full_device_dtype},
    tensor::CubeTensor,
};
use cubecl::ir::StorageType;
use cubecl::prelude::{ComputeClient, InputScalar, TensorBinding};
use cubecl::server::CopyDescriptor;
use cubecl::zspace::{Strides, metadata::Metadata};
use fused_ce_kernels::{
    GradientTarget, IncomingGradient, KernelTuning, LossSettings, OnePassBuffers, OnePassPlan,
    OnePassScratch, PackOptions, PlaneRows, RowLaunch, ShardGradientOptions, ShardRowsOptions,
    ShardScalars, WeightArgs, has_tma, launch_backward, launch_first_bad_target, launch_forward,
    launch_matmul_accumulate, launch_one_pass, launch_pack_shard_rows, launch_reduce_stats,
    launch_scale_gradient, launch_shard_gradient_rows, launch_shard_targets,
    launch_whole_vocabulary_rows, row_stat, scale_slot, split_k_slices, tma_readable_copy,
};

use crate::{
    backend::{
        CrossEntropyInputs, FusedCrossEntropyBackend, LossParts, OnePassScale, Reduced, RowStats,
        TwoPassBackward, float, lse_row, primitive, product, product_added, reduce_stats,
    },
    incoming_guess::next_guess,
    options::{CrossEntropyOptions, Reduction},
    target_check::PendingRead,
    test_hooks,
    vocab_parallel::{
        ExchangedRows, KernelBackwardRows, ShardBackwardRows, VocabShard, exchanged_rows,
        local_options, shard_contributions_by_tensor_ops, shard_gradient_rows_by_tensor_ops,
        shard_weights, smoothing_options, whole_vocabulary_rows_by_tensor_ops,
    },
};

/// Logits as the kernels read them: `[B, T, V]` (a 2-D `[N, V]` is bound as `[1, N, V]`,
/// metadata only), unit stride along the vocabulary. Rows keep any stride, so a slice of
/// a bigger tensor is not copied; a strided vocabulary is made contiguous first.
fn rows_view<R: CubeRuntime>(tensor: CubeTensor<R>) -> CubeTensor<R> {
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
fn has_separate_contiguous_rows<R: CubeRuntime>(tensor: &CubeTensor<R>) -> bool {
    let (shape, strides) = (tensor.meta.shape(), tensor.meta.strides());
    shape.num_dims() == 2 && strides[1] == 1 && strides[0] >= shape[1]
}

/// `[N, ..]` viewed as `[1, N, ..]` (no copy) when it has fewer than `rank` dimensions.
fn with_leading_one<R: CubeRuntime>(tensor: CubeTensor<R>, rank: usize) -> CubeTensor<R> {
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

/// The widest vector load that divides the vocabulary and every row stride involved.
fn vector_size<R: CubeRuntime>(tensors: &[&CubeTensor<R>]) -> usize {
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

fn row_launch<R: CubeRuntime>(
    logits: &CubeTensor<R>,
    targets: &CubeTensor<R>,
    vector_size: usize,
    weighted: bool,
    options: &CrossEntropyOptions,
) -> RowLaunch {
    let [outer, inner, vocab] = logits.meta.shape().dims::<3>();
    RowLaunch {
        rows: outer * inner,
        vocab,
        vector_size,
        address_type: logits.required_address_type(),
        float_dtype: logits.dtype.into(),
        int_dtype: targets.dtype.into(),
        settings: LossSettings {
            ignore_index: options.kernel_ignore_index(),
            label_smoothing: options.label_smoothing,
            z_loss_scale: options.z_loss_scale,
            softcap: options.softcap,
            weighted,
            argmax: options.outputs.needs_argmax(),
            exp_flush_to_zero: options.fast_math.exp_flush_to_zero,
            approximate_tanh: options.fast_math.approximate_tanh,
        },
        tuning: tuning_for(&logits.client, options),
    }
}

/// The tuning the options ask for, or the device's defaults.
fn tuning_for<R: CubeRuntime>(
    client: &cubecl::prelude::ComputeClient<R>,
    options: &CrossEntropyOptions,
) -> KernelTuning {
    options
        .tuning
        .unwrap_or_else(|| KernelTuning::for_device(client))
}

/// A new contiguous f32 buffer of `shape` (CUDA may pad the rows of a plain allocation),
/// poisoned with NaN when the tests ask for it.
fn f32_buffer<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape) -> CubeTensor<R> {
    let buffer = empty_device_contiguous_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        shape,
        DType::F32,
    );
    poison(buffer)
}

/// When the tests ask for it (`test_hooks::set_poison_outputs`), a buffer the kernel must
/// fully write is first filled with NaN (floats) or a large sentinel (ints), so an element
/// the kernel forgot shows up.
fn poison<R: CubeRuntime>(tensor: CubeTensor<R>) -> CubeTensor<R> {
    if !test_hooks::poison_outputs() || tensor.meta.num_elements() == 0 {
        return tensor;
    }
    let dtype = tensor.dtype;
    let value = if dtype.is_float() { f32::NAN } else { 77_777.0 };
    full_device_dtype::<R>(
        tensor.client.clone(),
        tensor.shape(),
        tensor.device.clone(),
        InputScalar::new(value, dtype),
        dtype,
    )
}

/// Weight arguments: the real ones (`weights`, `total`), or a one-element buffer bound in
/// their place (never read).
fn weight_args<R: CubeRuntime>(
    weights: Option<(CubeTensor<R>, CubeTensor<R>)>,
    like: &CubeTensor<R>,
) -> WeightArgs<R> {
    match weights {
        Some((weights, total)) => WeightArgs {
            weights: weights.into_tensor_arg(),
            total: total.into_tensor_arg(),
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

/// The vocabulary-parallel kernels' scalars for `shard` and `options`.
fn shard_scalars(shard: &VocabShard, options: &CrossEntropyOptions) -> ShardScalars {
    ShardScalars {
        index: shard.index(),
        classes: shard.classes(),
        shard_width: shard.width(),
        vocab: shard.vocab(),
        ignore_index: options.kernel_ignore_index(),
        softcap: options.softcap,
        label_smoothing: options.label_smoothing,
        z_loss_scale: options.z_loss_scale,
    }
}

/// Forward's outputs: the statistics, the predictions when asked for, and the launch
/// argument for `predicted` (a one-element buffer, never written, otherwise).
fn forward_outputs<R: CubeRuntime>(
    logits: &CubeTensor<R>,
    targets: &CubeTensor<R>,
    options: &CrossEntropyOptions,
) -> (
    CubeTensor<R>,
    Option<CubeTensor<R>>,
    cubecl::prelude::TensorArg<R>,
) {
    let [outer, inner, _] = logits.meta.shape().dims::<3>();
    let rows = outer * inner;
    let stats = f32_buffer(logits, Shape::new([row_stat::COUNT, rows]));
    let (predicted, predicted_arg) = predictions(targets, rows, options);
    (stats, predicted, predicted_arg)
}

/// The predictions `[rows]` (the targets' int type) when the options track the argmax,
/// and the launch argument for them (a one-element buffer, never written, otherwise).
fn predictions<R: CubeRuntime>(
    targets: &CubeTensor<R>,
    rows: usize,
    options: &CrossEntropyOptions,
) -> (Option<CubeTensor<R>>, cubecl::prelude::TensorArg<R>) {
    let int_buffer = |len: usize| {
        empty_device_dtype::<R>(
            targets.client.clone(),
            targets.device.clone(),
            Shape::new([len]),
            targets.dtype,
        )
    };
    let predicted = options
        .outputs
        .needs_argmax()
        .then(|| poison(int_buffer(rows)));
    let predicted_arg = match &predicted {
        Some(predicted) => predicted.clone().into_tensor_arg(),
        None => int_buffer(1).into_tensor_arg(),
    };
    (predicted, predicted_arg)
}

impl<R, F, I, BT> FusedCrossEntropyBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn cross_entropy_rows(
        inputs: CrossEntropyInputs<Self>,
        options: &CrossEntropyOptions,
    ) -> RowStats<Self> {
        let CrossEntropyInputs {
            logits,
            targets,
            class_weights,
        } = inputs;
        let logits = rows_view(logits);
        let targets = with_leading_one(targets, 2);
        let (stats, predicted, predicted_arg) = forward_outputs(&logits, &targets, options);
        let weighted = class_weights.is_some();
        let shape = row_launch(
            &logits,
            &targets,
            vector_size(&[&logits]),
            weighted,
            options,
        );
        launch_forward::<R>(
            &logits.client.clone(),
            shape,
            logits.clone().into_tensor_arg(),
            targets.into_tensor_arg(),
            weight_args(class_weights.map(|w| (w.weights, w.total)), &logits),
            stats.clone().into_tensor_arg(),
            predicted_arg,
        );
        RowStats {
            stats,
            predicted,
            weighted,
        }
    }

    fn shard_contributions(
        inputs: CrossEntropyInputs<Self>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
    ) -> CubeTensor<R> {
        let rows = inputs.targets.meta.num_elements();
        if rows == 0 {
            // Nothing to launch over.
            return shard_contributions_by_tensor_ops::<Self>(inputs, shard, options);
        }
        let targets_shape = inputs.targets.shape();
        let targets = with_leading_one(inputs.targets.clone(), 2);
        let smoothing = options.label_smoothing > 0.0;
        let int_buffer = |len: usize| {
            empty_device_contiguous_dtype::<R>(
                targets.client.clone(),
                targets.device.clone(),
                Shape::new([len]),
                targets.dtype,
            )
        };
        let local = poison(int_buffer(rows));
        let first_class = if smoothing {
            poison(int_buffer(rows))
        } else {
            int_buffer(1)
        };
        let scalars = shard_scalars(shard, options);
        launch_shard_targets::<R>(
            &targets.client.clone(),
            rows,
            targets.clone().into_tensor_arg(),
            local.clone().into_tensor_arg(),
            first_class.clone().into_tensor_arg(),
            targets.dtype.into(),
            &scalars,
            smoothing,
        );
        // The row kernel takes the targets in the logits' row shape.
        let shaped = |local: CubeTensor<R>| {
            <Self as burn::tensor::ops::IntTensorOps<Self>>::int_reshape(
                local,
                targets_shape.clone(),
            )
        };
        let own = Self::cross_entropy_rows(
            CrossEntropyInputs {
                logits: inputs.logits.clone(),
                targets: shaped(local),
                class_weights: None,
            },
            &local_options(options),
        );
        let smoothed = smoothing.then(|| {
            Self::cross_entropy_rows(
                CrossEntropyInputs {
                    logits: inputs.logits.clone(),
                    targets: shaped(first_class),
                    class_weights: shard_weights(inputs.class_weights.as_ref(), shard.classes()),
                },
                &smoothing_options(options),
            )
        });
        let argmax = options.outputs.needs_argmax();
        let unused_f32 = || f32_buffer(&own.stats, Shape::new([1]));
        let packed = f32_buffer(
            &own.stats,
            Shape::new([exchanged_rows(shard, options), rows]),
        );
        let logits = rows_view(inputs.logits);
        let logits_dtype = logits.dtype;
        launch_pack_shard_rows::<R>(
            &packed.client.clone(),
            rows,
            own.stats.clone().into_tensor_arg(),
            smoothed
                .map_or_else(unused_f32, |smoothed| smoothed.stats)
                .into_tensor_arg(),
            own.predicted
                .unwrap_or_else(|| int_buffer(1))
                .into_tensor_arg(),
            logits.into_tensor_arg(),
            targets.clone().into_tensor_arg(),
            packed.clone().into_tensor_arg(),
            [logits_dtype.into(), targets.dtype.into()],
            &scalars,
            PackOptions {
                shards: shard.count(),
                smoothing,
                argmax,
                softcap: options.softcap.is_some(),
            },
        );
        packed
    }

    fn shard_gradient_rows(
        inputs: ShardBackwardRows<Self>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
    ) -> KernelBackwardRows<Self> {
        let rows = inputs.stats.meta.shape()[1];
        if rows == 0 {
            // Nothing to launch over.
            return shard_gradient_rows_by_tensor_ops::<Self>(inputs, shard, options);
        }
        let ShardBackwardRows {
            stats,
            targets,
            logits,
            grad_output,
            denominators,
            weight_total,
        } = inputs;
        let targets = with_leading_one(targets, 2);
        let logits = rows_view(logits);
        let grad_output = into_contiguous(grad_output);
        let local = poison(empty_device_contiguous_dtype::<R>(
            targets.client.clone(),
            targets.device.clone(),
            Shape::new([rows]),
            targets.dtype,
        ));
        let local_stats = f32_buffer(&stats, Shape::new([row_stat::COUNT, rows]));
        let coefficients = f32_buffer(&stats, Shape::new([rows]));
        let smoothing = options.label_smoothing > 0.0;
        let unused = || f32_buffer(&stats, Shape::new([1]));
        let smooth = if smoothing {
            f32_buffer(&stats, Shape::new([rows]))
        } else {
            unused()
        };
        let mean = options.reduction == Reduction::Mean && denominators.is_some();
        let weighted = weight_total.is_some();
        let dtypes = [
            logits.dtype.into(),
            grad_output.dtype.into(),
            targets.dtype.into(),
        ];
        launch_shard_gradient_rows::<R>(
            &stats.client.clone(),
            rows,
            [
                stats.clone().into_tensor_arg(),
                targets.into_tensor_arg(),
                logits.into_tensor_arg(),
                grad_output.into_tensor_arg(),
                denominators.unwrap_or_else(unused).into_tensor_arg(),
                weight_total.unwrap_or_else(unused).into_tensor_arg(),
            ],
            [
                local.clone().into_tensor_arg(),
                local_stats.clone().into_tensor_arg(),
                coefficients.clone().into_tensor_arg(),
                smooth.clone().into_tensor_arg(),
            ],
            dtypes,
            &shard_scalars(shard, options),
            ShardGradientOptions {
                per_row: options.reduction == Reduction::None,
                mean,
                z_loss: options.z_loss_scale > 0.0,
                softcap: options.softcap.is_some(),
                smoothing,
                weighted,
            },
        );
        KernelBackwardRows {
            targets: local,
            stats: local_stats,
            coefficients,
            smooth: smoothing.then_some(smooth),
        }
    }

    fn whole_vocabulary_rows(
        exchanged: ExchangedRows<Self>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
    ) -> RowStats<Self> {
        let rows = exchanged.summed.meta.shape()[1];
        if rows == 0 {
            // Nothing to launch over.
            return whole_vocabulary_rows_by_tensor_ops::<Self>(exchanged, shard, options);
        }
        let ExchangedRows {
            summed,
            targets,
            class_weights,
            shard_totals,
        } = exchanged;
        let targets = with_leading_one(targets, 2);
        let stats = f32_buffer(&summed, Shape::new([row_stat::COUNT, rows]));
        let (predicted, predicted_arg) = predictions(&targets, rows, options);
        let (weighted, smoothing) = (class_weights.is_some(), shard_totals.is_some());
        let unused = || f32_buffer(&summed, Shape::new([1]));
        let weights = class_weights.map_or_else(unused, |weights| weights.weights);
        let totals = shard_totals.unwrap_or_else(unused);
        launch_whole_vocabulary_rows::<R>(
            &summed.client.clone(),
            rows,
            summed.clone().into_tensor_arg(),
            targets.clone().into_tensor_arg(),
            weights.into_tensor_arg(),
            totals.into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            predicted_arg,
            targets.dtype.into(),
            &shard_scalars(shard, options),
            ShardRowsOptions {
                shards: shard.count(),
                smoothing,
                weighted,
                argmax: predicted.is_some(),
            },
        );
        RowStats {
            stats,
            predicted,
            weighted,
        }
    }

    fn reduce_row_stats(
        rows: RowStats<Self>,
        options: &CrossEntropyOptions,
        dtype: DType,
        keep_denominators: bool,
    ) -> Reduced<Self> {
        let n_rows = rows.stats.meta.shape()[1];
        if n_rows == 0 || options.reduction == Reduction::None {
            // Per-row losses need no reduction (an accuracy asked for alongside is summed
            // by tensor ops); N = 0 launches nothing.
            return reduce_stats::<Self>(rows, options, dtype, keep_denominators);
        }
        let stats = rows.stats;
        let loss = poison(empty_device_contiguous_dtype::<R>(
            stats.client.clone(),
            stats.device.clone(),
            Shape::new([1]),
            dtype,
        ));
        let z_loss = f32_buffer(&stats, Shape::new([1]));
        let accuracy = f32_buffer(&stats, Shape::new([1]));
        let denominators = f32_buffer(&stats, Shape::new([2]));
        let mean = options.reduction == Reduction::Mean;
        launch_reduce_stats::<R>(
            &stats.client.clone(),
            stats.clone().into_tensor_arg(),
            loss.clone().into_tensor_arg(),
            z_loss.clone().into_tensor_arg(),
            accuracy.clone().into_tensor_arg(),
            denominators.clone().into_tensor_arg(),
            dtype.into(),
            mean,
            options.z_loss_scale > 0.0,
            rows.weighted,
        );
        let wanted = options.outputs;
        Reduced {
            parts: LossParts {
                loss,
                z_loss: wanted.z_loss.then_some(z_loss),
                accuracy: wanted.accuracy.then_some(accuracy),
                predicted: if wanted.predicted {
                    rows.predicted
                } else {
                    None
                },
                lse: wanted.lse.then(|| lse_row::<Self>(stats)),
            },
            denominators: (mean && keep_denominators).then_some(denominators),
        }
    }

    fn first_bad_target(targets: CubeTensor<R>, vocab: usize, ignore_index: i64) -> CubeTensor<R> {
        let targets = with_leading_one(targets, 2);
        let result = empty_device_contiguous_dtype::<R>(
            targets.client.clone(),
            targets.device.clone(),
            Shape::new([2]),
            targets.dtype,
        );
        launch_first_bad_target::<R>(
            &targets.client.clone(),
            targets.clone().into_tensor_arg(),
            result.clone().into_tensor_arg(),
            targets.dtype.into(),
            vocab,
            // As the loss kernels compare it (see `CrossEntropyOptions::kernel_ignore_index`).
            i32::try_from(ignore_index).unwrap_or(i32::MIN),
        );
        result
    }

    fn max_buffer_bytes(device: &R::Device) -> Option<usize> {
        usize::try_from(R::client(device).properties().memory.max_page_size).ok()
    }

    fn with_matmul_aligned_rows(matrix: CubeTensor<R>) -> CubeTensor<R> {
        let dtype = matrix.dtype;
        match tma_readable_copy(&matrix.client, matrix.clone().binding(), dtype.into()) {
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
        sum: CubeTensor<R>,
        lhs: CubeTensor<R>,
        rhs: CubeTensor<R>,
    ) -> CubeTensor<R> {
        // In place only where the kernel may write `sum` and nothing else reads it, and
        // only into rows that are each contiguous and apart (CUDA pads the rows of some
        // of Burn's matmul outputs, the first chunk's product among them).
        if !(sum.can_mut() && has_separate_contiguous_rows(&sum) && sum.meta.num_elements() > 0) {
            test_hooks::note_in_place_accumulate_refusal(|| {
                format!(
                    "the sum is shared or its rows are not contiguous and apart \
                     ({:?}, can_mut {}, shape {:?}, strides {:?})",
                    sum.dtype,
                    sum.can_mut(),
                    sum.meta.shape(),
                    sum.meta.strides()
                )
            });
            return product_added::<Self>(sum, lhs, rhs);
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
            product_added::<Self>(sum, lhs, rhs)
        }
    }

    fn matmul_split_k(lhs: CubeTensor<R>, rhs: CubeTensor<R>) -> CubeTensor<R> {
        if lhs.dtype != rhs.dtype
            || lhs.meta.num_dims() != 2
            || rhs.meta.num_dims() != 2
            || !has_tma(&lhs.client)
        {
            return product::<Self>(lhs, rhs);
        }
        let (lhs_operand, rhs_operand) = (matmul_operand(&lhs), matmul_operand(&rhs));
        let (slices, slice) = split_k_slices(
            &lhs.client,
            (&lhs_operand.0, lhs_operand.1),
            (&rhs_operand.0, rhs_operand.1),
            DType::F32.into(),
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
            let out = primitive(Tensor::<Self, 2>::zeros([m, n], (&lhs.device, lhs.dtype)));
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
                product::<Self>(lhs, rhs)
            };
        }
        let partial = primitive(Tensor::<Self, 3>::zeros(
            [slices, m, n],
            (&lhs.device, DType::F32),
        ));
        // `[slices, ..]` views of `tensor`, slice `s` starting `s * slice` columns along
        // the inner dimension `inner_dim`; or the columns left over, as one matrix.
        let sliced = |tensor: &CubeTensor<R>, inner_dim: usize| {
            let strides = tensor.meta.strides();
            let mut shape = tensor.meta.shape().to_vec();
            shape[inner_dim] = slice;
            shape.insert(0, slices);
            let batch = Strides::from(vec![slice * strides[inner_dim], strides[0], strides[1]]);
            let slices_view = view_of(tensor, tensor.handle.clone(), Shape::from(shape), batch);
            let used = (slices * slice * strides[inner_dim] * tensor.elem_size()) as u64;
            let mut shape = tensor.meta.shape().to_vec();
            shape[inner_dim] = inner - slices * slice;
            let rest = view_of(
                tensor,
                tensor.handle.clone().offset_start(used),
                Shape::from(shape),
                strides.clone(),
            );
            (slices_view, rest)
        };
        let ((lhs_slices, lhs_rest), (rhs_slices, rhs_rest)) = (sliced(&lhs, 1), sliced(&rhs, 0));
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
            return product::<Self>(lhs, rhs);
        }
        let summed = float::<Self, 3>(partial).sum_dim(0).reshape([m, n]);
        primitive(summed.cast(lhs.dtype))
    }

    fn start_read(tensor: CubeTensor<R>) -> PendingRead {
        let tensor = into_contiguous(tensor);
        let (shape, dtype) = (tensor.meta.shape().clone(), tensor.dtype);
        let descriptor = CopyDescriptor::new(
            tensor.handle.clone().binding(),
            shape.clone(),
            tensor.meta.strides().clone(),
            tensor.elem_size(),
        );
        // Queued now, behind the kernels already queued and before the ones to come; the
        // future only waits for it.
        let read = lasting_client(&tensor.client, &tensor.device).read_one_tensor_async(descriptor);
        PendingRead::new(async move {
            let bytes = read.await.map_err(|error| ExecutionError::WithContext {
                reason: error.to_string(),
            })?;
            Ok(TensorData::from_bytes(bytes, shape, dtype))
        })
    }

    fn cross_entropy_one_pass(
        inputs: CrossEntropyInputs<Self>,
        scale: OnePassScale<Self>,
        options: &CrossEntropyOptions,
    ) -> (RowStats<Self>, FloatTensor<Self>) {
        let CrossEntropyInputs {
            logits,
            targets,
            class_weights,
        } = inputs;
        let logits_shape = logits.shape();
        let logits = rows_view(logits);
        let targets = with_leading_one(targets, 2);
        let (stats, predicted, predicted_arg) = forward_outputs(&logits, &targets, options);
        let client = logits.client.clone();
        let weighted = class_weights.is_some();
        let weights = weight_args(class_weights.map(|w| (w.weights, w.total)), &logits);
        let mean = options.reduction == Reduction::Mean;
        let (target, grad) = gradient_buffer(&logits);
        let shape = row_launch(
            &logits,
            &targets,
            vector_size(&[&logits, &grad]),
            weighted,
            options,
        )
        .for_one_pass();
        let plan = OnePassPlan::new(&client, &shape);
        let scratch = one_pass_scratch(&logits, plan.partials_len(shape.rows));
        let buffers = OnePassBuffers {
            target,
            targets: targets.into_tensor_arg(),
            weights,
            stats: stats.clone().into_tensor_arg(),
            predicted: predicted_arg,
            guess: scale.guess.into_tensor_arg(),
            denominators: scale
                .denominators
                .filter(|_| mean)
                .map(|given| given.into_tensor_arg()),
            scratch,
        };
        launch_one_pass::<R>(&client, shape, plan, buffers, mean);
        (
            RowStats {
                stats,
                predicted,
                weighted,
            },
            reshaped(grad, logits_shape),
        )
    }

    fn scale_one_pass_gradient(
        grad: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        guess: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let grad_shape = grad.shape();
        let rows: usize = grad_shape.iter().take(grad_shape.num_dims() - 1).product();
        if rows == 0 {
            return (grad, next_guess::<Self>(grad_output, guess));
        }
        // Scaled in place: the gradient is normally held by the autodiff state alone.
        let grad = if grad.can_mut() { grad } else { grad.copy() };
        let grad = rows_view(grad);
        let [outer, inner, vocab] = grad.meta.shape().dims::<3>();
        let shape = RowLaunch {
            rows: outer * inner,
            vocab,
            vector_size: vector_size(&[&grad]),
            address_type: grad.required_address_type(),
            float_dtype: grad.dtype.into(),
            int_dtype: grad.dtype.into(),
            settings: LossSettings::default(),
            tuning: KernelTuning::for_device(&grad.client),
        };
        let next = f32_buffer(&grad, Shape::new([1]));
        launch_scale_gradient::<R>(
            &grad.client.clone(),
            shape,
            grad.clone().into_tensor_arg(),
            grad_output.clone().into_tensor_arg(),
            guess.into_tensor_arg(),
            next.clone().into_tensor_arg(),
            grad_output.dtype.into(),
        );
        (reshaped(grad, grad_shape), next)
    }

    fn cross_entropy_backward(
        inputs: CrossEntropyInputs<Self>,
        backward: TwoPassBackward<Self>,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        let CrossEntropyInputs {
            logits,
            targets,
            class_weights,
        } = inputs;
        let TwoPassBackward {
            stats,
            grad_output,
            denominators,
        } = backward;
        let logits_shape = logits.shape();
        let logits = rows_view(logits);
        let targets = with_leading_one(targets, 2);
        let client = logits.client.clone();
        let weighted = class_weights.is_some();
        let weights = weight_args(class_weights.map(|w| (w.weights, w.total)), &logits);
        let incoming = IncomingGradient {
            dtype: grad_output.dtype.into(),
            per_row: options.reduction == Reduction::None,
            mean: denominators.is_some(),
            // Without denominators the incoming gradient is bound in their place, unread.
            denominators: denominators
                .unwrap_or_else(|| grad_output.clone())
                .into_tensor_arg(),
            grad: grad_output.into_tensor_arg(),
        };
        let (target, grad) = gradient_buffer(&logits);
        let shape = row_launch(
            &logits,
            &targets,
            vector_size(&[&logits, &grad]),
            weighted,
            options,
        );
        launch_backward::<R>(
            &client,
            shape,
            target,
            targets.into_tensor_arg(),
            weights,
            stats.into_tensor_arg(),
            incoming,
        );
        reshaped(grad, logits_shape)
    }
}

/// A client of `device` that lives as long as the process, so a read it starts can
/// outlive the call that started it (cubecl's read futures borrow their client). One per
/// runtime and device, made once.
fn lasting_client<R: CubeRuntime>(
    client: &ComputeClient<R>,
    device: &R::Device,
) -> &'static ComputeClient<R> {
    type Clients = Mutex<Vec<(TypeId, String, &'static (dyn Any + Send + Sync))>>;
    static CLIENTS: OnceLock<Clients> = OnceLock::new();
    let key = (TypeId::of::<R>(), format!("{device:?}"));
    let mut clients = CLIENTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let found = clients
        .iter()
        .find(|(runtime, name, _)| (runtime, name) == (&key.0, &key.1))
        .and_then(|(_, _, client)| client.downcast_ref::<ComputeClient<R>>());
    if let Some(client) = found {
        return client;
    }
    let lasting: &'static ComputeClient<R> = Box::leak(Box::new(client.clone()));
    clients.push((key.0, key.1, lasting));
    lasting
}

/// Scratch buffers of the one-pass kernel (its prologue initialises them).
fn one_pass_scratch<R: CubeRuntime>(
    like: &CubeTensor<R>,
    partials_len: usize,
) -> OnePassScratch<R> {
    let buffer = |len: usize, dtype: DType| {
        empty_device_contiguous_dtype::<R>(
            like.client.clone(),
            like.device.clone(),
            Shape::new([len]),
            dtype,
        )
        .into_tensor_arg()
    };
    OnePassScratch {
        scales: buffer(scale_slot::LEN, DType::F32),
        tickets: buffer(1, DType::I32),
        partials: buffer(partials_len, DType::I32),
    }
}

/// Where a kernel writes the gradient of `logits` (a `[B, T, V]` view): over them when
/// this op holds the only handle (counted for the tests), else into a new contiguous
/// buffer. Returns the launch target and the gradient tensor.
fn gradient_buffer<R: CubeRuntime>(logits: &CubeTensor<R>) -> (GradientTarget<R>, CubeTensor<R>) {
    if logits.can_mut() {
        test_hooks::count_in_place_backward();
        let target = GradientTarget::InPlace(logits.clone().into_tensor_arg());
        return (target, logits.clone());
    }
    let grad = poison(empty_device_contiguous_dtype::<R>(
        logits.client.clone(),
        logits.device.clone(),
        logits.shape(),
        logits.dtype,
    ));
    let target = GradientTarget::Separate {
        logits: logits.clone().into_tensor_arg(),
        grad: grad.clone().into_tensor_arg(),
    };
    (target, grad)
}

/// The gradient with the logits' own rank: a `[1, N, V]` view back to `[N, V]`.
fn reshaped<R: CubeRuntime>(tensor: CubeTensor<R>, shape: Shape) -> CubeTensor<R> {
    if tensor.meta.shape().num_dims() == shape.num_dims() {
        return tensor;
    }
    let strides = tensor.meta.strides();
    let dropped = strides.len() - shape.num_dims();
    let strides = Strides::from(strides[dropped..].to_vec());
    view_of(&tensor, tensor.handle.clone(), shape, strides)
}

/// `tensor` as an operand of `launch_matmul_accumulate`: its binding and element type.
fn matmul_operand<R: CubeRuntime>(tensor: &CubeTensor<R>) -> (TensorBinding<R>, StorageType) {
    (tensor.clone().binding(), tensor.dtype.into())
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
            test_hooks::note_in_place_accumulate_refusal(|| format!("{error:?}"));
            false
        }
    }
}

/// `tensor`'s buffer from `handle` (its own, or a later start in it) seen with `shape` and
/// `strides`, no copy.
fn view_of<R: CubeRuntime>(
    tensor: &CubeTensor<R>,
    handle: cubecl::server::Handle,
    shape: Shape,
    strides: Strides,
) -> CubeTensor<R> {
    CubeTensor::new(
        tensor.client.clone(),
        handle,
        Metadata::new(shape, strides),
        tensor.device.clone(),
        tensor.dtype,
    )
}
