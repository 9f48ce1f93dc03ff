//! The fused linear cross-entropy's shape and dtype checks: the hidden states against the
//! targets and the head, before anything runs on the device.

use burn::tensor::{Int, Tensor};

use crate::loss::checks::{check_class_weights, check_rows};
use crate::options::CrossEntropyError;

/// Hidden states `[N, H]` with targets `[N]`, or `[B, T, H]` with `[B, T]`; the head's
/// `weight [H, V]` and `bias [V]`; class weights `[V]`. Returns `(N, V)`.
pub(crate) fn check_linear_shapes<const DH: usize, const DT: usize>(
    hidden: &Tensor<DH>,
    weight: &Tensor<2>,
    bias: Option<&Tensor<1>>,
    targets: &Tensor<DT, Int>,
    class_weights: Option<&Tensor<1>>,
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
