//! The chunks' products by Burn's own ops: the default bodies of the extension's product
//! ops, and what the cube implementation falls back to where its kernel refuses.

use burn::backend::{Backend, tensor::FloatTensor};

use crate::primitive::FloatOf;

/// `lhs rhs` for 2-D `lhs` and `rhs`, by the backend's matmul.
pub(crate) fn product<B: Backend>(lhs: FloatTensor<B>, rhs: FloatTensor<B>) -> FloatTensor<B> {
    FloatOf::<B, 2>::new(lhs)
        .matmul(FloatOf::new(rhs))
        .into_primitive()
}

/// `sum + lhs rhs` by tensor ops: the whole product, taken to `sum`'s dtype, then added
/// (the default of
/// [`LinearCrossEntropyBackend::accumulate_product`](crate::backend::LinearCrossEntropyBackend::accumulate_product)).
pub(crate) fn product_added<B: Backend>(
    sum: FloatTensor<B>,
    lhs: FloatTensor<B>,
    rhs: FloatTensor<B>,
) -> FloatTensor<B> {
    let sum = FloatOf::<B, 2>::new(sum);
    let product = FloatOf::<B, 2>::new(product::<B>(lhs, rhs)).cast(sum.dtype());
    sum.add(product).into_primitive()
}

/// `sum[:, start..start + w] += block` by tensor ops (the default of
/// [`LinearCrossEntropyBackend::add_into_columns`](crate::backend::LinearCrossEntropyBackend::add_into_columns)):
/// the block is added to a view of the columns, which `slice_assign` writes back.
pub(crate) fn columns_added<B: Backend>(
    sum: FloatTensor<B>,
    block: FloatTensor<B>,
    start: usize,
) -> FloatTensor<B> {
    let sum = FloatOf::<B, 2>::new(sum);
    let block = FloatOf::<B, 2>::new(block);
    let [rows, width] = block.dims();
    let columns = start..start + width;
    // The view is dropped once the add has read it: `slice_assign` then finds `sum` held
    // by nothing else and writes in place.
    let updated = sum.clone().slice([0..rows, columns.clone()]).add(block);
    sum.slice_assign([0..rows, columns], updated)
        .into_primitive()
}
