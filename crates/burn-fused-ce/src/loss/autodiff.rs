//! The loss under `Autodiff<B, C>`, in one of two plans (see [`GradientPlan`]):
//! - two passes: forward runs the inner backend's row kernel and keeps the per-row
//!   statistics; backward hands the incoming gradient (and the mean's denominators)
//!   straight to the inner backward kernel: one launch, no scale computed on the host;
//! - one pass (`Mean`/`Sum`): forward also writes the gradient for the guessed incoming
//!   gradient (the last one the loss saw); backward rescales it on the device when the
//!   guess missed (nothing when it hit) and remembers the real one for the next call.
//!
//! The loss is tracked, and so is the entropy output when asked for
//! (`entropy_node.rs`): in the two-pass plan its gradient joins the loss's in the same
//! backward launch. Class weights and the other extra outputs get no gradient.

use burn::backend::{
    AutodiffBackend, TensorMetadata,
    autodiff::{
        Autodiff,
        checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
        grads::Gradients,
        ops::{Backward, Ops, OpsKind},
    },
    tensor::{FloatTensor, IntTensor},
};
use burn::tensor::DType;

use crate::autodiff_conversions::{
    inner_inputs, inner_optional, inner_row_weights, inner_rows, inner_weights, outer_optional,
    outer_parts, outer_rows,
};
use crate::loss::check_read::TargetCheckRead;
use crate::loss::entropy_node::{EntropyGradient, outer_parts_with_entropy};
use crate::loss::extension::FusedCrossEntropyBackend;
use crate::loss::incoming_guess::IncomingGuess;
use crate::loss::reduce::given_denominators;
use crate::loss::types::{OnePassOutput, OnePassScale, Reduced, TwoPassBackward};
use crate::options::CrossEntropyOptions;
#[cfg(doc)]
use crate::options::GradientPlan;
use crate::primitive::FloatOf;
use crate::values::{CrossEntropyInputs, LossParts, OptionalFloat, RowStats, RowWeights};

/// What backward needs.
#[derive(Debug, Clone)]
enum CrossEntropyState<B: FusedCrossEntropyBackend> {
    /// The inputs (the logits owned, so they can become the gradient), the per-row
    /// statistics and, for `Mean`, the denominators.
    TwoPass {
        inputs: CrossEntropyInputs<B>,
        stats: FloatTensor<B>,
        denominators: OptionalFloat<B>,
        options: CrossEntropyOptions,
        entropy: EntropyGradient<B>,
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
                entropy,
            } => B::cross_entropy_backward(
                inputs,
                TwoPassBackward {
                    stats,
                    grad_output,
                    denominators,
                    entropy_grad_output: OptionalFloat::from_option(entropy.take()),
                },
                options,
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

impl<B: FusedCrossEntropyBackend, C: CheckpointStrategy> FusedCrossEntropyBackend
    for Autodiff<B, C>
{
    fn cross_entropy_rows(
        inputs: CrossEntropyInputs<Self>,
        options: CrossEntropyOptions,
    ) -> RowStats<Self> {
        outer_rows(B::cross_entropy_rows(inner_inputs(inputs), options))
    }

    fn cross_entropy_backward(
        inputs: CrossEntropyInputs<Self>,
        backward: TwoPassBackward<Self>,
        options: CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        let backward = TwoPassBackward {
            stats: backward.stats.into_primitive(),
            grad_output: backward.grad_output.into_primitive(),
            denominators: inner_optional(backward.denominators),
            entropy_grad_output: inner_optional(backward.entropy_grad_output),
        };
        Self::from_inner(B::cross_entropy_backward(
            inner_inputs(inputs),
            backward,
            options,
        ))
    }

    fn cross_entropy_one_pass(
        inputs: CrossEntropyInputs<Self>,
        scale: OnePassScale<Self>,
        options: CrossEntropyOptions,
    ) -> OnePassOutput<Self> {
        let scale = OnePassScale {
            guess: scale.guess.into_primitive(),
            denominators: inner_optional(scale.denominators),
        };
        let output = B::cross_entropy_one_pass(inner_inputs(inputs), scale, options);
        OnePassOutput {
            rows: outer_rows(output.rows),
            grad: Self::from_inner(output.grad),
        }
    }

    fn scale_one_pass_gradient(
        grad: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        guess: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (grad, next) = B::scale_one_pass_gradient(
            grad.into_primitive(),
            grad_output.into_primitive(),
            guess.into_primitive(),
        );
        (Self::from_inner(grad), Self::from_inner(next))
    }

    fn first_bad_target(
        targets: IntTensor<Self>,
        vocab: usize,
        ignore_index: i64,
    ) -> IntTensor<Self> {
        B::first_bad_target(targets, vocab, ignore_index)
    }

    fn start_target_check(
        targets: IntTensor<Self>,
        vocab: usize,
        ignore_index: i64,
        read: TargetCheckRead,
    ) -> IntTensor<Self> {
        B::start_target_check(targets, vocab, ignore_index, read)
    }

    fn reduce_row_stats(
        rows: RowStats<Self>,
        row_weights: RowWeights<Self>,
        options: CrossEntropyOptions,
        dtype: DType,
        keep_denominators: bool,
    ) -> Reduced<Self> {
        let reduced = B::reduce_row_stats(
            inner_rows(rows),
            inner_row_weights(row_weights),
            options,
            dtype,
            keep_denominators,
        );
        let loss = Self::from_inner(reduced.parts.loss.clone());
        Reduced {
            parts: outer_parts(loss, reduced.parts),
            denominators: outer_optional(reduced.denominators),
        }
    }

    fn fused_cross_entropy(
        inputs: CrossEntropyInputs<Self>,
        options: CrossEntropyOptions,
        memory: IncomingGuess,
    ) -> LossParts<Self> {
        let one_pass = takes_one_pass::<B>(inputs.logits.primitive(), &options);
        let (logits, node) = inputs.logits.into_parts();
        let dtype = logits.dtype();
        let row_weights = inner_row_weights(inputs.row_weights);
        let inputs = CrossEntropyInputs {
            logits,
            targets: inputs.targets,
            class_weights: inner_weights(inputs.class_weights),
            row_weights: row_weights.clone(),
        };
        let differentiable_entropy = options.differentiable_entropy();
        // The node guard keeps the logits' node referenced until this op's node is
        // registered.
        let (loss, parts, entropy) = match FusedCrossEntropyBackward
            .prepare::<C>([node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) if one_pass => {
                // The logits move into the op: with no other holder, their memory becomes
                // the gradient.
                let device = inputs.logits.device();
                let guess = memory.guess::<B>(&device);
                let scale = OnePassScale {
                    guess: guess.clone(),
                    denominators: OptionalFloat::from_option(
                        given_denominators::<B>(&options, &device).map(FloatOf::into_primitive),
                    ),
                };
                let output = B::cross_entropy_one_pass(inputs, scale, options.clone());
                let parts =
                    B::reduce_row_stats(output.rows, row_weights, options, dtype, false).parts;
                let state = CrossEntropyState::OnePass {
                    grad: output.grad,
                    guess,
                    memory,
                    device,
                };
                (prep.finish(state, parts.loss.clone()), parts, None)
            }
            OpsKind::Tracked(prep) => {
                // The state takes the only other handle on the logits: once the caller's
                // tensor is dropped, backward may overwrite them with their gradient.
                let rows = B::cross_entropy_rows(inputs.clone(), options.clone());
                let stats = rows.stats.clone();
                let reduced = B::reduce_row_stats(rows, row_weights, options.clone(), dtype, true);
                let entropy = EntropyGradient::new();
                let state = CrossEntropyState::TwoPass {
                    inputs,
                    stats,
                    denominators: reduced.denominators,
                    options,
                    entropy: entropy.clone(),
                };
                let parts = reduced.parts;
                (prep.finish(state, parts.loss.clone()), parts, Some(entropy))
            }
            OpsKind::UnTracked(prep) => {
                let parts = B::fused_cross_entropy(inputs, options, memory);
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
}
