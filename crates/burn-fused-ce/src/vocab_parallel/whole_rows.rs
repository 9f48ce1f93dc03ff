//! The whole vocabulary's per-row statistics from the exchanged sums, by tensor ops: the
//! default of [`crate::backend::VocabParallelBackend::whole_vocabulary_rows`] (the math is the
//! module doc's).

use burn::backend::Backend;
use burn::tensor::DType;

use crate::loss::reduce::stat_row;
use crate::options::CrossEntropyOptions;
use crate::primitive::{FloatOf, IntOf};
use crate::values::{ClassWeights, OptionalInt, RowStats, row_stat};
use crate::vocab_parallel::extension_types::ExchangedRows;
use crate::vocab_parallel::shard::{VocabShard, log_sum_rows};
use crate::vocab_parallel::target_rows::TargetRows;

/// The statistics in [`row_stat`]'s layout; ignored rows all 0.
pub(crate) fn whole_vocabulary_rows_by_tensor_ops<B: Backend>(
    exchanged: ExchangedRows<B>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> RowStats<B> {
    let summed = FloatOf::<B, 2>::new(exchanged.summed);
    let device = summed.device();
    let target_rows = &TargetRows::<B>::new(exchanged.targets, shard, options.ignore_index);
    let int_dtype = target_rows.targets.dtype();
    let class_weights = &exchanged.class_weights;
    let count = shard.count();
    let rows = summed.dims()[1];
    let across = |row: FloatOf<B, 1>| row.reshape([1, rows]).expand([count, rows]);

    let max_per_shard = summed.clone().slice([0..count, 0..rows]);
    let log_sums = log_sum_rows(shard, options);
    let log_sum_per_shard = summed.clone().slice([log_sums..log_sums + count, 0..rows]);
    // `lse = max + log_sum`, and a difference of two log-sum-exps is that of their maxima
    // plus that of their `log_sum` (the log-sum-exps rounded to f32 are off by up to
    // their ulp).
    let max = max_per_shard.clone().max_dim(0);
    let log_sum = max_per_shard
        .clone()
        .sub(max.clone().expand([count, rows]))
        .add(log_sum_per_shard.clone())
        .exp()
        .sum_dim(0)
        .log()
        .reshape([rows]);
    let max = max.reshape([rows]);
    let lse = max.clone().add(log_sum.clone());
    let owner = target_rows
        .targets
        .clone()
        .div_scalar(shard.width() as i64)
        .clamp(0, count as i64 - 1)
        .reshape([1, rows]);
    let max_owner = max_per_shard
        .clone()
        .gather(0, owner.clone())
        .reshape([rows]);
    let log_sum_owner = log_sum_per_shard
        .clone()
        .gather(0, owner.clone())
        .reshape([rows]);
    let others = IntOf::<B, 1>::arange(0..count as i64, &device, int_dtype)
        .reshape([count, 1])
        .expand([count, rows])
        .equal(owner.expand([count, rows]))
        .not();
    let share_elsewhere = max_per_shard
        .clone()
        .sub(across(max.clone()))
        .add(log_sum_per_shard.clone().sub(across(log_sum.clone())))
        .exp()
        .mask_fill(others.not(), 0.0)
        .sum_dim(0)
        .reshape([rows]);
    // `lse - lse_y`.
    let above_owner = max
        .clone()
        .sub(max_owner)
        .add(log_sum.clone().sub(log_sum_owner));
    let owner_share = above_owner.clone().neg().exp();
    let nll = stat_row(&summed, count).add(above_owner);
    let target_grad = stat_row(&summed, count + 1)
        .mul(owner_share)
        .sub(share_elsewhere);

    let counted = &target_rows.counted;
    let class = &target_rows.class;
    let target_weight = match class_weights {
        ClassWeights::Weighted { weights, .. } => {
            let at = target_rows
                .targets
                .clone()
                .clamp(0, shard.vocab() as i64 - 1);
            FloatOf::<B, 1>::new(weights.clone()).gather(0, at)
        }
        ClassWeights::Unweighted => target_rows.ones(),
    };
    let ls = options.label_smoothing as f64;
    let mut ce = nll.mul(target_weight.clone()).mul_scalar(1.0 - ls);
    let mut next = count + 2;
    if let Some(totals) = exchanged.shard_totals.into_option() {
        let totals = FloatOf::<B, 1>::new(totals)
            .reshape([count, 1])
            .expand([count, rows]);
        let spread = across(max.clone())
            .sub(max_per_shard)
            .add(across(log_sum.clone()).sub(log_sum_per_shard))
            .mul(totals)
            .sum_dim(0)
            .reshape([rows]);
        let smooth = spread.add(stat_row(&summed, next));
        next += 1;
        ce = ce.add(smooth.mul_scalar(ls / shard.vocab() as f64));
    }
    let z_loss = lse
        .clone()
        .powi_scalar(2)
        .mul_scalar(options.z_loss_scale as f64);
    // A target that is neither a class nor ignored gets a NaN loss, as on one device.
    let not_a_class = counted.clone().and(class.clone().not());
    let loss = ce.add(z_loss.clone()).mask_fill(not_a_class, f64::NAN);

    let (correct, predicted) = if options.outputs.needs_argmax() {
        let best_value = summed.clone().slice([next..next + count, 0..rows]);
        let best_column = summed.slice([next + count..next + 2 * count, 0..rows]);
        let best_shard = best_value.argmax(0, int_dtype);
        let column = best_column
            .gather(0, best_shard)
            .reshape([rows])
            .int(int_dtype);
        let correct = column
            .clone()
            .equal(target_rows.targets.clone())
            .float(DType::F32);
        let predicted =
            IntOf::<B, 1>::full([rows], -1, &device, int_dtype).mask_where(counted.clone(), column);
        (
            correct,
            OptionalInt::Present {
                tensor: predicted.into_primitive(),
            },
        )
    } else {
        (target_rows.zeros(), OptionalInt::Absent)
    };

    let mut stats: Vec<FloatOf<B, 1>> = (0..row_stat::COUNT).map(|_| target_rows.zeros()).collect();
    stats[row_stat::LOSS] = loss;
    stats[row_stat::Z_LOSS] = z_loss;
    stats[row_stat::WEIGHT] = target_weight;
    stats[row_stat::VALID] = target_rows.ones();
    stats[row_stat::CORRECT] = correct;
    stats[row_stat::LSE] = lse;
    stats[row_stat::TARGET_GRAD] = target_grad;
    stats[row_stat::MAX] = max;
    stats[row_stat::LOG_SUM] = log_sum;
    let stats = stats
        .into_iter()
        .map(|stat| TargetRows::masked(counted, stat).reshape([1, rows]))
        .collect();
    RowStats {
        stats: FloatOf::cat(stats, 0).into_primitive(),
        predicted,
        weighted: class_weights.is_weighted(),
    }
}
