//! What each product op of the fused linear cross-entropy on `Fusion<CubeBackend>`
//! returns, known before it runs: one tensor each, whose shape and dtype mirror what the
//! cube implementation (`cube.rs`) and the default bodies return.

use burn::backend::fusion::custom::TensorSpec;
use burn::tensor::Shape;

/// `sum` with a block added into its columns: `sum`'s shape and dtype.
pub(crate) fn add_into_columns_meta(
    sum: &TensorSpec,
    _block: &TensorSpec,
    _start: &usize,
) -> TensorSpec {
    sum.clone()
}

/// `sum + lhs rhs`: `sum`'s shape and dtype.
pub(crate) fn accumulate_product_meta(
    sum: &TensorSpec,
    _lhs: &TensorSpec,
    _rhs: &TensorSpec,
    _cublaslt: &bool,
) -> TensorSpec {
    sum.clone()
}

/// The same tensor's shape and dtype: a matrix with its rows perhaps padded (the spec
/// says nothing of strides).
pub(crate) fn same_tensor_meta(tensor: &TensorSpec) -> TensorSpec {
    tensor.clone()
}

/// `lhs rhs`: `[M, N]` in `lhs`'s dtype (the split-K product and the chunk product).
pub(crate) fn split_k_meta(lhs: &TensorSpec, rhs: &TensorSpec, _cublaslt: &bool) -> TensorSpec {
    TensorSpec::new(Shape::new([lhs.shape[0], rhs.shape[1]]), lhs.dtype)
}
