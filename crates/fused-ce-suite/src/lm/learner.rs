//! The language model trained through burn-train's `Learner`: its metrics, checkpoints
//! and dashboard, with the fused linear cross-entropy as the loss and burn-train's loss,
//! accuracy and perplexity metrics fed by [`FusedSequenceOutput`] (no logits kept).

use std::path::Path;

use burn::{
    data::{
        dataloader::{DataLoaderBuilder, batcher::Batcher},
        dataset::InMemDataset,
    },
    lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig,
    module::Module,
    optim::AdamWConfig,
    tensor::{Device, Int, Tensor, TensorData},
    train::{
        InferenceStep, Learner, LearningResult, SupervisedTraining, TrainOutput, TrainStep,
        logger::{FileMetricLogger, MetricLogger},
        metric::{AccuracyMetric, LossMetric, NumericEntry, PerplexityMetric, store::Split},
    },
};
use burn_fused_ce::{
    CrossEntropyError, ExtraOutputs, FusedCrossEntropyLossConfig, FusedLinearCrossEntropyLoss,
    FusedLinearCrossEntropyLossConfig, FusedSequenceOutput,
};
use rand::{SeedableRng, rngs::SmallRng};

use super::data::Corpus;
use super::model::{Gpt, GptConfig};
use super::train::RunConfig;

/// The model and its loss as one `Learner` model: the steps return the loss and the
/// token statistics of the same pass.
#[derive(Module, Debug)]
pub struct LearnerGpt {
    pub gpt: Gpt,
    loss: FusedLinearCrossEntropyLoss,
}

impl LearnerGpt {
    /// `gpt` with the fused linear cross-entropy (chunks from `run`) asking for the
    /// accuracy the metrics show.
    pub fn new(gpt: Gpt, run: &RunConfig, device: &Device) -> Self {
        let loss = FusedCrossEntropyLossConfig::new().with_outputs(ExtraOutputs {
            accuracy: true,
            ..ExtraOutputs::default()
        });
        let loss = FusedLinearCrossEntropyLossConfig::new()
            .with_loss(loss)
            .with_chunking(run.chunking)
            .init(device);
        Self { gpt, loss }
    }

    fn output(&self, batch: TokenBatch) -> Result<FusedSequenceOutput, CrossEntropyError> {
        let hidden = self.gpt.hidden(batch.inputs);
        let output =
            self.loss
                .try_forward_with_outputs(hidden, &self.gpt.head, batch.targets.clone())?;
        FusedSequenceOutput::new(output, batch.targets, self.loss.options())
    }
}

/// A batch: input tokens `[batch, seq]` and next-token targets `[batch * seq]`.
#[derive(Debug, Clone)]
pub struct TokenBatch {
    pub inputs: Tensor<2, Int>,
    pub targets: Tensor<1, Int>,
}

/// One window of the corpus: `seq` input tokens and their next tokens.
#[derive(Debug, Clone)]
pub struct Window {
    inputs: Vec<i64>,
    targets: Vec<i64>,
}

#[derive(Debug, Clone, Copy)]
struct WindowBatcher;

impl Batcher<Window, TokenBatch> for WindowBatcher {
    fn batch(&self, items: Vec<Window>, device: &Device) -> TokenBatch {
        let sequences = items.len();
        let seq = items.first().map_or(0, |window| window.inputs.len());
        let (inputs, targets): (Vec<_>, Vec<_>) = items
            .into_iter()
            .map(|window| (window.inputs, window.targets))
            .unzip();
        let inputs = TensorData::new(inputs.concat(), [sequences, seq]);
        let targets = TensorData::new(targets.concat(), [sequences * seq]);
        TokenBatch {
            inputs: Tensor::from_data(inputs, device),
            targets: Tensor::from_data(targets, device),
        }
    }
}

impl TrainStep for LearnerGpt {
    type Input = TokenBatch;
    type Output = FusedSequenceOutput;

    fn step(&self, batch: TokenBatch) -> TrainOutput<FusedSequenceOutput> {
        let output = self.output(batch).unwrap_or_else(|error| panic!("{error}"));
        let grads = output.loss.backward();
        TrainOutput::new(self, grads, output)
    }
}

impl InferenceStep for LearnerGpt {
    type Input = TokenBatch;
    type Output = FusedSequenceOutput;

    fn step(&self, batch: TokenBatch) -> FusedSequenceOutput {
        self.output(batch).unwrap_or_else(|error| panic!("{error}"))
    }
}

/// `steps` batches of `run.batch` windows drawn as [`super::train`] draws them from
/// `seed`, cut into windows in order: the Learner, loading them unshuffled, sees the
/// same batches as the hand-written loop.
fn windows(corpus: &Corpus, run: &RunConfig, seq: usize, steps: usize, seed: u64) -> Vec<Window> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut windows = Vec::with_capacity(steps * run.batch);
    for _ in 0..steps {
        let (inputs, targets) = corpus.batch(run.batch, seq, &mut rng);
        for (inputs, targets) in inputs.chunks(seq).zip(targets.chunks(seq)) {
            windows.push(Window {
                inputs: inputs.to_vec(),
                targets: targets.to_vec(),
            });
        }
    }
    windows
}

/// Where a Learner run writes its logs and checkpoints, and how it validates.
#[derive(Debug, Clone)]
pub struct LearnerRun {
    /// One epoch of `run.steps` steps, then `valid_steps` validation batches.
    pub valid_steps: usize,
    /// Checkpoints every epoch (burn-train's default checkpointers).
    pub checkpoints: bool,
    /// burn-train's summary of the metrics at the end.
    pub summary: bool,
}

/// Trains `model` (on an autodiff device) for one epoch of `run.steps` batches through
/// burn-train's `Learner`, with the loss, accuracy and perplexity metrics, logging to
/// `directory`. The batches are the ones [`super::train`] draws for the same `run`.
pub fn train_with_learner(
    config: &GptConfig,
    run: &RunConfig,
    learner_run: &LearnerRun,
    model: Gpt,
    corpus: &Corpus,
    directory: &Path,
) -> LearningResult<LearnerGpt> {
    let device = model.devices()[0].clone();
    let seq = config.seq_len;
    let train = windows(corpus, run, seq, run.steps, run.seed);
    // Validation draws from another seed, on the device without autodiff.
    let valid = windows(corpus, run, seq, learner_run.valid_steps, run.seed ^ 0x5eed);
    let loader = |windows, device: &Device| {
        DataLoaderBuilder::new(WindowBatcher)
            .batch_size(run.batch)
            .set_device(device.clone())
            .build(InMemDataset::new(windows))
    };
    let train_loader = loader(train, &device);
    let valid_loader = loader(valid, &device.clone().without_autodiff());

    let schedule = CosineAnnealingLrSchedulerConfig::new(run.lr, run.steps.max(1))
        .with_min_lr(run.lr / 10.0)
        .init()
        .expect("valid learning-rate schedule");
    let learner = Learner::new(
        LearnerGpt::new(model, run, &device),
        AdamWConfig::new().init(),
        schedule,
    );
    let mut training = SupervisedTraining::new(directory, train_loader, valid_loader)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .metric_train_numeric(AccuracyMetric::new())
        .metric_valid_numeric(AccuracyMetric::new())
        .metric_train_numeric(PerplexityMetric::new())
        .metric_valid_numeric(PerplexityMetric::new())
        .num_epochs(1);
    if learner_run.checkpoints {
        training = training.with_default_checkpointers();
    }
    if learner_run.summary {
        training = training.summary();
    }
    training.launch(learner)
}

/// The per-step values of a numeric metric (`"Loss"`, `"Accuracy"`, `"Perplexity"`) that
/// a Learner run logged to `directory` for `epoch` (from 1) of `split`.
pub fn logged_metric(
    directory: &Path,
    name: &str,
    epoch: usize,
    split: Split,
) -> Result<Vec<f64>, String> {
    let entries = FileMetricLogger::new(directory).read_numeric(name, epoch, &split)?;
    Ok(entries
        .into_iter()
        .filter_map(|entry| match entry {
            NumericEntry::Value(value) => Some(value),
            NumericEntry::Aggregated {
                aggregated_value, ..
            } => Some(aggregated_value),
            NumericEntry::Final(_) => None,
        })
        .collect())
}
