//! The fused linear cross-entropy as a module: the LM head and the loss in one op.

use burn::{
    config::Config,
    module::Module,
    tensor::{Device, Tensor},
};

use crate::error::CrossEntropyError;
use crate::linear::{
    api::linear_cross_entropy_checked,
    chunking::LinearChunking,
    inputs::{LinearCrossEntropyInputs, LmHead},
};
use crate::loss::module::{FusedCrossEntropyLoss, FusedCrossEntropyLossConfig};
use crate::mean_denominators::MeanDenominators;
use crate::options::CrossEntropyOptions;
use crate::output::CrossEntropyOutput;
use crate::targets::Targets;

/// Configuration of [`FusedLinearCrossEntropyLoss`]: the loss's own config (every option)
/// and how the rows are cut into chunks.
#[derive(Config, Debug, PartialEq)]
pub struct FusedLinearCrossEntropyLossConfig {
    /// The loss: reduction, ignore index, label smoothing, z-loss, softcap, class
    /// weights, target check, gradient plan, extra outputs, fast math.
    #[config(default = "FusedCrossEntropyLossConfig::new()")]
    pub loss: FusedCrossEntropyLossConfig,
    /// The chunks' memory budget and the weight gradient's accumulation dtype.
    #[config(default = "LinearChunking::default()")]
    pub chunking: LinearChunking,
}

impl FusedLinearCrossEntropyLossConfig {
    /// Builds the loss.
    ///
    /// # Panics
    /// On an invalid option or class weight; see [`Self::try_init`].
    pub fn init(&self, device: &Device) -> FusedLinearCrossEntropyLoss {
        match self.try_init(device) {
            Ok(loss) => loss,
            Err(error) => panic!("{error}"),
        }
    }

    /// Builds the loss, or says which option or class weight is invalid.
    pub fn try_init(
        &self,
        device: &Device,
    ) -> Result<FusedLinearCrossEntropyLoss, CrossEntropyError> {
        Ok(FusedLinearCrossEntropyLoss {
            loss: self.loss.try_init(device)?,
            chunking: self.chunking,
        })
    }
}

/// The LM head (`hidden @ weight + bias`) and the cross-entropy as one op: rows go in
/// chunks sized from a memory budget, each chunk's logits are formed, reduced and turned
/// into their gradient in place, so the N x V logits are never whole in memory.
#[derive(Module, Debug)]
pub struct FusedLinearCrossEntropyLoss {
    loss: FusedCrossEntropyLoss,
    #[module(skip)]
    chunking: LinearChunking,
}

impl FusedLinearCrossEntropyLoss {
    /// The loss of the head applied to `hidden` (`[N, H]` or `[B, T, H]`) against
    /// `targets` (`[N]` or `[B, T]`: class indices, or [`Targets`] with the rows' weights
    /// of a weighted objective): the targets' shape for `Reduction::None`, one element
    /// otherwise. The head is the model's `&Linear`, or an [`LmHead`] of tensors (tied
    /// weights). Gradients reach `hidden` and the head's weight and bias, those that are
    /// tracked (a head frozen by `no_grad()` or `Param::set_require_grad(false)` gets
    /// none, and its gradient is never formed).
    ///
    /// # Panics
    /// On bad input, with the message [`Self::try_forward`] returns as an error.
    pub fn forward<const DH: usize, const DT: usize>(
        &self,
        hidden: Tensor<DH>,
        head: impl Into<LmHead>,
        targets: impl Into<Targets<DT>>,
    ) -> Tensor<DT> {
        self.forward_with_outputs(hidden, head, targets).loss
    }

    /// [`Self::forward`], returning bad input as an error.
    pub fn try_forward<const DH: usize, const DT: usize>(
        &self,
        hidden: Tensor<DH>,
        head: impl Into<LmHead>,
        targets: impl Into<Targets<DT>>,
    ) -> Result<Tensor<DT>, CrossEntropyError> {
        Ok(self.try_forward_with_outputs(hidden, head, targets)?.loss)
    }

    /// The loss and the extra outputs the config asks for, from the same pass.
    ///
    /// # Panics
    /// On bad input; see [`Self::try_forward_with_outputs`].
    pub fn forward_with_outputs<const DH: usize, const DT: usize>(
        &self,
        hidden: Tensor<DH>,
        head: impl Into<LmHead>,
        targets: impl Into<Targets<DT>>,
    ) -> CrossEntropyOutput<DT> {
        match self.try_forward_with_outputs(hidden, head, targets) {
            Ok(output) => output,
            Err(error) => panic!("{error}"),
        }
    }

    /// [`Self::forward_with_outputs`], returning bad input as an error.
    pub fn try_forward_with_outputs<const DH: usize, const DT: usize>(
        &self,
        hidden: Tensor<DH>,
        head: impl Into<LmHead>,
        targets: impl Into<Targets<DT>>,
    ) -> Result<CrossEntropyOutput<DT>, CrossEntropyError> {
        let inputs = LinearCrossEntropyInputs::new(hidden, head, targets)
            .with_class_weights(self.loss.class_weights.clone());
        // The class weights' values were checked at `init`.
        linear_cross_entropy_checked(
            inputs,
            self.loss.options(),
            &self.chunking,
            false,
            &self.loss.guess,
        )
    }

    /// The options this loss runs with.
    pub fn options(&self) -> &CrossEntropyOptions {
        self.loss.options()
    }

    /// This loss (its weights and remembered incoming gradient shared), with `Mean`
    /// dividing by `denominators` instead of each call's own: for one part of a batch
    /// passed in parts (gradient accumulation), see [`MeanDenominators`]. `None` goes back
    /// to the call's own.
    pub fn with_mean_denominators(&self, denominators: Option<MeanDenominators>) -> Self {
        Self {
            loss: self.loss.with_mean_denominators(denominators),
            chunking: self.chunking,
        }
    }

    /// How this loss cuts the rows.
    pub fn chunking(&self) -> &LinearChunking {
        &self.chunking
    }
}
