//! The fused linear cross-entropy as a function of `Tensor`s: validate shapes and
//! options, check targets (one small read when asked), bound the chunks by the device's
//! largest buffer, hand the tensors to the backend extension, give the outputs the
//! targets' shape.

use burn::backend::Dispatch;
use burn::tensor::Tensor;

use crate::error::CrossEntropyError;
use crate::linear::checks::check_linear_shapes;
use crate::linear::inputs::{LinearCrossEntropyInputs, LmHead};
use crate::linear::{
    buffer_limit::max_buffer_bytes,
    chunking::LinearChunking,
    extension::LinearCrossEntropyBackend,
    types::{LinearHead, LinearInputs},
};
use crate::loss::checks::checked_values;
use crate::loss::incoming_guess::IncomingGuess;
use crate::options::CrossEntropyOptions;
use crate::output::{CrossEntropyOutput, shaped_output};
use crate::values::OptionalFloat;

/// The fused linear cross-entropy: the loss of `hidden @ weight + bias` against the
/// targets, computed in chunks of rows so that the N x V logits are never whole in memory
/// (see [`try_fused_linear_cross_entropy`]).
///
/// # Panics
/// On bad input, with the message of the [`CrossEntropyError`] that
/// [`try_fused_linear_cross_entropy`] returns.
pub fn fused_linear_cross_entropy<const DH: usize, const DT: usize>(
    inputs: LinearCrossEntropyInputs<DH, DT>,
    options: &CrossEntropyOptions,
    chunking: &LinearChunking,
) -> Tensor<DT> {
    match try_fused_linear_cross_entropy(inputs, options, chunking) {
        Ok(output) => output.loss,
        Err(error) => panic!("{error}"),
    }
}

/// The fused linear cross-entropy: the loss of `hidden @ weight + bias` (`hidden [N, H]`
/// or `[B, T, H]`, `weight [H, V]` as Burn's `Linear` stores it, `bias [V]`) against
/// `targets` (`[N]` or `[B, T]`), computed in chunks of rows so that the N x V logits are
/// never whole in memory, with the extra outputs the options ask for. Gradients reach the
/// hidden states, the weight and the bias, those that are tracked: a frozen weight
/// (`require_grad` off, adapter fine-tuning) costs no weight-gradient product and no `[H,
/// V]` buffer. The options are the loss's (every reduction and option; `gradient_plan`
/// as for the loss: the one pass forms the gradients in forward, the two-pass plan in
/// backward, with the logits computed again); `chunking` says how the rows are cut, its
/// logits budget at most the device's largest buffer ([`crate::linear::max_buffer_bytes`]).
/// The one pass guesses an incoming gradient of 1 (a
/// [`crate::FusedLinearCrossEntropyLoss`] remembers the last one instead). Errors as
/// [`crate::try_fused_cross_entropy`], and the head's: its shapes, and a weight or bias
/// of another dtype than the hidden states'.
///
/// # Example
///
/// Any weight and bias, nothing kept between calls:
///
/// ```rust
/// # use burn::tensor::{Device, DeviceKind, Distribution, Int, Tensor};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let device = Device::wgpu(DeviceKind::DefaultDevice).autodiff();
/// # let (rows, d_model, vocab) = (6, 32, 1000);
/// # let hidden = Tensor::<2>::random([rows, d_model], Distribution::Default, &device).require_grad();
/// # let targets = Tensor::<1, Int>::from_ints([1, 2, 3, -100, 5, 6], &device);
/// use burn_fused_ce::{
///     ChunkProducts, CrossEntropyOptions, LinearChunking, LinearCrossEntropyInputs, LmHead,
///     Reduction, try_fused_linear_cross_entropy,
/// };
///
/// let weight = Tensor::<2>::random([d_model, vocab], Distribution::Default, &device).require_grad();
/// let bias = Tensor::<1>::zeros([vocab], &device).require_grad();
/// let chunking = LinearChunking {
///     logits_bytes: Some(64 << 20), // at most 64 MiB of logits per chunk
///     products: ChunkProducts {
///         f32_weight_gradient: true, // an f32 [H, V] sum, for bf16 weights
///         ..ChunkProducts::default()
///     },
///     ..LinearChunking::default()
/// };
/// let head = LmHead::new(weight.clone()).with_bias(Some(bias.clone()));
/// let inputs = LinearCrossEntropyInputs::new(hidden.clone(), head, targets);
/// let options = CrossEntropyOptions::new(Reduction::Sum);
/// let out = try_fused_linear_cross_entropy(inputs, &options, &chunking)?;
/// let grads = out.loss.backward();
/// let (_grad_hidden, _grad_weight) = (hidden.grad(&grads).unwrap(), weight.grad(&grads).unwrap());
/// assert_eq!(bias.grad(&grads).unwrap().dims(), [vocab]);
/// # device.sync()?; // exiting with work in flight can crash lavapipe
/// # Ok(())
/// # }
/// ```
pub fn try_fused_linear_cross_entropy<const DH: usize, const DT: usize>(
    inputs: LinearCrossEntropyInputs<DH, DT>,
    options: &CrossEntropyOptions,
    chunking: &LinearChunking,
) -> Result<CrossEntropyOutput<DT>, CrossEntropyError> {
    linear_cross_entropy_checked(inputs, options, chunking, true, &IncomingGuess::new())
}

/// Validation, then the op. `check_weight_values` is off when the class weights were
/// checked on the host already (the loss module does that once, at `init`); `guess` is
/// what the one pass guesses of the incoming gradient.
pub(crate) fn linear_cross_entropy_checked<const DH: usize, const DT: usize>(
    inputs: LinearCrossEntropyInputs<DH, DT>,
    options: &CrossEntropyOptions,
    chunking: &LinearChunking,
    check_weight_values: bool,
    guess: &IncomingGuess,
) -> Result<CrossEntropyOutput<DT>, CrossEntropyError> {
    let LinearCrossEntropyInputs {
        hidden,
        head: LmHead { weight, bias },
        targets,
        class_weights,
    } = inputs;
    options.validate()?;
    let (rows, vocab) = check_linear_shapes(
        &hidden,
        &weight,
        bias.as_ref(),
        &targets.classes,
        class_weights.as_ref(),
    )?;
    targets.check()?;
    let width = weight.dims()[0];
    chunking.validate(width, vocab, hidden.dtype())?;
    let class_weights = checked_values(
        &targets.classes,
        class_weights,
        rows,
        vocab,
        options,
        check_weight_values,
    )?;
    let target_dims = targets.classes.dims();
    let chunking = chunking.within(max_buffer_bytes(&hidden.device()), vocab, hidden.dtype());
    let inputs = LinearInputs {
        hidden: hidden.reshape([rows, width]).into_dispatch(),
        head: LinearHead {
            weight: weight.into_dispatch(),
            bias: OptionalFloat::from_option(bias.map(Tensor::into_dispatch)),
        },
        row_weights: targets.row_weights(),
        targets: targets.classes.reshape([rows]).into_dispatch(),
        class_weights,
    };
    let parts = <Dispatch as LinearCrossEntropyBackend>::fused_linear_cross_entropy(
        inputs,
        options.clone(),
        chunking,
        guess.clone(),
    );
    Ok(shaped_output(parts, target_dims, options.reduction))
}
