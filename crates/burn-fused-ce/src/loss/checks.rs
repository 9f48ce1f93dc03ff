//! Input checks shared by every loss: shapes, dtypes, target and class-weight values.
//! Shape checks read nothing from the device; value checks run there (one small kernel
//! for the targets) and read back a few integers.

use burn::backend::Dispatch;
use burn::tensor::{DType, Int, Tensor, TensorData};

use crate::error::{CrossEntropyError, Input};
use crate::loss::check_read::TargetCheckRead;
use crate::loss::extension::FusedCrossEntropyBackend;
use crate::loss::target_check::{self, PendingTargetCheck};
use crate::options::{CrossEntropyOptions, TargetCheck};
use crate::values::ClassWeights;

/// The target and class-weight checks the options ask for (a deferred target check is
/// started here, earlier calls' are looked at), then the weights as the op takes them.
pub(crate) fn checked_values<const DT: usize>(
    targets: &Tensor<DT, Int>,
    class_weights: Option<Tensor<1>>,
    rows: usize,
    vocab: usize,
    options: &CrossEntropyOptions,
    check_weight_values: bool,
) -> Result<ClassWeights<Dispatch>, CrossEntropyError> {
    if options.target_check == TargetCheck::Deferred {
        // Earlier calls' checks, as far as the device has run them.
        target_check::surface_finished()?;
        if rows > 0 {
            let slot = TargetCheckRead::new();
            let found =
                Tensor::from_dispatch(<Dispatch as FusedCrossEntropyBackend>::start_target_check(
                    targets.clone().reshape([rows]).into_dispatch(),
                    vocab,
                    options.ignore_index,
                    slot.clone(),
                ));
            target_check::defer(PendingTargetCheck {
                slot,
                found,
                rows,
                vocab,
            });
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
    Ok(match class_weights {
        None => ClassWeights::Unweighted,
        Some(weights) => {
            let weights = weights.cast(DType::F32);
            ClassWeights::Weighted {
                total: weights.clone().sum().into_dispatch(),
                weights: weights.into_dispatch(),
            }
        }
    })
}

/// The float dtypes the ops compute in (math in f32 whatever the storage).
pub(crate) const FLOAT_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The int dtypes targets may have (the kernels read a wider target that i32 cannot hold
/// as a bad class, never as its low bits).
pub(crate) const TARGET_DTYPES: [DType; 2] = [DType::I64, DType::I32];

/// An input of rows `[N, last]` with targets `[N]`, or `[B, T, last]` with `[B, T]`.
pub(crate) fn check_rows(
    input_dims: &[usize],
    target_dims: &[usize],
    input: Input,
    last: &str,
) -> Result<(), CrossEntropyError> {
    let rank = input_dims.len();
    if !(rank == 2 || rank == 3) {
        return Err(CrossEntropyError::shape(
            input,
            format!("[N, {last}] or [B, T, {last}]"),
            input_dims,
        ));
    }
    let rows = &input_dims[..rank - 1];
    if target_dims != rows {
        return Err(CrossEntropyError::shape(
            Input::Targets,
            format!("{rows:?}, one per row of the {input} {input_dims:?}"),
            target_dims,
        ));
    }
    Ok(())
}

/// Class weights, when given, are `[vocab]` (one per class) floats of any dtype: they are
/// cast to f32.
pub(crate) fn check_class_weights(
    class_weights: Option<&Tensor<1>>,
    vocab: usize,
) -> Result<(), CrossEntropyError> {
    let Some(weights) = class_weights else {
        return Ok(());
    };
    if weights.dims() != [vocab] {
        return Err(CrossEntropyError::shape(
            Input::ClassWeights,
            format!("[{vocab}] (one per class)"),
            &weights.dims(),
        ));
    }
    CrossEntropyError::check_float(Input::ClassWeights, weights.dtype())
}

/// Targets of an int dtype the kernels read (see [`TARGET_DTYPES`]).
pub(crate) fn check_targets_dtype<const DT: usize>(
    targets: &Tensor<DT, Int>,
) -> Result<(), CrossEntropyError> {
    CrossEntropyError::check_dtype(Input::Targets, &TARGET_DTYPES, targets.dtype())
}

/// Logits `[N, V]` with targets `[N]`, or `[B, T, V]` with `[B, T]`; weights `[V]`.
/// Returns `(N, V)`.
pub(crate) fn check_shapes<const DL: usize, const DT: usize>(
    logits: &Tensor<DL>,
    targets: &Tensor<DT, Int>,
    class_weights: Option<&Tensor<1>>,
) -> Result<(usize, usize), CrossEntropyError> {
    let (rows, vocab) = check_logits(logits, targets, "V")?;
    check_class_weights(class_weights, vocab)?;
    Ok((rows, vocab))
}

/// Logits `[N, V]` of a float dtype the ops compute in with targets `[N]`, or `[B, T, V]`
/// with `[B, T]`, with a class when there are rows (`last` names `V` in errors). Returns
/// `(N, V)`.
pub(crate) fn check_logits<const DL: usize, const DT: usize>(
    logits: &Tensor<DL>,
    targets: &Tensor<DT, Int>,
    last: &str,
) -> Result<(usize, usize), CrossEntropyError> {
    let logits_dims = logits.dims();
    let target_dims = targets.dims();
    check_rows(&logits_dims, &target_dims, Input::Logits, last)?;
    let vocab = logits_dims[DL - 1];
    let rows: usize = target_dims.iter().product();
    if rows > 0 && vocab == 0 {
        return Err(CrossEntropyError::shape(
            Input::Logits,
            format!("at least one class in the last dimension ({last})"),
            &logits_dims,
        ));
    }
    CrossEntropyError::check_dtype(Input::Logits, &FLOAT_DTYPES, logits.dtype())?;
    check_targets_dtype(targets)?;
    Ok((rows, vocab))
}

/// The first target that is neither a class nor the ignore index (when `check_targets`;
/// one small kernel on cube backends), and the first weight that is negative or not
/// finite, found on the device; one read of two or three integers, plus one more only
/// when there is a bad weight to report.
fn check_values<const DT: usize>(
    targets: &Tensor<DT, Int>,
    check_targets: bool,
    class_weights: Option<&Tensor<1>>,
    rows: usize,
    vocab: usize,
    ignore_index: i64,
) -> Result<(), CrossEntropyError> {
    let device = targets.device();
    // `[row, target]`, `row = rows` standing for "no bad target" (also when unchecked:
    // an empty batch's targets are never read).
    let mut found = vec![if check_targets {
        first_bad_target(targets.clone().reshape([rows]), vocab, ignore_index)
    } else {
        Tensor::<1, Int>::from_data(TensorData::from([rows as i64, 0]), &device)
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
        .try_into_vec_as::<i64>()
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
            .try_into_vec_as::<f32>()
            .unwrap_or_default();
        return Err(CrossEntropyError::InvalidClassWeight {
            class,
            value: value.first().copied().unwrap_or(f32::NAN),
        });
    }
    Ok(())
}

/// `[first bad row, its target]` of `targets [N]` (see
/// [`FusedCrossEntropyBackend::first_bad_target`]).
fn first_bad_target(targets: Tensor<1, Int>, vocab: usize, ignore_index: i64) -> Tensor<1, Int> {
    Tensor::from_dispatch(<Dispatch as FusedCrossEntropyBackend>::first_bad_target(
        targets.into_dispatch(),
        vocab,
        ignore_index,
    ))
}

/// Index of the first `true` in `mask [len]`, or `len` when there is none, as `[1]`.
pub(crate) fn first_true(
    mask: Tensor<1, burn::tensor::Bool>,
    len: usize,
    device: &burn::tensor::Device,
) -> Tensor<1, Int> {
    let positions = Tensor::<1, Int>::arange(0..len as i64, device);
    let past_end = Tensor::<1, Int>::full([len], len as i64, device);
    past_end.mask_where(mask, positions).min()
}
