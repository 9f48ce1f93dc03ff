//! The op under `Autodiff<B>`, in one of two plans (see [`GradientPlan`]):
//! - two passes: forward runs the inner backend's row kernel and keeps the per-row
//!   statistics; backward hands the incoming gradient (and the mean's denominators)
//!   straight to the inner backward kernel: one launch, no scale computed on the host;
//! - one pass (`Mean`/`Sum`): forward also writes the gradient for the guessed incoming
//!   gradient (the last one the loss saw); backward rescales it on the device when the
//!   guess missed (nothing when it hit) and remembers the real one for the next call.
//!
//! Only the loss is tracked: class weights and the extra outputs get no gradient.

use burn::tensor::{
    TensorMetadata,
    backend::AutodiffBackend,
    ops::{FloatTensor, IntTensor},
};
use burn_autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};

#[cfg(doc)]
use crate::options::GradientPlan;
use crate::{
    autodiff_linear, autodiff_vocab_parallel,
    backend::{
        ClassWeights, CrossEntropyInputs, FusedCrossEntropyBackend, LossParts, OnePassScale,
        RowStats, TwoPassBackward,
    },
    incoming_guess::IncomingGuess,
    linear::{LinearChunking, LinearInputs},
    options::{CrossEntropyError, CrossEntropyOptions},
    target_check::PendingRead,
    vocab_parallel::{ShardExchange, VocabShard},
};

/// What backward needs.
#[derive(Debug, Clone)]
enum CrossEntropyState<B: FusedCrossEntropyBackend> {
    /// The inputs (the logits owned, so they can become the gradient), the per-row
    /// statistics and, for `Mean`, the denominators.
    TwoPass {
        inputs: CrossEntropyInputs<B>,
        stats: FloatTensor<B>,
        denominators: Option<FloatTensor<B>>,
        options: CrossEntropyOptions,
    },
    /// The gradient the one pass wrote for the incoming gradient `guess` (f32 `[1]`), and
    /// where the real one is remembered for the next call on `device`.
    OnePass {
        grad: FloatTensor<B>,
        guess: FloatTensor<B>,
        memory: IncomingGuess,
        device: B::Device,
    },
}

#[derive(Debug)]
struct FusedCrossEntropyBackward;

impl<B: FusedCrossEntropyBackend> Backward<B, 1> for FusedCrossEntropyBackward {
    type State = CrossEntropyState<B>;

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
        let grad_logits = match ops.state {
            CrossEntropyState::TwoPass {
                inputs,
                stats,
                denominators,
                options,
            } => B::cross_entropy_backward(
                inputs,
                TwoPassBackward {
                    stats,
                    grad_output,
                    denominators,
                },
                &options,
            ),
            CrossEntropyState::OnePass {
                grad,
                guess,
                memory,
                device,
            } => {
                let (grad, next) = B::scale_one_pass_gradient(grad, grad_output, guess);
                memory.remember::<B>(&device, next);
                grad
            }
        };
        grads.register::<B>(logits_node.id, grad_logits);
    }
}

/// Whether the one pass applies: asked for, a scalar incoming gradient, and at least one
/// row.
fn takes_one_pass<B: FusedCrossEntropyBackend>(
    logits: &FloatTensor<B>,
    options: &CrossEntropyOptions,
) -> bool {
    let shape = logits.shape();
    let rows: usize = shape.iter().take(shape.num_dims() - 1).product();
    options.one_pass() && rows > 0
}

/// The inner backend's inputs, the logits' autodiff node left behind.
fn inner_inputs<B: FusedCrossEntropyBackend, C: CheckpointStrategy>(
    inputs: CrossEntropyInputs<Autodiff<B, C>>,
) -> CrossEntropyInputs<B> {
    CrossEntropyInputs {
        logits: inputs.logits.primitive,
        targets: inputs.targets,
        class_weights: inputs.class_weights.map(|w| ClassWeights {
            weights: w.weights.primitive,
            total: w.total.primitive,
        }),
    }
}

impl<B: FusedCrossEntropyBackend, C: CheckpointStrategy> FusedCrossEntropyBackend
    for Autodiff<B, C>
{
    fn cross_entropy_rows(
        inputs: CrossEntropyInputs<Self>,
        options: &CrossEntropyOptions,
    ) -> RowStats<Self> {
        let rows = B::cross_entropy_rows(inner_inputs(inputs), options);
        RowStats {
            stats: Self::from_inner(rows.stats),
            predicted: rows.predicted,
            weighted: rows.weighted,
        }
    }

    fn first_bad_target(
        targets: IntTensor<Self>,
        vocab: usize,
        ignore_index: i64,
    ) -> IntTensor<Self> {
        B::first_bad_target(targets, vocab, ignore_index)
    }

    fn fused_linear_cross_entropy(
        inputs: LinearInputs<Self>,
        options: &CrossEntropyOptions,
        chunking: &LinearChunking,
        guess: &IncomingGuess,
    ) -> LossParts<Self> {
        match inputs.head.bias {
            Some(_) => autodiff_linear::fused_linear_cross_entropy::<B, C, 3>(
                inputs, options, chunking, guess,
            ),
            None => autodiff_linear::fused_linear_cross_entropy::<B, C, 2>(
                inputs, options, chunking, guess,
            ),
        }
    }

    fn vocab_parallel_cross_entropy<E: ShardExchange>(
        inputs: CrossEntropyInputs<Self>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
        exchange: &E,
    ) -> Result<LossParts<Self>, CrossEntropyError> {
        autodiff_vocab_parallel::vocab_parallel_cross_entropy::<B, C, E>(
            inputs, shard, options, exchange,
        )
    }

    fn start_read(tensor: IntTensor<Self>) -> PendingRead {
        B::start_read(tensor)
    }

    fn max_buffer_bytes(device: &B::Device) -> Option<usize> {
        B::max_buffer_bytes(device)
    }

    fn start_target_check(
        targets: IntTensor<Self>,
        vocab: usize,
        ignore_index: i64,
    ) -> PendingRead {
        B::start_target_check(targets, vocab, ignore_index)
    }

    fn cross_entropy_backward(
        inputs: CrossEntropyInputs<Self>,
        backward: TwoPassBackward<Self>,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        let backward = TwoPassBackward {
            stats: backward.stats.primitive,
            grad_output: backward.grad_output.primitive,
            denominators: backward.denominators.map(|d| d.primitive),
        };
        Self::from_inner(B::cross_entropy_backward(
            inner_inputs(inputs),
            backward,
            options,
        ))
    }

    fn fused_cross_entropy(
        inputs: CrossEntropyInputs<Self>,
        options: &CrossEntropyOptions,
        memory: &IncomingGuess,
    ) -> LossParts<Self> {
        let dtype = inputs.logits.primitive.dtype();
        let node = inputs.logits.node.clone();
        let one_pass = takes_one_pass::<B>(&inputs.logits.primitive, options);
        // Referenced until this op's node is registered below (see
        // `fused_linear_cross_entropy`).
        let _logits_referenced = inputs.logits.rc.clone();
        let inputs = inner_inputs(inputs);
        let (loss, parts) = match FusedCrossEntropyBackward
            .prepare::<C>([node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) if one_pass => {
                // The logits move into the op: with no other holder, their memory becomes
                // the gradient.
                let device = B::float_device(&inputs.logits);
                let guess = memory.guess::<B>(&device);
                let scale = OnePassScale {
                    guess: guess.clone(),
                    denominators: None,
                };
                let (rows, grad) = B::cross_entropy_one_pass(inputs, scale, options);
                let parts = B::reduce_row_stats(rows, options, dtype, false).parts;
                let state = CrossEntropyState::OnePass {
                    grad,
                    guess,
                    memory: memory.clone(),
                    device,
                };
                (prep.finish(state, parts.loss.clone()), parts)
            }
            OpsKind::Tracked(prep) => {
                // The state takes the only other handle on the logits: once the caller's
                // tensor is dropped, backward may overwrite them with their gradient.
                let rows = B::cross_entropy_rows(inputs.clone(), options);
                let stats = rows.stats.clone();
                let reduced = B::reduce_row_stats(rows, options, dtype, true);
                let state = CrossEntropyState::TwoPass {
                    inputs,
                    stats,
                    denominators: reduced.denominators,
                    options: options.clone(),
                };
                let parts = reduced.parts;
                (prep.finish(state, parts.loss.clone()), parts)
            }
            OpsKind::UnTracked(prep) => {
                let parts = B::fused_cross_entropy(inputs, options, memory);
                (prep.finish(parts.loss.clone()), parts)
            }
        };
        LossParts {
            loss,
            z_loss: parts.z_loss.map(Self::from_inner),
            accuracy: parts.accuracy.map(Self::from_inner),
            predicted: parts.predicted,
            lse: parts.lse.map(Self::from_inner),
        }
    }
}
