//! The op under `Autodiff<B>`, in one of two plans (see
//! [`CrossEntropyOptions::gradient_in_forward`]):
//! - statistics: forward runs the inner backend's row kernel and keeps the per-row
//!   statistics; backward hands the incoming gradient (and the mean's denominators)
//!   straight to the inner backward kernel: one launch, no scale computed on the host;
//! - formed gradient (`Mean`/`Sum`): forward also writes the gradient for an incoming
//!   gradient of 1; backward rescales it on the device (nothing when it is 1).
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

use crate::{
    backend::{ClassWeights, FusedCrossEntropyBackend, LossParts, RowStats},
    options::{CrossEntropyOptions, Reduction},
};

/// What backward needs.
#[derive(Debug, Clone)]
enum CrossEntropyState<B: FusedCrossEntropyBackend> {
    /// The logits (owned, so they can become the gradient), the targets, the weights, the
    /// per-row statistics and, for `Mean`, the denominators.
    Rows {
        logits: FloatTensor<B>,
        targets: IntTensor<B>,
        class_weights: Option<ClassWeights<B>>,
        stats: FloatTensor<B>,
        denominators: Option<FloatTensor<B>>,
        options: CrossEntropyOptions,
    },
    /// The gradient forward wrote for an incoming gradient of 1.
    Formed { grad: FloatTensor<B> },
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
            CrossEntropyState::Rows {
                logits,
                targets,
                class_weights,
                stats,
                denominators,
                options,
            } => B::cross_entropy_rows_backward(
                logits,
                targets,
                class_weights,
                stats,
                grad_output,
                denominators,
                &options,
            ),
            CrossEntropyState::Formed { grad } => B::scale_formed_gradient(grad, grad_output),
        };
        grads.register::<B>(logits_node.id, grad_logits);
    }
}

/// Whether the forward-formed plan applies: asked for, a scalar incoming gradient, and
/// at least one row.
fn forms_gradient<B: FusedCrossEntropyBackend>(
    logits: &FloatTensor<B>,
    options: &CrossEntropyOptions,
) -> bool {
    let shape = logits.shape();
    let rows: usize = shape.iter().take(shape.num_dims() - 1).product();
    options.gradient_in_forward && options.reduction != Reduction::None && rows > 0
}

fn inner_weights<B: FusedCrossEntropyBackend, C: CheckpointStrategy>(
    weights: Option<ClassWeights<Autodiff<B, C>>>,
) -> Option<ClassWeights<B>> {
    weights.map(|w| ClassWeights {
        weights: w.weights.primitive,
        total: w.total.primitive,
    })
}

impl<B: FusedCrossEntropyBackend, C: CheckpointStrategy> FusedCrossEntropyBackend
    for Autodiff<B, C>
{
    fn cross_entropy_rows(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        class_weights: Option<ClassWeights<Self>>,
        options: &CrossEntropyOptions,
    ) -> RowStats<Self> {
        let rows = B::cross_entropy_rows(
            logits.primitive,
            targets,
            inner_weights(class_weights),
            options,
        );
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

    fn cross_entropy_rows_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        class_weights: Option<ClassWeights<Self>>,
        stats: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        denominators: Option<FloatTensor<Self>>,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::cross_entropy_rows_backward(
            logits.primitive,
            targets,
            inner_weights(class_weights),
            stats.primitive,
            grad_output.primitive,
            denominators.map(|d| d.primitive),
            options,
        ))
    }

    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        class_weights: Option<ClassWeights<Self>>,
        options: &CrossEntropyOptions,
    ) -> LossParts<Self> {
        let dtype = logits.primitive.dtype();
        let class_weights = inner_weights(class_weights);
        let (loss, parts) = match FusedCrossEntropyBackward
            .prepare::<C>([logits.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) if forms_gradient::<B>(&logits.primitive, options) => {
                // The logits move into the op: with no other holder, their memory becomes
                // the gradient.
                let (rows, grad) = B::cross_entropy_rows_with_grad(
                    logits.primitive,
                    targets,
                    class_weights,
                    options,
                );
                let parts = B::reduce_row_stats(rows, options, dtype, false).parts;
                let state = CrossEntropyState::Formed { grad };
                (prep.finish(state, parts.loss.clone()), parts)
            }
            OpsKind::Tracked(prep) => {
                // The state takes the only other handle on the logits: once the caller's
                // tensor is dropped, backward may overwrite them with their gradient.
                let logits = logits.primitive;
                let rows = B::cross_entropy_rows(
                    logits.clone(),
                    targets.clone(),
                    class_weights.clone(),
                    options,
                );
                let stats = rows.stats.clone();
                let reduced = B::reduce_row_stats(rows, options, dtype, true);
                let state = CrossEntropyState::Rows {
                    logits,
                    targets,
                    class_weights,
                    stats,
                    denominators: reduced.denominators,
                    options: options.clone(),
                };
                let parts = reduced.parts;
                (prep.finish(state, parts.loss.clone()), parts)
            }
            OpsKind::UnTracked(prep) => {
                let parts =
                    B::fused_cross_entropy(logits.primitive, targets, class_weights, options);
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
