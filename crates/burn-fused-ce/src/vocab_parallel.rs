//! The vocabulary-parallel cross-entropy: the logits' classes are split over devices, each
//! holding one shard `[N, V_s]`. Each shard reduces its own classes with the row kernel,
//! the shards sum a few numbers per row through a [`ShardExchange`] (`O(N)`, never
//! `N x V`), and every shard then holds the whole loss and writes its own classes'
//! gradient.
//!
//! Per row, shard `k` contributes its log-sum-exp `lse_k`; the shard holding the target its
//! `lse_k - x_y` and `p_y - 1` over its own classes; with label smoothing, every shard its
//! `sum_c w_c (lse_k - x_c)`; with the argmax, every shard its best value and column. One
//! sum of a `[K, N]` f32 matrix in which each shard fills its own rows gathers them all
//! (a sum, since Burn's collective all-reduce has no max). From them:
//! `lse = logsumexp_k lse_k`; `lse - x_y = (lse_y - x_y) + (lse - lse_y)`;
//! `p_y - 1 = (p'_y - 1) r - (1 - r)` with `r = exp(lse_y - lse)` and
//! `1 - r = sum_{k != y's shard} exp(lse_k - lse)` (no cancellation);
//! `sum_c w_c (lse - x_c) = sum_k (W_k (lse - lse_k) + sum_{c in k} w_c (lse_k - x_c))`.

use core::ops::Range;

use burn::tensor::{
    Bool, DType, Int, Tensor, TensorMetadata,
    backend::Backend,
    ops::{FloatTensor, IntTensor},
};

use crate::backend::{
    ClassWeights, CrossEntropyInputs, FusedCrossEntropyBackend, RowStats, TwoPassBackward, float,
    stat_row,
};
use crate::options::{CrossEntropyError, CrossEntropyOptions, Reduction};
use fused_ce_kernels::row_stat;

/// Which classes one device holds: the vocabulary of `vocab` classes is cut into `count`
/// shards of `ceil(vocab / count)` classes (the last may be shorter), as Megatron cuts it;
/// this device holds shard `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VocabShard {
    index: usize,
    count: usize,
    vocab: usize,
}

impl VocabShard {
    /// Shard `index` of `count` over `vocab` classes. Every shard must hold at least one
    /// class.
    pub fn new(index: usize, count: usize, vocab: usize) -> Result<Self, CrossEntropyError> {
        let shard = Self {
            index,
            count,
            vocab,
        };
        if count == 0 || index >= count || vocab == 0 || shard.range(count - 1).is_empty() {
            return Err(CrossEntropyError::ShapeMismatch(format!(
                "no vocabulary shard {index} of {count} over {vocab} classes (each shard needs at least one class)"
            )));
        }
        Ok(shard)
    }

    /// This shard's position.
    pub fn index(&self) -> usize {
        self.index
    }

    /// How many shards the vocabulary is cut into.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The whole vocabulary's size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Classes per shard (all but the last).
    pub fn width(&self) -> usize {
        self.vocab.div_ceil(self.count)
    }

    /// The classes of shard `index`.
    pub fn range(&self, index: usize) -> Range<usize> {
        let width = self.width();
        (index * width).min(self.vocab)..((index + 1) * width).min(self.vocab)
    }

    /// This shard's classes.
    pub fn classes(&self) -> Range<usize> {
        self.range(self.index)
    }
}

/// How the shards of one call add up their per-row statistics: the element-wise sum of
/// one small f32 tensor over every shard, returned to each (an all-reduce). Every shard
/// of a call calls it once, with the same shape.
pub trait ShardExchange {
    /// The sum of `stats` over all shards, on `stats`'s device.
    fn sum<B: Backend>(&self, stats: FloatTensor<B>) -> Result<FloatTensor<B>, CrossEntropyError>;
}

/// The exchange through burn-collective: an all-reduce among the peers registered with
/// `burn::collective::register` for the backend that computes the loss (under
/// `Autodiff<B>`, `B`), one peer per shard.
#[cfg(feature = "collective")]
#[derive(Debug, Clone, Copy)]
pub struct CollectiveExchange {
    /// This shard's peer.
    pub peer: burn::collective::PeerId,
}

#[cfg(feature = "collective")]
impl ShardExchange for CollectiveExchange {
    fn sum<B: Backend>(&self, stats: FloatTensor<B>) -> Result<FloatTensor<B>, CrossEntropyError> {
        burn::collective::all_reduce::<B>(self.peer, stats, burn::collective::ReduceOperation::Sum)
            .map_err(|error| CrossEntropyError::Exchange(format!("{error:?}")))
    }
}

fn int<B: Backend, const D: usize>(primitive: IntTensor<B>) -> Tensor<B, D, Int> {
    Tensor::from_primitive(primitive)
}

/// What every shard knows of a row's target: `[N]` tensors.
struct TargetRows<B: Backend> {
    /// The targets, flattened.
    targets: Tensor<B, 1, Int>,
    /// Not the ignore index.
    counted: Tensor<B, 1, Bool>,
    /// Counted and a class of the vocabulary (a gradient flows).
    class: Tensor<B, 1, Bool>,
    /// Counted and one of this shard's classes.
    here: Tensor<B, 1, Bool>,
}

impl<B: Backend> TargetRows<B> {
    fn new(targets: IntTensor<B>, shard: &VocabShard, ignore_index: i64) -> Self {
        let targets = int::<B, 1>(targets);
        let rows = targets.shape().num_elements();
        let targets = targets.reshape([rows]);
        let counted = targets.clone().not_equal_elem(ignore_index);
        let within = |range: Range<usize>| {
            targets
                .clone()
                .greater_equal_elem(range.start as i64)
                .bool_and(targets.clone().lower_elem(range.end as i64))
                .bool_and(counted.clone())
        };
        Self {
            class: within(0..shard.vocab),
            here: within(shard.classes()),
            counted,
            targets,
        }
    }

    /// The targets as this shard's row kernel takes them (see [`local_options`]): a class
    /// of the shard as its column, an ignored row as [`SHARD_IGNORE`], any other target as
    /// [`ELSEWHERE`] (neither: the kernel reads the whole row and reports its log-sum-exp).
    fn local(&self, shard: &VocabShard) -> Tensor<B, 1, Int> {
        let start = shard.classes().start as i64;
        self.targets
            .clone()
            .mul_scalar(0)
            .add_scalar(ELSEWHERE)
            .mask_where(self.here.clone(), self.targets.clone().sub_scalar(start))
            .mask_fill(self.counted.clone().bool_not(), SHARD_IGNORE)
    }

    /// `value` where `mask`, else 0.
    fn masked(mask: &Tensor<B, 1, Bool>, value: Tensor<B, 1>) -> Tensor<B, 1> {
        value.clone().zeros_like().mask_where(mask.clone(), value)
    }
}

/// What the shards exchanged and what every shard knows of the rows: the input of
/// [`FusedCrossEntropyBackend::whole_vocabulary_rows`].
#[derive(Debug, Clone)]
pub struct ExchangedRows<B: Backend> {
    /// The element-wise sum over the shards of what each contributed, f32 `[R, N]`: rows
    /// `0..K` the shards' log-sum-exps (each shard fills its own row); row `K` the owning
    /// shard's `lse_y - x_y`, row `K + 1` its `p'_y - 1`; with label smoothing, row `K + 2`
    /// the shards' `sum_c w_c (lse_k - x_c)`; with the argmax, `K` rows of the shards' best
    /// values, then `K` rows of their columns in the whole vocabulary.
    pub summed: FloatTensor<B>,
    /// The targets, `[N]`.
    pub targets: IntTensor<B>,
    /// The whole vocabulary's class weights, when given.
    pub class_weights: Option<ClassWeights<B>>,
    /// With label smoothing, each shard's class-weight total (its class count without
    /// weights), f32 `[K]`.
    pub shard_totals: Option<FloatTensor<B>>,
}

/// The ignore index of the shard's own kernel passes (the caller's may be one of the
/// shard's columns), and the target of a row whose class another shard holds.
const SHARD_IGNORE: i64 = fused_ce_kernels::SHARD_IGNORE as i64;
const ELSEWHERE: i64 = fused_ce_kernels::ELSEWHERE as i64;

/// The options of the shard's own kernel passes: no label smoothing, z-loss or class
/// weights (they are formed over the whole vocabulary from the exchanged sums), the
/// argmax when an output needs it, ignored rows as [`SHARD_IGNORE`].
pub(crate) fn local_options(options: &CrossEntropyOptions) -> CrossEntropyOptions {
    CrossEntropyOptions {
        label_smoothing: 0.0,
        z_loss_scale: 0.0,
        ignore_index: SHARD_IGNORE,
        ..options.clone()
    }
}

/// The options of the shard's smoothing pass: all the weight on smoothing.
pub(crate) fn smoothing_options(options: &CrossEntropyOptions) -> CrossEntropyOptions {
    CrossEntropyOptions {
        label_smoothing: 1.0,
        outputs: Default::default(),
        ..local_options(options)
    }
}

/// Rows of the exchanged matrix (see [`ExchangedRows::summed`]).
pub(crate) fn exchanged_rows(shard: &VocabShard, options: &CrossEntropyOptions) -> usize {
    let smoothing = usize::from(options.label_smoothing > 0.0);
    let argmax = if options.outputs.needs_argmax() {
        2 * shard.count
    } else {
        0
    };
    shard.count + 2 + smoothing + argmax
}

/// The class weights of this shard's classes (f32, with their sum), or `None`.
pub(crate) fn shard_weights<B: Backend>(
    weights: Option<&ClassWeights<B>>,
    range: Range<usize>,
) -> Option<ClassWeights<B>> {
    weights.map(|weights| {
        let slice = float::<B, 1>(weights.weights.clone()).slice([range]);
        ClassWeights {
            total: slice.clone().sum().into_primitive().tensor(),
            weights: slice.into_primitive().tensor(),
        }
    })
}

/// Each shard's class-weight total `W_k` (its class count without weights), f32 `[K]`.
fn shard_weight_totals<B: Backend>(
    weights: Option<&ClassWeights<B>>,
    shard: &VocabShard,
    device: &B::Device,
) -> Tensor<B, 1> {
    let totals: Vec<Tensor<B, 1>> = (0..shard.count)
        .map(|k| match shard_weights(weights, shard.range(k)) {
            Some(slice) => float::<B, 1>(slice.total),
            None => Tensor::<B, 1>::full([1], shard.range(k).len() as f32, (device, DType::F32)),
        })
        .collect();
    Tensor::cat(totals, 0)
}

/// Forward on one shard: the shard's kernel passes, one exchange, then the per-row
/// statistics of the whole vocabulary (see [`RowStats`]), the same on every shard.
/// Inputs are validated: the logits are this shard's classes, the class weights (when
/// given) the whole vocabulary's.
pub(crate) fn shard_rows<B: FusedCrossEntropyBackend, E: ShardExchange>(
    inputs: CrossEntropyInputs<B>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
    exchange: &E,
) -> Result<RowStats<B>, CrossEntropyError> {
    let device = B::float_device(&inputs.logits);
    let rows = inputs.targets.shape().num_elements();
    let targets = B::int_reshape(inputs.targets.clone(), burn::tensor::Shape::new([rows]));
    let class_weights = inputs.class_weights.clone();
    let packed = B::shard_contributions(inputs, shard, options);
    let summed = exchange.sum::<B>(packed)?;
    let shard_totals = (options.label_smoothing > 0.0).then(|| {
        shard_weight_totals(class_weights.as_ref(), shard, &device)
            .into_primitive()
            .tensor()
    });
    Ok(B::whole_vocabulary_rows(
        ExchangedRows {
            summed,
            targets,
            class_weights,
            shard_totals,
        },
        shard,
        options,
    ))
}

/// [`FusedCrossEntropyBackend::shard_contributions`] by tensor ops around the trait's
/// `cross_entropy_rows`: the shard's row-kernel passes over its logits, then what it
/// contributes to the exchanged sums (see [`ExchangedRows::summed`]).
pub(crate) fn shard_contributions_by_tensor_ops<B: FusedCrossEntropyBackend>(
    inputs: CrossEntropyInputs<B>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> FloatTensor<B> {
    let device = B::float_device(&inputs.logits);
    let targets_shape = inputs.targets.shape();
    let rows = targets_shape.num_elements();
    let ignore_index = options.ignore_index;
    let target_rows = TargetRows::<B>::new(inputs.targets.clone(), shard, ignore_index);
    let local_targets = target_rows.local(shard);
    // The kernel takes the targets in the logits' row shape.
    let shaped = |targets: Tensor<B, 1, Int>| {
        B::int_reshape(targets.into_primitive(), targets_shape.clone())
    };
    let argmax = options.outputs.needs_argmax();
    let smoothing = options.label_smoothing > 0.0;
    let here = shard.classes();

    // The shard's statistics: its log-sum-exp, and at the target's shard its `lse - x_y`
    // and `p_y - 1`.
    let own = B::cross_entropy_rows(
        CrossEntropyInputs {
            logits: inputs.logits.clone(),
            targets: shaped(local_targets.clone()),
            class_weights: None,
        },
        &local_options(options),
    );
    let own_stats = float::<B, 2>(own.stats);
    let lse_here = stat_row(&own_stats, row_stat::LSE);
    let here_mask = &target_rows.here;
    let mut contributions: Vec<Tensor<B, 1>> = Vec::new();
    let zeros = || Tensor::<B, 1>::zeros([rows], (&device, DType::F32));
    for k in 0..shard.count {
        contributions.push(if k == shard.index {
            lse_here.clone()
        } else {
            zeros()
        });
    }
    contributions.push(TargetRows::masked(
        here_mask,
        stat_row(&own_stats, row_stat::LOSS),
    ));
    contributions.push(TargetRows::masked(
        here_mask,
        stat_row(&own_stats, row_stat::TARGET_GRAD),
    ));
    if smoothing {
        // One more pass with all the weight on smoothing and class 0 as the target: its
        // loss is `(1 / V_k) sum_c w_c (lse_k - x_c)`.
        let first_class = local_targets.clone().mul_scalar(0).mask_where(
            target_rows.counted.clone().bool_not(),
            local_targets.clone(),
        );
        let smoothed = B::cross_entropy_rows(
            CrossEntropyInputs {
                logits: inputs.logits.clone(),
                targets: shaped(first_class),
                class_weights: shard_weights(inputs.class_weights.as_ref(), here.clone()),
            },
            &smoothing_options(options),
        );
        let smoothed = stat_row(&float::<B, 2>(smoothed.stats), row_stat::LOSS);
        contributions.push(smoothed.mul_scalar(here.len() as f32));
    }
    if argmax {
        // The best value (soft-capped, as the kernel compares) and its column in the
        // whole vocabulary.
        let predicted =
            int::<B, 1>(own.predicted.expect("the kernel tracks the argmax")).reshape([rows]);
        let column = predicted.clone().clamp(0, here.len() as i64 - 1);
        let width = here.len();
        let logits = float::<B, 2>(B::float_reshape(
            inputs.logits.clone(),
            burn::tensor::Shape::new([rows, width]),
        ));
        let mut best = logits
            .gather(1, column.clone().reshape([rows, 1]))
            .reshape([rows])
            .cast(DType::F32);
        if let Some(cap) = options.softcap {
            best = best.div_scalar(cap).tanh().mul_scalar(cap);
        }
        let at = column
            .add_scalar(here.start as i64)
            .float()
            .cast(DType::F32);
        for k in 0..shard.count {
            contributions.push(if k == shard.index {
                TargetRows::masked(&target_rows.counted, best.clone())
            } else {
                zeros()
            });
        }
        for k in 0..shard.count {
            contributions.push(if k == shard.index {
                TargetRows::masked(&target_rows.counted, at.clone())
            } else {
                zeros()
            });
        }
    }
    Tensor::stack::<2>(contributions, 0)
        .into_primitive()
        .tensor()
}

/// [`FusedCrossEntropyBackend::whole_vocabulary_rows`] by tensor ops: the per-row
/// statistics of the whole vocabulary from the exchanged sums (see the module doc), in
/// [`row_stat`]'s layout; ignored rows all 0.
pub(crate) fn whole_vocabulary_rows_by_tensor_ops<B: Backend>(
    exchanged: ExchangedRows<B>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> RowStats<B> {
    let summed = float::<B, 2>(exchanged.summed);
    let device = summed.device();
    let device = &device;
    let target_rows = &TargetRows::<B>::new(exchanged.targets, shard, options.ignore_index);
    let class_weights = exchanged.class_weights.as_ref();
    let count = shard.count;
    let rows = summed.dims()[1];
    let lse_per_shard = summed.clone().slice([0..count, 0..rows]);
    let max = lse_per_shard.clone().max_dim(0);
    let lse = (lse_per_shard.clone() - max.clone())
        .exp()
        .sum_dim(0)
        .log()
        .add(max)
        .reshape([rows]);
    let owner = target_rows
        .targets
        .clone()
        .div_scalar(shard.width() as i64)
        .clamp(0, count as i64 - 1)
        .reshape([1, rows]);
    let lse_owner = lse_per_shard
        .clone()
        .gather(0, owner.clone())
        .reshape([rows]);
    let others = Tensor::<B, 1, Int>::arange(0..count as i64, device)
        .float()
        .cast(DType::F32)
        .reshape([count, 1])
        .not_equal(owner.clone().float().cast(DType::F32));
    let share_elsewhere = (lse_per_shard.clone() - lse.clone().reshape([1, rows]))
        .exp()
        .mask_fill(others.bool_not(), 0.0)
        .sum_dim(0)
        .reshape([rows]);
    let owner_share = (lse_owner.clone() - lse.clone()).exp();
    let nll = stat_row(&summed, count) + (lse.clone() - lse_owner);
    let target_grad = stat_row(&summed, count + 1) * owner_share - share_elsewhere;

    let counted = &target_rows.counted;
    let class = &target_rows.class;
    let ones = Tensor::<B, 1>::ones([rows], (device, DType::F32));
    let target_weight = match class_weights {
        Some(weights) => {
            let at = target_rows.targets.clone().clamp(0, shard.vocab as i64 - 1);
            float::<B, 1>(weights.weights.clone()).gather(0, at)
        }
        None => ones.clone(),
    };
    let ls = options.label_smoothing;
    let mut ce = nll.mul(target_weight.clone()).mul_scalar(1.0 - ls);
    let mut next = count + 2;
    if let Some(totals) = exchanged.shard_totals {
        let totals = float::<B, 1>(totals).reshape([count, 1]);
        let spread = (lse.clone().reshape([1, rows]) - lse_per_shard)
            .mul(totals)
            .sum_dim(0)
            .reshape([rows]);
        let smooth = spread + stat_row(&summed, next);
        next += 1;
        ce = ce + smooth.mul_scalar(ls / shard.vocab as f32);
    }
    let z_loss = lse.clone().powi_scalar(2).mul_scalar(options.z_loss_scale);
    // A target that is neither a class nor ignored gets a NaN loss, as on one device.
    let not_a_class = counted.clone().bool_and(class.clone().bool_not());
    let loss = (ce + z_loss.clone()).mask_fill(not_a_class, f32::NAN);

    let (correct, predicted) = if options.outputs.needs_argmax() {
        let best_value = summed.clone().slice([next..next + count, 0..rows]);
        let best_column = summed.slice([next + count..next + 2 * count, 0..rows]);
        let best_shard = best_value.argmax(0);
        let column = best_column.gather(0, best_shard).reshape([rows]).int();
        let column = column.cast(target_rows.targets.dtype());
        let correct = column.clone().equal(target_rows.targets.clone()).float();
        let predicted = column
            .clone()
            .mul_scalar(0)
            .sub_scalar(1)
            .mask_where(counted.clone(), column);
        (correct.cast(DType::F32), Some(predicted.into_primitive()))
    } else {
        (Tensor::<B, 1>::zeros([rows], (device, DType::F32)), None)
    };

    let mut stats = vec![Tensor::<B, 1>::zeros([rows], (device, DType::F32)); row_stat::COUNT];
    stats[row_stat::LOSS] = loss;
    stats[row_stat::Z_LOSS] = z_loss;
    stats[row_stat::WEIGHT] = target_weight;
    stats[row_stat::VALID] = ones;
    stats[row_stat::CORRECT] = correct;
    stats[row_stat::LSE] = lse;
    stats[row_stat::TARGET_GRAD] = target_grad;
    let stats = stats
        .into_iter()
        .map(|stat| TargetRows::masked(counted, stat))
        .collect();
    RowStats {
        stats: Tensor::stack::<2>(stats, 0).into_primitive().tensor(),
        predicted,
        weighted: class_weights.is_some(),
    }
}

/// Backward on one shard: the gradient of this shard's logits (their shape and dtype)
/// from the whole vocabulary's statistics, the incoming gradient (`[N]` for `None`, `[1]`
/// otherwise) and, for `Mean`, the denominators `[D, n]`:
/// `grad_c = (sc ((1 - ls) w_y (p_c - [c = y]) + (ls / V)(W p_c - w_c)) + 2 s sz lse p_c)`,
/// times softcap's derivative, for this shard's columns `c`. The backward kernel writes it
/// ([`kernel_gradient`]) unless label smoothing and softcap both apply; then element-wise
/// tensor ops do (which may hold `[N, V_s]` f32 temporaries).
pub(crate) fn shard_gradient<B: FusedCrossEntropyBackend>(
    inputs: CrossEntropyInputs<B>,
    stats: FloatTensor<B>,
    grad_output: FloatTensor<B>,
    denominators: Option<FloatTensor<B>>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> FloatTensor<B> {
    if options.label_smoothing == 0.0 || options.softcap.is_none() {
        return kernel_gradient::<B>(inputs, stats, grad_output, denominators, shard, options);
    }
    let device = B::float_device(&inputs.logits);
    let shape = inputs.logits.shape();
    let dtype = inputs.logits.dtype();
    let here = shard.classes();
    let width = here.len();
    let target_rows = TargetRows::<B>::new(inputs.targets.clone(), shard, options.ignore_index);
    let rows = target_rows.targets.dims()[0];
    let stats = float::<B, 2>(stats);
    let flowing = target_rows.class.clone();

    let scales = row_scales::<B>(grad_output, denominators, options.reduction, rows, &flowing);
    let weight_total = inputs.class_weights.as_ref().map(|w| w.total.clone());
    // Rows with no gradient get a log-sum-exp that makes every probability 0, not `inf * 0`.
    let lse = stat_row(&stats, row_stat::LSE).mask_fill(flowing.bool_not(), f32::MAX);
    let coefficients =
        RowCoefficients::new(scales, &stats, lse.clone(), weight_total, shard, options);
    let target_coef = coefficients.target.clone();
    let prob_coef = coefficients.probability();

    let column = |values: Tensor<B, 1>| values.reshape([rows, 1]);
    let logits = float::<B, 2>(B::float_reshape(
        inputs.logits,
        burn::tensor::Shape::new([rows, width]),
    ))
    .cast(DType::F32);
    let capped = match options.softcap {
        Some(cap) => logits.div_scalar(cap).tanh().mul_scalar(cap),
        None => logits,
    };
    let probs = (capped.clone() - column(lse)).exp();
    let local_target = target_rows
        .targets
        .clone()
        .sub_scalar(here.start as i64)
        .float()
        .cast(DType::F32)
        .mask_fill(target_rows.here.clone().bool_not(), -1.0);
    let columns = Tensor::<B, 1, Int>::arange(0..width as i64, &device)
        .float()
        .cast(DType::F32)
        .reshape([1, width]);
    let is_target = columns.equal(column(local_target)).float().cast(DType::F32);
    let mut grad = probs * column(prob_coef) - is_target * column(target_coef);
    if let Some(smooth) = coefficients.smooth {
        grad = grad - smoothing_term(smooth, inputs.class_weights.as_ref(), shard, &device);
    }
    if let Some(cap) = options.softcap {
        let scaled = capped.div_scalar(cap);
        grad = grad * (scaled.clone() * scaled).neg().add_scalar(1.0);
    }
    B::float_reshape(grad.cast(dtype).into_primitive().tensor(), shape)
}

/// [`shard_gradient`] through the backward kernel, unless label smoothing and softcap
/// both apply. The spec's gradient on the shard's columns is `c p_c - s w_c - [c = y]
/// sc (1 - ls) w_y` (see [`FusedCrossEntropyBackend::shard_gradient_rows`]): the kernel,
/// run with the per-row coefficients `c` as its incoming gradient and no smoothing,
/// z-loss or class weights of its own, writes `c p_c` and the target's value (times
/// softcap's derivative); label smoothing's `s w_c` is subtracted afterwards (which is why
/// softcap, whose derivative it would need, takes the element-wise path with it). A row
/// whose target another shard holds gets column 0 as its target, with a value that makes
/// the kernel write `c p_0` there.
fn kernel_gradient<B: FusedCrossEntropyBackend>(
    inputs: CrossEntropyInputs<B>,
    stats: FloatTensor<B>,
    grad_output: FloatTensor<B>,
    denominators: Option<FloatTensor<B>>,
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
            targets: B::int_reshape(inputs.targets.clone(), burn::tensor::Shape::new([rows])),
            logits: inputs.logits.clone(),
            grad_output,
            denominators,
            weight_total: inputs.class_weights.as_ref().map(|w| w.total.clone()),
        },
        shard,
        options,
    );
    let grad = B::cross_entropy_backward(
        CrossEntropyInputs {
            logits: inputs.logits,
            targets: B::int_reshape(kernel_rows.targets, targets_shape),
            class_weights: None,
        },
        TwoPassBackward {
            stats: kernel_rows.stats,
            grad_output: kernel_rows.coefficients,
            denominators: None,
        },
        &CrossEntropyOptions {
            reduction: Reduction::None,
            label_smoothing: 0.0,
            z_loss_scale: 0.0,
            ignore_index: SHARD_IGNORE,
            ..options.clone()
        },
    );
    let Some(smooth) = kernel_rows.smooth else {
        return grad;
    };
    let device = B::float_device(&grad);
    let grad = float::<B, 2>(B::float_reshape(
        grad,
        burn::tensor::Shape::new([rows, width]),
    ));
    let smoothing = smoothing_term(
        float::<B, 1>(smooth),
        inputs.class_weights.as_ref(),
        shard,
        &device,
    );
    let grad = (grad.cast(DType::F32) - smoothing).cast(dtype);
    B::float_reshape(grad.into_primitive().tensor(), shape)
}

/// Label smoothing's part `s w_c` of a shard's gradient, f32 `[N, V_s]`: each row's `s`
/// (`smooth [N]`) times the class weight of each of the shard's columns (1 without
/// weights).
fn smoothing_term<B: Backend>(
    smooth: Tensor<B, 1>,
    class_weights: Option<&ClassWeights<B>>,
    shard: &VocabShard,
    device: &B::Device,
) -> Tensor<B, 2> {
    let width = shard.classes().len();
    let weights = match class_weights {
        Some(weights) => float::<B, 1>(weights.weights.clone()).slice([shard.classes()]),
        None => Tensor::<B, 1>::ones([width], (device, DType::F32)),
    };
    let rows = smooth.dims()[0];
    smooth.reshape([rows, 1]) * weights.reshape([1, width])
}

/// Each row's coefficients of the spec's gradient on a shard, `c p_c - s w_c - [c = y]
/// target`, f32 `[N]`, from the row scales `(sc, sz)` of [`row_scales`] and the
/// log-sum-exps `lse`: `target = sc (1 - ls) w_y`, `s = sc ls / V`, `c = target + extra`
/// with `extra = s W + 2 z sz lse` (`W` the class-weight total, or `V`).
struct RowCoefficients<B: Backend> {
    target: Tensor<B, 1>,
    /// `s`, with label smoothing.
    smooth: Option<Tensor<B, 1>>,
    extra: Tensor<B, 1>,
}

impl<B: Backend> RowCoefficients<B> {
    fn new(
        (ce_scale, z_scale): (Tensor<B, 1>, Tensor<B, 1>),
        stats: &Tensor<B, 2>,
        lse: Tensor<B, 1>,
        weight_total: Option<FloatTensor<B>>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
    ) -> Self {
        let ls = options.label_smoothing;
        let mut target = ce_scale.clone();
        if weight_total.is_some() {
            target = target * stat_row(stats, row_stat::WEIGHT);
        }
        let mut extra = ce_scale.zeros_like();
        let mut smooth = None;
        if ls > 0.0 {
            target = target.mul_scalar(1.0 - ls);
            let smooth_coef = ce_scale.mul_scalar(ls / shard.vocab as f32);
            extra = match weight_total {
                Some(total) => smooth_coef.clone() * float::<B, 1>(total),
                None => smooth_coef.clone().mul_scalar(shard.vocab as f32),
            };
            smooth = Some(smooth_coef);
        }
        if options.z_loss_scale > 0.0 {
            extra = extra + z_scale * lse.mul_scalar(2.0 * options.z_loss_scale);
        }
        Self {
            target,
            smooth,
            extra,
        }
    }

    /// `c`, the coefficient of `p_c`.
    fn probability(&self) -> Tensor<B, 1> {
        self.target.clone() + self.extra.clone()
    }
}

/// The inputs of a shard's backward kernel: what
/// [`FusedCrossEntropyBackend::shard_gradient_rows`] reads.
#[derive(Debug, Clone)]
pub struct ShardBackwardRows<B: Backend> {
    /// The whole vocabulary's per-row statistics, f32 `[COUNT, N]`.
    pub stats: FloatTensor<B>,
    /// The targets, `[N]`.
    pub targets: IntTensor<B>,
    /// The shard's logits (`[N, V_s]` or `[B, T, V_s]`).
    pub logits: FloatTensor<B>,
    /// The incoming gradient: `[N]` for `Reduction::None`, `[1]` otherwise.
    pub grad_output: FloatTensor<B>,
    /// `Mean`'s denominators `[D, n]`.
    pub denominators: Option<FloatTensor<B>>,
    /// With class weights, the whole vocabulary's class-weight total, f32 `[1]`.
    pub weight_total: Option<FloatTensor<B>>,
}

/// What a shard's backward kernel takes, from
/// [`FusedCrossEntropyBackend::shard_gradient_rows`].
#[derive(Debug, Clone)]
pub struct KernelBackwardRows<B: Backend> {
    /// The targets as the kernel takes them, `[N]`.
    pub targets: IntTensor<B>,
    /// The statistics with the target values the kernel needs, f32 `[COUNT, N]`.
    pub stats: FloatTensor<B>,
    /// Each row's coefficient `c`, the kernel's incoming gradient, f32 `[N]`.
    pub coefficients: FloatTensor<B>,
    /// With label smoothing, each row's `s`, f32 `[N]`: the caller subtracts `s w_c`.
    pub smooth: Option<FloatTensor<B>>,
}

/// [`FusedCrossEntropyBackend::shard_gradient_rows`] by tensor ops.
pub(crate) fn shard_gradient_rows_by_tensor_ops<B: Backend>(
    inputs: ShardBackwardRows<B>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> KernelBackwardRows<B> {
    let ShardBackwardRows {
        stats,
        targets,
        logits,
        grad_output,
        denominators,
        weight_total,
    } = inputs;
    let target_rows = &TargetRows::<B>::new(targets, shard, options.ignore_index);
    let stats = float::<B, 2>(stats);
    let rows = target_rows.targets.dims()[0];
    let width = shard.classes().len();
    let start = shard.classes().start as i64;
    let targets = target_rows
        .targets
        .clone()
        .mul_scalar(0)
        .mask_where(
            target_rows.here.clone(),
            target_rows.targets.clone().sub_scalar(start),
        )
        .mask_fill(target_rows.class.clone().bool_not(), SHARD_IGNORE);
    let lse = stat_row(&stats, row_stat::LSE);
    let scales = row_scales::<B>(
        grad_output,
        denominators,
        options.reduction,
        rows,
        &target_rows.class,
    );
    let coefficients =
        RowCoefficients::new(scales, &stats, lse.clone(), weight_total, shard, options);
    let coefficient = coefficients.probability();
    let zero = coefficient.clone().equal_elem(0.0);
    let safe = coefficient.clone().mask_fill(zero.clone(), 1.0);
    let target_grad = stat_row(&stats, row_stat::TARGET_GRAD) + coefficients.extra / safe;
    let first = float::<B, 2>(B::float_reshape(
        logits,
        burn::tensor::Shape::new([rows, width]),
    ))
    .slice([0..rows, 0..1])
    .reshape([rows])
    .cast(DType::F32);
    let first = match options.softcap {
        Some(cap) => first.div_scalar(cap).tanh().mul_scalar(cap),
        None => first,
    };
    let elsewhere = (first - lse).exp();
    let written = elsewhere
        .mask_where(target_rows.here.clone(), target_grad)
        .mask_fill(zero, 0.0);
    let stats = Tensor::stack::<2>(
        (0..row_stat::COUNT)
            .map(|stat| {
                if stat == row_stat::TARGET_GRAD {
                    written.clone()
                } else {
                    stat_row(&stats, stat)
                }
            })
            .collect(),
        0,
    );
    KernelBackwardRows {
        targets: targets.into_primitive(),
        stats: stats.into_primitive().tensor(),
        coefficients: coefficient.into_primitive().tensor(),
        smooth: coefficients
            .smooth
            .map(|smooth| smooth.into_primitive().tensor()),
    }
}

/// Each row's scales `(sc, sz)` of the spec's gradient, f32 `[N]`: the incoming gradient
/// (`[N]` for `None`, `[1]` otherwise) over the mean's denominators `[D, n]` for `Mean`,
/// itself otherwise; 0 outside `flowing`.
fn row_scales<B: Backend>(
    grad_output: FloatTensor<B>,
    denominators: Option<FloatTensor<B>>,
    reduction: Reduction,
    rows: usize,
    flowing: &Tensor<B, 1, Bool>,
) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let incoming = float::<B, 1>(grad_output).cast(DType::F32);
    let incoming = if reduction == Reduction::None {
        incoming.reshape([rows])
    } else {
        incoming.reshape([1]).expand([rows])
    };
    let incoming = TargetRows::masked(flowing, incoming);
    match denominators {
        Some(denominators) if reduction == Reduction::Mean => {
            let denominators = float::<B, 1>(denominators);
            (
                incoming.clone() / denominators.clone().narrow(0, 0, 1),
                incoming / denominators.narrow(0, 1, 1),
            )
        }
        _ => (incoming.clone(), incoming),
    }
}
