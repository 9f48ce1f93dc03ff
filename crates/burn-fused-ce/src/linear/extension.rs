//! The fused linear cross-entropy's backend extension: the op that runs the LM head and
//! the loss together, and the products its chunks go through, which backends may run by
//! kernels of their own. Inputs here are already validated (see `api.rs`). Burn's
//! dispatch routes a call to the backend of its tensors: [`burn_cubecl::CubeBackend`]
//! runs our in-place matmul (`cube.rs`), `Fusion<CubeBackend>` defers each product as a
//! custom op (`fusion_meta.rs`), Flex takes every default (`flex.rs`) and `Autodiff<B, C>`
//! records the backward step (`autodiff.rs`). Also the op's default forward, chunk by
//! chunk: each chunk's logits from the backend's chunk product, read in place by the
//! loss kernels.

use burn::backend::{TensorMetadata, backend_extension, tensor::FloatTensor};

#[cfg(all(feature = "fusion", feature = "cube"))]
use crate::linear::fusion_meta::*;
use crate::linear::types::{LinearHead, LinearInputs};
use crate::linear::{
    chunking::LinearChunking,
    products::{columns_added, product, product_added},
    rows::{Typed, chunks, joined},
};
use crate::loss::extension::FusedCrossEntropyBackend;
use crate::loss::incoming_guess::IncomingGuess;

use crate::options::CrossEntropyOptions;
use crate::primitive::FloatOf;
use crate::test_hooks::{self, LinearProduct};
use crate::values::{CrossEntropyInputs, LossParts, RowStats};

/// A Burn backend that can run the fused linear cross-entropy.
///
/// Callers validate shapes and options first, and bound the chunks' logits by the
/// device's largest buffer ([`LinearChunking::within`]); the typed functions in this
/// crate do.
#[backend_extension(
    Cube: cfg(feature = "cube"),
    Flex: cfg(feature = "flex"),
    Autodiff,
    Fusion: cfg(all(feature = "fusion", feature = "cube")),
)]
pub trait LinearCrossEntropyBackend: FusedCrossEntropyBackend {
    /// `sum[:, start..start + w] += block` for `sum [H, V]` and `block [H, w]` of one
    /// dtype: the weight gradient summed a block of columns at a time
    /// ([`LinearChunking::weight_gradient_block_bytes`]), in place when nothing else holds
    /// `sum`. The default uses tensor ops: the block is added to a view of the columns,
    /// which `slice_assign` writes back. Fusion backends run it as one custom op, so that
    /// the stream does not fuse the write-back into a kernel that writes a whole new
    /// `sum`.
    #[fusion(meta = add_into_columns_meta)]
    fn add_into_columns(
        sum: FloatTensor<Self>,
        block: FloatTensor<Self>,
        start: usize,
    ) -> FloatTensor<Self> {
        columns_added::<Self>(sum, block, start)
    }

    /// `matrix` with rows this backend's fastest matmuls can read, its values unchanged:
    /// the head's weight passes through it once per call. Cube backends on devices with
    /// TMA (Hopper and later) copy a matrix whose rows are not 16-byte aligned (a
    /// vocabulary of 50257 or 100277 bf16 classes without padding, as Burn's optimizer
    /// step leaves a weight) into rows padded to the allocator's pitch: otherwise each
    /// chunk's matmuls run on kernels without TMA. Fusion backends run that as one custom
    /// op. The default returns `matrix` as is.
    #[fusion(meta = same_tensor_meta)]
    fn with_matmul_aligned_rows(matrix: FloatTensor<Self>) -> FloatTensor<Self> {
        matrix
    }

    /// `sum + lhs rhs` for `lhs [M, K]` and `rhs [K, N]` of one dtype and `sum [M, N]` of
    /// this or another float dtype (the product is taken to `sum`'s): the weight gradient
    /// summed over the chunks in place ([`ChunkProducts::weight_gradient_in_place`](crate::ChunkProducts::weight_gradient_in_place)).
    /// The default forms the whole product and adds it. Cube backends run one matmul that
    /// adds `sum` to the product as it writes over it, when nothing else holds it and the
    /// kernel suits the device and the operands; fusion backends run that as one custom
    /// op, so that the stream hands over the sum's handle by value.
    ///
    /// With `cublaslt`, cube backends on CUDA devices first try NVIDIA's cuBLASLt
    /// ([`ChunkProducts::cublaslt`](crate::ChunkProducts::cublaslt)), in place under the same conditions.
    #[fusion(meta = accumulate_product_meta)]
    fn accumulate_product(
        sum: FloatTensor<Self>,
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        cublaslt: bool,
    ) -> FloatTensor<Self> {
        let _ = cublaslt;
        product_added::<Self>(sum, lhs, rhs)
    }

    /// `lhs rhs` for `lhs [M, K]` and `rhs [K, N]` of one dtype, in that dtype: a chunk's
    /// logits, and its gradients' products where no other op forms them. The default is
    /// the backend's matmul; with `cublaslt`, cube backends on CUDA devices first try
    /// NVIDIA's cuBLASLt ([`ChunkProducts::cublaslt`](crate::ChunkProducts::cublaslt)). Fusion backends run it as one
    /// custom op.
    #[fusion(meta = split_k_meta)]
    fn chunk_product(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        cublaslt: bool,
    ) -> FloatTensor<Self> {
        let _ = cublaslt;
        product::<Self>(lhs, rhs)
    }

    /// `lhs rhs` for `lhs [M, K]` and `rhs [K, N]` of one dtype, with the inner dimension
    /// cut into slices multiplied side by side and summed in f32 (split-K) where the
    /// output alone has too few tiles to occupy the device: each chunk's hidden-state
    /// gradient, `chunk x H` over the whole vocabulary
    /// ([`ChunkProducts::hidden_gradient_split_k`](crate::ChunkProducts::hidden_gradient_split_k)). The default is the backend's
    /// matmul. Cube backends on devices with TMA (Hopper and later) run the in-place
    /// matmul (`fused_ce_kernels::launch_matmul_accumulate`, two rows of tiles per plane
    /// over a long inner dimension): split where that fills more of the SMs
    /// (`fused_ce_kernels::split_k_slices`), one launch for all slices into f32 zeros;
    /// otherwise unsplit into zeros. Fusion backends run that as one custom op.
    /// With `cublaslt`, cube backends on CUDA devices first try NVIDIA's cuBLASLt
    /// ([`ChunkProducts::cublaslt`](crate::ChunkProducts::cublaslt)), unsplit.
    #[fusion(meta = split_k_meta)]
    fn matmul_split_k(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        cublaslt: bool,
    ) -> FloatTensor<Self> {
        let _ = cublaslt;
        product::<Self>(lhs, rhs)
    }

    /// The fused linear cross-entropy (see [`crate::try_fused_linear_cross_entropy`]):
    /// the loss (`[N]` for `Reduction::None`, `[1]` otherwise, in the hidden states'
    /// dtype) and the extra outputs asked for. `Autodiff` overrides it to record the
    /// backward step, the one pass forming the gradients for `guess`'s incoming gradient;
    /// the default computes the forward alone, chunk by chunk.
    #[fusion(default)]
    fn fused_linear_cross_entropy(
        #[extension_type] inputs: LinearInputs<Self>,
        options: CrossEntropyOptions,
        chunking: LinearChunking,
        guess: IncomingGuess,
    ) -> LossParts<Self> {
        let _ = guess;
        let dtype = TensorMetadata::dtype(&inputs.hidden);
        let row_weights = inputs.row_weights.clone();
        let rows = linear_rows::<Self>(with_aligned_weight::<Self>(inputs), &options, &chunking);
        Self::reduce_row_stats(rows, row_weights, options, dtype, false).parts
    }
}

/// The call's inputs with the weight passed through
/// [`LinearCrossEntropyBackend::with_matmul_aligned_rows`], as the chunks' matmuls read
/// it.
pub(crate) fn with_aligned_weight<B: LinearCrossEntropyBackend>(
    inputs: LinearInputs<B>,
) -> LinearInputs<B> {
    LinearInputs {
        head: LinearHead {
            weight: B::with_matmul_aligned_rows(inputs.head.weight),
            bias: inputs.head.bias,
        },
        ..inputs
    }
}

impl<B: LinearCrossEntropyBackend> Typed<B> {
    /// The loss kernels' inputs for the chunk `start..end`: its logits `h_c W (+ b)`, from
    /// the backend's chunk product (through cuBLASLt where `cublaslt` asks for it and
    /// it runs), which nothing else holds.
    // A slice of a rank-1 tensor is an array of one range.
    #[allow(clippy::single_range_in_vec_init)]
    pub fn chunk_inputs(&self, start: usize, end: usize, cublaslt: bool) -> CrossEntropyInputs<B> {
        test_hooks::count_linear_product(LinearProduct::Logits);
        let logits = FloatOf::<B, 2>::new(B::chunk_product(
            self.hidden_rows(start, end).into_primitive(),
            self.weight.clone().into_primitive(),
            cublaslt,
        ));
        // A backend caller's bias of another dtype is cast to the logits' (the functions
        // refuse one): Burn's cube add reads both operands as the left one's dtype.
        let logits = match &self.bias {
            Some(bias) => {
                let bias = bias.clone().cast(logits.dtype());
                logits.add(bias.reshape([1, self.vocab()]))
            }
            None => logits,
        };
        CrossEntropyInputs {
            logits: logits.into_primitive(),
            targets: self.targets.clone().slice([start..end]).into_primitive(),
            class_weights: self.class_weights.clone(),
            row_weights: self.chunk_row_weights(start, end),
        }
    }
}

/// Forward alone: the per-row statistics of every row, one chunk of logits at a time.
/// The weight is read as given (see [`Typed::of`]).
pub(crate) fn linear_rows<B: LinearCrossEntropyBackend>(
    inputs: LinearInputs<B>,
    options: &CrossEntropyOptions,
    chunking: &LinearChunking,
) -> RowStats<B> {
    let typed = Typed::of(inputs);
    let per_chunk = typed.rows_per_chunk(chunking);
    let parts = chunks(typed.rows(), per_chunk)
        .map(|(start, end)| {
            let inputs = typed.chunk_inputs(start, end, chunking.products.cublaslt);
            B::cross_entropy_rows(inputs, options.clone())
        })
        .collect();
    joined(parts, &typed, options.outputs.needs_argmax())
}
