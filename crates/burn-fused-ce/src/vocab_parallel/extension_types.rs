//! The inputs and outputs of the vocabulary-parallel ops that the loss's types do not
//! cover: what the shards exchanged, and what a shard's backward kernel reads and takes.

use burn::backend::{
    Backend, ExtensionType,
    tensor::{FloatTensor, IntTensor},
};

use crate::values::{ClassWeights, OptionalFloat};

/// What the shards exchanged and what every shard knows of the rows: the input of
/// [`crate::backend::VocabParallelBackend::whole_vocabulary_rows`].
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct ExchangedRows<B: Backend> {
    /// The element-wise sum over the shards of what each contributed, f32 `[R, N]`: rows
    /// `0..K` the shards' row maxima (each shard fills its own row); row `K` the owning
    /// shard's `lse_y - x_y`, row `K + 1` its `p'_y - 1`; with label smoothing, row `K + 2`
    /// the shards' `sum_c w_c (lse_k - x_c)`; with the argmax, `K` rows of the shards' best
    /// values, then `K` rows of their columns in the whole vocabulary; last, `K` rows of
    /// the shards' `ln sum exp(x - max)` (their log-sum-exp is the maximum plus it).
    pub summed: FloatTensor<B>,
    /// The targets, `[N]`.
    pub targets: IntTensor<B>,
    /// The whole vocabulary's class weights.
    #[extension_type]
    pub class_weights: ClassWeights<B>,
    /// With label smoothing, each shard's class-weight total (its class count without
    /// weights), f32 `[K]`.
    #[extension_type]
    pub shard_totals: OptionalFloat<B>,
}

/// The inputs of a shard's backward kernel: what
/// [`crate::backend::VocabParallelBackend::shard_gradient_rows`] reads.
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
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
    #[extension_type]
    pub denominators: OptionalFloat<B>,
    /// With class weights, the whole vocabulary's class-weight total, f32 `[1]`.
    #[extension_type]
    pub weight_total: OptionalFloat<B>,
}

/// What a shard's backward kernel takes, from
/// [`crate::backend::VocabParallelBackend::shard_gradient_rows`].
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct KernelBackwardRows<B: Backend> {
    /// The targets as the kernel takes them, `[N]`.
    pub targets: IntTensor<B>,
    /// The statistics with the target values the kernel needs, f32 `[COUNT, N]`.
    pub stats: FloatTensor<B>,
    /// Each row's coefficient `c`, the kernel's incoming gradient, f32 `[N]`.
    pub coefficients: FloatTensor<B>,
    /// With label smoothing, each row's `s`, f32 `[N]`: the caller subtracts `s w_c`.
    #[extension_type]
    pub smooth: OptionalFloat<B>,
}
