//! What each vocabulary-parallel op on `Fusion<CubeBackend>` returns, known before it
//! runs. Each function mirrors what the cube implementation (`cube.rs`) and the tensor-op
//! versions return.

use burn::backend::fusion::custom::TensorSpec;
use burn::tensor::{DType, Shape};

use crate::options::CrossEntropyOptions;
use crate::values::row_stat;
use crate::values::{
    ClassWeightsMetadata, CrossEntropyInputsMetadata, OptionalFloatMetadata, OptionalIntMetadata,
    RowStatsMetadata,
};
use crate::vocab_parallel::extension_types::{
    ExchangedRowsMetadata, KernelBackwardRowsMetadata, ShardBackwardRowsMetadata,
};
use crate::vocab_parallel::shard::{VocabShard, exchanged_rows};

fn spec(shape: impl Into<Shape>, dtype: DType) -> TensorSpec {
    TensorSpec::new(shape.into(), dtype)
}

pub(crate) fn contributions_meta(
    inputs: &CrossEntropyInputsMetadata,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> TensorSpec {
    let rows = inputs.targets.shape.num_elements();
    spec([exchanged_rows(shard, options), rows], DType::F32)
}

pub(crate) fn whole_rows_meta(
    exchanged: &ExchangedRowsMetadata,
    _shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> RowStatsMetadata {
    let rows = exchanged.summed.shape[1];
    RowStatsMetadata {
        stats: spec([row_stat::COUNT, rows], DType::F32),
        predicted: if options.outputs.needs_argmax() {
            OptionalIntMetadata::Present {
                tensor: spec([rows], exchanged.targets.dtype),
            }
        } else {
            OptionalIntMetadata::Absent
        },
        weighted: matches!(
            exchanged.class_weights,
            ClassWeightsMetadata::Weighted { .. }
        ),
    }
}

pub(crate) fn gradient_rows_meta(
    inputs: &ShardBackwardRowsMetadata,
    _shard: &VocabShard,
    options: &CrossEntropyOptions,
) -> KernelBackwardRowsMetadata {
    let rows = inputs.stats.shape[1];
    KernelBackwardRowsMetadata {
        targets: spec([rows], inputs.targets.dtype),
        stats: spec([row_stat::COUNT, rows], DType::F32),
        coefficients: spec([rows], DType::F32),
        smooth: if options.label_smoothing > 0.0 {
            OptionalFloatMetadata::Present {
                tensor: spec([rows], DType::F32),
            }
        } else {
            OptionalFloatMetadata::Absent
        },
    }
}
