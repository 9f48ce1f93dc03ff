//! Launch arguments that more than one family takes.

use cubecl::prelude::*;

/// Class weights `[V]` and their total `[1]` (f32), or any small f32 buffers when the
/// launch is not weighted (they are then never read).
pub struct WeightArgs {
    pub weights: TensorArg,
    pub total: TensorArg,
}

/// Where backward writes the gradient.
pub enum GradientTarget {
    /// Over the logits themselves (they are not read again by anyone).
    InPlace(TensorArg),
    /// Read `logits`, write `grad` (same shape).
    Separate { logits: TensorArg, grad: TensorArg },
}

impl GradientTarget {
    /// The `(logits, grad)` launch arguments. Every gradient-writing kernel takes the
    /// logits as its first input, so an in-place gradient is an alias of input 0.
    pub(crate) fn into_args(self) -> (TensorArg, TensorArg) {
        match self {
            GradientTarget::InPlace(logits) => {
                let grad = TensorArg::Alias {
                    input_pos: 0,
                    strides: logits.strides().into(),
                    shape: logits.shape().into(),
                };
                (logits, grad)
            }
            GradientTarget::Separate { logits, grad } => (logits, grad),
        }
    }
}

/// A second launch argument for the same buffer (`TensorArg` is not `Clone`).
pub(crate) fn same_arg(arg: &TensorArg) -> TensorArg {
    match arg {
        TensorArg::Handle { handle } => TensorArg::Handle {
            handle: handle.clone(),
        },
        TensorArg::Alias {
            input_pos,
            strides,
            shape,
        } => TensorArg::Alias {
            input_pos: *input_pos,
            strides: strides.clone(),
            shape: shape.clone(),
        },
    }
}
