//! The fused linear cross-entropy under `Autodiff<B>`: one node whose parents are the
//! hidden states, the weight and, when there is one, the bias.
//! - `Mean`/`Sum`: forward runs the one pass over every chunk and forms all three
//!   gradients for the guessed incoming gradient; backward rescales them when the guess
//!   missed and remembers the real one.
//! - `None`: forward keeps the per-row statistics; backward computes each chunk's logits
//!   again with the per-row incoming gradient.
//!
//! [`crate::GradientPlan`] does not apply: with `Mean`/`Sum` the gradients are always
//! formed in forward.

use burn::tensor::{TensorMetadata, backend::AutodiffBackend, ops::FloatTensor};
use burn_autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};

use crate::{
    backend::{ClassWeights, FusedCrossEntropyBackend, LossParts},
    incoming_guess::IncomingGuess,
    linear::{
        LinearChunking, LinearGradients, LinearHead, LinearInputs, linear_backward,
        linear_one_pass, linear_rows,
    },
    options::{CrossEntropyOptions, Reduction},
};

/// What backward needs.
#[derive(Debug, Clone)]
enum LinearState<B: FusedCrossEntropyBackend> {
    /// The gradients the one pass formed for the incoming gradient `guess`, and where the
    /// real one is remembered for the next call on `device`.
    OnePass {
        grads: LinearGradients<B>,
        guess: FloatTensor<B>,
        memory: IncomingGuess,
        device: B::Device,
    },
    /// The inputs and forward's per-row statistics.
    Rows {
        inputs: LinearInputs<B>,
        stats: FloatTensor<B>,
        options: CrossEntropyOptions,
        chunking: LinearChunking,
    },
}

/// The node; `N` is 3 with a bias, else 2.
#[derive(Debug)]
struct FusedLinearCrossEntropyBackward<const N: usize>;

/// `grad * g / guess` for a gradient of any rank (the scale works on rows), and the next
/// guess.
fn rescaled<B: FusedCrossEntropyBackend>(
    grad: FloatTensor<B>,
    grad_output: &FloatTensor<B>,
    guess: &FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let shape = grad.shape();
    let rows = if shape.num_dims() == 1 {
        B::float_reshape(grad, burn::tensor::Shape::new([1, shape[0]]))
    } else {
        grad
    };
    let (scaled, next) = B::scale_one_pass_gradient(rows, grad_output.clone(), guess.clone());
    (B::float_reshape(scaled, shape), next)
}

impl<B: FusedCrossEntropyBackend, const N: usize> Backward<B, N>
    for FusedLinearCrossEntropyBackward<N>
{
    type State = LinearState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let grad_output = grads.consume::<B>(&ops.node);
        if ops.parents.iter().all(Option::is_none) {
            return;
        }
        let gradients = match ops.state {
            LinearState::OnePass {
                grads: formed,
                guess,
                memory,
                device,
            } => {
                let (weight, next) = rescaled::<B>(formed.weight, &grad_output, &guess);
                memory.remember::<B>(&device, next);
                LinearGradients {
                    hidden: rescaled::<B>(formed.hidden, &grad_output, &guess).0,
                    weight,
                    bias: formed
                        .bias
                        .map(|bias| rescaled::<B>(bias, &grad_output, &guess).0),
                }
            }
            LinearState::Rows {
                inputs,
                stats,
                options,
                chunking,
            } => linear_backward::<B>(inputs, stats, grad_output, &options, &chunking),
        };
        let [hidden, weight, bias] = [
            Some(gradients.hidden),
            Some(gradients.weight),
            gradients.bias,
        ];
        for (parent, grad) in ops.parents.iter().zip([hidden, weight, bias]) {
            if let (Some(parent), Some(grad)) = (parent, grad) {
                grads.register::<B>(parent.id, grad);
            }
        }
    }
}

/// The inner backend's inputs, the autodiff nodes left behind.
fn inner_inputs<B: FusedCrossEntropyBackend, C: CheckpointStrategy>(
    inputs: LinearInputs<Autodiff<B, C>>,
) -> LinearInputs<B> {
    LinearInputs {
        hidden: inputs.hidden.primitive,
        head: LinearHead {
            weight: inputs.head.weight.primitive,
            bias: inputs.head.bias.map(|bias| bias.primitive),
        },
        targets: inputs.targets,
        class_weights: inputs.class_weights.map(|w| ClassWeights {
            weights: w.weights.primitive,
            total: w.total.primitive,
        }),
    }
}

/// The op under autodiff, with `N` parents (hidden, weight, [bias]).
pub(crate) fn fused_linear_cross_entropy<
    B: FusedCrossEntropyBackend,
    C: CheckpointStrategy,
    const N: usize,
>(
    inputs: LinearInputs<Autodiff<B, C>>,
    options: &CrossEntropyOptions,
    chunking: &LinearChunking,
    memory: &IncomingGuess,
) -> LossParts<Autodiff<B, C>> {
    let dtype = inputs.hidden.primitive.dtype();
    let mut nodes = vec![inputs.hidden.node.clone(), inputs.head.weight.node.clone()];
    nodes.extend(inputs.head.bias.as_ref().map(|bias| bias.node.clone()));
    let nodes: [_; N] = nodes
        .try_into()
        .unwrap_or_else(|_| unreachable!("N counts the hidden states, the weight and the bias"));
    let rows = inputs.hidden.primitive.shape()[0];
    // Until this op's node is registered below, its inputs' nodes stay referenced:
    // burn-autodiff frees unreferenced steps of every graph whenever any thread's backward
    // ends, and could otherwise free the steps above this op before it registers, leaving
    // the parameters there without gradients. (Burn's own ops hold their inputs until
    // they register.)
    let _inputs_referenced = [
        Some(inputs.hidden.rc.clone()),
        Some(inputs.head.weight.rc.clone()),
        inputs.head.bias.as_ref().map(|bias| bias.rc.clone()),
    ];
    let inputs = inner_inputs(inputs);
    let (loss, parts) = match FusedLinearCrossEntropyBackward::<N>
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        // Mean and Sum always form their gradients in forward here: recomputing the
        // chunks' logits in backward would cost a third more matmul work.
        OpsKind::Tracked(prep) if options.reduction != Reduction::None && rows > 0 => {
            let device = B::float_device(&inputs.hidden);
            let guess = memory.guess::<B>(&device);
            let (stats, grads) = linear_one_pass::<B>(inputs, guess.clone(), options, chunking);
            let parts = B::reduce_row_stats(stats, options, dtype, false).parts;
            let state = LinearState::OnePass {
                grads,
                guess,
                memory: memory.clone(),
                device,
            };
            (prep.finish(state, parts.loss.clone()), parts)
        }
        OpsKind::Tracked(prep) => {
            let rows = linear_rows::<B>(inputs.clone(), options, chunking);
            let stats = rows.stats.clone();
            let parts = B::reduce_row_stats(rows, options, dtype, false).parts;
            let state = LinearState::Rows {
                inputs,
                stats,
                options: options.clone(),
                chunking: *chunking,
            };
            (prep.finish(state, parts.loss.clone()), parts)
        }
        OpsKind::UnTracked(prep) => {
            let parts = B::fused_linear_cross_entropy(inputs, options, chunking, memory);
            (prep.finish(parts.loss.clone()), parts)
        }
    };
    LossParts {
        loss,
        z_loss: parts.z_loss.map(Autodiff::<B, C>::from_inner),
        accuracy: parts.accuracy.map(Autodiff::<B, C>::from_inner),
        predicted: parts.predicted,
        lse: parts.lse.map(Autodiff::<B, C>::from_inner),
    }
}
