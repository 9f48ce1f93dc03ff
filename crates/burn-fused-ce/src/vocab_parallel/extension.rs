//! The vocabulary-parallel loss's backend extension: the ops of one shard, on primitives.
//! Inputs here are already validated (see `api.rs`). As for the loss,
//! [`burn_cubecl::CubeBackend`] runs our kernels (`cube.rs`), `Fusion<CubeBackend>` defers
//! them as custom ops (`fusion_meta.rs`), Flex runs the tensor-op versions (`flex.rs`) and
//! `Autodiff<B, C>` records the backward step on the shard's logits (`autodiff.rs`).

use burn::backend::{backend_extension, tensor::FloatTensor};

use crate::loss::extension::FusedCrossEntropyBackend;

use crate::options::CrossEntropyOptions;
use crate::values::{CrossEntropyInputs, LossParts, RowStats, RowWeights};
use crate::vocab_parallel::contributions::shard_contributions_by_tensor_ops;
use crate::vocab_parallel::extension_types::{
    ExchangedRows, KernelBackwardRows, ShardBackwardRows,
};
use crate::vocab_parallel::gradient_rows::shard_gradient_rows_by_tensor_ops;
use crate::vocab_parallel::shard::VocabShard;
use crate::vocab_parallel::whole_rows::whole_vocabulary_rows_by_tensor_ops;

#[cfg(all(feature = "fusion", feature = "cube"))]
use crate::vocab_parallel::fusion_meta::*;

/// A Burn backend that can run the vocabulary-parallel cross-entropy (see
/// [`crate::vocab_parallel::try_vocab_parallel_cross_entropy`]) on one shard.
///
/// Callers validate shapes and options first (the typed functions in this crate do).
#[backend_extension(
    Cube: cfg(feature = "cube"),
    Flex: cfg(feature = "flex"),
    Autodiff,
    Fusion: cfg(all(feature = "fusion", feature = "cube")),
)]
pub trait VocabParallelBackend: FusedCrossEntropyBackend {
    /// What one shard contributes to the sums the shards exchange (see
    /// [`ExchangedRows::summed`]), f32 `[R, N]`: its row-kernel passes over its logits
    /// (`inputs`: the shard's logits, the targets, the whole vocabulary's class weights),
    /// packed. The default uses tensor ops around
    /// [`FusedCrossEntropyBackend::cross_entropy_rows`]; cube backends make the targets
    /// local and pack in one small kernel each.
    #[fusion(meta = contributions_meta)]
    fn shard_contributions(
        #[extension_type] inputs: CrossEntropyInputs<Self>,
        shard: VocabShard,
        options: CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        shard_contributions_by_tensor_ops::<Self>(inputs, &shard, &options)
    }

    /// The per-row statistics of the whole vocabulary (see [`RowStats`]) from what the
    /// shards exchanged (see [`ExchangedRows`]), the same on every shard. The default uses
    /// tensor ops (about sixty small ones); cube backends run one kernel.
    #[fusion(meta = whole_rows_meta)]
    fn whole_vocabulary_rows(
        #[extension_type] exchanged: ExchangedRows<Self>,
        shard: VocabShard,
        options: CrossEntropyOptions,
    ) -> RowStats<Self> {
        whole_vocabulary_rows_by_tensor_ops::<Self>(exchanged, &shard, &options)
    }

    /// The inputs of one shard's backward kernel (see [`KernelBackwardRows`]), run with
    /// one incoming gradient per row and no options of its own but softcap: the spec's
    /// gradient on the shard's columns is `c p_c - s w_c - [c = y] sc (1 - ls) w_y` with
    /// the row's coefficient `c = sc (1 - ls) w_y + s W + 2 z sz lse` and `s = sc ls / V`;
    /// the kernel takes `c` as the row's incoming gradient, the targets made local (column
    /// 0 where another shard holds the target) and target values that make it write
    /// `c (p_y - 1) + c - sc (1 - ls) w_y` at the target and `c p_0` at such a column 0.
    /// The default uses tensor ops; cube backends run one kernel.
    #[fusion(meta = gradient_rows_meta)]
    fn shard_gradient_rows(
        #[extension_type] inputs: ShardBackwardRows<Self>,
        shard: VocabShard,
        options: CrossEntropyOptions,
    ) -> KernelBackwardRows<Self> {
        shard_gradient_rows_by_tensor_ops::<Self>(inputs, &shard, &options)
    }

    /// The whole vocabulary's loss and extra outputs on one shard from the whole
    /// vocabulary's statistics `rows` (see [`Self::whole_vocabulary_rows`]), in the dtype
    /// of `inputs`' logits (this shard's). `Autodiff` overrides it to record the backward
    /// step on the shard's logits, which needs no exchange; the default reduces.
    #[fusion(default)]
    fn vocab_parallel_cross_entropy(
        #[extension_type] inputs: CrossEntropyInputs<Self>,
        #[extension_type] rows: RowStats<Self>,
        shard: VocabShard,
        options: CrossEntropyOptions,
    ) -> LossParts<Self> {
        let _ = shard;
        let dtype = burn::backend::TensorMetadata::dtype(&inputs.logits);
        Self::reduce_row_stats(rows, RowWeights::none(), options, dtype, false).parts
    }
}
