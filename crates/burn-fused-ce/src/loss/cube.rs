//! The loss ops on [`CubeBackend`], every cube runtime: primitives in, kernel launches out.

use burn::backend::TensorMetadata;
use burn::tensor::{DType, Shape};
use burn_cubecl::{CubeBackend, kernel::into_contiguous, tensor::CubeTensor};
use fused_ce_kernels::{
    IncomingGradient, KernelTuning, LossSettings, OnePassBuffers, OnePassPlan, OnePassScratch,
    RowLaunch, launch_backward, launch_first_bad_target, launch_forward, launch_one_pass,
    launch_reduce_stats, launch_scale_gradient, row_stat, scale_slot,
};

use crate::cube_tensors::{
    contiguous_buffer, elem, f32_buffer, gradient_buffer, optional_f32_arg, poison, predictions,
    reshaped, rows_view, vector_size, weight_args, with_leading_one,
};
use crate::loss::check_read::{TargetCheckRead, queued_cube_read};
use crate::loss::entropy_incoming::entropy_incoming;
use crate::loss::extension::FusedCrossEntropyBackend;
use crate::loss::incoming_guess::next_guess;
use crate::loss::reduce::{reduce_stats, stat_row};
use crate::loss::types::{OnePassOutput, OnePassScale, Reduced, TwoPassBackward};
use crate::options::{CrossEntropyOptions, Reduction};
use crate::primitive::FloatOf;
use crate::values::{
    CrossEntropyInputs, LossParts, OptionalFloat, OptionalInt, RowStats, RowWeights,
};

/// Row `stat` of forward's statistics, f32 `[N]` (a view).
fn stat_row_of(stats: CubeTensor, stat: usize) -> CubeTensor {
    stat_row(&FloatOf::<CubeBackend, 2>::new(stats), stat).into_primitive()
}

/// The row kernels' launch for `[B, T, V]` logits and `[B, T]` targets (`weighted`: class
/// weights given; `entropy_weighted`: the rows' entropy weights given).
pub(crate) fn row_launch(
    logits: &CubeTensor,
    targets: &CubeTensor,
    vector_size: usize,
    weighted: bool,
    entropy_weighted: bool,
    options: &CrossEntropyOptions,
) -> RowLaunch {
    let [outer, inner, vocab] = logits.meta.shape().dims::<3>();
    RowLaunch {
        rows: outer * inner,
        vocab,
        vector_size,
        address_type: logits.required_address_type(),
        float_dtype: elem(logits.dtype),
        int_dtype: elem(targets.dtype),
        settings: LossSettings {
            ignore_index: options.kernel_ignore_index(),
            label_smoothing: options.label_smoothing,
            z_loss_scale: options.z_loss_scale,
            softcap: options.softcap,
            temperature: options.temperature,
            weighted,
            argmax: options.outputs.needs_argmax(),
            entropy: options.outputs.entropy.is_on(),
            entropy_weighted,
            exp_flush_to_zero: options.fast_math.exp_flush_to_zero,
            approximate_tanh: options.fast_math.approximate_tanh,
        },
        tuning: tuning_for(logits, options),
    }
}

/// The tuning the options ask for, or the device's defaults.
fn tuning_for(like: &CubeTensor, options: &CrossEntropyOptions) -> KernelTuning {
    options
        .tuning()
        .copied()
        .unwrap_or_else(|| KernelTuning::for_device(&like.client))
}

/// Forward's outputs for `[B, T, V]` logits: the statistics, the predictions when asked
/// for, and the launch argument for `predicted`.
fn forward_outputs(
    logits: &CubeTensor,
    targets: &CubeTensor,
    options: &CrossEntropyOptions,
) -> (CubeTensor, Option<CubeTensor>, cubecl::prelude::TensorArg) {
    let [outer, inner, _] = logits.meta.shape().dims::<3>();
    let rows = outer * inner;
    let stats = f32_buffer(logits, Shape::new([row_stat::COUNT, rows]));
    let (predicted, predicted_arg) = predictions(targets, rows, options.outputs.needs_argmax());
    (stats, predicted, predicted_arg)
}

/// Scratch buffers of the one-pass kernel (its prologue initialises them).
fn one_pass_scratch(like: &CubeTensor, partials_len: usize) -> OnePassScratch {
    let buffer = |len: usize, dtype: DType| {
        contiguous_buffer(like, Shape::new([len]), dtype).into_tensor_arg()
    };
    OnePassScratch {
        scales: buffer(scale_slot::LEN, DType::F32),
        tickets: buffer(1, DType::I32),
        partials: buffer(partials_len, DType::I32),
    }
}

impl FusedCrossEntropyBackend for CubeBackend {
    fn cross_entropy_rows(
        inputs: CrossEntropyInputs<Self>,
        options: CrossEntropyOptions,
    ) -> RowStats<Self> {
        let CrossEntropyInputs {
            logits,
            targets,
            class_weights,
            row_weights,
        } = inputs;
        let logits = rows_view(logits);
        let targets = with_leading_one(targets, 2);
        let (stats, predicted, predicted_arg) = forward_outputs(&logits, &targets, &options);
        let weighted = class_weights.is_weighted();
        // Entropy weights need the rows' entropy in the statistics.
        let shape = row_launch(
            &logits,
            &targets,
            vector_size(&[&logits]),
            weighted,
            row_weights.has_entropy(),
            &options,
        );
        launch_forward(
            &logits.client.clone(),
            shape,
            logits.clone().into_tensor_arg(),
            targets.into_tensor_arg(),
            weight_args(class_weights.tensors(), &logits),
            stats.clone().into_tensor_arg(),
            predicted_arg,
        );
        RowStats {
            stats,
            predicted: OptionalInt::from_option(predicted),
            weighted,
        }
    }

    fn cross_entropy_backward(
        inputs: CrossEntropyInputs<Self>,
        backward: TwoPassBackward<Self>,
        options: CrossEntropyOptions,
    ) -> CubeTensor {
        let CrossEntropyInputs {
            logits,
            targets,
            class_weights,
            row_weights,
        } = inputs;
        let TwoPassBackward {
            stats,
            grad_output,
            denominators,
            entropy_grad_output,
        } = backward;
        let denominators = denominators.into_option();
        let logits_shape = logits.shape();
        let logits = rows_view(logits);
        let targets = with_leading_one(targets, 2);
        let client = logits.client.clone();
        let weighted = class_weights.is_weighted();
        let weights = weight_args(class_weights.tensors(), &logits);
        let entropy = entropy_incoming::<Self>(
            entropy_grad_output.into_option(),
            row_weights.entropy.into_option(),
            &grad_output,
            denominators.as_ref(),
        );
        let incoming = IncomingGradient {
            dtype: elem(grad_output.dtype),
            per_row: options.reduction == Reduction::None,
            mean: denominators.is_some(),
            // Without denominators the incoming gradient is bound in their place, unread.
            denominators: denominators
                .unwrap_or_else(|| grad_output.clone())
                .into_tensor_arg(),
            grad: grad_output.into_tensor_arg(),
            entropy: optional_f32_arg(entropy),
            row_weights: optional_f32_arg(row_weights.loss.into_option()),
        };
        let (target, grad) = gradient_buffer(&logits);
        let shape = row_launch(
            &logits,
            &targets,
            vector_size(&[&logits, &grad]),
            weighted,
            false,
            &options,
        );
        launch_backward(
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

    fn cross_entropy_one_pass(
        inputs: CrossEntropyInputs<Self>,
        scale: OnePassScale<Self>,
        options: CrossEntropyOptions,
    ) -> OnePassOutput<Self> {
        let CrossEntropyInputs {
            logits,
            targets,
            class_weights,
            row_weights,
        } = inputs;
        let logits_shape = logits.shape();
        let logits = rows_view(logits);
        let targets = with_leading_one(targets, 2);
        let (stats, predicted, predicted_arg) = forward_outputs(&logits, &targets, &options);
        let client = logits.client.clone();
        let weighted = class_weights.is_weighted();
        let weights = weight_args(class_weights.tensors(), &logits);
        let mean = options.reduction == Reduction::Mean;
        let (target, grad) = gradient_buffer(&logits);
        let shape = row_launch(
            &logits,
            &targets,
            vector_size(&[&logits, &grad]),
            weighted,
            row_weights.has_entropy(),
            &options,
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
                .into_option()
                .filter(|_| mean)
                .map(|given| given.into_tensor_arg()),
            row_weights: optional_f32_arg(row_weights.loss.into_option()),
            entropy_weights: optional_f32_arg(row_weights.entropy.into_option()),
            scratch,
        };
        launch_one_pass(&client, shape, plan, buffers, mean);
        OnePassOutput {
            rows: RowStats {
                stats,
                predicted: OptionalInt::from_option(predicted),
                weighted,
            },
            grad: reshaped(grad, logits_shape),
        }
    }

    fn scale_one_pass_gradient(
        grad: CubeTensor,
        grad_output: CubeTensor,
        guess: CubeTensor,
    ) -> (CubeTensor, CubeTensor) {
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
            float_dtype: elem(grad.dtype),
            int_dtype: elem(grad.dtype),
            settings: LossSettings::default(),
            tuning: KernelTuning::for_device(&grad.client),
        };
        let next = f32_buffer(&grad, Shape::new([1]));
        launch_scale_gradient(
            &grad.client.clone(),
            shape,
            grad.clone().into_tensor_arg(),
            grad_output.clone().into_tensor_arg(),
            guess.into_tensor_arg(),
            next.clone().into_tensor_arg(),
            elem(grad_output.dtype),
        );
        (reshaped(grad, grad_shape), next)
    }

    fn first_bad_target(targets: CubeTensor, vocab: usize, ignore_index: i64) -> CubeTensor {
        let targets = with_leading_one(targets, 2);
        let result = contiguous_buffer(&targets, Shape::new([2]), targets.dtype);
        launch_first_bad_target(
            &targets.client.clone(),
            targets.clone().into_tensor_arg(),
            result.clone().into_tensor_arg(),
            elem(targets.dtype),
            vocab,
            // As the loss kernels compare it (see `CrossEntropyOptions::kernel_ignore_index`).
            i32::try_from(ignore_index).unwrap_or(i32::MIN),
        );
        result
    }

    fn start_target_check(
        targets: CubeTensor,
        vocab: usize,
        ignore_index: i64,
        read: TargetCheckRead,
    ) -> CubeTensor {
        let found = Self::first_bad_target(targets, vocab, ignore_index);
        read.start(queued_cube_read(&found));
        found
    }

    fn reduce_row_stats(
        rows: RowStats<Self>,
        row_weights: RowWeights<Self>,
        options: CrossEntropyOptions,
        dtype: DType,
        keep_denominators: bool,
    ) -> Reduced<Self> {
        let n_rows = rows.stats.meta.shape()[1];
        if n_rows == 0
            || options.reduction == Reduction::None
            || options.mean_denominators.is_some()
        {
            // Per-row losses need no reduction (an accuracy asked for alongside is summed
            // by tensor ops); N = 0 launches nothing; the kernel divides by the call's own
            // denominators, tensor ops by given ones.
            return reduce_stats::<Self>(rows, row_weights, &options, dtype, keep_denominators);
        }
        let stats = into_contiguous(rows.stats);
        let loss = poison(contiguous_buffer(&stats, Shape::new([1]), dtype));
        let z_loss = f32_buffer(&stats, Shape::new([1]));
        let accuracy = f32_buffer(&stats, Shape::new([1]));
        let denominators = f32_buffer(&stats, Shape::new([2]));
        let mean = options.reduction == Reduction::Mean;
        launch_reduce_stats(
            &stats.client.clone(),
            stats.clone().into_tensor_arg(),
            optional_f32_arg(row_weights.loss.into_option()),
            optional_f32_arg(row_weights.entropy.into_option()),
            loss.clone().into_tensor_arg(),
            z_loss.clone().into_tensor_arg(),
            accuracy.clone().into_tensor_arg(),
            denominators.clone().into_tensor_arg(),
            elem(dtype),
            mean,
            options.z_loss_scale > 0.0,
            rows.weighted,
        );
        let wanted = options.outputs;
        Reduced {
            parts: LossParts {
                loss,
                z_loss: OptionalFloat::from_option(wanted.z_loss.then_some(z_loss)),
                accuracy: OptionalFloat::from_option(wanted.accuracy.then_some(accuracy)),
                predicted: if wanted.predicted {
                    rows.predicted
                } else {
                    OptionalInt::Absent
                },
                lse: OptionalFloat::from_option(
                    wanted
                        .lse
                        .then(|| stat_row_of(stats.clone(), row_stat::LSE)),
                ),
                entropy: OptionalFloat::from_option(
                    wanted
                        .entropy
                        .is_on()
                        .then(|| stat_row_of(stats, row_stat::ENTROPY)),
                ),
            },
            denominators: OptionalFloat::from_option(
                (mean && keep_denominators).then_some(denominators),
            ),
        }
    }
}
