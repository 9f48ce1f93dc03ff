//! Which classes one shard holds, and the options of the shard's own kernel passes.

use core::ops::Range;

use crate::error::CrossEntropyError;
use crate::options::CrossEntropyOptions;

/// Which classes one device holds: the vocabulary of `vocab` classes is cut into `count`
/// shards of `ceil(vocab / count)` classes (the last may be shorter), as Megatron cuts it;
/// this device holds shard `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
            return Err(CrossEntropyError::invalid_option(
                "shard",
                format!("{index} of {count} over {vocab} classes"),
                "an index below the count, each shard holding at least one class",
            ));
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

/// The ignore index of the shard's own kernel passes (the caller's may be one of the
/// shard's columns).
pub(crate) const SHARD_IGNORE: i64 = fused_ce_kernels::SHARD_IGNORE as i64;
/// The target of a row whose class another shard holds.
pub(crate) const ELSEWHERE: i64 = fused_ce_kernels::ELSEWHERE as i64;

/// The options of the shard's own kernel passes: no label smoothing or z-loss (they are
/// formed over the whole vocabulary from the exchanged sums, as are the class weights),
/// the argmax when an output needs it, ignored rows as [`SHARD_IGNORE`].
pub(crate) fn local_options(options: &CrossEntropyOptions) -> CrossEntropyOptions {
    options
        .clone()
        .with_label_smoothing(0.0)
        .with_z_loss_scale(0.0)
        .with_ignore_index(SHARD_IGNORE)
}

/// The options of the shard's smoothing pass: all the weight on smoothing.
pub(crate) fn smoothing_options(options: &CrossEntropyOptions) -> CrossEntropyOptions {
    local_options(options)
        .with_label_smoothing(1.0)
        .with_outputs(Default::default())
}

/// Rows of the exchanged matrix (see [`crate::ExchangedRows::summed`]).
pub(crate) fn exchanged_rows(shard: &VocabShard, options: &CrossEntropyOptions) -> usize {
    log_sum_rows(shard, options) + shard.count
}

/// The first of the exchanged matrix's last `K` rows: the shards' `row_stat::LOG_SUM`.
pub(crate) fn log_sum_rows(shard: &VocabShard, options: &CrossEntropyOptions) -> usize {
    fused_ce_kernels::log_sum_rows(
        shard.count,
        options.label_smoothing > 0.0,
        options.outputs.needs_argmax(),
    )
}
