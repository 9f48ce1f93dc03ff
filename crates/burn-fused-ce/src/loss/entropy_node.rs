//! The entropy output as a node of Burn's autodiff graph, so that an objective using it
//! (an RL entropy bonus) differentiates through it. Only a differentiable entropy
//! (`EntropyOutput::Differentiable`, decided at forward, which keeps the logits for
//! backward) becomes one; a metric entropy is a constant. The node is a child of the loss's own
//! node: Burn runs a child's backward step before its parent's, so the entropy's
//! incoming gradient is handed to the loss's step, which forms one gradient over the
//! logits for both (no second pass over `N x V`). The entropy's node gives the loss's
//! node a zero gradient, so that the loss's step runs even when the objective uses the
//! entropy alone.

use std::sync::{Arc, Mutex};

use burn::backend::{
    Backend, TensorMetadata,
    autodiff::{
        Autodiff,
        checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
        grads::Gradients,
        ops::{Backward, Ops, OpsKind},
    },
    tensor::FloatTensor,
};
use burn::tensor::{DType, Shape};

use crate::autodiff_conversions::outer_parts;
use crate::primitive::FloatOf;
use crate::values::{LossParts, OptionalFloat};

/// Where the entropy's step leaves its incoming gradient (f32 `[N]`) for the loss's step.
/// Clones share it.
#[derive(Debug, Clone)]
pub(crate) struct EntropyGradient<B: Backend>(Arc<Mutex<Option<FloatTensor<B>>>>);

impl<B: Backend> EntropyGradient<B> {
    pub(crate) fn new() -> Self {
        Self(Arc::new(Mutex::new(None)))
    }

    fn put(&self, grad: FloatTensor<B>) {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(grad);
    }

    /// The entropy's incoming gradient, when the objective used the entropy.
    pub(crate) fn take(&self) -> Option<FloatTensor<B>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

#[derive(Debug, Clone)]
struct EntropyState<B: Backend> {
    gradient: EntropyGradient<B>,
    loss_shape: Shape,
    loss_dtype: DType,
    device: B::Device,
}

#[derive(Debug)]
struct EntropyBackward;

impl<B: Backend> Backward<B, 1> for EntropyBackward {
    type State = EntropyState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let grad = grads.consume::<B>(&ops.node);
        let state = ops.state;
        state
            .gradient
            .put(FloatOf::<B, 1>::flat_f32(grad).into_primitive());
        let [loss_node] = ops.parents;
        if let Some(loss_node) = loss_node {
            let zeros = FloatOf::<B, 1>::zeros(
                [state.loss_shape.num_elements()],
                &state.device,
                state.loss_dtype,
            );
            grads.register::<B>(
                loss_node.id,
                B::float_reshape(zeros.into_primitive(), state.loss_shape),
            );
        }
    }
}

/// The per-row `entropy` (f32 `[N]`) as a tracked tensor whose parent is the tracked
/// `loss`; its incoming gradient goes to `gradient`.
fn tracked_entropy<B: Backend, C: CheckpointStrategy>(
    loss: &FloatTensor<Autodiff<B, C>>,
    entropy: FloatTensor<B>,
    gradient: EntropyGradient<B>,
) -> FloatTensor<Autodiff<B, C>> {
    let state = EntropyState {
        gradient,
        loss_shape: loss.shape(),
        loss_dtype: loss.dtype(),
        device: entropy.device(),
    };
    let (_, loss_node) = loss.clone().into_parts();
    match EntropyBackward
        .prepare::<C>([loss_node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state, entropy),
        OpsKind::UnTracked(prep) => prep.finish(entropy),
    }
}

/// [`outer_parts`] with the entropy tracked as a child of the tracked `loss`, its
/// incoming gradient handed to `gradient` for the loss's backward step.
pub(crate) fn outer_parts_with_entropy<B: Backend, C: CheckpointStrategy>(
    loss: FloatTensor<Autodiff<B, C>>,
    mut parts: LossParts<B>,
    gradient: EntropyGradient<B>,
) -> LossParts<Autodiff<B, C>> {
    let entropy = parts.entropy.into_option();
    parts.entropy = OptionalFloat::Absent;
    let entropy = entropy.map(|entropy| tracked_entropy::<B, C>(&loss, entropy, gradient));
    LossParts {
        entropy: OptionalFloat::from_option(entropy),
        ..outer_parts(loss, parts)
    }
}
