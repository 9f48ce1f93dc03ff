//! The vocabulary-parallel cross-entropy ([`try_vocab_parallel_cross_entropy`]): the
//! logits' classes are split over devices, each holding one shard `[N, V_s]`. Each shard reduces its own classes with the row kernel,
//! the shards sum a few numbers per row through a [`ShardExchange`] (`O(N)`, never
//! `N x V`), and every shard then holds the whole loss and writes its own classes'
//! gradient.
//!
//! Per row, shard `k` contributes its log-sum-exp `lse_k`; the shard holding the target its
//! `lse_k - x_y` and `p_y - 1` over its own classes; with label smoothing, every shard its
//! `sum_c w_c (lse_k - x_c)`; with the argmax, every shard its best value and column. One
//! sum of a `[R, N]` f32 matrix in which each shard fills its own rows gathers them all
//! (a sum: Burn's all-reduce has no max). From them:
//! `lse = logsumexp_k lse_k`; `lse - x_y = (lse_y - x_y) + (lse - lse_y)`;
//! `p_y - 1 = (p'_y - 1) r - (1 - r)` with `r = exp(lse_y - lse)` and
//! `1 - r = sum_{k != y's shard} exp(lse_k - lse)` (no cancellation);
//! `sum_c w_c (lse - x_c) = sum_k (W_k (lse - lse_k) + sum_{c in k} w_c (lse_k - x_c))`.
//!
//! Burn's extension ops are not generic, so the exchange sits between ops, in `api.rs`:
//! [`VocabParallelBackend::shard_contributions`], the exchange,
//! [`VocabParallelBackend::whole_vocabulary_rows`], then
//! [`VocabParallelBackend::vocab_parallel_cross_entropy`], whose backward (under
//! autodiff) is local to the shard.

pub(crate) mod api;
mod autodiff;
mod contributions;
#[cfg(feature = "cube")]
mod cube;
pub(crate) mod exchange;
pub(crate) mod extension;
pub(crate) mod extension_types;
#[cfg(feature = "flex")]
mod flex;
#[cfg(all(feature = "fusion", feature = "cube"))]
mod fusion_meta;
mod gradient;
mod gradient_rows;
pub(crate) mod shard;
mod target_rows;
mod whole_rows;

pub use api::try_vocab_parallel_cross_entropy;
pub use exchange::{DistributedExchange, InProcessExchange, ShardExchange};
pub use shard::VocabShard;
