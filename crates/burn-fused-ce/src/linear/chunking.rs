//! How the fused linear cross-entropy cuts its work: rows into chunks whose logits fit a
//! memory budget, the weight-gradient product into blocks of columns; and how the chunks'
//! products are formed ([`ChunkProducts`]).

use burn::tensor::DType;
use serde::{Deserialize, Serialize};

use crate::error::CrossEntropyError;
use crate::linear::chunk_products::ChunkProducts;

/// How the fused linear cross-entropy cuts its work.
// Unknown fields are ignored (no `deny_unknown_fields`): a config saved with the removed
// `weight_gradient_stream` loads. `products` is flattened: the saved layout is flat, as
// before it was split out.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LinearChunking {
    /// The most bytes one chunk's logits take (their gradient is written over them): the
    /// rows are spread evenly over as few chunks as the budget allows, at least 16 rows a
    /// chunk ([`LinearChunking::rows_per_chunk`]). `None`: the default, chunks of
    /// [`LinearChunking::DEFAULT_CHUNK_ROWS`] rows. Given or default, at most the device's
    /// largest buffer ([`LinearChunking::within`]). A budget below one row of logits is
    /// an error ([`LinearChunking::validate`]). A small budget saves memory and costs time
    /// (docs/performance.md has the frontier).
    pub logits_bytes: Option<usize>,
    /// Form each chunk's weight-gradient product `h_c^T dlogits_c` a block of columns at a
    /// time, each block at most this many bytes in the dtype the sum is kept in, and add
    /// each block into the sum in place
    /// ([`LinearCrossEntropyBackend::add_into_columns`](crate::backend::LinearCrossEntropyBackend::add_into_columns)). `None`: the whole `[H, V]`
    /// product of a chunk at once, added to the sum, which holds a second `[H, V]` buffer
    /// while it is summed. A
    /// block below one column of the sum is an error ([`LinearChunking::validate`]).
    pub weight_gradient_block_bytes: Option<usize>,
    /// How the chunks' products are formed: through which kernels, in place or not, the
    /// weight gradient's sum in which dtype. Saved flat, its fields beside the two above.
    #[serde(flatten)]
    pub products: ChunkProducts,
}

/// Fewest rows in a chunk, whatever the budget.
const MIN_CHUNK_ROWS: usize = 16;

/// Rows of one matmul tile: chunks of more rows than this are a multiple of it, so that no
/// tile of the chunk's matmuls runs mostly empty.
const TILE_ROWS: usize = 128;

/// Rows of the tiles cubek-matmul's TMA kernels take on the chunks' `[rows, V]` logits and
/// gradient (its stage along M): without cuBLASLt, chunks of more rows than this are a
/// multiple of it, so that no row of tiles runs half empty. cuBLASLt's tiles are at most
/// [`TILE_ROWS`] rows: with it, chunks are a multiple of that, and a budget between two
/// multiples of 256 rows is not rounded down by 128 of them (fewer chunks, each
/// reading and writing the weight gradient's sum once).
const STAGE_ROWS: usize = 256;

impl LinearChunking {
    /// The rows of a chunk when no budget is given: enough that the weight gradient's sum,
    /// `grad_W += h_c^T dlogits_c`, stays compute-bound. That product reads and writes
    /// the whole `[H, V]` sum once per chunk for `2 H V rows` flops: with fewer rows a
    /// chunk it waits on memory (docs/performance.md has the frontier). The logits of
    /// such a chunk take `rows * V` elements: 501 MiB of bf16 for Llama 3's 128256 classes.
    pub const DEFAULT_CHUNK_ROWS: usize = 2048;

    /// The budget of one chunk's logits of `vocab` classes in `dtype`: the given one, or
    /// [`Self::DEFAULT_CHUNK_ROWS`] rows of them.
    fn logits_budget(&self, vocab: usize, dtype: DType) -> usize {
        self.logits_bytes
            .unwrap_or(Self::DEFAULT_CHUNK_ROWS * vocab.max(1) * dtype.size())
    }

    /// Rows per chunk for `rows` rows of `vocab` classes in `dtype`. The budget holds
    /// `fit` rows, rounded down to a multiple of 128, a tile's rows, with
    /// [`ChunkProducts::cublaslt`] (else of 256, cubek-matmul's stage along M, then of 128), and
    /// of 16 below that (at least 16); the rows are then
    /// spread evenly over as many chunks as that takes, each rounded up to the same
    /// multiple, so that the last chunk is not a sliver: 8192 rows that fit 1046 at a
    /// time go in 8 chunks of 1024.
    pub fn rows_per_chunk(&self, rows: usize, vocab: usize, dtype: DType) -> usize {
        let budget = self.logits_budget(vocab, dtype);
        let fit = budget / (vocab * dtype.size()).max(1);
        let steps: &[usize] = if self.products.cublaslt {
            &[TILE_ROWS]
        } else {
            &[STAGE_ROWS, TILE_ROWS]
        };
        let step = steps
            .iter()
            .copied()
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

    /// Refuses budgets that cannot cut a step of `vocab` classes over `width` hidden units
    /// in `dtype`: a given logits budget below one row of logits, a given weight-gradient
    /// block below one column of the sum (in f32 with [`ChunkProducts::f32_weight_gradient`]).
    pub fn validate(
        &self,
        width: usize,
        vocab: usize,
        dtype: DType,
    ) -> Result<(), CrossEntropyError> {
        let row_bytes = vocab * dtype.size();
        if let Some(bytes) = self.logits_bytes
            && bytes < row_bytes
        {
            return Err(CrossEntropyError::InvalidOption {
                name: "LinearChunking::logits_bytes",
                value: format!(
                    "{bytes} bytes, below one row of {vocab} {dtype:?} logits ({row_bytes} bytes)"
                ),
                expected: "at least one row of logits",
            });
        }
        let sum_dtype = self.products.weight_gradient_sum_dtype(dtype);
        let column_bytes = width * sum_dtype.size();
        if let Some(bytes) = self.weight_gradient_block_bytes
            && bytes < column_bytes
        {
            return Err(CrossEntropyError::InvalidOption {
                name: "LinearChunking::weight_gradient_block_bytes",
                value: format!(
                    "{bytes} bytes, below one column of a {width}-row {sum_dtype:?} weight gradient ({column_bytes} bytes)"
                ),
                expected: "at least one column of the weight gradient",
            });
        }
        Ok(())
    }

    /// This chunking with its logits budget for `vocab` classes in `dtype` (given or
    /// default) at most `max_buffer_bytes` (a device's largest buffer,
    /// [`crate::linear::max_buffer_bytes`]), so that a chunk's logits can be allocated.
    /// The typed functions and the module apply it before the op runs.
    pub fn within(&self, max_buffer_bytes: Option<usize>, vocab: usize, dtype: DType) -> Self {
        let budget = self.logits_budget(vocab, dtype);
        Self {
            logits_bytes: Some(max_buffer_bytes.map_or(budget, |most| budget.min(most))),
            ..*self
        }
    }

    /// Columns per block of the weight-gradient product for `width` hidden units and
    /// `vocab` classes summed in `dtype` ([`Self::weight_gradient_block_bytes`]): as many
    /// as the budget holds, a multiple of 128 (a tile's rows) when that many fit, at least
    /// one; `None` when the product is formed whole.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_below_one_row_or_column_are_refused() {
        let (width, vocab) = (64, 1000);
        let one_row = LinearChunking {
            logits_bytes: Some(vocab * 2),
            weight_gradient_block_bytes: Some(width * 2),
            ..LinearChunking::default()
        };
        assert_eq!(one_row.validate(width, vocab, DType::BF16), Ok(()));
        let name =
            |chunking: LinearChunking, dtype: DType| match chunking.validate(width, vocab, dtype) {
                Err(CrossEntropyError::InvalidOption { name, .. }) => name,
                other => panic!("expected an invalid option, got {other:?}"),
            };
        // The same budgets hold less than a row or a column of f32.
        assert_eq!(name(one_row, DType::F32), "LinearChunking::logits_bytes");
        let wide_enough_rows = LinearChunking {
            logits_bytes: None,
            ..one_row
        };
        assert_eq!(
            name(wide_enough_rows, DType::F32),
            "LinearChunking::weight_gradient_block_bytes"
        );
        let f32_sum = LinearChunking {
            products: ChunkProducts {
                f32_weight_gradient: true,
                ..ChunkProducts::default()
            },
            ..wide_enough_rows
        };
        assert_eq!(
            name(f32_sum, DType::BF16),
            "LinearChunking::weight_gradient_block_bytes"
        );
    }
}
