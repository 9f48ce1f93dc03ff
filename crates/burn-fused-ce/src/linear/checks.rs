//! The fused linear cross-entropy's shape and dtype checks: the hidden states against the
//! targets and the head, before anything runs on the device.

use burn::tensor::{Int, Tensor};

use crate::error::{CrossEntropyError, Input};
use crate::loss::checks::{FLOAT_DTYPES, check_class_weights, check_rows, check_targets_dtype};

/// Hidden states `[N, H]` with targets `[N]`, or `[B, T, H]` with `[B, T]`, of a float
/// dtype the ops compute in; the head's `weight [H, V]` and `bias [V]` in the hidden
/// states' dtype; class weights `[V]`. Returns `(N, V)`.
pub(crate) fn check_linear_shapes<const DH: usize, const DT: usize>(
    hidden: &Tensor<DH>,
    weight: &Tensor<2>,
    bias: Option<&Tensor<1>>,
    targets: &Tensor<DT, Int>,
    class_weights: Option<&Tensor<1>>,
) -> Result<(usize, usize), CrossEntropyError> {
    let hidden_dims = hidden.dims();
    let target_dims = targets.dims();
    check_rows(&hidden_dims, &target_dims, Input::Hidden, "H")?;
    let width = hidden_dims[DH - 1];
    let [weight_width, vocab] = weight.dims();
    if weight_width != width {
        return Err(CrossEntropyError::shape(
            Input::Weight,
            format!("[{width}, V] (Burn's Linear layout [H, V], H the hidden states' width)"),
            &weight.dims(),
        ));
    }
    if let Some(bias) = bias
        && bias.dims() != [vocab]
    {
        return Err(CrossEntropyError::shape(
            Input::Bias,
            format!("[{vocab}] (one per class of the weight)"),
            &bias.dims(),
        ));
    }
    let rows: usize = target_dims.iter().product();
    if rows > 0 && vocab == 0 {
        return Err(CrossEntropyError::shape(
            Input::Weight,
            "at least one class (V)",
            &weight.dims(),
        ));
    }
    check_class_weights(class_weights, vocab)?;
    let dtype = hidden.dtype();
    CrossEntropyError::check_dtype(Input::Hidden, &FLOAT_DTYPES, dtype)?;
    CrossEntropyError::check_dtype(Input::Weight, &[dtype], weight.dtype())?;
    if let Some(bias) = bias {
        CrossEntropyError::check_dtype(Input::Bias, &[dtype], bias.dtype())?;
    }
    check_targets_dtype(targets)?;
    Ok((rows, vocab))
}
