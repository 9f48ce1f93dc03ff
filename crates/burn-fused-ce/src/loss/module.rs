//! The loss module users put in their model, configured like Burn's own losses.

use burn::{
    config::Config,
    module::Module,
    tensor::{Device, Tensor},
};

use crate::error::CrossEntropyError;
use crate::loss::{api::cross_entropy_checked, incoming_guess::IncomingGuess};
use crate::mean_denominators::MeanDenominators;
use crate::options::{
    CrossEntropyOptions, ExtraOutputs, FastMath, GradientPlan, Reduction, TargetCheck,
};
use crate::output::CrossEntropyOutput;
use crate::targets::Targets;

/// Configuration of [`FusedCrossEntropyLoss`] (serde-serialisable, like Burn's configs).
/// Names and defaults follow PyTorch's `cross_entropy` and Liger-Kernel.
#[derive(Config, Debug, PartialEq)]
pub struct FusedCrossEntropyLossConfig {
    /// How per-row losses are combined: `None` gives the targets' shape, `Mean` and `Sum`
    /// one value.
    #[config(default = "Reduction::Mean")]
    pub reduction: Reduction,
    /// Rows whose target equals this are ignored (PyTorch's default, -100).
    #[config(default = -100)]
    pub ignore_index: i64,
    /// PyTorch's label smoothing, in `[0, 1]`.
    #[config(default = 0.0)]
    pub label_smoothing: f32,
    /// PaLM's z-loss scale (`s * lse^2` per row), `>= 0`.
    #[config(default = 0.0)]
    pub z_loss_scale: f32,
    /// Logits divided by this temperature `T > 0` before everything else.
    #[config(default = "None")]
    pub temperature: Option<f32>,
    /// Tanh soft-capping of the logits, `c > 0`.
    #[config(default = "None")]
    pub softcap: Option<f32>,
    /// One weight per class, all `>= 0` (PyTorch's `weight`).
    #[config(default = "None")]
    pub class_weights: Option<Vec<f32>>,
    /// How bad targets are reported (see [`TargetCheck`]).
    #[config(default = "TargetCheck::Deferred")]
    pub target_check: TargetCheck,
    /// How the gradient is formed under autodiff (see [`GradientPlan`]).
    #[config(default = "GradientPlan::Auto")]
    pub gradient_plan: GradientPlan,
    /// Extra outputs of [`FusedCrossEntropyLoss::forward_with_outputs`].
    #[config(default = "ExtraOutputs::default()")]
    pub outputs: ExtraOutputs,
    /// Fast-math switches (CUDA only; see [`FastMath`]).
    #[config(default = "FastMath::default()")]
    pub fast_math: FastMath,
}

impl FusedCrossEntropyLossConfig {
    /// Builds the loss.
    ///
    /// # Panics
    /// On an invalid option or class weight; see [`Self::try_init`].
    pub fn init(&self, device: &Device) -> FusedCrossEntropyLoss {
        match self.try_init(device) {
            Ok(loss) => loss,
            Err(error) => panic!("{error}"),
        }
    }

    /// Builds the loss, or says which option or class weight is invalid.
    pub fn try_init(&self, device: &Device) -> Result<FusedCrossEntropyLoss, CrossEntropyError> {
        let options = self.options();
        options.validate()?;
        if let Some(weights) = &self.class_weights
            && let Some((class, &value)) = weights
                .iter()
                .enumerate()
                .find(|(_, w)| !(w.is_finite() && **w >= 0.0))
        {
            return Err(CrossEntropyError::InvalidClassWeight { class, value });
        }
        Ok(FusedCrossEntropyLoss {
            options,
            guess: IncomingGuess::new(),
            class_weights: self
                .class_weights
                .as_ref()
                .map(|weights| Tensor::from_floats(weights.as_slice(), device)),
        })
    }

    /// The op-level options this config stands for (class weights travel as a tensor).
    pub fn options(&self) -> CrossEntropyOptions {
        CrossEntropyOptions::new(self.reduction)
            .with_ignore_index(self.ignore_index)
            .with_label_smoothing(self.label_smoothing)
            .with_z_loss_scale(self.z_loss_scale)
            .with_temperature(self.temperature)
            .with_softcap(self.softcap)
            .with_target_check(self.target_check)
            .with_gradient_plan(self.gradient_plan)
            .with_outputs(self.outputs)
            .with_fast_math(self.fast_math)
    }
}

/// Cross-entropy of logits against class indices, computed by fused kernels.
#[derive(Module, Debug)]
pub struct FusedCrossEntropyLoss {
    #[module(skip)]
    options: CrossEntropyOptions,
    /// Constant (not trained), like Burn's `CrossEntropyLoss::weights`.
    pub(crate) class_weights: Option<Tensor<1>>,
    /// The last incoming gradient, which the one pass forms the next gradient for.
    #[module(skip)]
    pub(crate) guess: IncomingGuess,
}

impl FusedCrossEntropyLoss {
    /// Loss of `logits` (`[N, V]` or `[B, T, V]`) against `targets` (`[N]` or `[B, T]`:
    /// class indices, or [`Targets`] with the rows' weights of a weighted objective): the
    /// targets' shape for `Reduction::None`, one element otherwise, in the logits' dtype.
    ///
    /// # Panics
    /// On bad input, with the message [`Self::try_forward`] returns as an error.
    pub fn forward<const DL: usize, const DT: usize>(
        &self,
        logits: Tensor<DL>,
        targets: impl Into<Targets<DT>>,
    ) -> Tensor<DT> {
        self.forward_with_outputs(logits, targets).loss
    }

    /// [`Self::forward`], returning bad input as an error.
    pub fn try_forward<const DL: usize, const DT: usize>(
        &self,
        logits: Tensor<DL>,
        targets: impl Into<Targets<DT>>,
    ) -> Result<Tensor<DT>, CrossEntropyError> {
        Ok(self.try_forward_with_outputs(logits, targets)?.loss)
    }

    /// The loss and the extra outputs the config asks for, from the same pass.
    ///
    /// # Panics
    /// On bad input; see [`Self::try_forward_with_outputs`].
    pub fn forward_with_outputs<const DL: usize, const DT: usize>(
        &self,
        logits: Tensor<DL>,
        targets: impl Into<Targets<DT>>,
    ) -> CrossEntropyOutput<DT> {
        match self.try_forward_with_outputs(logits, targets) {
            Ok(output) => output,
            Err(error) => panic!("{error}"),
        }
    }

    /// [`Self::forward_with_outputs`], returning bad input as an error.
    pub fn try_forward_with_outputs<const DL: usize, const DT: usize>(
        &self,
        logits: Tensor<DL>,
        targets: impl Into<Targets<DT>>,
    ) -> Result<CrossEntropyOutput<DT>, CrossEntropyError> {
        // The weights' values were checked at `init`.
        cross_entropy_checked(
            logits,
            targets.into(),
            self.class_weights.clone(),
            &self.options,
            false,
            &self.guess,
        )
    }

    /// The options this loss runs with.
    pub fn options(&self) -> &CrossEntropyOptions {
        &self.options
    }

    /// This loss (its weights and remembered incoming gradient shared), with `Mean`
    /// dividing by `denominators` instead of each call's own: for one part of a batch
    /// passed in parts (gradient accumulation), see [`MeanDenominators`]. `None` goes back
    /// to the call's own.
    pub fn with_mean_denominators(&self, denominators: Option<MeanDenominators>) -> Self {
        Self {
            options: self.options.clone().with_mean_denominators(denominators),
            class_weights: self.class_weights.clone(),
            guess: self.guess.clone(),
        }
    }
}
