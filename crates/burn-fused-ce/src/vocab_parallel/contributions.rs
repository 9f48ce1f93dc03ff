//! What one shard contributes to the exchanged sums, by tensor ops around the loss's row
//! op: the default of [`crate::backend::VocabParallelBackend::shard_contributions`].

use burn::backend::{TensorMetadata, tensor::FloatTensor};
use burn::tensor::{DType, Shape};

use crate::loss::extension::FusedCrossEntropyBackend;
use crate::loss::reduce::stat_row;

use crate::options::CrossEntropyOptions;
use crate::primitive::{FloatOf, IntOf};
use crate::values::{ClassWeights, CrossEntropyInputs, RowWeights, row_stat};
use crate::vocab_parallel::shard::{VocabShard, local_options, smoothing_options};
use crate::vocab_parallel::target_rows::{TargetRows, shard_weights};

/// The shard's row-kernel passes over its logits, then what it contributes to the
/// exchanged sums (see [`crate::ExchangedRows::summed`]), f32 `[R, N]`.
pub(crate) fn shard_contributions_by_tensor_ops<B: FusedCrossEntropyBackend>(
    inputs: CrossEntropyInputs<B>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> FloatTensor<B> {
    let targets_shape = inputs.targets.shape();
    let rows = targets_shape.num_elements();
    let target_rows = TargetRows::<B>::new(inputs.targets.clone(), shard, options.ignore_index);
    let local_targets = target_rows.local(shard);
    // The row op takes the targets in the logits' row shape.
    let shaped =
        |targets: IntOf<B, 1>| B::int_reshape(targets.into_primitive(), targets_shape.clone());
    let here = shard.classes();

    // The shard's statistics: its maximum and `ln sum exp(x - max)`, and at the target's
    // shard its `lse - x_y` and `p_y - 1`.
    let own = B::cross_entropy_rows(
        CrossEntropyInputs {
            logits: inputs.logits.clone(),
            targets: shaped(local_targets.clone()),
            class_weights: ClassWeights::Unweighted,
            row_weights: RowWeights::none(),
        },
        local_options(options),
    );
    let own_stats = FloatOf::<B, 2>::new(own.stats);
    // `value` in the shard's own row of a block of `K`, zeros in the others'.
    let zeros_of = &target_rows;
    let own_row = |value: FloatOf<B, 1>| {
        (0..shard.count()).map(move |k| {
            if k == shard.index() {
                value.clone()
            } else {
                zeros_of.zeros()
            }
        })
    };
    let mut contributions: Vec<FloatOf<B, 1>> =
        own_row(stat_row(&own_stats, row_stat::MAX)).collect();
    let here_mask = &target_rows.here;
    contributions.push(TargetRows::masked(
        here_mask,
        stat_row(&own_stats, row_stat::LOSS),
    ));
    contributions.push(TargetRows::masked(
        here_mask,
        stat_row(&own_stats, row_stat::TARGET_GRAD),
    ));
    if options.label_smoothing > 0.0 {
        // One more pass with all the weight on smoothing and class 0 as the target: its
        // loss is `(1 / V_k) sum_c w_c (lse_k - x_c)`.
        let first_class = target_rows
            .int_zeros()
            .mask_where(target_rows.counted.clone().not(), local_targets);
        let smoothed = B::cross_entropy_rows(
            CrossEntropyInputs {
                logits: inputs.logits.clone(),
                targets: shaped(first_class),
                class_weights: shard_weights(&inputs.class_weights, here.clone()),
                row_weights: RowWeights::none(),
            },
            smoothing_options(options),
        );
        let smoothed = stat_row(&FloatOf::<B, 2>::new(smoothed.stats), row_stat::LOSS);
        contributions.push(smoothed.mul_scalar(here.len() as f64));
    }
    if options.outputs.needs_argmax() {
        // The best value (soft-capped, as the kernel compares) and its column in the
        // whole vocabulary.
        let predicted = own
            .predicted
            .into_option()
            .expect("the row op tracks the argmax when an output needs it");
        let width = here.len();
        let column = IntOf::<B, 1>::new(B::int_reshape(predicted, Shape::new([rows])))
            .clamp(0, width as i64 - 1);
        let logits =
            FloatOf::<B, 2>::new(B::float_reshape(inputs.logits, Shape::new([rows, width])));
        let mut best = logits
            .gather(1, column.clone().reshape([rows, 1]))
            .reshape([rows])
            .cast(DType::F32);
        if let Some(cap) = options.softcap {
            let cap = cap as f64;
            best = best.div_scalar(cap).tanh().mul_scalar(cap);
        }
        let at = column.add_scalar(here.start as i64).float(DType::F32);
        let counted = &target_rows.counted;
        for values in [best, at] {
            contributions.extend(own_row(TargetRows::masked(counted, values)));
        }
    }
    // Last, the shard's `ln sum exp(x - max)`, in its own row of `K`.
    contributions.extend(own_row(stat_row(&own_stats, row_stat::LOG_SUM)));
    let contributions = contributions
        .into_iter()
        .map(|row| row.reshape([1, rows]))
        .collect();
    FloatOf::cat(contributions, 0).into_primitive()
}
