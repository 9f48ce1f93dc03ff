//! What each loss op on `Fusion<CubeBackend>` returns, known before it runs: the shapes
//! and dtypes of its outputs and which optional ones it has. Each function mirrors what
//! the cube implementation (`cube.rs`) and the default bodies return.

use burn::backend::fusion::custom::TensorSpec;
use burn::tensor::{DType, Shape};

use crate::loss::check_read::TargetCheckRead;
use crate::loss::types::{
    OnePassOutputMetadata, OnePassScaleMetadata, ReducedMetadata, TwoPassBackwardMetadata,
};
use crate::options::{CrossEntropyOptions, Reduction};
use crate::values::row_stat;
use crate::values::{
    ClassWeightsMetadata, CrossEntropyInputsMetadata, LossPartsMetadata, OptionalFloatMetadata,
    OptionalIntMetadata, RowStatsMetadata, RowWeightsMetadata,
};

fn spec(shape: impl Into<Shape>, dtype: DType) -> TensorSpec {
    TensorSpec::new(shape.into(), dtype)
}

fn present(tensor: TensorSpec) -> OptionalFloatMetadata {
    OptionalFloatMetadata::Present { tensor }
}

/// The rows of `[N, V]` or `[B, T, V]` logits.
fn row_count(logits: &TensorSpec) -> usize {
    let dims = logits.shape.num_dims();
    (0..dims - 1).map(|dim| logits.shape[dim]).product()
}

pub(crate) fn rows_meta(
    inputs: &CrossEntropyInputsMetadata,
    options: &CrossEntropyOptions,
) -> RowStatsMetadata {
    let rows = row_count(&inputs.logits);
    RowStatsMetadata {
        stats: spec([row_stat::COUNT, rows], DType::F32),
        predicted: if options.outputs.needs_argmax() {
            OptionalIntMetadata::Present {
                tensor: spec([rows], inputs.targets.dtype),
            }
        } else {
            OptionalIntMetadata::Absent
        },
        weighted: matches!(inputs.class_weights, ClassWeightsMetadata::Weighted { .. }),
    }
}

pub(crate) fn backward_meta(
    inputs: &CrossEntropyInputsMetadata,
    _backward: &TwoPassBackwardMetadata,
    _options: &CrossEntropyOptions,
) -> TensorSpec {
    inputs.logits.clone()
}

pub(crate) fn one_pass_meta(
    inputs: &CrossEntropyInputsMetadata,
    _scale: &OnePassScaleMetadata,
    options: &CrossEntropyOptions,
) -> OnePassOutputMetadata {
    OnePassOutputMetadata {
        rows: rows_meta(inputs, options),
        grad: inputs.logits.clone(),
    }
}

pub(crate) fn scale_meta(
    grad: &TensorSpec,
    _grad_output: &TensorSpec,
    _guess: &TensorSpec,
) -> (TensorSpec, TensorSpec) {
    (grad.clone(), spec([1], DType::F32))
}

pub(crate) fn first_bad_target_meta(
    targets: &TensorSpec,
    _vocab: &usize,
    _ignore_index: &i64,
) -> TensorSpec {
    spec([2], targets.dtype)
}

pub(crate) fn start_target_check_meta(
    targets: &TensorSpec,
    _vocab: &usize,
    _ignore_index: &i64,
    _read: &TargetCheckRead,
) -> TensorSpec {
    spec([2], targets.dtype)
}

pub(crate) fn reduce_meta(
    rows: &RowStatsMetadata,
    _row_weights: &RowWeightsMetadata,
    options: &CrossEntropyOptions,
    dtype: &DType,
    keep_denominators: &bool,
) -> ReducedMetadata {
    let n_rows = rows.stats.shape[1];
    let wanted = options.outputs;
    let reduced = if options.reduction == Reduction::None {
        [n_rows]
    } else {
        [1]
    };
    let optional = |wanted: bool, tensor: TensorSpec| {
        if wanted {
            present(tensor)
        } else {
            OptionalFloatMetadata::Absent
        }
    };
    let mean = options.reduction == Reduction::Mean;
    ReducedMetadata {
        parts: LossPartsMetadata {
            loss: spec(reduced, *dtype),
            z_loss: optional(wanted.z_loss, spec(reduced, DType::F32)),
            accuracy: optional(wanted.accuracy, spec([1], DType::F32)),
            predicted: if wanted.predicted {
                rows.predicted.clone()
            } else {
                OptionalIntMetadata::Absent
            },
            lse: optional(wanted.lse, spec([n_rows], DType::F32)),
            entropy: optional(wanted.entropy.is_on(), spec([n_rows], DType::F32)),
        },
        denominators: optional(mean && *keep_denominators, spec([2], DType::F32)),
    }
}
