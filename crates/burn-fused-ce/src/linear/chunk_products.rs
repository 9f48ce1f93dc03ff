//! How the fused linear cross-entropy forms each chunk's products (the logits, the
//! hidden-state gradient and the weight gradient's sum): through which of the backend's
//! own kernels, in place or not, and the dtype the weight gradient is summed in.

use burn::tensor::DType;
use serde::{Deserialize, Serialize};

/// How the chunks' products are formed: [`LinearChunking::products`](crate::LinearChunking::products).
/// Saved flat within [`LinearChunking`](crate::LinearChunking) (serde `flatten`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChunkProducts {
    /// Accumulate the weight gradient over the chunks in f32 (Liger-Kernel's
    /// `accum_dtype`), cast to the weight's dtype at the end. Off: in the weight's dtype,
    /// one rounding per chunk; on: an f32 `[H, V]` buffer for the whole step. Off by
    /// default (also when a saved config lacks it).
    #[serde(default)]
    pub f32_weight_gradient: bool,
    /// Sum each chunk's weight-gradient product into the sum in place, in one matmul that
    /// adds the sum as it writes ([`LinearCrossEntropyBackend::accumulate_product`](crate::backend::LinearCrossEntropyBackend::accumulate_product)):
    /// no `[H, V]` product beside the sum. Where the backend cannot (no TMA, or rows not
    /// 16-byte aligned) the product is formed and added as without it. Takes precedence
    /// over [`LinearChunking::weight_gradient_block_bytes`](crate::LinearChunking::weight_gradient_block_bytes).
    /// On by default (also when a saved config lacks it).
    #[serde(default = "in_place_by_default")]
    pub weight_gradient_in_place: bool,
    /// Form each chunk's hidden-state gradient `dlogits_c W^T` (`chunk x H` over the
    /// whole vocabulary, often too few output tiles to occupy a large GPU) by the
    /// backend's own kernel ([`LinearCrossEntropyBackend::matmul_split_k`](crate::backend::LinearCrossEntropyBackend::matmul_split_k)), where the
    /// backend has one (TMA): with the vocabulary cut into slices multiplied side by side
    /// and summed in f32 where that fills more of the device, unsplit otherwise; off: the
    /// backend's matmul. On by default (also when a saved config lacks it).
    #[serde(default = "split_k_by_default", alias = "hidden_gradient_in_place")]
    pub hidden_gradient_split_k: bool,
    /// Form the chunks' three products (the logits, the hidden-state gradient and the
    /// weight gradient's sum) with NVIDIA's cuBLASLt on CUDA devices, where this crate's
    /// `cuda` feature is on and the library loads at run time (`cublaslt_version` tells
    /// whether it does); a product it refuses, and every
    /// product elsewhere, takes the CubeCL path the options above describe. Exact f32 for
    /// f32 operands (not TF32). Each kind of product (shapes, layouts, dtypes, summed or
    /// not) takes the fastest of cuBLASLt's first 8 algorithms, timed on the device the
    /// first time the kind runs in the process (a one-time host wait, as Burn's autotune)
    /// and kept on disk with the `persistence` feature. On by default (also when a saved
    /// config lacks it).
    #[serde(default = "cublaslt_by_default")]
    pub cublaslt: bool,
}

impl Default for ChunkProducts {
    fn default() -> Self {
        Self {
            f32_weight_gradient: false,
            weight_gradient_in_place: in_place_by_default(),
            hidden_gradient_split_k: split_k_by_default(),
            cublaslt: cublaslt_by_default(),
        }
    }
}

impl ChunkProducts {
    /// The dtype the weight gradient is summed in for a step in `dtype`: f32 with
    /// [`Self::f32_weight_gradient`], else `dtype`.
    pub(crate) fn weight_gradient_sum_dtype(&self, dtype: DType) -> DType {
        if self.f32_weight_gradient {
            DType::F32
        } else {
            dtype
        }
    }
}

/// [`ChunkProducts::weight_gradient_in_place`] when not given: on, as it leaves no
/// `[H, V]` product beside the sum for about the time of forming and adding one.
fn in_place_by_default() -> bool {
    true
}

/// [`ChunkProducts::cublaslt`] when not given: on, as cuBLAS's kernels use the tensor
/// cores' fastest instructions (Hopper's warpgroup MMA), which CubeCL's do not.
fn cublaslt_by_default() -> bool {
    true
}

/// [`ChunkProducts::hidden_gradient_split_k`] when not given: on, as the chunks'
/// hidden-state gradients take the largest share of the time the fused step loses to
/// the unfused head.
fn split_k_by_default() -> bool {
    true
}
