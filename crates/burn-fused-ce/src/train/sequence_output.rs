//! The output of a language model's training or validation step when its loss is ours:
//! burn-train's `SequenceOutput` without the logits.

use burn::tensor::{ExecutionError, FloatDType, Int, Tensor};
use burn::train::ItemLazy;
use burn::train::metric::{AccuracyInput, Adaptor, LossInput, PerplexityInput};

use crate::error::CrossEntropyError;
use crate::options::{CrossEntropyOptions, Reduction};
use crate::output::CrossEntropyOutput;
use crate::train::metric_rows::{accuracy_rows, perplexity_rows};

/// What a `TrainStep` or `InferenceStep` returns to burn-train's `Learner` when the loss
/// is [`FusedCrossEntropyLoss`](crate::FusedCrossEntropyLoss) or
/// [`FusedLinearCrossEntropyLoss`](crate::FusedLinearCrossEntropyLoss): the loss and the
/// token statistics of the same pass. burn-train's `LossMetric`, `AccuracyMetric` and
/// `PerplexityMetric` take it as they are (no pad token to set: ignored rows are left
/// out), and no `[N, V]` logits are kept for them.
///
/// Accuracy is the share of counted tokens whose argmax is the target; perplexity is
/// `exp` of the loss's cross-entropy part (the loss without its z-loss), which is the
/// mean negative log-likelihood per counted token unless label smoothing, class weights
/// or given mean denominators are on.
///
/// # Example
///
/// A model whose head is a `Linear`, trained and validated through the `Learner`:
///
/// ```rust
/// # mod learner_example {
/// use burn::module::Module;
/// use burn::nn::Linear;
/// use burn::tensor::{Int, Tensor};
/// use burn::train::{InferenceStep, TrainOutput, TrainStep};
/// use burn_fused_ce::{
///     ExtraOutputs, FusedCrossEntropyLossConfig, FusedLinearCrossEntropyLoss,
///     FusedLinearCrossEntropyLossConfig, FusedSequenceOutput,
/// };
///
/// #[derive(Module, Debug)]
/// pub struct Model {
///     head: Linear, // and the layers before it
///     loss: FusedLinearCrossEntropyLoss,
/// }
///
/// pub fn loss_config() -> FusedLinearCrossEntropyLossConfig {
///     let accuracy = ExtraOutputs { accuracy: true, ..ExtraOutputs::default() };
///     FusedLinearCrossEntropyLossConfig::new()
///         .with_loss(FusedCrossEntropyLossConfig::new().with_outputs(accuracy))
/// }
///
/// #[derive(Debug, Clone)]
/// pub struct Batch {
///     hidden: Tensor<2>, // in a real model: the tokens, and `hidden` from the layers
///     targets: Tensor<1, Int>,
/// }
///
/// impl Model {
///     fn output(&self, batch: Batch) -> FusedSequenceOutput {
///         let targets = batch.targets;
///         let output = self.loss.forward_with_outputs(batch.hidden, &self.head, targets.clone());
///         FusedSequenceOutput::new(output, targets, self.loss.options()).expect("Mean, with accuracy")
///     }
/// }
///
/// impl TrainStep for Model {
///     type Input = Batch;
///     type Output = FusedSequenceOutput;
///     fn step(&self, batch: Batch) -> TrainOutput<FusedSequenceOutput> {
///         let output = self.output(batch);
///         let grads = output.loss.backward();
///         TrainOutput::new(self, grads, output)
///     }
/// }
///
/// impl InferenceStep for Model {
///     type Input = Batch;
///     type Output = FusedSequenceOutput;
///     fn step(&self, batch: Batch) -> FusedSequenceOutput {
///         self.output(batch)
///     }
/// }
/// // Then, as with any model: SupervisedTraining::new(dir, train_loader, valid_loader)
/// //     .metric_train_numeric(LossMetric::new())
/// //     .metric_train_numeric(AccuracyMetric::new())
/// //     .metric_train_numeric(PerplexityMetric::new())
/// //     .launch(Learner::new(model, optimizer, schedule));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FusedSequenceOutput {
    /// The step's loss (`[1]`); the only tensor with a gradient until the Learner syncs
    /// the item.
    pub loss: Tensor<1>,
    /// The loss's cross-entropy part (`[1]`, f32): the loss without its z-loss.
    pub cross_entropy: Tensor<1>,
    /// Share of counted tokens whose argmax is the target (`[1]`, f32).
    pub accuracy: Tensor<1>,
    /// Tokens whose target is not the ignore index (`[1]`).
    pub counted_tokens: Tensor<1, Int>,
}

impl FusedSequenceOutput {
    /// The step's output from the loss's output and the targets it saw. The loss must be
    /// `Reduction::Mean` and ask for the `accuracy` extra output, and for `z_loss` too
    /// when its z-loss scale is not 0 (the z-loss is taken out of the perplexity).
    ///
    /// # Errors
    /// [`CrossEntropyError::InvalidOption`] naming the option to change.
    pub fn new<const D: usize>(
        output: CrossEntropyOutput<D>,
        targets: Tensor<D, Int>,
        options: &CrossEntropyOptions,
    ) -> Result<Self, CrossEntropyError> {
        if options.reduction != Reduction::Mean {
            return Err(CrossEntropyError::invalid_option(
                "reduction",
                format!("{:?}", options.reduction),
                "Mean for burn-train's metrics",
            ));
        }
        let Some(accuracy) = output.accuracy else {
            return Err(CrossEntropyError::invalid_option(
                "outputs.accuracy",
                false,
                "true for burn-train's accuracy metric",
            ));
        };
        let loss = output.loss.flatten::<1>(0, D - 1);
        let mut cross_entropy = loss.clone().detach().cast(FloatDType::F32);
        if options.z_loss_scale != 0.0 {
            let Some(z_loss) = output.z_loss else {
                return Err(CrossEntropyError::invalid_option(
                    "outputs.z_loss",
                    false,
                    "true with a z-loss, to take it out of the perplexity",
                ));
            };
            cross_entropy = cross_entropy - z_loss.flatten(0, D - 1);
        }
        let counted_tokens = targets
            .flatten::<1>(0, D - 1)
            .not_equal_scalar(options.ignore_index)
            .int()
            .sum();
        Ok(Self {
            loss,
            cross_entropy,
            accuracy,
            counted_tokens,
        })
    }
}

impl ItemLazy for FusedSequenceOutput {
    fn sync(self) -> Result<Self, ExecutionError> {
        // As burn-train's own outputs: the metrics read their scalars on the device, off
        // the autodiff graph; flushing hands the queued work to the device first.
        self.loss.device().flush()?;
        Ok(Self {
            loss: self.loss.without_autodiff(),
            cross_entropy: self.cross_entropy.without_autodiff(),
            accuracy: self.accuracy.without_autodiff(),
            counted_tokens: self.counted_tokens.without_autodiff(),
        })
    }
}

impl Adaptor<LossInput> for FusedSequenceOutput {
    fn adapt(&self) -> LossInput {
        LossInput::new(self.loss.clone())
    }
}

impl Adaptor<AccuracyInput> for FusedSequenceOutput {
    fn adapt(&self) -> AccuracyInput {
        let (outputs, targets) = accuracy_rows(&self.accuracy, &self.counted_tokens);
        AccuracyInput::new(outputs, targets)
    }
}

impl Adaptor<PerplexityInput> for FusedSequenceOutput {
    fn adapt(&self) -> PerplexityInput {
        let (outputs, targets) = perplexity_rows(&self.cross_entropy, &self.counted_tokens);
        PerplexityInput::new(outputs, targets)
    }
}
