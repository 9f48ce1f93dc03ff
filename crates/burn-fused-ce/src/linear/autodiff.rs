//! The fused linear cross-entropy under `Autodiff<B, C>`: one node whose parents are the
//! hidden states, the weight and, when there is one, the bias.
//! - `Mean`/`Sum`: forward runs the one pass over every chunk and forms all three
//!   gradients for the guessed incoming gradient; backward rescales them when the guess
//!   missed and remembers the real one.
//! - `None`: forward keeps the per-row statistics; backward computes each chunk's logits
//!   again with the per-row incoming gradient.
//!
//! [`crate::GradientPlan`] does not apply: with `Mean`/`Sum` the gradients are always
//! formed in forward. The products (`accumulate_product`, `matmul_split_k`, ...) take
//! their default bodies here, which Burn's autodiff differentiates.

use burn::backend::{
    TensorMetadata,
    autodiff::{
        Autodiff,
        checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
        grads::Gradients,
        ops::{Backward, NodeGuard, Ops, OpsKind},
    },
    tensor::FloatTensor,
};
use burn::tensor::Shape;

use crate::autodiff_conversions::{inner_weights, outer_parts};
use crate::linear::{
    chunking::LinearChunking,
    extension::{LinearCrossEntropyBackend, linear_rows, with_aligned_weight},
    gradients::{LinearGradients, linear_backward, linear_one_pass},
    types::{LinearHead, LinearInputs},
};
use crate::loss::incoming_guess::IncomingGuess;
use crate::loss::types::{LossParts, OptionalFloat};
use crate::options::{CrossEntropyOptions, Reduction};

/// What backward needs.
#[derive(Debug, Clone)]
enum LinearState<B: LinearCrossEntropyBackend> {
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
        // Boxed: the options are most of the state's size, and this variant is the rare one.
        options: Box<CrossEntropyOptions>,
        chunking: LinearChunking,
    },
}

/// The node; `N` is 3 with a bias, else 2.
#[derive(Debug)]
struct FusedLinearCrossEntropyBackward<const N: usize>;

/// `grad * g / guess` for a gradient of any rank (the scale works on rows), and the next
/// guess.
fn rescaled<B: LinearCrossEntropyBackend>(
    grad: FloatTensor<B>,
    grad_output: &FloatTensor<B>,
    guess: &FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let shape = grad.shape();
    let rows = if shape.num_dims() == 1 {
        B::float_reshape(grad, Shape::new([1, shape[0]]))
    } else {
        grad
    };
    let (scaled, next) = B::scale_one_pass_gradient(rows, grad_output.clone(), guess.clone());
    (B::float_reshape(scaled, shape), next)
}

impl<B: LinearCrossEntropyBackend, const N: usize> Backward<B, N>
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
        let all = [
            Some(gradients.hidden),
            Some(gradients.weight),
            gradients.bias,
        ];
        for (parent, grad) in ops.parents.iter().zip(all) {
            if let (Some(parent), Some(grad)) = (parent, grad) {
                grads.register::<B>(parent.id, grad);
            }
        }
    }
}

/// The op with `N` parents (hidden, weight, [bias]) whose guards are `nodes`, on the
/// inner backend's `inputs`.
fn tracked<B: LinearCrossEntropyBackend, C: CheckpointStrategy, const N: usize>(
    inputs: LinearInputs<B>,
    nodes: [NodeGuard; N],
    options: CrossEntropyOptions,
    chunking: LinearChunking,
    memory: IncomingGuess,
) -> LossParts<Autodiff<B, C>> {
    let dtype = inputs.hidden.dtype();
    let rows = inputs.hidden.shape()[0];
    // The guards keep the inputs' nodes referenced until this op's node is registered.
    let (loss, parts) = match FusedLinearCrossEntropyBackward::<N>
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        // Mean and Sum always form their gradients in forward here: recomputing the
        // chunks' logits in backward would cost a third more matmul work.
        OpsKind::Tracked(prep) if options.reduction != Reduction::None && rows > 0 => {
            let device = inputs.hidden.device();
            let guess = memory.guess::<B>(&device);
            let (stats, grads) = linear_one_pass::<B>(inputs, guess.clone(), &options, &chunking);
            let parts = B::reduce_row_stats(stats, options, dtype, false).parts;
            let state = LinearState::OnePass {
                grads,
                guess,
                memory,
                device,
            };
            (prep.finish(state, parts.loss.clone()), parts)
        }
        OpsKind::Tracked(prep) => {
            let rows = linear_rows::<B>(with_aligned_weight(inputs.clone()), &options, &chunking);
            let stats = rows.stats.clone();
            let parts = B::reduce_row_stats(rows, options.clone(), dtype, false).parts;
            let state = LinearState::Rows {
                inputs,
                stats,
                options: Box::new(options),
                chunking,
            };
            (prep.finish(state, parts.loss.clone()), parts)
        }
        OpsKind::UnTracked(prep) => {
            let parts = B::fused_linear_cross_entropy(inputs, options, chunking, memory);
            (prep.finish(parts.loss.clone()), parts)
        }
    };
    outer_parts(loss, parts)
}

impl<B: LinearCrossEntropyBackend, C: CheckpointStrategy> LinearCrossEntropyBackend
    for Autodiff<B, C>
{
    fn fused_linear_cross_entropy(
        inputs: LinearInputs<Self>,
        options: CrossEntropyOptions,
        chunking: LinearChunking,
        memory: IncomingGuess,
    ) -> LossParts<Self> {
        let LinearInputs {
            hidden,
            head: LinearHead { weight, bias },
            targets,
            class_weights,
        } = inputs;
        let (hidden, hidden_node) = hidden.into_parts();
        let (weight, weight_node) = weight.into_parts();
        let inner = |bias: Option<FloatTensor<B>>| LinearInputs {
            hidden,
            head: LinearHead {
                weight,
                bias: OptionalFloat::from_option(bias),
            },
            targets,
            class_weights: inner_weights(class_weights),
        };
        match bias.into_option() {
            Some(bias) => {
                let (bias, bias_node) = bias.into_parts();
                let nodes = [hidden_node, weight_node, bias_node];
                tracked::<B, C, 3>(inner(Some(bias)), nodes, options, chunking, memory)
            }
            None => {
                let nodes = [hidden_node, weight_node];
                tracked::<B, C, 2>(inner(None), nodes, options, chunking, memory)
            }
        }
    }
}
