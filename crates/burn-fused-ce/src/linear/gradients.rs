//! The fused linear cross-entropy's passes that form the gradients, chunk by chunk: the
//! loss kernels write each chunk's logits gradient over its logits (in the one pass, in
//! forward; in the two-pass plan, in backward over logits computed again), and two more
//! matmuls take it to the hidden states and the weight; the weight gradient is summed
//! over the chunks as it goes. Only the gradients autodiff tracks are formed: a frozen
//! head skips the weight's product and its `[H, V]` sum, a frozen body the hidden
//! states'.

use burn::backend::{Backend, tensor::FloatTensor};
use burn::tensor::DType;

use crate::linear::{
    chunk_products::ChunkProducts,
    chunking::LinearChunking,
    extension::{LinearCrossEntropyBackend, with_aligned_weight},
    rows::{Typed, chunks, joined, mean_denominators_of},
    types::LinearInputs,
};
use crate::loss::reduce::given_denominators;
use crate::loss::types::{OnePassScale, TwoPassBackward};
use crate::options::{CrossEntropyOptions, Reduction};
use crate::primitive::FloatOf;
use crate::test_hooks::{self, LinearProduct};
use crate::values::{OptionalFloat, RowStats};

/// Which of the op's inputs get a gradient: those whose autodiff parent is tracked
/// (Burn's node requirements). A frozen head (adapter fine-tuning) needs the hidden
/// states' alone, a frozen body (linear probing) the weight's and the bias's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GradientsNeeded {
    pub hidden: bool,
    pub weight: bool,
    pub bias: bool,
}

/// The gradients of the hidden states `[N, H]`, the weight `[H, V]` and the bias `[V]`
/// that were needed, each in the dtype of what it is the gradient of.
#[derive(Debug, Clone)]
pub(crate) struct LinearGradients<B: Backend> {
    pub hidden: Option<FloatTensor<B>>,
    pub weight: Option<FloatTensor<B>>,
    pub bias: Option<FloatTensor<B>>,
}

/// The gradients summed over the chunks so far.
struct GradientSums<B: Backend> {
    hidden: Vec<FloatOf<B, 2>>,
    weight: Option<FloatOf<B, 2>>,
    /// f32.
    bias: Option<FloatOf<B, 1>>,
    products: ChunkProducts,
    /// The dtype the weight gradient is summed in.
    sum_dtype: DType,
    /// Columns per block of the weight-gradient product
    /// ([`LinearChunking::weight_gradient_block_columns`]); `None`: whole.
    block_columns: Option<usize>,
    needed: GradientsNeeded,
}

impl<B: LinearCrossEntropyBackend> GradientSums<B> {
    fn new(typed: &Typed<B>, chunking: &LinearChunking, needed: GradientsNeeded) -> Self {
        let products = chunking.products;
        let sum_dtype = products.weight_gradient_sum_dtype(typed.weight.dtype());
        Self {
            hidden: Vec::new(),
            weight: None,
            bias: None,
            products,
            sum_dtype,
            block_columns: chunking.weight_gradient_block_columns(
                typed.width(),
                typed.vocab(),
                sum_dtype,
            ),
            needed,
        }
    }

    /// Takes one chunk's logits gradient (rows `start..end`) to the hidden states, the
    /// weight and the bias, as far as they are needed.
    fn add(&mut self, typed: &Typed<B>, start: usize, end: usize, logits_grad: FloatOf<B, 2>) {
        let needed = self.needed;
        if needed.hidden {
            self.add_hidden(typed, logits_grad.clone());
        }
        if needed.weight {
            self.add_weight(typed, start, end, logits_grad.clone());
        }
        if needed.bias {
            self.add_bias(typed, logits_grad);
        }
    }

    /// The chunk's hidden-state gradient `dlogits_c W^T`.
    fn add_hidden(&mut self, typed: &Typed<B>, logits_grad: FloatOf<B, 2>) {
        test_hooks::count_linear_product(LinearProduct::HiddenGradient);
        let weight_t = typed.weight.clone().transpose();
        let cublaslt = self.products.cublaslt;
        self.hidden
            .push(FloatOf::new(if self.products.hidden_gradient_split_k {
                B::matmul_split_k(
                    logits_grad.into_primitive(),
                    weight_t.into_primitive(),
                    cublaslt,
                )
            } else {
                B::chunk_product(
                    logits_grad.into_primitive(),
                    weight_t.into_primitive(),
                    cublaslt,
                )
            }));
    }

    /// `grad_W += h_c^T dlogits_c`: the first chunk's product is the sum.
    fn add_weight(
        &mut self,
        typed: &Typed<B>,
        start: usize,
        end: usize,
        logits_grad: FloatOf<B, 2>,
    ) {
        test_hooks::count_linear_product(LinearProduct::WeightGradient);
        let cublaslt = self.products.cublaslt;
        let hidden_t = typed.hidden_rows(start, end).transpose();
        let sum_dtype = self.sum_dtype;
        // `h^T d` for these columns of the chunk's gradient, in the sum's dtype.
        let weight_product = |hidden_t: FloatOf<B, 2>, grad: FloatOf<B, 2>| {
            FloatOf::<B, 2>::new(B::chunk_product(
                hidden_t.into_primitive(),
                grad.into_primitive(),
                cublaslt,
            ))
            .cast(sum_dtype)
        };
        let vocab = typed.vocab();
        let in_place = self.products.weight_gradient_in_place;
        self.weight = Some(match (self.weight.take(), self.block_columns) {
            (None, _) => weight_product(hidden_t, logits_grad),
            (Some(sum), _) if in_place => FloatOf::new(B::accumulate_product(
                sum.into_primitive(),
                hidden_t.into_primitive(),
                logits_grad.into_primitive(),
                cublaslt,
            )),
            // The product is a whole [H, V] buffer beside the sum until the add.
            (Some(sum), None) => sum.add(weight_product(hidden_t, logits_grad)),
            (Some(mut sum), Some(columns)) => {
                for first in (0..vocab).step_by(columns) {
                    let block_grad =
                        logits_grad
                            .clone()
                            .narrow(1, first, columns.min(vocab - first));
                    let block = weight_product(hidden_t.clone(), block_grad);
                    sum = FloatOf::new(B::add_into_columns(
                        sum.into_primitive(),
                        block.into_primitive(),
                        first,
                    ));
                }
                sum
            }
        });
    }

    /// The chunk's bias gradient (its column sums, in f32) into the sum.
    fn add_bias(&mut self, typed: &Typed<B>, logits_grad: FloatOf<B, 2>) {
        if typed.bias.is_some() {
            test_hooks::count_linear_product(LinearProduct::BiasGradient);
            let bias = logits_grad
                .sum_dim(0)
                .reshape([typed.vocab()])
                .cast(DType::F32);
            self.bias = Some(match self.bias.take() {
                None => bias,
                Some(sum) => sum.add(bias),
            });
        }
    }

    /// The needed sums in the dtypes of what they are the gradients of.
    fn finish(self, typed: &Typed<B>) -> LinearGradients<B> {
        let device = typed.hidden.device();
        let needed = self.needed;
        let hidden = needed.hidden.then(|| {
            if self.hidden.is_empty() {
                // No rows: nothing to fill (a launch over zero elements is invalid on CUDA).
                FloatOf::<B, 2>::empty(typed.hidden.shape(), &device, typed.hidden.dtype())
            } else {
                FloatOf::cat(self.hidden, 0)
            }
            .into_primitive()
        });
        let weight = needed.weight.then(|| {
            match self.weight {
                Some(grad) => grad.cast(typed.weight.dtype()),
                None => FloatOf::zeros(typed.weight.shape(), &device, typed.weight.dtype()),
            }
            .into_primitive()
        });
        let bias = typed.bias.as_ref().filter(|_| needed.bias).map(|bias| {
            match self.bias {
                Some(grad) => grad.cast(bias.dtype()),
                None => FloatOf::zeros(bias.shape(), &device, bias.dtype()),
            }
            .into_primitive()
        });
        LinearGradients {
            hidden,
            weight,
            bias,
        }
    }
}

/// The one pass over every chunk: the per-row statistics, and the gradients of the hidden
/// states, the weight and the bias formed for the incoming gradient `guess` (f32 `[1]`;
/// `Mean` or `Sum`).
pub(crate) fn linear_one_pass<B: LinearCrossEntropyBackend>(
    inputs: LinearInputs<B>,
    guess: FloatTensor<B>,
    options: &CrossEntropyOptions,
    chunking: &LinearChunking,
    needed: GradientsNeeded,
) -> (RowStats<B>, LinearGradients<B>) {
    let typed = Typed::of(with_aligned_weight(inputs));
    let per_chunk = typed.rows_per_chunk(chunking);
    let denominators = (options.reduction == Reduction::Mean).then(|| {
        given_denominators::<B>(options, &typed.hidden.device())
            .unwrap_or_else(|| mean_denominators_of(&typed, options.ignore_index))
            .into_primitive()
    });
    let mut parts = Vec::new();
    let mut sums = GradientSums::new(&typed, chunking, needed);
    for (start, end) in chunks(typed.rows(), per_chunk) {
        let scale = OnePassScale {
            guess: guess.clone(),
            denominators: OptionalFloat::from_option(denominators.clone()),
        };
        let output = B::cross_entropy_one_pass(
            typed.chunk_inputs(start, end, chunking.products.cublaslt),
            scale,
            options.clone(),
        );
        parts.push(output.rows);
        sums.add(&typed, start, end, FloatOf::new(output.grad));
    }
    let rows = joined(parts, &typed, options.outputs.needs_argmax());
    (rows, sums.finish(&typed))
}

/// The incoming gradients of a backward that forms the gradients: the loss's (`[N]` for
/// `Reduction::None`, `[1]` otherwise) and, when the objective used it, the entropy's
/// (f32 `[N]`); for `Mean`, the denominators `[D, n]` over all rows.
pub(crate) struct LinearIncoming<B: Backend> {
    pub loss: FloatTensor<B>,
    pub entropy: Option<FloatTensor<B>>,
    pub denominators: Option<FloatTensor<B>>,
}

/// Backward of a forward that kept only the per-row statistics (`stats [COUNT, N]`): each
/// chunk's logits are computed again, their gradient for `incoming` written over them,
/// then taken to the hidden states, the weight and the bias as far as `needed`. `inputs`
/// as forward read them: the weight already through
/// [`LinearCrossEntropyBackend::with_matmul_aligned_rows`], so that a step copies it at
/// most once.
pub(crate) fn linear_backward<B: LinearCrossEntropyBackend>(
    inputs: LinearInputs<B>,
    stats: FloatTensor<B>,
    incoming: LinearIncoming<B>,
    options: &CrossEntropyOptions,
    chunking: &LinearChunking,
    needed: GradientsNeeded,
) -> LinearGradients<B> {
    let typed = Typed::of(inputs);
    let rows = typed.rows();
    let mut sums = GradientSums::new(&typed, chunking, needed);
    if rows == 0 {
        return sums.finish(&typed);
    }
    let per_chunk = typed.rows_per_chunk(chunking);
    let stats = FloatOf::<B, 2>::new(stats);
    let per_row = options.reduction == Reduction::None;
    let loss_incoming = if per_row {
        FloatOf::<B, 1>::new(incoming.loss).reshape([rows])
    } else {
        FloatOf::<B, 1>::new(incoming.loss).reshape([1])
    };
    let entropy_incoming = incoming.entropy.map(|grad| FloatOf::<B, 1>::new(grad));
    for (start, end) in chunks(rows, per_chunk) {
        let len = end - start;
        let backward = TwoPassBackward {
            stats: stats.clone().narrow(1, start, len).into_primitive(),
            grad_output: if per_row {
                loss_incoming.clone().narrow(0, start, len)
            } else {
                loss_incoming.clone()
            }
            .into_primitive(),
            denominators: OptionalFloat::from_option(incoming.denominators.clone()),
            entropy_grad_output: OptionalFloat::from_option(
                entropy_incoming
                    .as_ref()
                    .map(|grad| grad.clone().narrow(0, start, len).into_primitive()),
            ),
        };
        let logits_grad = B::cross_entropy_backward(
            typed.chunk_inputs(start, end, chunking.products.cublaslt),
            backward,
            options.clone(),
        );
        sums.add(&typed, start, end, FloatOf::new(logits_grad));
    }
    sums.finish(&typed)
}
