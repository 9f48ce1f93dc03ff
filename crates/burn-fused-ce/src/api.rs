//! The typed entry points: validate shapes and options, check targets (one small read when
//! asked), hand primitives to the backend op, give the outputs the targets' shape.

use burn::tensor::{DType, Int, Shape, Tensor, TensorPrimitive, backend::Backend};

use crate::{
    backend::{ClassWeights, CrossEntropyInputs, FusedCrossEntropyBackend, LossParts, first_true},
    incoming_guess::IncomingGuess,
    linear::{LinearChunking, LinearHead, LinearInputs},
    options::{CrossEntropyError, CrossEntropyOptions, Reduction, TargetCheck},
    target_check::{self, PendingTargetCheck},
    vocab_parallel::{ShardExchange, VocabShard},
};

/// The loss and the extra outputs asked for in [`CrossEntropyOptions::outputs`].
///
/// `D` is the targets' rank. Per-row tensors have the targets' shape (`[N]` or `[B, T]`);
/// reduced ones have one element (`[1]` or `[1, 1]`).
#[derive(Debug, Clone)]
pub struct CrossEntropyOutput<B: Backend, const D: usize> {
    /// The loss in the logits' dtype; the only output with a gradient.
    pub loss: Tensor<B, D>,
    /// The z-loss part alone (f32), reduced like the loss.
    pub z_loss: Option<Tensor<B, D>>,
    /// Share of non-ignored rows whose argmax is the target (f32 `[1]`; 0 when none).
    pub accuracy: Option<Tensor<B, 1>>,
    /// Argmax per row (first on ties), -1 on ignored rows.
    pub predicted: Option<Tensor<B, D, Int>>,
    /// Per-row log-sum-exp of the (soft-capped) logits (f32), 0 on ignored rows.
    pub lse: Option<Tensor<B, D>>,
}

/// The loss of `logits` (`[N, V]` or `[B, T, V]`, rows may be strided) against class
/// indices `targets` (`[N]` or `[B, T]`): the targets' shape for `Reduction::None`, one
/// element otherwise, in the logits' dtype.
///
/// # Panics
/// On bad input, with the message of the [`CrossEntropyError`] that
/// [`try_fused_cross_entropy`] returns.
pub fn fused_cross_entropy<B: FusedCrossEntropyBackend, const DL: usize, const DT: usize>(
    logits: Tensor<B, DL>,
    targets: Tensor<B, DT, Int>,
    options: &CrossEntropyOptions,
) -> Tensor<B, DT> {
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
pub fn try_fused_cross_entropy<B: FusedCrossEntropyBackend, const DL: usize, const DT: usize>(
    logits: Tensor<B, DL>,
    targets: Tensor<B, DT, Int>,
    class_weights: Option<Tensor<B, 1>>,
    options: &CrossEntropyOptions,
) -> Result<CrossEntropyOutput<B, DT>, CrossEntropyError> {
    cross_entropy_checked(
        logits,
        targets,
        class_weights,
        options,
        true,
        &IncomingGuess::new(),
    )
}

/// The fused linear cross-entropy: the loss of `hidden @ weight + bias` (`hidden [N, H]` or
/// `[B, T, H]`, `weight [H, V]` as Burn's `Linear` stores it, `bias [V]`) against
/// `targets` (`[N]` or `[B, T]`), computed in chunks of rows so that the N x V logits are
/// never whole in memory. Gradients reach the hidden states, the weight and the bias. The
/// options are the loss's (every reduction and option); `chunking` says how the rows are
/// cut. Errors as [`try_fused_cross_entropy`].
pub fn try_fused_linear_cross_entropy<
    B: FusedCrossEntropyBackend,
    const DH: usize,
    const DT: usize,
>(
    hidden: Tensor<B, DH>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    targets: Tensor<B, DT, Int>,
    class_weights: Option<Tensor<B, 1>>,
    options: &CrossEntropyOptions,
    chunking: &LinearChunking,
) -> Result<CrossEntropyOutput<B, DT>, CrossEntropyError> {
    linear_cross_entropy_checked(
        hidden,
        weight,
        bias,
        targets,
        class_weights,
        options,
        chunking,
        true,
        &IncomingGuess::new(),
    )
}

/// The vocabulary-parallel cross-entropy on one shard: `logits` are this device's classes
/// (`[N, V_s]` or `[B, T, V_s]`, `V_s` = `shard.classes().len()`), `targets` the whole
/// vocabulary's class indices (`[N]` or `[B, T]`, the same on every shard), and the class
/// weights, when given, the whole vocabulary's (`[V]`). Every shard calls it with the same
/// targets and options; `exchange` sums a few numbers per row over the shards (see
/// [`ShardExchange`]). Returns the whole vocabulary's loss and extra outputs, the same on
/// every shard; under autodiff the gradient reaches this shard's logits. Errors as
/// [`try_fused_cross_entropy`], and the exchange's.
pub fn try_vocab_parallel_cross_entropy<
    B: FusedCrossEntropyBackend,
    E: ShardExchange,
    const DL: usize,
    const DT: usize,
>(
    logits: Tensor<B, DL>,
    targets: Tensor<B, DT, Int>,
    class_weights: Option<Tensor<B, 1>>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
    exchange: &E,
) -> Result<CrossEntropyOutput<B, DT>, CrossEntropyError> {
    options.validate()?;
    let target_dims = targets.dims();
    let (rows, width) = check_logits(&logits, &targets, "V_s")?;
    let classes = shard.classes().len();
    if width != classes {
        return Err(CrossEntropyError::ShapeMismatch(format!(
            "logits {:?} do not hold vocabulary shard {} of {} ({classes} classes)",
            logits.dims(),
            shard.index(),
            shard.count()
        )));
    }
    check_class_weights(class_weights.as_ref(), shard.vocab())?;
    let class_weights =
        checked_values(&targets, class_weights, rows, shard.vocab(), options, true)?;
    if rows == 0 {
        // Nothing to exchange: every shard sees the same empty batch.
        return cross_entropy_checked(logits, targets, None, options, false, &IncomingGuess::new());
    }
    let inputs = CrossEntropyInputs {
        logits: logits.into_primitive().tensor(),
        targets: targets.into_primitive(),
        class_weights,
    };
    let parts = B::vocab_parallel_cross_entropy(inputs, shard, options, exchange)?;
    Ok(shaped_output(parts, target_dims, options.reduction))
}

/// Validation, then the op. `check_weight_values` is off when the weights were checked on
/// the host already (the loss module does that once, at `init`); `guess` is what the one
/// pass guesses of the incoming gradient.
pub(crate) fn cross_entropy_checked<
    B: FusedCrossEntropyBackend,
    const DL: usize,
    const DT: usize,
>(
    logits: Tensor<B, DL>,
    targets: Tensor<B, DT, Int>,
    class_weights: Option<Tensor<B, 1>>,
    options: &CrossEntropyOptions,
    check_weight_values: bool,
    guess: &IncomingGuess,
) -> Result<CrossEntropyOutput<B, DT>, CrossEntropyError> {
    options.validate()?;
    let (rows, vocab) = check_shapes(&logits, &targets, class_weights.as_ref())?;
    let class_weights = checked_values(
        &targets,
        class_weights,
        rows,
        vocab,
        options,
        check_weight_values,
    )?;
    let target_dims = targets.dims();
    let inputs = CrossEntropyInputs {
        logits: logits.into_primitive().tensor(),
        targets: targets.into_primitive(),
        class_weights,
    };
    let parts = B::fused_cross_entropy(inputs, options, guess);
    Ok(shaped_output(parts, target_dims, options.reduction))
}

/// The fused linear cross-entropy of `hidden` (`[N, H]` or `[B, T, H]`) through the head
/// `weight [H, V]` and `bias [V]` against `targets` (`[N]` or `[B, T]`): validation, then
/// the op, as [`cross_entropy_checked`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_cross_entropy_checked<
    B: FusedCrossEntropyBackend,
    const DH: usize,
    const DT: usize,
>(
    hidden: Tensor<B, DH>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    targets: Tensor<B, DT, Int>,
    class_weights: Option<Tensor<B, 1>>,
    options: &CrossEntropyOptions,
    chunking: &LinearChunking,
    check_weight_values: bool,
    guess: &IncomingGuess,
) -> Result<CrossEntropyOutput<B, DT>, CrossEntropyError> {
    options.validate()?;
    let (rows, vocab) = check_linear_shapes(
        &hidden,
        &weight,
        bias.as_ref(),
        &targets,
        class_weights.as_ref(),
    )?;
    let class_weights = checked_values(
        &targets,
        class_weights,
        rows,
        vocab,
        options,
        check_weight_values,
    )?;
    let target_dims = targets.dims();
    let width = weight.dims()[0];
    let inputs = LinearInputs {
        hidden: hidden.reshape([rows, width]).into_primitive().tensor(),
        head: LinearHead {
            weight: weight.into_primitive().tensor(),
            bias: bias.map(|bias| bias.into_primitive().tensor()),
        },
        targets: targets.reshape([rows]).into_primitive(),
        class_weights,
    };
    let parts = B::fused_linear_cross_entropy(inputs, options, chunking, guess);
    Ok(shaped_output(parts, target_dims, options.reduction))
}

/// The target and class-weight checks the options ask for (a deferred target check is
/// started here, earlier calls' are looked at), then the weights as the op takes them.
fn checked_values<B: FusedCrossEntropyBackend, const DT: usize>(
    targets: &Tensor<B, DT, Int>,
    class_weights: Option<Tensor<B, 1>>,
    rows: usize,
    vocab: usize,
    options: &CrossEntropyOptions,
    check_weight_values: bool,
) -> Result<Option<ClassWeights<B>>, CrossEntropyError> {
    if options.target_check == TargetCheck::Deferred {
        // Earlier calls' checks, as far as the device has run them.
        target_check::surface_finished()?;
        if rows > 0 {
            let read = B::start_target_check(
                targets.clone().reshape([rows]).into_primitive(),
                vocab,
                options.ignore_index,
            );
            target_check::defer(PendingTargetCheck { read, rows, vocab });
        }
    }
    // Class weights given as a tensor are checked on every call (one small read; the loss
    // module checks its weights once, on the host, at `init`). Targets when asked.
    let weights = class_weights.as_ref().filter(|_| check_weight_values);
    let check_targets = options.target_check == TargetCheck::Immediate && rows > 0;
    if check_targets || weights.is_some() {
        check_values(
            targets,
            check_targets,
            weights,
            rows,
            vocab,
            options.ignore_index,
        )?;
    }
    Ok(class_weights.map(|weights| {
        let weights = weights.cast(DType::F32);
        ClassWeights {
            total: weights.clone().sum().into_primitive().tensor(),
            weights: weights.into_primitive().tensor(),
        }
    }))
}

/// The op's outputs with the targets' shape (`target_dims`): per-row ones `[N]` or
/// `[B, T]`, reduced ones `[1]` or `[1, 1]`.
fn shaped_output<B: Backend, const DT: usize>(
    parts: LossParts<B>,
    target_dims: [usize; DT],
    reduction: Reduction,
) -> CrossEntropyOutput<B, DT> {
    let per_row_shape = Shape::new(target_dims);
    let loss_shape = if reduction == Reduction::None {
        per_row_shape.clone()
    } else {
        Shape::new([1; DT])
    };
    let float = |primitive, shape: Shape| -> Tensor<B, DT> {
        Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(primitive)).reshape(shape)
    };
    CrossEntropyOutput {
        loss: float(parts.loss, loss_shape.clone()),
        z_loss: parts.z_loss.map(|z| float(z, loss_shape)),
        accuracy: parts
            .accuracy
            .map(|a| Tensor::from_primitive(TensorPrimitive::Float(a))),
        predicted: parts
            .predicted
            .map(|p| Tensor::<B, 1, Int>::from_primitive(p).reshape(per_row_shape.clone())),
        lse: parts.lse.map(|lse| float(lse, per_row_shape)),
    }
}

/// Hidden states `[N, H]` with targets `[N]`, or `[B, T, H]` with `[B, T]`; the head's
/// `weight [H, V]` and `bias [V]`; class weights `[V]`. Returns `(N, V)`.
fn check_linear_shapes<B: Backend, const DH: usize, const DT: usize>(
    hidden: &Tensor<B, DH>,
    weight: &Tensor<B, 2>,
    bias: Option<&Tensor<B, 1>>,
    targets: &Tensor<B, DT, Int>,
    class_weights: Option<&Tensor<B, 1>>,
) -> Result<(usize, usize), CrossEntropyError> {
    let hidden_dims = hidden.dims();
    let target_dims = targets.dims();
    check_rows(&hidden_dims, &target_dims, "hidden states", "H")?;
    let [width, vocab] = weight.dims();
    if hidden_dims[DH - 1] != width {
        return Err(CrossEntropyError::ShapeMismatch(format!(
            "the head's weight {:?} does not take hidden states of width {} (expected [H, V], Burn's Linear layout)",
            weight.dims(),
            hidden_dims[DH - 1]
        )));
    }
    if let Some(bias) = bias
        && bias.dims() != [vocab]
    {
        return Err(CrossEntropyError::ShapeMismatch(format!(
            "the head's bias has shape {:?}, expected [{vocab}]",
            bias.dims()
        )));
    }
    let rows: usize = target_dims.iter().product();
    if rows > 0 && vocab == 0 {
        return Err(CrossEntropyError::ShapeMismatch(format!(
            "the head's weight {:?} has no classes",
            weight.dims()
        )));
    }
    check_class_weights(class_weights, vocab)?;
    for (name, dtype) in [
        ("hidden states", hidden.dtype()),
        ("weight", weight.dtype()),
    ] {
        if !dtype.is_float() {
            return Err(CrossEntropyError::ShapeMismatch(format!(
                "the {name} must be floats, got {dtype:?}"
            )));
        }
    }
    if hidden.dtype() != weight.dtype() {
        return Err(CrossEntropyError::ShapeMismatch(format!(
            "the hidden states ({:?}) and the weight ({:?}) must have one dtype",
            hidden.dtype(),
            weight.dtype()
        )));
    }
    Ok((rows, vocab))
}

/// An input of rows `[N, last]` with targets `[N]`, or `[B, T, last]` with `[B, T]`.
fn check_rows(
    input_dims: &[usize],
    target_dims: &[usize],
    input: &str,
    last: &str,
) -> Result<(), CrossEntropyError> {
    let rank = input_dims.len();
    if !(rank == 2 || rank == 3)
        || target_dims.len() + 1 != rank
        || input_dims[..rank - 1] != target_dims[..]
    {
        return Err(CrossEntropyError::ShapeMismatch(format!(
            "expected {input} [N, {last}] with targets [N], or [B, T, {last}] with [B, T]; got {input} {input_dims:?} and targets {target_dims:?}"
        )));
    }
    Ok(())
}

/// Class weights, when given, are `[vocab]`: one per class.
fn check_class_weights<B: Backend>(
    class_weights: Option<&Tensor<B, 1>>,
    vocab: usize,
) -> Result<(), CrossEntropyError> {
    match class_weights {
        Some(weights) if weights.dims() != [vocab] => {
            Err(CrossEntropyError::ShapeMismatch(format!(
                "class weights have shape {:?}, expected [{vocab}] (one per class)",
                weights.dims()
            )))
        }
        _ => Ok(()),
    }
}

/// Logits `[N, V]` with targets `[N]`, or `[B, T, V]` with `[B, T]`; weights `[V]`.
/// Returns `(N, V)`.
fn check_shapes<B: Backend, const DL: usize, const DT: usize>(
    logits: &Tensor<B, DL>,
    targets: &Tensor<B, DT, Int>,
    class_weights: Option<&Tensor<B, 1>>,
) -> Result<(usize, usize), CrossEntropyError> {
    let (rows, vocab) = check_logits(logits, targets, "V")?;
    check_class_weights(class_weights, vocab)?;
    Ok((rows, vocab))
}

/// Float logits `[N, V]` with targets `[N]`, or `[B, T, V]` with `[B, T]`, with a class
/// when there are rows (`last` names `V` in errors). Returns `(N, V)`.
fn check_logits<B: Backend, const DL: usize, const DT: usize>(
    logits: &Tensor<B, DL>,
    targets: &Tensor<B, DT, Int>,
    last: &str,
) -> Result<(usize, usize), CrossEntropyError> {
    let logits_dims = logits.dims();
    let target_dims = targets.dims();
    check_rows(&logits_dims, &target_dims, "logits", last)?;
    let vocab = logits_dims[DL - 1];
    let rows: usize = target_dims.iter().product();
    if rows > 0 && vocab == 0 {
        return Err(CrossEntropyError::ShapeMismatch(format!(
            "logits {logits_dims:?} have no classes"
        )));
    }
    if !logits.dtype().is_float() {
        return Err(CrossEntropyError::ShapeMismatch(format!(
            "logits must be floats, got {:?}",
            logits.dtype()
        )));
    }
    Ok((rows, vocab))
}

/// The first target that is neither a class nor the ignore index (when `check_targets`;
/// one small kernel on cube backends), and the first weight that is negative or not
/// finite, found on the device; one read of two or three integers, plus one more only
/// when there is a bad weight to report.
fn check_values<B: FusedCrossEntropyBackend, const DT: usize>(
    targets: &Tensor<B, DT, Int>,
    check_targets: bool,
    class_weights: Option<&Tensor<B, 1>>,
    rows: usize,
    vocab: usize,
    ignore_index: i64,
) -> Result<(), CrossEntropyError> {
    let device = targets.device();
    // `[row, target]`, `row = rows` standing for "no bad target" (also when unchecked:
    // an empty batch's targets are never read).
    let mut found = vec![if check_targets {
        let targets = targets.clone().reshape([rows]);
        Tensor::<B, 1, Int>::from_primitive(B::first_bad_target(
            targets.into_primitive(),
            vocab,
            ignore_index,
        ))
    } else {
        Tensor::<B, 1, Int>::from_data([rows as i64, 0], &device)
    }];
    if let Some(weights) = class_weights {
        let bad_weight = weights
            .clone()
            .is_finite()
            .bool_not()
            .bool_or(weights.clone().lower_elem(0.0));
        found.push(first_true(bad_weight, vocab, &device));
    }
    let found = Tensor::cat(found, 0)
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .unwrap_or_default();
    if let [row, value, ..] = found[..]
        && (row as usize) < rows
    {
        return Err(CrossEntropyError::TargetOutOfRange {
            row: row as usize,
            value,
            vocab,
            earlier_call: false,
        });
    }
    if let (Some(&class), Some(weights)) = (found.get(2), class_weights)
        && (class as usize) < vocab
    {
        let class = class as usize;
        let value = weights
            .clone()
            .narrow(0, class, 1)
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .unwrap_or_default();
        return Err(CrossEntropyError::InvalidClassWeight {
            class,
            value: value.first().copied().unwrap_or(f32::NAN),
        });
    }
    Ok(())
}
