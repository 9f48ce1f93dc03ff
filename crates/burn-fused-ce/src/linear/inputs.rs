//! The fused linear cross-entropy's inputs as `Tensor`s, named: the LM head, and the
//! call's tensors around it.

use burn::nn::Linear;
use burn::tensor::Tensor;

use crate::targets::Targets;

/// The LM head as tensors: `weight [H, V]` (Burn's `Linear` layout) and, when it has one,
/// `bias [V]`. A Burn `&Linear` converts into it; weights tied to a token embedding's
/// `[V, H]` table are that table transposed.
#[derive(Debug, Clone)]
pub struct LmHead {
    /// `[H, V]`.
    pub weight: Tensor<2>,
    /// `[V]`, in the weight's dtype.
    pub bias: Option<Tensor<1>>,
}

impl LmHead {
    /// A head without bias.
    pub fn new(weight: Tensor<2>) -> Self {
        Self { weight, bias: None }
    }

    /// This head with `bias` (`None`: without).
    pub fn with_bias(self, bias: Option<Tensor<1>>) -> Self {
        Self { bias, ..self }
    }
}

impl From<&Linear> for LmHead {
    fn from(linear: &Linear) -> Self {
        Self {
            weight: linear.weight.val(),
            bias: linear.bias.as_ref().map(|bias| bias.val()),
        }
    }
}

/// The inputs of [`try_fused_linear_cross_entropy`](crate::try_fused_linear_cross_entropy),
/// named: `hidden [N, H]` or `[B, T, H]`, the head, the targets (`[N]` or `[B, T]`, with
/// the rows' weights when the objective is weighted) and optional class weights `[V]`.
/// Built with [`Self::new`] and the `with_*` setters.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LinearCrossEntropyInputs<const DH: usize, const DT: usize> {
    /// The LM head's input.
    pub hidden: Tensor<DH>,
    /// The LM head.
    pub head: LmHead,
    /// Class indices (the ignore index marks rows that do not count) and the rows'
    /// weights.
    pub targets: Targets<DT>,
    /// One weight per class, all `>= 0` (PyTorch's `weight`), any float dtype.
    pub class_weights: Option<Tensor<1>>,
}

impl<const DH: usize, const DT: usize> LinearCrossEntropyInputs<DH, DT> {
    /// The loss of `head` applied to `hidden`, against `targets`, without class weights.
    pub fn new(
        hidden: Tensor<DH>,
        head: impl Into<LmHead>,
        targets: impl Into<Targets<DT>>,
    ) -> Self {
        Self {
            hidden,
            head: head.into(),
            targets: targets.into(),
            class_weights: None,
        }
    }

    /// These inputs with `class_weights` (`None`: unweighted).
    pub fn with_class_weights(self, class_weights: Option<Tensor<1>>) -> Self {
        Self {
            class_weights,
            ..self
        }
    }
}
