//! The vocabulary-parallel loss under `Autodiff<B>`: forward computes the whole
//! vocabulary's per-row statistics on the inner backend (one exchange between shards) and
//! keeps them; backward writes this shard's gradient from them, with no exchange.

use burn::tensor::{TensorMetadata, backend::AutodiffBackend, ops::FloatTensor};
use burn_autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};

use crate::{
    backend::{ClassWeights, CrossEntropyInputs, FusedCrossEntropyBackend, LossParts},
    options::{CrossEntropyError, CrossEntropyOptions},
    vocab_parallel::{ShardExchange, VocabShard, shard_gradient, shard_rows},
};

/// What backward needs: the shard's inputs, the whole vocabulary's statistics and, for
/// `Mean`, the denominators.
#[derive(Debug, Clone)]
struct ShardState<B: FusedCrossEntropyBackend> {
    inputs: CrossEntropyInputs<B>,
    stats: FloatTensor<B>,
    denominators: Option<FloatTensor<B>>,
    shard: VocabShard,
    options: CrossEntropyOptions,
}

#[derive(Debug)]
struct VocabParallelBackward;

impl<B: FusedCrossEntropyBackend> Backward<B, 1> for VocabParallelBackward {
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

/// The op on `Autodiff<B>`: forward on `B`, the node registered when the logits are
/// tracked.
pub(crate) fn vocab_parallel_cross_entropy<
    B: FusedCrossEntropyBackend,
    C: CheckpointStrategy,
    E: ShardExchange,
>(
    inputs: CrossEntropyInputs<Autodiff<B, C>>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
    exchange: &E,
) -> Result<LossParts<Autodiff<B, C>>, CrossEntropyError> {
    let dtype = inputs.logits.primitive.dtype();
    let node = inputs.logits.node.clone();
    // Referenced until this op's node is registered below (see
    // `crate::autodiff_linear::fused_linear_cross_entropy`): the exchange waits on other
    // threads, whose backward may end meanwhile.
    let _logits_referenced = inputs.logits.rc.clone();
    let inner = CrossEntropyInputs {
        logits: inputs.logits.primitive,
        targets: inputs.targets,
        class_weights: inputs.class_weights.map(|w| ClassWeights {
            weights: w.weights.primitive,
            total: w.total.primitive,
        }),
    };
    let rows = shard_rows::<B, E>(inner.clone(), shard, options, exchange)?;
    let stats = rows.stats.clone();
    let (loss, parts) = match VocabParallelBackward
        .prepare::<C>([node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let reduced = B::reduce_row_stats(rows, options, dtype, true);
            let state = ShardState {
                inputs: inner,
                stats,
                denominators: reduced.denominators,
                shard: *shard,
                options: options.clone(),
            };
            let parts = reduced.parts;
            (prep.finish(state, parts.loss.clone()), parts)
        }
        OpsKind::UnTracked(prep) => {
            let parts = B::reduce_row_stats(rows, options, dtype, false).parts;
            (prep.finish(parts.loss.clone()), parts)
        }
    };
    Ok(LossParts {
        loss,
        z_loss: parts.z_loss.map(Autodiff::<B, C>::from_inner),
        accuracy: parts.accuracy.map(Autodiff::<B, C>::from_inner),
        predicted: parts.predicted,
        lse: parts.lse.map(Autodiff::<B, C>::from_inner),
    })
}
