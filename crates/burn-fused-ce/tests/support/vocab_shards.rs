//! What the vocabulary-parallel tests share, the crate's smoke test
//! (`tests/vocab_parallel_smoke.rs`) and the workspace's suite
//! (`crates/fused-ce-suite/tests/suite/vocab_parallel/`) alike: a shard's columns of the whole logits, and a
//! call's outputs flattened to rank 1. Included by each with `#[path = ...] mod
//! vocab_shards;`.

use burn::tensor::{Int, Tensor};
use burn_fused_ce::CrossEntropyOutput;

/// The columns `range` of a row-major `[rows, vocab]` matrix.
pub fn columns(values: &[f32], vocab: usize, range: std::ops::Range<usize>) -> Vec<f32> {
    values
        .chunks(vocab)
        .flat_map(|row| row[range.clone()].to_vec())
        .collect()
}

/// The outputs of one call, flattened to rank 1.
pub struct Flat {
    pub loss: Tensor<1>,
    pub z_loss: Option<Tensor<1>>,
    pub accuracy: Option<Tensor<1>>,
    pub predicted: Option<Tensor<1, Int>>,
    pub lse: Option<Tensor<1>>,
}

impl Flat {
    /// `output`'s loss, z-loss, accuracy, predictions and log-sum-exps, each of rank 1.
    pub fn of<const DT: usize>(output: CrossEntropyOutput<DT>) -> Self {
        let flat = |tensor: Tensor<DT>| {
            let elements = tensor.dims().iter().product::<usize>();
            tensor.reshape([elements])
        };
        Flat {
            loss: flat(output.loss),
            z_loss: output.z_loss.map(flat),
            accuracy: output.accuracy,
            predicted: output.predicted.map(|predicted| {
                let elements = predicted.dims().iter().product::<usize>();
                predicted.reshape([elements])
            }),
            lse: output.lse.map(flat),
        }
    }
}
