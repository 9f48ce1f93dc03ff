//! Backward on one shard: the gradient of the shard's logits from the whole vocabulary's
//! statistics, with no exchange (they are the same on every shard).

use burn::backend::{TensorMetadata, tensor::FloatTensor};
use burn::tensor::{DType, Shape};

use crate::loss::extension::FusedCrossEntropyBackend;
use crate::loss::reduce::stat_row;
use crate::loss::types::TwoPassBackward;
use crate::options::{CrossEntropyOptions, Reduction};
use crate::primitive::{FloatOf, IntOf};
use crate::values::{ClassWeights, CrossEntropyInputs, OptionalFloat, RowWeights, row_stat};
use crate::vocab_parallel::extension::VocabParallelBackend;
use crate::vocab_parallel::extension_types::ShardBackwardRows;
use crate::vocab_parallel::gradient_rows::{RowCoefficients, row_scales};
use crate::vocab_parallel::shard::{SHARD_IGNORE, VocabShard};
use crate::vocab_parallel::target_rows::{TargetRows, shard_column_weights, weight_total};

/// The gradient of this shard's logits (their shape and dtype) from the whole
/// vocabulary's statistics `stats`, the incoming gradient (`[N]` for `None`, `[1]`
/// otherwise) and, for `Mean`, the denominators `[D, n]`:
/// `grad_c = (sc ((1 - ls) w_y (p_c - [c = y]) + (ls / V)(W p_c - w_c)) + 2 s sz lse p_c)`,
/// times softcap's derivative, for this shard's columns `c`. The backward kernel writes it
/// ([`kernel_gradient`]) unless label smoothing and softcap both apply; then element-wise
/// tensor ops do (which may hold `[N, V_s]` f32 temporaries).
pub(crate) fn shard_gradient<B: VocabParallelBackend>(
    inputs: CrossEntropyInputs<B>,
    stats: FloatTensor<B>,
    grad_output: FloatTensor<B>,
    denominators: OptionalFloat<B>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> FloatTensor<B> {
    if options.label_smoothing == 0.0 || options.softcap.is_none() {
        return kernel_gradient::<B>(inputs, stats, grad_output, denominators, shard, options);
    }
    elementwise_gradient::<B>(inputs, stats, grad_output, denominators, shard, options)
}

/// [`shard_gradient`] by element-wise tensor ops (label smoothing with softcap).
fn elementwise_gradient<B: VocabParallelBackend>(
    inputs: CrossEntropyInputs<B>,
    stats: FloatTensor<B>,
    grad_output: FloatTensor<B>,
    denominators: OptionalFloat<B>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> FloatTensor<B> {
    let device = inputs.logits.device();
    let shape = inputs.logits.shape();
    let dtype = inputs.logits.dtype();
    let here = shard.classes();
    let width = here.len();
    let target_rows = TargetRows::<B>::new(inputs.targets.clone(), shard, options.ignore_index);
    let rows = target_rows.rows();
    let stats = FloatOf::<B, 2>::new(stats);
    let flowing = target_rows.class.clone();

    let scales = row_scales::<B>(
        grad_output,
        denominators.into_option(),
        options.reduction,
        &flowing,
        rows,
    );
    // Rows with no gradient get a maximum that makes every probability 0, and finite
    // statistics (not `inf * 0`).
    let stopped = flowing.not();
    let lse = stat_row(&stats, row_stat::LSE).mask_fill(stopped.clone(), 0.0);
    let max = stat_row(&stats, row_stat::MAX).mask_fill(stopped.clone(), f32::MAX as f64);
    let log_sum = stat_row(&stats, row_stat::LOG_SUM).mask_fill(stopped, 0.0);
    let coefficients = RowCoefficients::new(
        scales,
        &stats,
        lse.clone(),
        weight_total(&inputs.class_weights),
        shard,
        options,
    );
    let target_coef = coefficients.target.clone();
    let prob_coef = coefficients.probability();

    let column = |values: FloatOf<B, 1>| values.reshape([rows, 1]).expand([rows, width]);
    let logits = FloatOf::<B, 2>::new(B::float_reshape(inputs.logits, Shape::new([rows, width])))
        .cast(DType::F32);
    let capped = match options.softcap {
        Some(cap) => {
            let cap = cap as f64;
            logits.div_scalar(cap).tanh().mul_scalar(cap)
        }
        None => logits,
    };
    // `x - max` first: exact for the columns whose probability matters, where the
    // log-sum-exp rounded to f32 is off by up to its ulp.
    let probs = capped.clone().sub(column(max)).sub(column(log_sum)).exp();
    let int_dtype = target_rows.targets.dtype();
    let local_target = target_rows
        .targets
        .clone()
        .sub_scalar(here.start as i64)
        .mask_fill(target_rows.here.clone().not(), -1)
        .reshape([rows, 1])
        .expand([rows, width]);
    let is_target = IntOf::<B, 1>::arange(0..width as i64, &device, int_dtype)
        .reshape([1, width])
        .expand([rows, width])
        .equal(local_target)
        .float(DType::F32);
    let mut grad = probs
        .mul(column(prob_coef))
        .sub(is_target.mul(column(target_coef)));
    if let Some(smooth) = coefficients.smooth {
        grad = grad.sub(smoothing_term(
            smooth,
            &inputs.class_weights,
            shard,
            &device,
        ));
    }
    if let Some(cap) = options.softcap {
        let scaled = capped.div_scalar(cap as f64);
        grad = grad.mul(scaled.clone().mul(scaled).neg().add_scalar(1.0));
    }
    B::float_reshape(grad.cast(dtype).into_primitive(), shape)
}

/// [`shard_gradient`] through the backward kernel, unless label smoothing and softcap
/// both apply. The spec's gradient on the shard's columns is `c p_c - s w_c - [c = y]
/// sc (1 - ls) w_y` (see [`VocabParallelBackend::shard_gradient_rows`]): the kernel,
/// run with the per-row coefficients `c` as its incoming gradient and no smoothing,
/// z-loss or class weights of its own, writes `c p_c` and the target's value (times
/// softcap's derivative); label smoothing's `s w_c` is subtracted afterwards (which is why
/// softcap, whose derivative it would need, takes the element-wise path with it). A row
/// whose target another shard holds gets column 0 as its target, with a value that makes
/// the kernel write `c p_0` there.
fn kernel_gradient<B: VocabParallelBackend>(
    inputs: CrossEntropyInputs<B>,
    stats: FloatTensor<B>,
    grad_output: FloatTensor<B>,
    denominators: OptionalFloat<B>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> FloatTensor<B> {
    let targets_shape = inputs.targets.shape();
    let rows = targets_shape.num_elements();
    let (shape, dtype) = (inputs.logits.shape(), inputs.logits.dtype());
    let width = shard.classes().len();
    let kernel_rows = B::shard_gradient_rows(
        ShardBackwardRows {
            stats,
            targets: B::int_reshape(inputs.targets.clone(), Shape::new([rows])),
            logits: inputs.logits.clone(),
            grad_output,
            denominators,
            weight_total: OptionalFloat::from_option(weight_total(&inputs.class_weights)),
        },
        *shard,
        options.clone(),
    );
    let grad = B::cross_entropy_backward(
        CrossEntropyInputs {
            logits: inputs.logits,
            targets: B::int_reshape(kernel_rows.targets, targets_shape),
            class_weights: ClassWeights::Unweighted,
            row_weights: RowWeights::none(),
        },
        TwoPassBackward {
            stats: kernel_rows.stats,
            grad_output: kernel_rows.coefficients,
            denominators: OptionalFloat::Absent,
            entropy_grad_output: OptionalFloat::Absent,
        },
        options
            .clone()
            .with_reduction(Reduction::None)
            .with_label_smoothing(0.0)
            .with_z_loss_scale(0.0)
            .with_ignore_index(SHARD_IGNORE),
    );
    let Some(smooth) = kernel_rows.smooth.into_option() else {
        return grad;
    };
    let device = grad.device();
    let grad = FloatOf::<B, 2>::new(B::float_reshape(grad, Shape::new([rows, width])));
    let smoothing = smoothing_term(FloatOf::new(smooth), &inputs.class_weights, shard, &device);
    let grad = grad.cast(DType::F32).sub(smoothing).cast(dtype);
    B::float_reshape(grad.into_primitive(), shape)
}

/// Label smoothing's part `s w_c` of a shard's gradient, f32 `[N, V_s]`: each row's `s`
/// (`smooth [N]`) times the class weight of each of the shard's columns (1 without
/// weights).
fn smoothing_term<B: FusedCrossEntropyBackend>(
    smooth: FloatOf<B, 1>,
    class_weights: &ClassWeights<B>,
    shard: &VocabShard,
    device: &B::Device,
) -> FloatOf<B, 2> {
    let width = shard.classes().len();
    let weights = shard_column_weights(class_weights, shard, device);
    let rows = smooth.dims()[0];
    smooth
        .reshape([rows, 1])
        .expand([rows, width])
        .mul(weights.reshape([1, width]).expand([rows, width]))
}
