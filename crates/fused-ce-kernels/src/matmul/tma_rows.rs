//! Matrices whose rows TMA can read. cubek-matmul's fastest kernels on Hopper load their
//! operands through TMA, which needs a tensor's start and its rows 16-byte aligned; a
//! matrix whose rows are not (a vocabulary of 50257 or 100277 bf16 classes, laid out
//! without padding) sends every matmul that reads it to kernels without TMA.

use cubecl::{
    client::Client,
    features::Tma,
    ir::ElemType,
    prelude::TensorBinding,
    std::tensor::{MatrixBatchLayout, TensorHandle, into_contiguous_pitched, matrix_batch_layout},
};

/// The alignment TMA needs of a tensor's start and of its rows, in bytes.
const TMA_ALIGN_BYTES: u64 = 16;

/// Whether the device loads through TMA (Hopper and later).
pub fn has_tma(client: &Client) -> bool {
    client.properties().features.tma.contains(Tma::Base)
}

/// Whether TMA can read `binding` of `dtype`: a matrix or a transposed one, or a batch of
/// them (`[B, R, C]`, the batch at any stride: slices of one matrix side by side), its
/// start and its rows 16-byte aligned.
pub fn tma_readable(binding: &TensorBinding, dtype: ElemType) -> bool {
    let aligned = |bytes: u64| bytes.is_multiple_of(TMA_ALIGN_BYTES);
    let strides = &binding.strides;
    let layout = match strides.len() {
        // The kernels map a batch dimension onto the tensor map's own, with its stride.
        3 => (strides[1] == 1 || strides[2] == 1) && (strides[0] > 0 || binding.shape[0] == 1),
        _ => matches!(
            matrix_batch_layout(strides, None),
            MatrixBatchLayout::Contiguous
                | MatrixBatchLayout::MildlyPermuted {
                    batch_swap: false,
                    ..
                }
        ),
    };
    let rows = strides
        .iter()
        .filter(|&&stride| stride != 1)
        .all(|&stride| aligned(stride as u64 * dtype.size() as u64));
    layout && rows && aligned(binding.handle.offset_start.unwrap_or(0))
}

/// A copy of `matrix` whose rows TMA can read (the allocator's pitched layout pads each
/// row), where the device has TMA and `matrix`'s rows are not readable as they are;
/// `None` otherwise (also where the copy would not be readable either).
pub fn tma_readable_copy(
    client: &Client,
    matrix: TensorBinding,
    dtype: ElemType,
) -> Option<TensorHandle> {
    if !has_tma(client) || matrix.shape.len() != 2 || tma_readable(&matrix, dtype) {
        return None;
    }
    let copy = into_contiguous_pitched(client, matrix, dtype);
    tma_readable(&copy.clone().binding(), dtype).then_some(copy)
}
