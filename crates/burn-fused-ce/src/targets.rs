//! A call's targets as the user gives them: the class indices and, for a weighted
//! objective, each row's weights.

use burn::backend::Dispatch;
use burn::tensor::{DType, Int, Tensor};

use crate::error::{CrossEntropyError, Input};
use crate::values::{OptionalFloat, RowWeights};

/// The targets of a call: class indices `[N]` or `[B, T]` and, for a weighted objective,
/// each row's weights, of the same shape and any float dtype. With them the loss is the
/// reduction of `w_r loss_r - c_r H_r` (`H_r` the row's entropy, after temperature and
/// softcap), its gradient that of this objective, formed in the same pass as the loss's
/// under the one pass:
///
/// - `Sum`: `sum_r (w_r loss_r - c_r H_r)`;
/// - `Mean`: `sum_r w_r ce_r / D + sum_r (w_r z_r - c_r H_r) / n`, `D` and `n` the mean's
///   own denominators (the class weights' sum over the counted rows and their count, or
///   the given `MeanDenominators`), never the weights' sum;
/// - `None`: `w_r loss_r - c_r H_r` per row.
///
/// Weights may be negative or zero (advantages are); a NaN or infinite weight makes its
/// row's loss and gradient NaN or infinite, as a NaN logit does; an ignored row stays
/// exactly 0 whatever its weights. The weights get no gradient. A `Tensor<D, Int>` of
/// class indices converts into targets without weights.
#[derive(Debug, Clone)]
pub struct Targets<const D: usize> {
    /// The class indices; the ignore index marks rows that do not count.
    pub classes: Tensor<D, Int>,
    /// `w_r`: each row's loss weight (1 without).
    pub weights: Option<Tensor<D>>,
    /// `c_r`: each row's entropy weight, an entropy bonus with `c_r > 0` (none without).
    pub entropy_weights: Option<Tensor<D>>,
}

impl<const D: usize> Targets<D> {
    /// Class indices without weights.
    pub fn new(classes: Tensor<D, Int>) -> Self {
        Self {
            classes,
            weights: None,
            entropy_weights: None,
        }
    }

    /// These targets with each row's loss weight (`None`: 1).
    pub fn with_weights(self, weights: Option<Tensor<D>>) -> Self {
        Self { weights, ..self }
    }

    /// These targets with each row's entropy weight (`None`: no entropy term).
    pub fn with_entropy_weights(self, entropy_weights: Option<Tensor<D>>) -> Self {
        Self {
            entropy_weights,
            ..self
        }
    }

    /// Whether any weights are given.
    pub fn is_weighted(&self) -> bool {
        self.weights.is_some() || self.entropy_weights.is_some()
    }

    /// The weights' shapes against the classes', and their dtypes.
    pub(crate) fn check(&self) -> Result<(), CrossEntropyError> {
        let dims = self.classes.dims();
        for (input, weights) in [
            (Input::RowWeights, &self.weights),
            (Input::EntropyWeights, &self.entropy_weights),
        ] {
            let Some(weights) = weights else {
                continue;
            };
            if weights.dims() != dims {
                return Err(CrossEntropyError::shape(
                    input,
                    format!("{dims:?}, the targets' shape"),
                    &weights.dims(),
                ));
            }
            CrossEntropyError::check_float(input, weights.dtype())?;
        }
        Ok(())
    }

    /// The weights as the ops take them: f32 `[N]` each.
    pub(crate) fn row_weights(&self) -> RowWeights<Dispatch> {
        let rows = self.classes.shape().num_elements();
        let flat = |weights: &Option<Tensor<D>>| {
            OptionalFloat::from_option(weights.as_ref().map(|weights| {
                weights
                    .clone()
                    .reshape([rows])
                    .cast(DType::F32)
                    .into_dispatch()
            }))
        };
        RowWeights {
            loss: flat(&self.weights),
            entropy: flat(&self.entropy_weights),
        }
    }
}

impl<const D: usize> From<Tensor<D, Int>> for Targets<D> {
    fn from(classes: Tensor<D, Int>) -> Self {
        Self::new(classes)
    }
}
