//! The vocabulary-parallel loss's per-row kernels, one unit per row: a shard's targets
//! made local and its contribution to the exchanged sums packed, the whole vocabulary's
//! statistics from those sums, and the backward kernel's inputs on a shard. Done with
//! Burn's tensor ops these were about a hundred small ops per step (a log-sum-exp over
//! the shards, gathers at the target's shard, masks), each with a fixed cost on the host
//! and the device.

mod gradient;
mod launch;
mod local_targets;
mod pack;
mod whole_vocabulary;

pub use gradient::{ShardGradientOptions, shard_gradient_rows_kernel};
pub use launch::{
    ShardScalars, launch_pack_shard_rows, launch_shard_gradient_rows, launch_shard_targets,
    launch_whole_vocabulary_rows,
};
pub use local_targets::{ELSEWHERE, SHARD_IGNORE, shard_targets_kernel};
pub use pack::{PackOptions, pack_shard_rows_kernel};
pub use whole_vocabulary::{ShardRowsOptions, log_sum_rows, whole_vocabulary_rows_kernel};
