//! The loss as functions of `Tensor`s: validate shapes and options, check targets (one
//! small read when asked), hand the tensors to the backend extension, give the outputs
//! the targets' shape.

use burn::backend::Dispatch;
use burn::tensor::Tensor;

use crate::loss::checks::{check_shapes, checked_values};
use crate::loss::extension::FusedCrossEntropyBackend;
use crate::loss::incoming_guess::IncomingGuess;

use crate::error::CrossEntropyError;
use crate::options::CrossEntropyOptions;
use crate::output::{CrossEntropyOutput, shaped_output};
use crate::targets::Targets;
use crate::values::CrossEntropyInputs;

/// The loss of `logits` (`[N, V]` or `[B, T, V]`, rows may be strided) against class
/// indices `targets` (`[N]` or `[B, T]`): the targets' shape for `Reduction::None`, one
/// element otherwise, in the logits' dtype.
///
/// # Panics
/// On bad input, with the message of the [`CrossEntropyError`] that
/// [`try_fused_cross_entropy`] returns.
pub fn fused_cross_entropy<const DL: usize, const DT: usize>(
    logits: Tensor<DL>,
    targets: impl Into<Targets<DT>>,
    options: &CrossEntropyOptions,
) -> Tensor<DT> {
    match try_fused_cross_entropy(logits, targets, None, options) {
        Ok(output) => output.loss,
        Err(error) => panic!("{error}"),
    }
}

/// The loss and extra outputs, with optional class weights (`[V]`, all `>= 0`), or the
/// reason the input was refused. Nothing runs on the device before shapes and options are
/// validated. Class weights are checked on the device and one small result is read back
/// (a sync point); targets as [`CrossEntropyOptions::target_check`] says. The one pass
/// guesses an incoming gradient of 1 (a [`crate::FusedCrossEntropyLoss`] remembers the
/// last one instead).
///
/// # Example
///
/// ```rust
/// # use burn::tensor::{Device, DeviceKind, Distribution, Int, Tensor};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let device = Device::wgpu(DeviceKind::DefaultDevice).autodiff();
/// # let logits = Tensor::<2>::random([4, 10], Distribution::Default, &device).require_grad();
/// # let targets = Tensor::<1, Int>::from_ints([1, 2, -100, 9], &device);
/// use burn_fused_ce::{
///     CrossEntropyOptions, ExtraOutputs, Reduction, fused_cross_entropy, try_fused_cross_entropy,
/// };
///
/// let options = CrossEntropyOptions::new(Reduction::Sum).with_label_smoothing(0.1);
/// let _loss = fused_cross_entropy(logits.clone(), targets.clone(), &options);
///
/// let weights = Tensor::<1>::from_floats([1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], &device);
/// let options = options.with_outputs(ExtraOutputs::all());
/// let out = try_fused_cross_entropy(logits, targets, Some(weights), &options)?;
/// let _grads = out.loss.backward();
/// # device.sync()?; // exiting with work in flight can crash lavapipe
/// # Ok(())
/// # }
/// ```
pub fn try_fused_cross_entropy<const DL: usize, const DT: usize>(
    logits: Tensor<DL>,
    targets: impl Into<Targets<DT>>,
    class_weights: Option<Tensor<1>>,
    options: &CrossEntropyOptions,
) -> Result<CrossEntropyOutput<DT>, CrossEntropyError> {
    cross_entropy_checked(
        logits,
        targets.into(),
        class_weights,
        options,
        true,
        &IncomingGuess::new(),
    )
}

/// Validation, then the op. `check_weight_values` is off when the weights were checked on
/// the host already (the loss module does that once, at `init`); `guess` is what the one
/// pass guesses of the incoming gradient.
pub(crate) fn cross_entropy_checked<const DL: usize, const DT: usize>(
    logits: Tensor<DL>,
    targets: Targets<DT>,
    class_weights: Option<Tensor<1>>,
    options: &CrossEntropyOptions,
    check_weight_values: bool,
    guess: &IncomingGuess,
) -> Result<CrossEntropyOutput<DT>, CrossEntropyError> {
    options.validate()?;
    let (rows, vocab) = check_shapes(&logits, &targets.classes, class_weights.as_ref())?;
    targets.check()?;
    let class_weights = checked_values(
        &targets.classes,
        class_weights,
        rows,
        vocab,
        options,
        check_weight_values,
    )?;
    let target_dims = targets.classes.dims();
    let inputs = CrossEntropyInputs {
        logits: logits.into_dispatch(),
        row_weights: targets.row_weights(),
        targets: targets.classes.into_dispatch(),
        class_weights,
    };
    let parts = <Dispatch as FusedCrossEntropyBackend>::fused_cross_entropy(
        inputs,
        options.clone(),
        guess.clone(),
    );
    Ok(shaped_output(parts, target_dims, options.reduction))
}
