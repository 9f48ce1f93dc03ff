//! The vocabulary-parallel loss under `Autodiff<B, C>`: the shard ops run on the inner
//! backend (their outputs are constants); the loss keeps the whole vocabulary's per-row
//! statistics and, in backward, writes this shard's gradient from them, with no exchange.
//!
//! Only the loss is tracked: class weights and the extra outputs get no gradient.

use burn::backend::{
    AutodiffBackend, TensorMetadata,
    autodiff::{
        Autodiff,
        checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
        grads::Gradients,
        ops::{Backward, Ops, OpsKind},
    },
    tensor::FloatTensor,
};

use crate::autodiff_conversions::{
    inner_inputs, inner_optional, inner_rows, inner_weights, outer_optional, outer_parts,
    outer_rows,
};
use crate::options::CrossEntropyOptions;
use crate::values::{CrossEntropyInputs, LossParts, OptionalFloat, RowStats, RowWeights};
use crate::vocab_parallel::extension::VocabParallelBackend;
use crate::vocab_parallel::extension_types::{
    ExchangedRows, KernelBackwardRows, ShardBackwardRows,
};
use crate::vocab_parallel::gradient::shard_gradient;
use crate::vocab_parallel::shard::VocabShard;

/// What backward needs: the shard's inputs (the logits owned, so they can become the
/// gradient), the whole vocabulary's statistics and, for `Mean`, the denominators.
#[derive(Debug, Clone)]
struct ShardState<B: VocabParallelBackend> {
    inputs: CrossEntropyInputs<B>,
    stats: FloatTensor<B>,
    denominators: OptionalFloat<B>,
    shard: VocabShard,
    options: CrossEntropyOptions,
}

#[derive(Debug)]
struct VocabParallelBackward;

impl<B: VocabParallelBackend> Backward<B, 1> for VocabParallelBackward {
    type State = ShardState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let [logits_node] = ops.parents;
        let grad_output = grads.consume::<B>(&ops.node);
        let Some(logits_node) = logits_node else {
            return;
        };
        let state = ops.state;
        let grad = shard_gradient::<B>(
            state.inputs,
            state.stats,
            grad_output,
            state.denominators,
            &state.shard,
            &state.options,
        );
        grads.register::<B>(logits_node.id, grad);
    }
}

impl<B: VocabParallelBackend, C: CheckpointStrategy> VocabParallelBackend for Autodiff<B, C> {
    fn shard_contributions(
        inputs: CrossEntropyInputs<Self>,
        shard: VocabShard,
        options: CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::shard_contributions(inner_inputs(inputs), shard, options))
    }

    fn whole_vocabulary_rows(
        exchanged: ExchangedRows<Self>,
        shard: VocabShard,
        options: CrossEntropyOptions,
    ) -> RowStats<Self> {
        let exchanged = ExchangedRows {
            summed: exchanged.summed.into_primitive(),
            targets: exchanged.targets,
            class_weights: inner_weights(exchanged.class_weights),
            shard_totals: inner_optional(exchanged.shard_totals),
        };
        outer_rows(B::whole_vocabulary_rows(exchanged, shard, options))
    }

    fn shard_gradient_rows(
        inputs: ShardBackwardRows<Self>,
        shard: VocabShard,
        options: CrossEntropyOptions,
    ) -> KernelBackwardRows<Self> {
        let inputs = ShardBackwardRows {
            stats: inputs.stats.into_primitive(),
            targets: inputs.targets,
            logits: inputs.logits.into_primitive(),
            grad_output: inputs.grad_output.into_primitive(),
            denominators: inner_optional(inputs.denominators),
            weight_total: inner_optional(inputs.weight_total),
        };
        let rows = B::shard_gradient_rows(inputs, shard, options);
        KernelBackwardRows {
            targets: rows.targets,
            stats: Self::from_inner(rows.stats),
            coefficients: Self::from_inner(rows.coefficients),
            smooth: outer_optional(rows.smooth),
        }
    }

    fn vocab_parallel_cross_entropy(
        inputs: CrossEntropyInputs<Self>,
        rows: RowStats<Self>,
        shard: VocabShard,
        options: CrossEntropyOptions,
    ) -> LossParts<Self> {
        let (logits, node) = inputs.logits.into_parts();
        let dtype = logits.dtype();
        let inputs = CrossEntropyInputs {
            logits,
            targets: inputs.targets,
            class_weights: inner_weights(inputs.class_weights),
            row_weights: RowWeights::none(),
        };
        let rows = inner_rows(rows);
        // The node guard keeps the logits' node referenced until this op's node is
        // registered.
        let (loss, parts) = match VocabParallelBackward
            .prepare::<C>([node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                // The state takes the only other handle on the logits: once the caller's
                // tensor is dropped, backward may overwrite them with their gradient.
                let stats = rows.stats.clone();
                let reduced =
                    B::reduce_row_stats(rows, RowWeights::none(), options.clone(), dtype, true);
                let state = ShardState {
                    inputs,
                    stats,
                    denominators: reduced.denominators,
                    shard,
                    options,
                };
                let parts = reduced.parts;
                (prep.finish(state, parts.loss.clone()), parts)
            }
            OpsKind::UnTracked(prep) => {
                let parts = B::vocab_parallel_cross_entropy(inputs, rows, shard, options);
                (prep.finish(parts.loss.clone()), parts)
            }
        };
        outer_parts(loss, parts)
    }
}
