//! The backend extension: the op every backend that runs our kernels implements, and the
//! device-side reductions built on it. Inputs here are already validated (see `api.rs`).

use burn::tensor::{
    Bool, DType, Int, Tensor, TensorMetadata, TensorPrimitive,
    backend::Backend,
    ops::{FloatTensor, IntTensor},
};

pub use fused_ce_kernels::row_stat;

use crate::incoming_guess::{IncomingGuess, next_guess};
use crate::linear::{LinearChunking, LinearInputs, linear_rows};
use crate::options::CrossEntropyError;
use crate::options::{CrossEntropyOptions, Reduction};
use crate::target_check::PendingRead;
use crate::vocab_parallel::{
    ExchangedRows, KernelBackwardRows, ShardBackwardRows, ShardExchange, VocabShard,
    shard_contributions_by_tensor_ops, shard_gradient_rows_by_tensor_ops, shard_rows,
    whole_vocabulary_rows_by_tensor_ops,
};

/// Class weights on the device, f32: `weights [V]` and their sum `total [1]`.
#[derive(Debug, Clone)]
pub struct ClassWeights<B: Backend> {
    pub weights: FloatTensor<B>,
    pub total: FloatTensor<B>,
}

/// What the fused forward pass produces.
#[derive(Debug, Clone)]
pub struct RowStats<B: Backend> {
    /// f32 `[row_stat::COUNT, N]`, one row per statistic (see [`row_stat`]); `N` counts
    /// the rows of `[N, V]` or `[B, T, V]` logits in row-major order. `O(N)`, and all that
    /// backward needs besides the logits.
    pub stats: FloatTensor<B>,
    /// The argmax per row (-1 on ignored rows), in the targets' int type, `[N]`; present
    /// when `options.outputs` asks for accuracy or predictions.
    pub predicted: Option<IntTensor<B>>,
    /// Class weights were given (the `WEIGHT` statistic differs from `VALID`).
    pub weighted: bool,
}

/// The tensors of one call: logits `[N, V]` or `[B, T, V]` (rows may be strided; the
/// class dimension is read as it is laid out), targets `[N]` or `[B, T]`, and the class
/// weights when given.
#[derive(Debug, Clone)]
pub struct CrossEntropyInputs<B: Backend> {
    pub logits: FloatTensor<B>,
    pub targets: IntTensor<B>,
    pub class_weights: Option<ClassWeights<B>>,
}

/// What the two-pass backward reads besides the call's inputs.
#[derive(Debug, Clone)]
pub struct TwoPassBackward<B: Backend> {
    /// Forward's per-row statistics (see [`RowStats::stats`]).
    pub stats: FloatTensor<B>,
    /// The loss's incoming gradient: `[N]` for `Reduction::None`, `[1]` otherwise, any
    /// float dtype.
    pub grad_output: FloatTensor<B>,
    /// For `Mean`, f32 `[2]`: the class-weight total `D` for the cross-entropy part and
    /// the row count `n` for the z-loss part.
    pub denominators: Option<FloatTensor<B>>,
}

/// What the one pass forms the gradient for: the guessed incoming gradient (f32 `[1]`)
/// and, for `Mean`, the denominators `[D, n]` (f32 `[2]`) when they are the whole
/// batch's rather than the call's rows' (the fused linear cross-entropy's chunks).
#[derive(Debug, Clone)]
pub struct OnePassScale<B: Backend> {
    pub guess: FloatTensor<B>,
    pub denominators: Option<FloatTensor<B>>,
}

/// A Burn backend that can run the fused cross-entropy.
///
/// Callers validate shapes and options first (the typed functions in this crate do).
pub trait FusedCrossEntropyBackend: Backend {
    /// Per-row forward: reads the logits once and writes nothing of size N x V.
    fn cross_entropy_rows(
        inputs: CrossEntropyInputs<Self>,
        options: &CrossEntropyOptions,
    ) -> RowStats<Self>;

    /// The two-pass backward: the gradient with respect to the logits (same shape),
    /// scaled per row by the incoming gradient and, for `Mean`, divided by the
    /// denominators. Writes over the logits when nothing else holds that buffer.
    fn cross_entropy_backward(
        inputs: CrossEntropyInputs<Self>,
        backward: TwoPassBackward<Self>,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self>;

    /// The one pass: forward that also forms the gradient for the incoming gradient
    /// `scale.guess` (`Mean` or `Sum`; divided by the mean's denominators for `Mean`, the
    /// given ones or those of the call's rows), in the same pass when the backend can,
    /// over the logits when nothing else holds them. The default runs forward and the
    /// two-pass backward.
    fn cross_entropy_one_pass(
        inputs: CrossEntropyInputs<Self>,
        scale: OnePassScale<Self>,
        options: &CrossEntropyOptions,
    ) -> (RowStats<Self>, FloatTensor<Self>) {
        let rows = Self::cross_entropy_rows(inputs.clone(), options);
        let denominators = match scale.denominators {
            Some(given) => Some(given),
            None => {
                (options.reduction == Reduction::Mean).then(|| mean_denominators::<Self>(&rows))
            }
        };
        let backward = TwoPassBackward {
            stats: rows.stats.clone(),
            grad_output: scale.guess,
            denominators: denominators.filter(|_| options.reduction == Reduction::Mean),
        };
        let grad = Self::cross_entropy_backward(inputs, backward, options);
        (rows, grad)
    }

    /// Backward of the one pass: `grad * g / guess` for the scalar incoming gradient `g`
    /// (`[1]`, any float dtype) and the `guess` (f32 `[1]`) the one pass formed `grad`
    /// for (`[N, V]` or `[B, T, V]`), and the guess for the next call (see
    /// [`crate::incoming_guess::next_guess`]). Cube backends leave `grad` as is on the
    /// device when `g` equals the guess, and form the next guess in the same launch.
    fn scale_one_pass_gradient(
        grad: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        guess: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let dtype = grad.dtype();
        let incoming = float::<Self, 1>(grad_output.clone())
            .cast(DType::F32)
            .reshape([1]);
        let scale = (incoming / float::<Self, 1>(guess.clone())).cast(dtype);
        let scaled = match grad.shape().num_dims() {
            2 => primitive(float::<Self, 2>(grad) * scale.reshape([1, 1])),
            _ => primitive(float::<Self, 3>(grad) * scale.reshape([1, 1, 1])),
        };
        (scaled, next_guess::<Self>(grad_output, guess))
    }

    /// The input check: `[first bad row, its target]` (`[2]`, the targets' int type) for
    /// `targets` (`[N]`, `N > 0`), where a bad target is neither in
    /// `[0, vocab)` nor `ignore_index`; the row is `N` when there is none. The default
    /// uses tensor ops; cube backends run one small kernel.
    fn first_bad_target(
        targets: IntTensor<Self>,
        vocab: usize,
        ignore_index: i64,
    ) -> IntTensor<Self> {
        let targets = Tensor::<Self, 1, Int>::from_primitive(targets);
        let rows = targets.dims()[0];
        let device = targets.device();
        let bad = targets
            .clone()
            .lower_elem(0)
            .bool_or(targets.clone().greater_equal_elem(vocab as i64))
            .bool_and(targets.clone().not_equal_elem(ignore_index));
        let first = first_true(bad, rows, &device);
        let at = first.clone().clamp_max(rows as i64 - 1);
        let value = targets.gather(0, at);
        Tensor::cat(vec![first, value], 0).into_primitive()
    }

    /// Starts reading a small int tensor back to the host without waiting for it: the
    /// result is looked at later (see [`crate::TargetCheck::Deferred`]). The default reads
    /// when the result is first polled; cube backends queue the copy at once.
    fn start_read(tensor: IntTensor<Self>) -> PendingRead {
        PendingRead::new(Tensor::<Self, 1, Int>::from_primitive(tensor).into_data_async())
    }

    /// [`Self::first_bad_target`] and the start of its read ([`Self::start_read`]).
    fn start_target_check(
        targets: IntTensor<Self>,
        vocab: usize,
        ignore_index: i64,
    ) -> PendingRead {
        Self::start_read(Self::first_bad_target(targets, vocab, ignore_index))
    }

    /// The most bytes one buffer may take on `device`, when the backend knows it: the
    /// fused linear cross-entropy keeps a chunk's logits within it
    /// ([`LinearChunking::within`]). Cube backends read the device's properties (on wgpu,
    /// its storage-binding limit: 128 MiB on lavapipe).
    fn max_buffer_bytes(_device: &Self::Device) -> Option<usize> {
        None
    }

    /// `sum[:, start..start + w] += block` for `sum [H, V]` and `block [H, w]` of one
    /// dtype: the fused linear cross-entropy's weight gradient summed a block of columns
    /// at a time ([`LinearChunking::weight_gradient_block_bytes`]), in place when nothing
    /// else holds `sum`. The default uses tensor ops: the block is added to a view of the
    /// columns, which `slice_assign` writes back. Fusion backends run it as one custom op,
    /// so that the stream does not fuse the write-back into a kernel that writes a whole
    /// new `sum`.
    fn add_into_columns(
        sum: FloatTensor<Self>,
        block: FloatTensor<Self>,
        start: usize,
    ) -> FloatTensor<Self> {
        let sum = float::<Self, 2>(sum);
        let block = float::<Self, 2>(block);
        let [rows, width] = block.dims();
        let columns = start..start + width;
        // The view is dropped once the add has read it: `slice_assign` then finds `sum`
        // held by nothing else and writes in place.
        let updated = sum.clone().slice([0..rows, columns.clone()]) + block;
        primitive(sum.slice_assign([0..rows, columns], updated))
    }

    /// `matrix` with rows this backend's fastest matmuls can read, its values unchanged:
    /// the fused linear cross-entropy passes the head's weight through it once per call.
    /// Cube backends on devices with TMA (Hopper and later) copy a matrix whose rows are
    /// not 16-byte aligned (a vocabulary of 50257 or 100277 bf16 classes without padding,
    /// as Burn's optimizer step leaves a weight) into rows padded to the allocator's
    /// pitch: otherwise each chunk's matmuls run on kernels without TMA. Fusion backends
    /// run that as one custom op. The default returns `matrix` as is.
    fn with_matmul_aligned_rows(matrix: FloatTensor<Self>) -> FloatTensor<Self> {
        matrix
    }

    /// `sum + lhs rhs` for `lhs [M, K]` and `rhs [K, N]` of one dtype and `sum [M, N]` of
    /// this or another float dtype (the product is taken to `sum`'s): the fused linear
    /// cross-entropy's weight gradient summed over the chunks in place
    /// ([`LinearChunking::weight_gradient_in_place`]). The default forms the whole product
    /// and adds it. Cube backends on devices with TMA (Hopper and later) run one matmul
    /// that adds `sum` to the product as it writes over it, when nothing else holds it;
    /// fusion backends run that as one custom op.
    fn accumulate_product(
        sum: FloatTensor<Self>,
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        product_added::<Self>(sum, lhs, rhs)
    }

    /// `lhs rhs` for `lhs [M, K]` and `rhs [K, N]` of one dtype, with the inner dimension
    /// cut into slices multiplied side by side and summed in f32 (split-K) where the
    /// output alone has too few tiles to occupy the device: each chunk's hidden-state
    /// gradient, `chunk x H` over the whole vocabulary
    /// ([`LinearChunking::hidden_gradient_split_k`]). The default is the backend's
    /// matmul. Cube backends on devices with TMA (Hopper and later) run the in-place
    /// matmul (`fused_ce_kernels::launch_matmul_accumulate`, two rows of tiles per plane
    /// over a long inner dimension): split where that fills more of the SMs
    /// (`fused_ce_kernels::split_k_slices`), one launch for all slices into f32 zeros;
    /// otherwise unsplit into zeros. Fusion backends run that as one custom op.
    fn matmul_split_k(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        product::<Self>(lhs, rhs)
    }

    /// The fused linear cross-entropy (see [`crate::try_fused_linear_cross_entropy`]):
    /// the loss and extra outputs. Backends with autodiff override this to register the
    /// backward step; the default computes the forward alone, chunk by chunk.
    fn fused_linear_cross_entropy(
        inputs: LinearInputs<Self>,
        options: &CrossEntropyOptions,
        chunking: &LinearChunking,
        _guess: &IncomingGuess,
    ) -> LossParts<Self> {
        let dtype = inputs.hidden.dtype();
        let rows = linear_rows::<Self>(inputs, options, chunking);
        Self::reduce_row_stats(rows, options, dtype, false).parts
    }

    /// The loss and extra outputs from forward's statistics (see [`Reduced`]), on the
    /// device. The default uses tensor ops (about eight small launches for `Mean`); cube
    /// backends run one kernel.
    fn reduce_row_stats(
        rows: RowStats<Self>,
        options: &CrossEntropyOptions,
        dtype: DType,
        keep_denominators: bool,
    ) -> Reduced<Self> {
        reduce_stats::<Self>(rows, options, dtype, keep_denominators)
    }

    /// What one shard of the vocabulary-parallel loss contributes to the sums the shards
    /// exchange (see [`ExchangedRows::summed`]), f32 `[R, N]`: its row-kernel passes over
    /// its logits (`inputs`: the shard's logits, the targets, the whole vocabulary's class
    /// weights), packed. The default uses tensor ops around [`Self::cross_entropy_rows`];
    /// cube backends make the targets local and pack in one small kernel each.
    fn shard_contributions(
        inputs: CrossEntropyInputs<Self>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        shard_contributions_by_tensor_ops::<Self>(inputs, shard, options)
    }

    /// The inputs of one shard's backward kernel (see [`KernelBackwardRows`]), run with one
    /// incoming gradient per row and no options of its own but softcap: the spec's
    /// gradient on the shard's columns is `c p_c - s w_c - [c = y] sc (1 - ls) w_y` with
    /// the row's coefficient `c = sc (1 - ls) w_y + s W + 2 z sz lse` and `s = sc ls / V`;
    /// the kernel takes `c` as the row's incoming gradient, the targets made local (column 0
    /// where another shard holds the target) and target values that make it write
    /// `c (p_y - 1) + c - sc (1 - ls) w_y` at the target and `c p_0` at such a column 0.
    /// The default uses tensor ops; cube backends run one kernel.
    fn shard_gradient_rows(
        inputs: ShardBackwardRows<Self>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
    ) -> KernelBackwardRows<Self> {
        shard_gradient_rows_by_tensor_ops::<Self>(inputs, shard, options)
    }

    /// The vocabulary-parallel loss's per-row statistics of the whole vocabulary (see
    /// [`RowStats`]) from what the shards exchanged (see [`ExchangedRows`]), the same on
    /// every shard. The default uses tensor ops (about sixty small ones); cube backends
    /// run one kernel.
    fn whole_vocabulary_rows(
        exchanged: ExchangedRows<Self>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
    ) -> RowStats<Self> {
        whole_vocabulary_rows_by_tensor_ops::<Self>(exchanged, shard, options)
    }

    /// The vocabulary-parallel loss on one shard (see
    /// [`crate::try_vocab_parallel_cross_entropy`]): the whole vocabulary's loss and extra
    /// outputs, the same on every shard. Backends with autodiff override this to register
    /// the backward step; the default computes the forward alone.
    fn vocab_parallel_cross_entropy<E: ShardExchange>(
        inputs: CrossEntropyInputs<Self>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
        exchange: &E,
    ) -> Result<LossParts<Self>, CrossEntropyError> {
        let dtype = inputs.logits.dtype();
        let rows = shard_rows::<Self, E>(inputs, shard, options, exchange)?;
        Ok(Self::reduce_row_stats(rows, options, dtype, false).parts)
    }

    /// The loss (`[N]` for `Reduction::None`, `[1]` otherwise, in the logits' dtype) and
    /// the extra outputs asked for. Backends with autodiff override this to register the
    /// backward step; the one pass forms the gradient for `guess`'s incoming gradient.
    fn fused_cross_entropy(
        inputs: CrossEntropyInputs<Self>,
        options: &CrossEntropyOptions,
        _guess: &IncomingGuess,
    ) -> LossParts<Self> {
        let dtype = inputs.logits.dtype();
        let rows = Self::cross_entropy_rows(inputs, options);
        Self::reduce_row_stats(rows, options, dtype, false).parts
    }
}

/// The loss and extra outputs as primitives, all rank 1 (`[N]` per row, `[1]` reduced).
#[derive(Debug, Clone)]
pub struct LossParts<B: Backend> {
    /// In the logits' dtype.
    pub loss: FloatTensor<B>,
    /// f32, reduced like the loss.
    pub z_loss: Option<FloatTensor<B>>,
    /// f32 `[1]`.
    pub accuracy: Option<FloatTensor<B>>,
    /// `[N]`, -1 on ignored rows.
    pub predicted: Option<IntTensor<B>>,
    /// f32 `[N]`.
    pub lse: Option<FloatTensor<B>>,
}

/// The reduced outputs and, for `Mean`, the denominators backward divides by.
pub struct Reduced<B: Backend> {
    /// The loss (in the logits' dtype) and the extra outputs asked for.
    pub parts: LossParts<B>,
    /// f32 `[2]`: `max(D, MIN_POSITIVE)` and `max(n, 1)`, when asked for (a tracked
    /// `Mean`).
    pub denominators: Option<FloatTensor<B>>,
}

/// A float primitive as a typed tensor of rank `D`.
pub(crate) fn float<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

/// `lhs rhs` for 2-D `lhs` and `rhs`, by the backend's matmul.
pub(crate) fn product<B: Backend>(lhs: FloatTensor<B>, rhs: FloatTensor<B>) -> FloatTensor<B> {
    primitive(float::<B, 2>(lhs).matmul(float::<B, 2>(rhs)))
}

/// `sum + lhs rhs` by tensor ops: the whole product, taken to `sum`'s dtype, then added
/// (the default of [`FusedCrossEntropyBackend::accumulate_product`]).
pub(crate) fn product_added<B: Backend>(
    sum: FloatTensor<B>,
    lhs: FloatTensor<B>,
    rhs: FloatTensor<B>,
) -> FloatTensor<B> {
    let sum = float::<B, 2>(sum);
    let product = float::<B, 2>(product::<B>(lhs, rhs));
    let product = if product.dtype() == sum.dtype() {
        product
    } else {
        product.cast(sum.dtype())
    };
    primitive(sum + product)
}

/// A typed float tensor's primitive.
pub(crate) fn primitive<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> FloatTensor<B> {
    tensor.into_primitive().tensor()
}

/// One statistic's row of the stats matrix, `[N]` (a view: rows are contiguous).
pub(crate) fn stat_row<B: Backend>(stats: &Tensor<B, 2>, stat: usize) -> Tensor<B, 1> {
    let rows = stats.dims()[1];
    stats
        .clone()
        .slice([stat..stat + 1, 0..rows])
        .reshape([rows])
}

/// The log-sum-exp row of forward's statistics, f32 `[N]` (a view).
pub(crate) fn lse_row<B: Backend>(stats: FloatTensor<B>) -> FloatTensor<B> {
    primitive(stat_row(&float::<B, 2>(stats), row_stat::LSE))
}

/// Reduces the per-row statistics on the device, in f32; the loss is cast to `dtype`
/// last. `Mean` divides the cross-entropy part by `max(D, MIN_POSITIVE)` and the z-loss
/// part by `max(n, 1)`: an all-ignored batch gives 0, not NaN. `keep_denominators` (a
/// tracked `Mean`) also returns `[D, n]` for backward. Each launch here has a fixed cost,
/// so only what an output needs is computed.
pub(crate) fn reduce_stats<B: Backend>(
    rows: RowStats<B>,
    options: &CrossEntropyOptions,
    dtype: DType,
    keep_denominators: bool,
) -> Reduced<B> {
    let stats = float::<B, 2>(rows.stats);
    let [_, n_rows] = stats.dims();
    let wanted = options.outputs;
    let has_z = options.z_loss_scale > 0.0;
    if n_rows == 0 {
        return reduce_no_rows::<B>(&stats.device(), options, dtype, rows.predicted);
    }
    // Whole-vector sums of the statistics' rows: Burn's full reductions are fast where a
    // `sum_dim` over the `[7, N]` matrix measured far slower (one unit per row).
    let sum_of = |stat: usize| -> Tensor<B, 1> { stat_row(&stats, stat).sum() };
    // `D` and `n` (clamped), once: the mean and the accuracy share `n`.
    let counts = (options.reduction == Reduction::Mean || wanted.accuracy)
        .then(|| clamped_denominators(&stats, rows.weighted));

    let (loss, z_loss, denominators) = match options.reduction {
        Reduction::None => (
            stat_row(&stats, row_stat::LOSS),
            wanted.z_loss.then(|| stat_row(&stats, row_stat::Z_LOSS)),
            None,
        ),
        Reduction::Sum => (
            sum_of(row_stat::LOSS),
            wanted.z_loss.then(|| sum_of(row_stat::Z_LOSS)),
            None,
        ),
        Reduction::Mean => {
            let (weight_total, n) = counts.clone().expect("the counts are summed for the mean");
            let z_sum = (has_z || wanted.z_loss).then(|| sum_of(row_stat::Z_LOSS));
            let loss = match &z_sum {
                Some(z_sum) if has_z => {
                    (sum_of(row_stat::LOSS) - z_sum.clone()) / weight_total.clone()
                        + z_sum.clone() / n.clone()
                }
                _ => sum_of(row_stat::LOSS) / weight_total.clone(),
            };
            let z_loss = z_sum.filter(|_| wanted.z_loss).map(|z| z / n.clone());
            let denominators = keep_denominators.then(|| Tensor::cat(vec![weight_total, n], 0));
            (loss, z_loss, denominators)
        }
    };
    let parts = LossParts {
        loss: primitive(loss.cast(dtype)),
        z_loss: z_loss.map(primitive),
        accuracy: counts
            .filter(|_| wanted.accuracy)
            .map(|(_, n)| primitive(sum_of(row_stat::CORRECT) / n)),
        predicted: if wanted.predicted {
            rows.predicted
        } else {
            None
        },
        lse: wanted
            .lse
            .then(|| primitive(stat_row(&stats, row_stat::LSE))),
    };
    Reduced {
        parts,
        denominators: denominators.map(primitive),
    }
}

/// Index of the first `true` in `mask [len]`, or `len` when there is none, as `[1]`.
pub(crate) fn first_true<B: Backend>(
    mask: Tensor<B, 1, Bool>,
    len: usize,
    device: &B::Device,
) -> Tensor<B, 1, Int> {
    let positions = Tensor::<B, 1, Int>::arange(0..len as i64, device);
    let past_end = Tensor::<B, 1, Int>::full([len], len as i64, device);
    past_end.mask_where(mask, positions).min()
}

/// The mean's denominators from the statistics of `N > 0` rows, as backward divides by
/// them: `max(D, MIN_POSITIVE)` and `max(n, 1)`. Without class weights `D` is `n`: one
/// sum serves both.
fn clamped_denominators<B: Backend>(
    stats: &Tensor<B, 2>,
    weighted: bool,
) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let n = stat_row(stats, row_stat::VALID).sum().clamp_min(1.0);
    let weight_total = if weighted {
        stat_row(stats, row_stat::WEIGHT)
            .sum()
            .clamp_min(f32::MIN_POSITIVE)
    } else {
        n.clone()
    };
    (weight_total, n)
}

/// f32 `[2]` (`D`, `n`) from the statistics of `N > 0` rows.
pub(crate) fn mean_denominators<B: Backend>(rows: &RowStats<B>) -> FloatTensor<B> {
    let (weight_total, n) = clamped_denominators(&float::<B, 2>(rows.stats.clone()), rows.weighted);
    primitive(Tensor::cat(vec![weight_total, n], 0))
}

/// N = 0 without any launch (a kernel over zero elements is an invalid launch on CUDA):
/// empty vectors for `None` and per-row outputs, 0 for reduced ones.
fn reduce_no_rows<B: Backend>(
    device: &B::Device,
    options: &CrossEntropyOptions,
    dtype: DType,
    predicted: Option<IntTensor<B>>,
) -> Reduced<B> {
    let per_row = options.reduction == Reduction::None;
    let value = |dtype: DType| -> FloatTensor<B> {
        if per_row {
            primitive(Tensor::<B, 1>::empty([0], (device, dtype)))
        } else {
            primitive(Tensor::<B, 1>::zeros([1], (device, dtype)))
        }
    };
    let wanted = options.outputs;
    let parts = LossParts {
        loss: value(dtype),
        z_loss: wanted.z_loss.then(|| value(DType::F32)),
        accuracy: wanted
            .accuracy
            .then(|| primitive(Tensor::<B, 1>::zeros([1], (device, DType::F32)))),
        predicted: if wanted.predicted {
            predicted.or_else(|| Some(Tensor::<B, 1, Int>::empty([0], device).into_primitive()))
        } else {
            None
        },
        lse: wanted
            .lse
            .then(|| primitive(Tensor::<B, 1>::empty([0], (device, DType::F32)))),
    };
    Reduced {
        parts,
        denominators: (options.reduction == Reduction::Mean)
            .then(|| primitive(Tensor::<B, 1>::ones([2], (device, DType::F32)))),
    }
}
