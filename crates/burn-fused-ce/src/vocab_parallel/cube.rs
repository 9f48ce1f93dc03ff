//! The vocabulary-parallel ops on [`CubeBackend`], every cube runtime: the shard's targets
//! made local, its contributions packed, the whole vocabulary's statistics and the
//! backward kernel's inputs, one small kernel each.

use burn::backend::TensorMetadata;
use burn::backend::ops::IntTensorOps;
use burn::tensor::Shape;
use burn_cubecl::{CubeBackend, kernel::into_contiguous, tensor::CubeTensor};
use fused_ce_kernels::{
    PackOptions, ShardGradientOptions, ShardRowsOptions, ShardScalars, launch_pack_shard_rows,
    launch_shard_gradient_rows, launch_shard_targets, launch_whole_vocabulary_rows, row_stat,
};

use crate::cube_tensors::{
    as_f32, contiguous_buffer, elem, f32_buffer, poison, predictions, rows_view, with_leading_one,
};
use crate::loss::extension::FusedCrossEntropyBackend;

use crate::options::{CrossEntropyOptions, Reduction};
use crate::values::{
    ClassWeights, CrossEntropyInputs, OptionalFloat, OptionalInt, RowStats, RowWeights,
};
use crate::vocab_parallel::contributions::shard_contributions_by_tensor_ops;
use crate::vocab_parallel::extension::VocabParallelBackend;
use crate::vocab_parallel::extension_types::{
    ExchangedRows, KernelBackwardRows, ShardBackwardRows,
};
use crate::vocab_parallel::gradient_rows::shard_gradient_rows_by_tensor_ops;
use crate::vocab_parallel::shard::{VocabShard, exchanged_rows, local_options, smoothing_options};
use crate::vocab_parallel::target_rows::shard_weights;
use crate::vocab_parallel::whole_rows::whole_vocabulary_rows_by_tensor_ops;

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

impl VocabParallelBackend for CubeBackend {
    fn shard_contributions(
        inputs: CrossEntropyInputs<Self>,
        shard: VocabShard,
        options: CrossEntropyOptions,
    ) -> CubeTensor {
        let rows = inputs.targets.meta.num_elements();
        if rows == 0 {
            // Nothing to launch over.
            return shard_contributions_by_tensor_ops::<Self>(inputs, &shard, &options);
        }
        let targets_shape = inputs.targets.shape();
        let targets = with_leading_one(inputs.targets.clone(), 2);
        let smoothing = options.label_smoothing > 0.0;
        let int_buffer = |len: usize| contiguous_buffer(&targets, Shape::new([len]), targets.dtype);
        let local = poison(int_buffer(rows));
        let first_class = if smoothing {
            poison(int_buffer(rows))
        } else {
            int_buffer(1)
        };
        let scalars = shard_scalars(&shard, &options);
        launch_shard_targets(
            &targets.client.clone(),
            rows,
            targets.clone().into_tensor_arg(),
            local.clone().into_tensor_arg(),
            first_class.clone().into_tensor_arg(),
            elem(targets.dtype),
            &scalars,
            smoothing,
        );
        // The row kernel takes the targets in the logits' row shape.
        let shaped = |local: CubeTensor| Self::int_reshape(local, targets_shape.clone());
        let own = <Self as FusedCrossEntropyBackend>::cross_entropy_rows(
            CrossEntropyInputs {
                logits: inputs.logits.clone(),
                targets: shaped(local),
                class_weights: ClassWeights::Unweighted,
                row_weights: RowWeights::none(),
            },
            local_options(&options),
        );
        let smoothed = smoothing.then(|| {
            <Self as FusedCrossEntropyBackend>::cross_entropy_rows(
                CrossEntropyInputs {
                    logits: inputs.logits.clone(),
                    targets: shaped(first_class),
                    class_weights: shard_weights(&inputs.class_weights, shard.classes()),
                    row_weights: RowWeights::none(),
                },
                smoothing_options(&options),
            )
        });
        let unused_f32 = || f32_buffer(&own.stats, Shape::new([1]));
        let packed = f32_buffer(
            &own.stats,
            Shape::new([exchanged_rows(&shard, &options), rows]),
        );
        let logits = rows_view(inputs.logits);
        let logits_dtype = logits.dtype;
        launch_pack_shard_rows(
            &packed.client.clone(),
            rows,
            own.stats.clone().into_tensor_arg(),
            smoothed
                .map_or_else(unused_f32, |smoothed| smoothed.stats)
                .into_tensor_arg(),
            own.predicted
                .into_option()
                .unwrap_or_else(|| int_buffer(1))
                .into_tensor_arg(),
            logits.into_tensor_arg(),
            targets.clone().into_tensor_arg(),
            packed.clone().into_tensor_arg(),
            [elem(logits_dtype), elem(targets.dtype)],
            &scalars,
            PackOptions {
                shards: shard.count(),
                smoothing,
                argmax: options.outputs.needs_argmax(),
                softcap: options.softcap.is_some(),
            },
        );
        packed
    }

    fn shard_gradient_rows(
        inputs: ShardBackwardRows<Self>,
        shard: VocabShard,
        options: CrossEntropyOptions,
    ) -> KernelBackwardRows<Self> {
        let rows = inputs.stats.meta.shape()[1];
        if rows == 0 {
            // Nothing to launch over.
            return shard_gradient_rows_by_tensor_ops::<Self>(inputs, &shard, &options);
        }
        let ShardBackwardRows {
            stats,
            targets,
            logits,
            grad_output,
            denominators,
            weight_total,
        } = inputs;
        let denominators = denominators.into_option();
        let weight_total = weight_total.into_option();
        let targets = with_leading_one(targets, 2);
        let logits = rows_view(logits);
        let grad_output = into_contiguous(grad_output);
        let local = poison(contiguous_buffer(
            &targets,
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
            elem(logits.dtype),
            elem(grad_output.dtype),
            elem(targets.dtype),
        ];
        launch_shard_gradient_rows(
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
            &shard_scalars(&shard, &options),
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
            smooth: OptionalFloat::from_option(smoothing.then_some(smooth)),
        }
    }

    fn whole_vocabulary_rows(
        exchanged: ExchangedRows<Self>,
        shard: VocabShard,
        options: CrossEntropyOptions,
    ) -> RowStats<Self> {
        let rows = exchanged.summed.meta.shape()[1];
        if rows == 0 {
            // Nothing to launch over.
            return whole_vocabulary_rows_by_tensor_ops::<Self>(exchanged, &shard, &options);
        }
        let ExchangedRows {
            summed,
            targets,
            class_weights,
            shard_totals,
        } = exchanged;
        // The kernel reads the exchanged rows as laid out in one contiguous block.
        let summed = into_contiguous(summed);
        let targets = with_leading_one(targets, 2);
        let stats = f32_buffer(&summed, Shape::new([row_stat::COUNT, rows]));
        let (predicted, predicted_arg) =
            predictions(&targets, rows, options.outputs.needs_argmax());
        let weighted = class_weights.is_weighted();
        let shard_totals = shard_totals.into_option();
        let smoothing = shard_totals.is_some();
        let unused = || f32_buffer(&summed, Shape::new([1]));
        let weights = class_weights
            .tensors()
            .map_or_else(unused, |(weights, _)| as_f32(weights));
        let totals = shard_totals.map_or_else(unused, as_f32);
        launch_whole_vocabulary_rows(
            &summed.client.clone(),
            rows,
            summed.clone().into_tensor_arg(),
            targets.clone().into_tensor_arg(),
            weights.into_tensor_arg(),
            totals.into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            predicted_arg,
            elem(targets.dtype),
            &shard_scalars(&shard, &options),
            ShardRowsOptions {
                shards: shard.count(),
                smoothing,
                weighted,
                argmax: predicted.is_some(),
            },
        );
        RowStats {
            stats,
            predicted: OptionalInt::from_option(predicted),
            weighted,
        }
    }
}
