//! The fused linear cross-entropy's chunked passes, on any backend that runs the loss:
//! the LM head `logits = h W + b` and the loss over rows in chunks, so that the N x V
//! logits are never whole in memory. Each chunk's logits come from the backend's own
//! (autotuned) matmul; the loss kernels then read them in place and, in the one pass,
//! write their gradient over them; two more matmuls take that gradient to the hidden
//! states and the weight.

use burn::tensor::{
    Bool, DType, Int, Tensor,
    backend::Backend,
    ops::{FloatTensor, IntTensor},
};
use serde::{Deserialize, Serialize};

use crate::{
    backend::{
        ClassWeights, CrossEntropyInputs, FusedCrossEntropyBackend, OnePassScale, RowStats,
        TwoPassBackward, float, primitive, row_stat,
    },
    options::{CrossEntropyOptions, Reduction},
};

/// How the fused linear cross-entropy cuts its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LinearChunking {
    /// The most bytes one chunk's logits take (their gradient is written over them): the
    /// rows are spread evenly over as few chunks as the budget allows, at least 16 rows a
    /// chunk ([`LinearChunking::rows_per_chunk`]). `None`:
    /// [`LinearChunking::DEFAULT_LOGITS_BYTES`]. Given or default, at most the device's
    /// largest buffer ([`LinearChunking::within`]).
    pub logits_bytes: Option<usize>,
    /// Accumulate the weight gradient over the chunks in f32 (Liger-Kernel's
    /// `accum_dtype`), cast to the weight's dtype at the end. Off: in the weight's dtype,
    /// one rounding per chunk; on: an f32 `[H, V]` buffer for the whole step.
    pub f32_weight_gradient: bool,
    /// Form each chunk's weight-gradient product `h_c^T dlogits_c` a block of columns at a
    /// time, each block at most this many bytes in the dtype the sum is kept in, and add
    /// each block into the sum in place
    /// ([`FusedCrossEntropyBackend::add_into_columns`]). `None`: the whole `[H, V]`
    /// product of a chunk at once, added to the sum (under Burn's fusion backend as the
    /// matmul's epilogue), which holds a second `[H, V]` buffer while it is summed.
    pub weight_gradient_block_bytes: Option<usize>,
    /// Sum each chunk's weight-gradient product into the sum in place, in one matmul that
    /// adds the sum as it writes ([`FusedCrossEntropyBackend::accumulate_product`]):
    /// no `[H, V]` product beside the sum. Where the backend cannot (no TMA, or rows not
    /// 16-byte aligned) the product is formed and added as without it. Takes precedence
    /// over [`Self::weight_gradient_block_bytes`]. On by default (also when a saved
    /// config lacks it).
    #[serde(default = "in_place_by_default")]
    pub weight_gradient_in_place: bool,
    /// Form each chunk's hidden-state gradient `dlogits_c W^T` (`chunk x H` over the
    /// whole vocabulary, often too few output tiles to occupy a large GPU) by the
    /// backend's own kernel ([`FusedCrossEntropyBackend::matmul_split_k`]), where the
    /// backend has one (TMA): with the vocabulary cut into slices multiplied side by side
    /// and summed in f32 where that fills more of the device, unsplit otherwise; off: the
    /// backend's matmul. On by default (also when a saved config lacks it).
    #[serde(default = "split_k_by_default", alias = "hidden_gradient_in_place")]
    pub hidden_gradient_split_k: bool,
}

impl Default for LinearChunking {
    fn default() -> Self {
        Self {
            logits_bytes: None,
            f32_weight_gradient: false,
            weight_gradient_block_bytes: None,
            weight_gradient_in_place: in_place_by_default(),
            hidden_gradient_split_k: split_k_by_default(),
        }
    }
}

/// [`LinearChunking::weight_gradient_in_place`] when not given: on, as it leaves no
/// `[H, V]` product beside the sum for about the time of forming and adding one.
fn in_place_by_default() -> bool {
    true
}

/// [`LinearChunking::hidden_gradient_split_k`] when not given: on, as the chunks'
/// hidden-state gradients take the largest share of the time the fused step loses to
/// the unfused head.
fn split_k_by_default() -> bool {
    true
}

/// Fewest rows in a chunk, whatever the budget.
const MIN_CHUNK_ROWS: usize = 16;

/// Rows of one matmul tile: chunks of more rows than this are a multiple of it, so that no
/// tile of the chunk's matmuls runs mostly empty.
const TILE_ROWS: usize = 128;

/// Rows of the tiles cubek-matmul's TMA kernels take on the chunks' `[rows, V]` logits and
/// gradient (its stage along M): chunks of more rows than this are a multiple of it, so
/// that no row of tiles runs half empty.
const STAGE_ROWS: usize = 256;

impl LinearChunking {
    /// The budget of one chunk's logits when none is given: 640 MiB, 2048 rows of bf16
    /// logits of up to 163840 classes (Llama 3's 128256, Qwen's 151936), rows enough for
    /// the chunks' matmuls to run close to the whole batch's rate. A smaller budget saves
    /// memory and costs time (docs/performance.md).
    pub const DEFAULT_LOGITS_BYTES: usize = 640 << 20;

    /// The budget of one chunk's logits: the given one, or the default.
    fn logits_budget(&self) -> usize {
        self.logits_bytes.unwrap_or(Self::DEFAULT_LOGITS_BYTES)
    }

    /// Rows per chunk for `rows` rows of `vocab` classes in `dtype`. The budget holds
    /// `fit` rows, rounded down to a multiple of [`STAGE_ROWS`] (of [`TILE_ROWS`], then of
    /// 16, below that; at least [`MIN_CHUNK_ROWS`]); the rows are then spread evenly over
    /// as many chunks as that takes, each rounded up to the same multiple, so that the
    /// last chunk is not a sliver: 8192 rows that fit 1046 at a time go in 8 chunks of
    /// 1024.
    pub fn rows_per_chunk(&self, rows: usize, vocab: usize, dtype: DType) -> usize {
        let budget = self.logits_budget();
        let fit = budget / (vocab * dtype.size()).max(1);
        let step = [STAGE_ROWS, TILE_ROWS]
            .into_iter()
            .find(|&step| fit >= step)
            .unwrap_or(MIN_CHUNK_ROWS);
        let fit = (fit - fit % step).max(MIN_CHUNK_ROWS);
        if rows <= fit {
            return rows.max(1);
        }
        // At most `fit`: `rows / chunks <= fit`, and `fit` is a multiple of `step`.
        let even = rows.div_ceil(rows.div_ceil(fit));
        even.next_multiple_of(step).min(fit)
    }

    /// This chunking with its logits budget (given or default) at most `max_buffer_bytes`
    /// (a device's largest buffer, [`FusedCrossEntropyBackend::max_buffer_bytes`]), so
    /// that a chunk's logits can be allocated.
    pub fn within(&self, max_buffer_bytes: Option<usize>) -> Self {
        let budget = self.logits_budget();
        Self {
            logits_bytes: Some(max_buffer_bytes.map_or(budget, |most| budget.min(most))),
            ..*self
        }
    }

    /// Columns per block of the weight-gradient product for `width` hidden units and
    /// `vocab` classes summed in `dtype` ([`Self::weight_gradient_block_bytes`]): as many
    /// as the budget holds, a multiple of [`TILE_ROWS`] when that many fit, at least one;
    /// `None` when the product is formed whole.
    pub fn weight_gradient_block_columns(
        &self,
        width: usize,
        vocab: usize,
        dtype: DType,
    ) -> Option<usize> {
        let fit = self.weight_gradient_block_bytes? / (width * dtype.size()).max(1);
        let columns = if fit >= TILE_ROWS {
            fit - fit % TILE_ROWS
        } else {
            fit.max(1)
        };
        (columns < vocab).then_some(columns)
    }
}

/// The LM head: `weight [H, V]` (Burn's `Linear` layout) and an optional `bias [V]`.
#[derive(Debug, Clone)]
pub struct LinearHead<B: Backend> {
    pub weight: FloatTensor<B>,
    pub bias: Option<FloatTensor<B>>,
}

/// The tensors of one call: `hidden [N, H]`, the head, `targets [N]` and the class
/// weights when given.
#[derive(Debug, Clone)]
pub struct LinearInputs<B: Backend> {
    pub hidden: FloatTensor<B>,
    pub head: LinearHead<B>,
    pub targets: IntTensor<B>,
    pub class_weights: Option<ClassWeights<B>>,
}

/// The gradients of the hidden states, the weight and the bias.
#[derive(Debug, Clone)]
pub struct LinearGradients<B: Backend> {
    pub hidden: FloatTensor<B>,
    pub weight: FloatTensor<B>,
    pub bias: Option<FloatTensor<B>>,
}

/// The rows `start..end` of a `[N, ..]` tensor (a view).
fn rows_of<B: Backend, const D: usize>(
    tensor: &Tensor<B, D>,
    start: usize,
    end: usize,
) -> Tensor<B, D> {
    tensor.clone().narrow(0, start, end - start)
}

/// One chunk's logits: `hidden_c W (+ b)`, from the backend's matmul.
fn chunk_logits<B: Backend>(
    hidden: Tensor<B, 2>,
    weight: &Tensor<B, 2>,
    bias: Option<&Tensor<B, 1>>,
) -> Tensor<B, 2> {
    let logits = hidden.matmul(weight.clone());
    match bias {
        Some(bias) => logits + bias.clone().unsqueeze_dim(0),
        None => logits,
    }
}

/// The chunks of `rows` rows: `(start, end)` pairs.
fn chunks(rows: usize, per_chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..rows)
        .step_by(per_chunk.max(1))
        .map(move |start| (start, (start + per_chunk).min(rows)))
}

/// The per-row statistics of the chunks, as one `RowStats` over all rows (none: zero
/// rows, on `device`, with an empty argmax when `argmax`).
fn joined<B: Backend>(
    parts: Vec<RowStats<B>>,
    weighted: bool,
    argmax: bool,
    device: &B::Device,
) -> RowStats<B> {
    if parts.is_empty() {
        return RowStats {
            // `empty`, not `zeros`: a fill over zero elements is an invalid launch on CUDA.
            stats: primitive(Tensor::<B, 2>::empty(
                [row_stat::COUNT, 0],
                (device, DType::F32),
            )),
            predicted: argmax.then(|| Tensor::<B, 1, Int>::empty([0], device).into_primitive()),
            weighted,
        };
    }
    let mut stats = Vec::with_capacity(parts.len());
    let mut predicted = Vec::with_capacity(parts.len());
    for part in parts {
        stats.push(float::<B, 2>(part.stats));
        if let Some(p) = part.predicted {
            predicted.push(Tensor::<B, 1, Int>::from_primitive(p));
        }
    }
    RowStats {
        stats: primitive(Tensor::cat(stats, 1)),
        predicted: (!predicted.is_empty()).then(|| Tensor::cat(predicted, 0).into_primitive()),
        weighted,
    }
}

/// The typed tensors of a call.
struct Typed<B: Backend> {
    hidden: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    targets: Tensor<B, 1, Int>,
}

impl<B: FusedCrossEntropyBackend> Typed<B> {
    /// The call's tensors, the weight with rows the chunks' matmuls read at full speed
    /// ([`FusedCrossEntropyBackend::with_matmul_aligned_rows`]).
    fn of(inputs: &LinearInputs<B>) -> Self {
        Self {
            hidden: float::<B, 2>(inputs.hidden.clone()),
            weight: float::<B, 2>(B::with_matmul_aligned_rows(inputs.head.weight.clone())),
            bias: inputs.head.bias.clone().map(float::<B, 1>),
            targets: Tensor::from_primitive(inputs.targets.clone()),
        }
    }
}

impl<B: Backend> Typed<B> {
    fn rows(&self) -> usize {
        self.hidden.dims()[0]
    }

    fn vocab(&self) -> usize {
        self.weight.dims()[1]
    }

    /// The loss kernels' inputs for the chunk `start..end`.
    fn chunk_inputs(
        &self,
        start: usize,
        end: usize,
        class_weights: &Option<ClassWeights<B>>,
    ) -> CrossEntropyInputs<B> {
        let logits = chunk_logits(
            rows_of(&self.hidden, start, end),
            &self.weight,
            self.bias.as_ref(),
        );
        CrossEntropyInputs {
            logits: primitive(logits),
            targets: self
                .targets
                .clone()
                .narrow(0, start, end - start)
                .into_primitive(),
            class_weights: class_weights.clone(),
        }
    }
}

impl<B: FusedCrossEntropyBackend> Typed<B> {
    /// Rows per chunk of `chunking` on this call's device (its budget at most the
    /// device's largest buffer).
    fn rows_per_chunk(&self, chunking: &LinearChunking) -> usize {
        chunking
            .within(B::max_buffer_bytes(&self.hidden.device()))
            .rows_per_chunk(self.rows(), self.vocab(), self.hidden.dtype())
    }
}

/// Forward alone: the per-row statistics of every row, one chunk of logits at a time.
pub(crate) fn linear_rows<B: FusedCrossEntropyBackend>(
    inputs: LinearInputs<B>,
    options: &CrossEntropyOptions,
    chunking: &LinearChunking,
) -> RowStats<B> {
    let typed = Typed::of(&inputs);
    let per_chunk = typed.rows_per_chunk(chunking);
    let parts = chunks(typed.rows(), per_chunk)
        .map(|(start, end)| {
            B::cross_entropy_rows(
                typed.chunk_inputs(start, end, &inputs.class_weights),
                options,
            )
        })
        .collect();
    joined(
        parts,
        inputs.class_weights.is_some(),
        options.outputs.needs_argmax(),
        &typed.hidden.device(),
    )
}

/// The mean's denominators over all rows, f32 `[2]`: `D` (the targets' class weights over
/// non-ignored rows; 1 for a target that is not a class) and `n` (non-ignored rows),
/// clamped as the loss clamps them. The one pass of each chunk divides by these rather
/// than by its own rows'.
fn mean_denominators_of<B: Backend>(
    targets: &Tensor<B, 1, Int>,
    class_weights: Option<&ClassWeights<B>>,
    vocab: usize,
    ignore_index: i64,
) -> FloatTensor<B> {
    let counted: Tensor<B, 1, Bool> = targets.clone().not_equal_elem(ignore_index);
    let n = counted
        .clone()
        .float()
        .cast(DType::F32)
        .sum()
        .clamp_min(1.0);
    let d = match class_weights {
        None => n.clone(),
        Some(weights) => {
            let is_class = targets
                .clone()
                .greater_equal_elem(0)
                .bool_and(targets.clone().lower_elem(vocab as i64));
            let class = targets.clone().clamp(0, vocab as i64 - 1);
            let weight = float::<B, 1>(weights.weights.clone())
                .gather(0, class)
                .mask_fill(is_class.bool_not(), 1.0)
                .mask_fill(counted.bool_not(), 0.0);
            weight.sum().clamp_min(f32::MIN_POSITIVE)
        }
    };
    primitive(Tensor::cat(vec![d, n], 0))
}

/// The gradients summed over the chunks so far.
struct GradientSums<B: Backend> {
    hidden: Vec<Tensor<B, 2>>,
    weight: Option<Tensor<B, 2>>,
    /// f32.
    bias: Option<Tensor<B, 1>>,
    chunking: LinearChunking,
}

impl<B: FusedCrossEntropyBackend> GradientSums<B> {
    fn new(chunking: &LinearChunking) -> Self {
        Self {
            hidden: Vec::new(),
            weight: None,
            bias: None,
            chunking: *chunking,
        }
    }

    /// Takes one chunk's logits gradient (rows `start..end`) to the hidden states, the
    /// weight and the bias.
    fn add(&mut self, typed: &Typed<B>, start: usize, end: usize, logits_grad: Tensor<B, 2>) {
        let weight_t = typed.weight.clone().transpose();
        self.hidden.push(if self.chunking.hidden_gradient_split_k {
            float::<B, 2>(B::matmul_split_k(
                primitive(logits_grad.clone()),
                primitive(weight_t),
            ))
        } else {
            logits_grad.clone().matmul(weight_t)
        });
        // `grad_W += h_c^T dlogits_c`: the first chunk's product is the sum.
        let hidden_t = rows_of(&typed.hidden, start, end).transpose();
        let f32_sum = self.chunking.f32_weight_gradient;
        let summed_as = |product: Tensor<B, 2>| {
            if f32_sum {
                product.cast(DType::F32)
            } else {
                product
            }
        };
        let (width, vocab) = (typed.weight.dims()[0], typed.vocab());
        let sum_dtype = if f32_sum {
            DType::F32
        } else {
            typed.weight.dtype()
        };
        let block_columns = self
            .chunking
            .weight_gradient_block_columns(width, vocab, sum_dtype);
        let in_place = self.chunking.weight_gradient_in_place;
        self.weight = Some(match (self.weight.take(), block_columns) {
            (None, _) => summed_as(hidden_t.matmul(logits_grad.clone())),
            (Some(sum), _) if in_place => float::<B, 2>(B::accumulate_product(
                primitive(sum),
                primitive(hidden_t),
                primitive(logits_grad.clone()),
            )),
            // Under Burn's fusion backend the add runs as the matmul's epilogue; the
            // product is still a whole [H, V] buffer until then.
            (Some(sum), None) => sum + summed_as(hidden_t.matmul(logits_grad.clone())),
            (Some(mut sum), Some(columns)) => {
                for first in (0..vocab).step_by(columns) {
                    let block_grad =
                        logits_grad
                            .clone()
                            .narrow(1, first, columns.min(vocab - first));
                    let block = summed_as(hidden_t.clone().matmul(block_grad));
                    sum =
                        float::<B, 2>(B::add_into_columns(primitive(sum), primitive(block), first));
                }
                sum
            }
        });
        self.add_bias(typed, logits_grad);
    }

    /// The chunk's bias gradient (its column sums, in f32) into the sum.
    fn add_bias(&mut self, typed: &Typed<B>, logits_grad: Tensor<B, 2>) {
        if typed.bias.is_some() {
            let bias = logits_grad
                .sum_dim(0)
                .reshape([typed.vocab()])
                .cast(DType::F32);
            self.bias = Some(match self.bias.take() {
                None => bias,
                Some(sum) => sum + bias,
            });
        }
    }

    /// The sums in the dtypes of what they are the gradients of.
    fn finish(self, typed: &Typed<B>) -> LinearGradients<B> {
        LinearGradients {
            hidden: primitive(if self.hidden.is_empty() {
                // No rows: nothing to fill (a launch over zero elements is invalid on CUDA).
                Tensor::empty(
                    typed.hidden.shape(),
                    (&typed.hidden.device(), typed.hidden.dtype()),
                )
            } else {
                Tensor::cat(self.hidden, 0)
            }),
            weight: primitive(match self.weight {
                Some(grad) => grad.cast(typed.weight.dtype()),
                None => typed.weight.zeros_like(),
            }),
            bias: typed.bias.as_ref().map(|bias| {
                primitive(match self.bias {
                    Some(grad) => grad.cast(bias.dtype()),
                    None => bias.zeros_like(),
                })
            }),
        }
    }
}

/// The one pass over every chunk: the per-row statistics, and the gradients of the hidden
/// states, the weight and the bias formed for the incoming gradient `guess` (f32 `[1]`;
/// `Mean` or `Sum`).
pub(crate) fn linear_one_pass<B: FusedCrossEntropyBackend>(
    inputs: LinearInputs<B>,
    guess: FloatTensor<B>,
    options: &CrossEntropyOptions,
    chunking: &LinearChunking,
) -> (RowStats<B>, LinearGradients<B>) {
    let typed = Typed::of(&inputs);
    let (rows, vocab) = (typed.rows(), typed.vocab());
    let per_chunk = typed.rows_per_chunk(chunking);
    let denominators = (options.reduction == Reduction::Mean).then(|| {
        mean_denominators_of(
            &typed.targets,
            inputs.class_weights.as_ref(),
            vocab,
            options.ignore_index,
        )
    });
    let mut parts = Vec::new();
    let mut sums = GradientSums::new(chunking);
    for (start, end) in chunks(rows, per_chunk) {
        let scale = OnePassScale {
            guess: guess.clone(),
            denominators: denominators.clone(),
        };
        let chunk = typed.chunk_inputs(start, end, &inputs.class_weights);
        let (stats, logits_grad) = B::cross_entropy_one_pass(chunk, scale, options);
        parts.push(stats);
        sums.add(&typed, start, end, float::<B, 2>(logits_grad));
    }
    (
        joined(
            parts,
            inputs.class_weights.is_some(),
            options.outputs.needs_argmax(),
            &typed.hidden.device(),
        ),
        sums.finish(&typed),
    )
}

/// Backward of a forward that kept only the per-row statistics (`stats [COUNT, N]`;
/// `Reduction::None`, whose per-row gradient `grad_output [N]` is known only now): each
/// chunk's logits are computed again, their gradient written over them, then taken to the
/// hidden states, the weight and the bias.
pub(crate) fn linear_backward<B: FusedCrossEntropyBackend>(
    inputs: LinearInputs<B>,
    stats: FloatTensor<B>,
    grad_output: FloatTensor<B>,
    options: &CrossEntropyOptions,
    chunking: &LinearChunking,
) -> LinearGradients<B> {
    let typed = Typed::of(&inputs);
    let rows = typed.rows();
    let mut sums = GradientSums::new(chunking);
    if rows == 0 {
        return sums.finish(&typed);
    }
    let per_chunk = typed.rows_per_chunk(chunking);
    let stats = float::<B, 2>(stats);
    let grad_output = float::<B, 1>(grad_output).reshape([rows]);
    for (start, end) in chunks(rows, per_chunk) {
        let chunk = typed.chunk_inputs(start, end, &inputs.class_weights);
        let backward = TwoPassBackward {
            stats: primitive(stats.clone().narrow(1, start, end - start)),
            grad_output: primitive(rows_of(&grad_output, start, end)),
            denominators: None,
        };
        let logits_grad = B::cross_entropy_backward(chunk, backward, options);
        sums.add(&typed, start, end, float::<B, 2>(logits_grad));
    }
    sums.finish(&typed)
}
