//! The fused linear cross-entropy under `Autodiff<B, C>`: one node whose parents are the
//! hidden states, the weight and, when there is one, the bias. Only the gradients of
//! tracked parents are formed (Burn's node requirements, as its own `linear` checks
//! them): a frozen head pays for no weight gradient, a frozen body for no hidden-state
//! gradient. Two plans, as [`crate::GradientPlan`] says:
//! - the one pass (`Mean`/`Sum`, `GradientPlan::OnePass`): forward forms the needed
//!   gradients over every chunk for the guessed incoming gradient; backward rescales them
//!   when the guess missed and remembers the real one;
//! - two passes (`Reduction::None`, or `GradientPlan::TwoPass`): forward keeps the per-row
//!   statistics; backward computes each chunk's logits again and forms the gradients for
//!   the real incoming gradient, the entropy's too when the objective used the entropy
//!   output (`loss/entropy_node.rs`): one logits gradient per chunk carries both.
//!
//! The products (`accumulate_product`, `matmul_split_k`, ...) take their default bodies
//! here, which Burn's autodiff differentiates.

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

use crate::autodiff_conversions::{inner_row_weights, inner_weights, outer_parts};
use crate::linear::{
    chunking::LinearChunking,
    extension::{LinearCrossEntropyBackend, linear_rows, with_aligned_weight},
    gradients::{
        GradientsNeeded, LinearGradients, LinearIncoming, linear_backward, linear_one_pass,
    },
    types::{LinearHead, LinearInputs},
};
use crate::loss::entropy_node::{EntropyGradient, outer_parts_with_entropy};
use crate::loss::incoming_guess::IncomingGuess;
use crate::options::CrossEntropyOptions;
use crate::values::{LossParts, OptionalFloat};

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
    /// The inputs, forward's per-row statistics and, for `Mean`, the denominators.
    Rows(Box<RowsState<B>>),
}

/// The two-pass plan's state (boxed: the options are most of its size).
#[derive(Debug, Clone)]
struct RowsState<B: LinearCrossEntropyBackend> {
    /// The weight as forward read it, through
    /// [`LinearCrossEntropyBackend::with_matmul_aligned_rows`].
    inputs: LinearInputs<B>,
    stats: FloatTensor<B>,
    denominators: Option<FloatTensor<B>>,
    entropy: EntropyGradient<B>,
    options: CrossEntropyOptions,
    chunking: LinearChunking,
    needed: GradientsNeeded,
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
                // Every formed gradient is rescaled alike; the first one's launch also
                // forms the next guess.
                let mut next = None;
                let mut rescale = |grad: Option<FloatTensor<B>>| {
                    grad.map(|grad| {
                        let (scaled, guessed) = rescaled::<B>(grad, &grad_output, &guess);
                        next.get_or_insert(guessed);
                        scaled
                    })
                };
                let gradients = LinearGradients {
                    hidden: rescale(formed.hidden),
                    weight: rescale(formed.weight),
                    bias: rescale(formed.bias),
                };
                if let Some(next) = next {
                    memory.remember::<B>(&device, next);
                }
                gradients
            }
            LinearState::Rows(state) => {
                let RowsState {
                    inputs,
                    stats,
                    denominators,
                    entropy,
                    options,
                    chunking,
                    needed,
                } = *state;
                let incoming = LinearIncoming {
                    loss: grad_output,
                    entropy: entropy.take(),
                    denominators,
                };
                linear_backward::<B>(inputs, stats, incoming, &options, &chunking, needed)
            }
        };
        let all = [gradients.hidden, gradients.weight, gradients.bias];
        for (parent, grad) in ops.parents.iter().zip(all) {
            if let (Some(parent), Some(grad)) = (parent, grad) {
                grads.register::<B>(parent.id, grad);
            }
        }
    }
}

/// The op with `N` parents (hidden, weight, [bias]) whose guards are `nodes`, on the
/// inner backend's `inputs`; `needed` says which parents are tracked.
fn tracked<B: LinearCrossEntropyBackend, C: CheckpointStrategy, const N: usize>(
    inputs: LinearInputs<B>,
    nodes: [NodeGuard; N],
    needed: GradientsNeeded,
    options: CrossEntropyOptions,
    chunking: LinearChunking,
    memory: IncomingGuess,
) -> LossParts<Autodiff<B, C>> {
    let dtype = inputs.hidden.dtype();
    let rows = inputs.hidden.shape()[0];
    let row_weights = inputs.row_weights.clone();
    let differentiable_entropy = options.differentiable_entropy();
    // The guards keep the inputs' nodes referenced until this op's node is registered.
    let (loss, parts, entropy) = match FusedLinearCrossEntropyBackward::<N>
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        // The one pass forms the gradients in forward: recomputing the chunks' logits in
        // backward would cost a third more matmul work.
        OpsKind::Tracked(prep) if options.one_pass() && rows > 0 => {
            let device = inputs.hidden.device();
            let guess = memory.guess::<B>(&device);
            let (stats, grads) =
                linear_one_pass::<B>(inputs, guess.clone(), &options, &chunking, needed);
            let parts = B::reduce_row_stats(stats, row_weights, options, dtype, false).parts;
            let state = LinearState::OnePass {
                grads,
                guess,
                memory,
                device,
            };
            (prep.finish(state, parts.loss.clone()), parts, None)
        }
        OpsKind::Tracked(prep) => {
            // Aligned once: backward reads the weight as forward did.
            let inputs = with_aligned_weight(inputs);
            let rows = linear_rows::<B>(inputs.clone(), &options, &chunking);
            let stats = rows.stats.clone();
            let reduced = B::reduce_row_stats(rows, row_weights, options.clone(), dtype, true);
            let entropy = EntropyGradient::new();
            let state = LinearState::Rows(Box::new(RowsState {
                inputs,
                stats,
                denominators: reduced.denominators.into_option(),
                entropy: entropy.clone(),
                options,
                chunking,
                needed,
            }));
            let parts = reduced.parts;
            (prep.finish(state, parts.loss.clone()), parts, Some(entropy))
        }
        OpsKind::UnTracked(prep) => {
            let parts = B::fused_linear_cross_entropy(inputs, options, chunking, memory);
            (prep.finish(parts.loss.clone()), parts, None)
        }
    };
    match entropy {
        Some(gradient) if differentiable_entropy && loss.is_tracked() => {
            outer_parts_with_entropy(loss, parts, gradient)
        }
        _ => outer_parts(loss, parts),
    }
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
            row_weights,
        } = inputs;
        let bias = bias.into_option();
        let needed = GradientsNeeded {
            hidden: hidden.is_tracked(),
            weight: weight.is_tracked(),
            bias: bias.as_ref().is_some_and(|bias| bias.is_tracked()),
        };
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
            row_weights: inner_row_weights(row_weights),
        };
        match bias {
            Some(bias) => {
                let (bias, bias_node) = bias.into_parts();
                let nodes = [hidden_node, weight_node, bias_node];
                tracked::<B, C, 3>(inner(Some(bias)), nodes, needed, options, chunking, memory)
            }
            None => {
                let nodes = [hidden_node, weight_node];
                tracked::<B, C, 2>(inner(None), nodes, needed, options, chunking, memory)
            }
        }
    }
}
