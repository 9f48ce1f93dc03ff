//! The op under `Autodiff<B>`, in one of two plans (see [`GradientPlan`]):
//! - two passes: forward runs the inner backend's row kernel and keeps the per-row
//!   statistics; backward hands the incoming gradient (and the mean's denominators)
//!   straight to the inner backward kernel: one launch, no scale computed on the host;
//! - one pass (`Mean`/`Sum`): forward also writes the gradient for an incoming gradient
//!   of 1; backward rescales it on the device (nothing when it is 1).
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
    backend::{
        ClassWeights, CrossEntropyInputs, FusedCrossEntropyBackend, LossParts, RowStats,
        TwoPassBackward,
    },
    options::CrossEntropyOptions,
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
    /// The gradient the one pass wrote for an incoming gradient of 1.
    OnePass { grad: FloatTensor<B> },
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
            CrossEntropyState::OnePass { grad } => B::scale_one_pass_gradient(grad, grad_output),
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
    ) -> LossParts<Self> {
        let dtype = inputs.logits.primitive.dtype();
        let node = inputs.logits.node.clone();
        let one_pass = takes_one_pass::<B>(&inputs.logits.primitive, options);
        let inputs = inner_inputs(inputs);
        let (loss, parts) = match FusedCrossEntropyBackward
            .prepare::<C>([node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) if one_pass => {
                // The logits move into the op: with no other holder, their memory becomes
                // the gradient.
                let (rows, grad) = B::cross_entropy_one_pass(inputs, options);
                let parts = B::reduce_row_stats(rows, options, dtype, false).parts;
                let state = CrossEntropyState::OnePass { grad };
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
                let parts = B::fused_cross_entropy(inputs, options);
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
