//! The typed entry points: validate shapes and options, check targets (one small read when
//! asked), hand primitives to the backend op, give the outputs the targets' shape.

use burn::tensor::{DType, Int, Shape, Tensor, TensorPrimitive, backend::Backend};

use crate::{
    backend::{ClassWeights, CrossEntropyInputs, FusedCrossEntropyBackend, first_true},
    options::{CrossEntropyError, CrossEntropyOptions, Reduction},
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
/// validated; class weights, and the targets with `options.check_targets`, are checked on
/// the device and one small result is read back (a sync point).
pub fn try_fused_cross_entropy<B: FusedCrossEntropyBackend, const DL: usize, const DT: usize>(
    logits: Tensor<B, DL>,
    targets: Tensor<B, DT, Int>,
    class_weights: Option<Tensor<B, 1>>,
    options: &CrossEntropyOptions,
) -> Result<CrossEntropyOutput<B, DT>, CrossEntropyError> {
    cross_entropy_checked(logits, targets, class_weights, options, true)
}

/// Validation, then the op. `check_weight_values` is off when the weights were checked on
/// the host already (the loss module does that once, at `init`).
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
) -> Result<CrossEntropyOutput<B, DT>, CrossEntropyError> {
    options.validate()?;
    let (rows, vocab) = check_shapes(&logits, &targets, class_weights.as_ref())?;
    // Class weights given as a tensor are checked on every call (one small read; the loss
    // module checks its weights once, on the host, at `init`). Targets when asked.
    let weights = class_weights.as_ref().filter(|_| check_weight_values);
    let check_targets = options.check_targets && rows > 0;
    if check_targets || weights.is_some() {
        check_values(
            &targets,
            check_targets,
            weights,
            rows,
            vocab,
            options.ignore_index,
        )?;
    }
    let target_dims = targets.dims();
    let weights = class_weights.map(|weights| {
        let weights = weights.cast(DType::F32);
        ClassWeights {
            total: weights.clone().sum().into_primitive().tensor(),
            weights: weights.into_primitive().tensor(),
        }
    });
    let inputs = CrossEntropyInputs {
        logits: logits.into_primitive().tensor(),
        targets: targets.into_primitive(),
        class_weights: weights,
    };
    let parts = B::fused_cross_entropy(inputs, options);

    let per_row_shape = Shape::new(target_dims);
    let reduced_shape = Shape::new([1; DT]);
    let loss_shape = if options.reduction == Reduction::None {
        per_row_shape.clone()
    } else {
        reduced_shape
    };
    let float = |primitive, shape: Shape| -> Tensor<B, DT> {
        Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(primitive)).reshape(shape)
    };
    Ok(CrossEntropyOutput {
        loss: float(parts.loss, loss_shape.clone()),
        z_loss: parts.z_loss.map(|z| float(z, loss_shape)),
        accuracy: parts
            .accuracy
            .map(|a| Tensor::from_primitive(TensorPrimitive::Float(a))),
        predicted: parts
            .predicted
            .map(|p| Tensor::<B, 1, Int>::from_primitive(p).reshape(per_row_shape.clone())),
        lse: parts.lse.map(|lse| float(lse, per_row_shape)),
    })
}

/// Logits `[N, V]` with targets `[N]`, or `[B, T, V]` with `[B, T]`; weights `[V]`.
/// Returns `(N, V)`.
fn check_shapes<B: Backend, const DL: usize, const DT: usize>(
    logits: &Tensor<B, DL>,
    targets: &Tensor<B, DT, Int>,
    class_weights: Option<&Tensor<B, 1>>,
) -> Result<(usize, usize), CrossEntropyError> {
    let logits_dims = logits.dims();
    let target_dims = targets.dims();
    if !(DL == 2 || DL == 3) || DT + 1 != DL || logits_dims[..DT] != target_dims[..] {
        return Err(CrossEntropyError::ShapeMismatch(format!(
            "expected logits [N, V] with targets [N], or [B, T, V] with [B, T]; got logits {logits_dims:?} and targets {target_dims:?}"
        )));
    }
    let vocab = logits_dims[DL - 1];
    let rows: usize = target_dims.iter().product();
    if rows > 0 && vocab == 0 {
        return Err(CrossEntropyError::ShapeMismatch(format!(
            "logits {logits_dims:?} have no classes"
        )));
    }
    if let Some(weights) = class_weights
        && weights.dims() != [vocab]
    {
        return Err(CrossEntropyError::ShapeMismatch(format!(
            "class weights have shape {:?}, expected [{vocab}] (one per class)",
            weights.dims()
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
