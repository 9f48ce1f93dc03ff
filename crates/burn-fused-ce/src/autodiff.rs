//! The op under `Autodiff<B>`: forward runs the inner backend's row kernel and keeps the
//! row log-sum-exp; backward turns the incoming gradient into a per-row (or shared) scale
//! on the device and runs the inner backward kernel once.

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

use crate::{
    backend::{FusedCrossEntropyBackend, RowStats, SavedRows, gradient_scale, reduce_rows},
    options::CrossEntropyOptions,
};

/// What backward needs: the logits (owned, so they can become the gradient), the targets,
/// the saved rows and, for `Mean`, the denominator.
#[derive(Debug, Clone)]
struct CrossEntropyState<B: FusedCrossEntropyBackend> {
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
    saved: SavedRows<B>,
    mean_denominator: Option<FloatTensor<B>>,
    options: CrossEntropyOptions,
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
        let state = ops.state;
        let grad_scale = gradient_scale::<B>(grad_output, state.mean_denominator);
        let grad_logits = B::cross_entropy_rows_backward(
            state.logits,
            state.targets,
            state.saved,
            grad_scale,
            &state.options,
        );
        grads.register::<B>(logits_node.id, grad_logits);
    }
}

impl<B: FusedCrossEntropyBackend, C: CheckpointStrategy> FusedCrossEntropyBackend
    for Autodiff<B, C>
{
    fn cross_entropy_rows(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        options: &CrossEntropyOptions,
    ) -> RowStats<Self> {
        let rows = B::cross_entropy_rows(logits.primitive, targets, options);
        RowStats {
            loss: Self::from_inner(rows.loss),
            valid: Self::from_inner(rows.valid),
            saved: SavedRows {
                lse: Self::from_inner(rows.saved.lse),
                target_grad: Self::from_inner(rows.saved.target_grad),
            },
        }
    }

    fn cross_entropy_rows_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        saved: SavedRows<Self>,
        grad_scale: FloatTensor<Self>,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        let saved = SavedRows {
            lse: saved.lse.primitive,
            target_grad: saved.target_grad.primitive,
        };
        Self::from_inner(B::cross_entropy_rows_backward(
            logits.primitive,
            targets,
            saved,
            grad_scale.primitive,
            options,
        ))
    }

    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        let dtype = logits.primitive.dtype();
        match FusedCrossEntropyBackward
            .prepare::<C>([logits.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                // The state takes the only other handle on the logits: once the caller's
                // tensor is dropped, backward may overwrite them with their gradient.
                let logits = logits.primitive;
                let rows = B::cross_entropy_rows(logits.clone(), targets.clone(), options);
                let reduced = reduce_rows::<B>(rows.loss, rows.valid, options.reduction, dtype);
                let state = CrossEntropyState {
                    logits,
                    targets,
                    saved: rows.saved,
                    mean_denominator: reduced.mean_denominator,
                    options: options.clone(),
                };
                prep.finish(state, reduced.loss)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::fused_cross_entropy(logits.primitive, targets, options))
            }
        }
    }
}
