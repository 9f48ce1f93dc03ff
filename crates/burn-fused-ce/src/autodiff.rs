//! The op under `Autodiff<B>`, two plans:
//!
//! - `Mean`/`Sum` (a scalar incoming gradient): forward also forms the gradient for an
//!   incoming gradient of 1, over the logits when nothing else holds them (one read, one
//!   write); backward multiplies it by the incoming gradient, which the kernel skips on the
//!   device when that is 1 (the usual `loss.backward()`).
//! - `None` (a per-row incoming gradient, unknown at forward time): forward keeps each
//!   row's log-sum-exp; backward forms the per-row scale on the device and writes the
//!   gradient in one pass.

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
    backend::{
        FusedCrossEntropyBackend, RowStats, SavedRows, forward_gradient_scale, gradient_scale,
        reduce_rows,
    },
    options::{CrossEntropyOptions, Reduction},
};

/// What backward needs.
#[derive(Debug, Clone)]
enum CrossEntropyState<B: FusedCrossEntropyBackend> {
    /// The gradient for an incoming gradient of 1, formed in forward.
    Formed { grad: FloatTensor<B> },
    /// The logits (owned, so they can become the gradient), the targets, the saved rows
    /// and, for `Mean`, the denominator.
    Recompute {
        logits: FloatTensor<B>,
        targets: IntTensor<B>,
        saved: SavedRows<B>,
        mean_denominator: Option<FloatTensor<B>>,
        options: CrossEntropyOptions,
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
            CrossEntropyState::Formed { grad } => {
                B::cross_entropy_scale_gradient(grad, gradient_scale::<B>(grad_output, None))
            }
            CrossEntropyState::Recompute {
                logits,
                targets,
                saved,
                mean_denominator,
                options,
            } => {
                let grad_scale = gradient_scale::<B>(grad_output, mean_denominator);
                B::cross_entropy_rows_backward(logits, targets, saved, grad_scale, &options)
            }
        };
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
            OpsKind::Tracked(prep) if options.reduction != Reduction::None => {
                // Moved in: when the caller kept no clone, the kernel writes the gradient
                // over the logits.
                let grad_scale = forward_gradient_scale::<B>(targets.clone(), options);
                let (rows, grad) =
                    B::cross_entropy_rows_with_grad(logits.primitive, targets, grad_scale, options);
                let reduced = reduce_rows::<B>(rows.loss, rows.valid, options.reduction, dtype);
                prep.finish(CrossEntropyState::Formed { grad }, reduced.loss)
            }
            OpsKind::Tracked(prep) => {
                // The state takes the only other handle on the logits: once the caller's
                // tensor is dropped, backward may overwrite them with their gradient.
                let logits = logits.primitive;
                let rows = B::cross_entropy_rows(logits.clone(), targets.clone(), options);
                let reduced = reduce_rows::<B>(rows.loss, rows.valid, options.reduction, dtype);
                let state = CrossEntropyState::Recompute {
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
