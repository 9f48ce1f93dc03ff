//! The training loop of the language-model example and its test, with the LM head's loss
//! computed one of three ways.

use std::time::Instant;

use burn::{
    lr_scheduler::{
        cosine::CosineAnnealingLrSchedulerConfig, module_lr_scheduler::ModuleLrScheduler,
    },
    module::{Module, ModuleVisitor, Param},
    nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig},
    optim::{AdamWConfig, GradientsParams, ModuleOptimizer},
    tensor::{Device, Int, Tensor, TensorData},
};
use burn_fused_ce::{
    FusedCrossEntropyLoss, FusedCrossEntropyLossConfig, FusedLinearCrossEntropyLoss,
    FusedLinearCrossEntropyLossConfig, LinearChunking,
};
use rand::{Rng, SeedableRng, rngs::SmallRng};

use super::data::Corpus;
use super::model::{Gpt, GptConfig};

/// How the loss over the vocabulary is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossKind {
    /// The head's logits, then Burn's stock `CrossEntropyLoss`.
    Stock,
    /// The head's logits, then our fused loss.
    Fused,
    /// The head and the loss as one op: `FusedLinearCrossEntropyLoss`.
    FusedLinear,
}

impl LossKind {
    pub const ALL: [LossKind; 3] = [LossKind::Stock, LossKind::Fused, LossKind::FusedLinear];

    pub fn name(self) -> &'static str {
        match self {
            LossKind::Stock => "Burn's loss",
            LossKind::Fused => "fused loss",
            LossKind::FusedLinear => "fused linear CE",
        }
    }
}

/// A run's sizes and schedule.
#[derive(Debug, Clone, Copy)]
pub struct RunConfig {
    pub batch: usize,
    pub steps: usize,
    pub lr: f64,
    pub seed: u64,
    /// The fused linear cross-entropy's chunks (its logits budget among them).
    pub chunking: LinearChunking,
}

/// What a step reports.
#[derive(Debug, Clone)]
pub struct StepLog {
    pub loss: f64,
    /// Wall time of the step, the read of its loss (a sync) included.
    pub seconds: f64,
    pub tokens: usize,
}

/// The seeded starting model on `device` (an autodiff device to train it). Runs to compare
/// start from clones of one.
pub fn initial_model(config: &GptConfig, seed: u64, device: &Device) -> Gpt {
    device.seed(seed);
    let model = Gpt::new(config, device);
    // Burn initialises parameters lazily, at first use: draw them all now, in the module's
    // order, so that the draws follow from the seed alone and every clone starts from them.
    model.visit(&mut DrawParameters);
    model
}

/// Initialises every float parameter it visits.
struct DrawParameters;

impl ModuleVisitor for DrawParameters {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = param.val();
    }
}

/// One replica's training state: the optimizer, the learning-rate schedule and the loss
/// modules (the fused ones remember the incoming gradient they guess, per device).
pub(crate) struct Trainer {
    optimizer: ModuleOptimizer,
    schedule: ModuleLrScheduler,
    stock: CrossEntropyLoss,
    fused: FusedCrossEntropyLoss,
    fused_linear: FusedLinearCrossEntropyLoss,
    kind: LossKind,
}

impl Trainer {
    pub(crate) fn new(run: &RunConfig, kind: LossKind, device: &Device) -> Self {
        Self {
            optimizer: AdamWConfig::new().init(),
            schedule: CosineAnnealingLrSchedulerConfig::new(run.lr, run.steps.max(1))
                .with_min_lr(run.lr / 10.0)
                .init()
                .expect("valid learning-rate schedule"),
            stock: CrossEntropyLossConfig::new().init(device),
            fused: FusedCrossEntropyLossConfig::new().init(device),
            fused_linear: FusedLinearCrossEntropyLossConfig::new()
                .with_chunking(run.chunking)
                .init(device),
            kind,
        }
    }

    /// The mean loss over the tokens of `inputs` and `targets` (`[sequences * seq]` each)
    /// and its gradients, on `device` (where `model` is). The loss is not read back.
    pub(crate) fn gradients(
        &self,
        model: &Gpt,
        (inputs, targets): (Vec<i64>, Vec<i64>),
        seq: usize,
        device: &Device,
    ) -> (GradientsParams, Tensor<1>) {
        let rows = targets.len();
        let sequences = rows / seq;
        let input = Tensor::<2, Int>::from_data(TensorData::new(inputs, [sequences, seq]), device);
        let target = Tensor::<1, Int>::from_data(TensorData::new(targets, [rows]), device);
        let loss = match self.kind {
            LossKind::Stock => self.stock.forward(model.forward(input), target),
            LossKind::Fused => self.fused.forward(model.forward(input), target),
            LossKind::FusedLinear => {
                self.fused_linear
                    .forward(model.hidden(input), &model.head, target)
            }
        };
        (GradientsParams::from_grads(loss.backward(), model), loss)
    }

    /// The optimizer's step with `grads` at the schedule's next learning rate.
    pub(crate) fn apply(&mut self, model: Gpt, grads: GradientsParams) -> Gpt {
        self.optimizer.step(self.schedule.step(), model, grads)
    }
}

/// Trains `model` (on the autodiff device `device`) on `corpus` and returns per-step logs
/// and the trained model. Batches are drawn from `run.seed` on the host, so equal starts
/// see equal data. `on_step` sees each step's log as it ends.
pub fn train(
    config: &GptConfig,
    run: &RunConfig,
    kind: LossKind,
    mut model: Gpt,
    corpus: &Corpus,
    device: &Device,
    mut on_step: impl FnMut(usize, &StepLog),
) -> (Vec<StepLog>, Gpt) {
    let mut trainer = Trainer::new(run, kind, device);
    let mut rng = SmallRng::seed_from_u64(run.seed);
    let seq = config.seq_len;
    let mut logs = Vec::with_capacity(run.steps);
    for step in 0..run.steps {
        let started = Instant::now();
        let batch = corpus.batch(run.batch, seq, &mut rng);
        let rows = batch.1.len();
        let (grads, loss) = trainer.gradients(&model, batch, seq, device);
        model = trainer.apply(model, grads);
        let log = StepLog {
            loss: loss.into_scalar::<f64>(),
            seconds: started.elapsed().as_secs_f64(),
            tokens: rows,
        };
        on_step(step, &log);
        logs.push(log);
    }
    (logs, model)
}

/// How [`sample_with`] picks each next token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// The logits are divided by it before the softmax: below 1 sharpens the distribution,
    /// above 1 flattens it; 0 (or less) picks the most likely token, as [`sample`] does.
    pub temperature: f64,
    /// Draw among the `top_k` most likely tokens only (0: among all of them).
    pub top_k: usize,
    /// The draws follow from it alone, on the host: a seed gives the same text on every run.
    pub seed: u64,
}

impl Sampling {
    /// The most likely token each time.
    pub const GREEDY: Sampling = Sampling {
        temperature: 0.0,
        top_k: 0,
        seed: 0,
    };
}

/// Greedy continuation of `prompt` by `len` tokens, without autodiff (whatever the device
/// `model` trained on).
pub fn sample(
    model: &Gpt,
    config: &GptConfig,
    corpus: &Corpus,
    prompt: &[u32],
    len: usize,
    device: &Device,
) -> String {
    sample_with(
        model,
        config,
        corpus,
        prompt,
        len,
        &Sampling::GREEDY,
        device,
    )
}

/// Continuation of `prompt` by `len` tokens drawn as `sampling` says, without autodiff
/// (whatever the device `model` trained on).
pub fn sample_with(
    model: &Gpt,
    config: &GptConfig,
    corpus: &Corpus,
    prompt: &[u32],
    len: usize,
    sampling: &Sampling,
    device: &Device,
) -> String {
    let model = model.valid();
    let device = device.clone().without_autodiff();
    let mut rng = SmallRng::seed_from_u64(sampling.seed);
    let mut tokens = prompt.to_vec();
    // One input shape for every token: the context padded on the right to a fixed window.
    // Causal attention leaves the positions before the padding as they were, and under
    // Burn's autotune each new sequence length would tune its matmuls again.
    let window = (prompt.len() + len).clamp(1, config.seq_len);
    for _ in 0..len {
        let context = &tokens[tokens.len().saturating_sub(window)..];
        let last = context.len().max(1) - 1;
        let input: Vec<i64> = context
            .iter()
            .map(|&t| i64::from(t))
            .chain(std::iter::repeat(0))
            .take(window)
            .collect();
        let input = Tensor::<2, Int>::from_data(TensorData::new(input, [1, window]), &device);
        let logits = model
            .forward(input)
            .slice([last..last + 1, 0..config.vocab]);
        let next = if sampling.temperature > 0.0 {
            let logits = logits
                .into_data()
                .try_into_vec_as::<f64>()
                .expect("the logits read back as numbers");
            draw(&logits, sampling, &mut rng)
        } else {
            logits.argmax(1).into_scalar::<i64>() as usize
        };
        tokens.push(next as u32);
    }
    corpus.decode(&tokens)
}

/// A token drawn from the softmax of `logits / temperature` over the `top_k` largest.
fn draw(logits: &[f64], sampling: &Sampling, rng: &mut SmallRng) -> usize {
    let mut order: Vec<usize> = (0..logits.len())
        .filter(|&i| logits[i].is_finite())
        .collect();
    let k = match sampling.top_k {
        0 => order.len(),
        k => k.min(order.len()),
    };
    if k == 0 {
        return 0;
    }
    let larger = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]);
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, larger);
        order.truncate(k);
    }
    // Sorted, so that the draw does not depend on the selection's order.
    order.sort_unstable_by(larger);
    let top = logits[order[0]];
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i] - top) / sampling.temperature).exp())
        .collect();
    let mut target = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (&i, &weight) in order.iter().zip(&weights) {
        if target < weight {
            return i;
        }
        target -= weight;
    }
    order[k - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(temperature: f64, top_k: usize) -> Sampling {
        Sampling {
            temperature,
            top_k,
            seed: 7,
        }
    }

    #[test]
    fn draws_stay_among_the_top_k_and_follow_the_seed() {
        let logits = [0.5, 3.0, f64::NAN, 2.0, -1.0, 2.5];
        let draws = |sampling: &Sampling| {
            let mut rng = SmallRng::seed_from_u64(sampling.seed);
            (0..200)
                .map(|_| draw(&logits, sampling, &mut rng))
                .collect::<Vec<_>>()
        };
        assert!(draws(&sampling(1.0, 1)).iter().all(|&t| t == 1));
        let top_three = draws(&sampling(1.0, 3));
        assert!(top_three.iter().all(|t| [1, 5, 3].contains(t)));
        assert!([1, 5, 3].iter().all(|t| top_three.contains(t)));
        assert_eq!(top_three, draws(&sampling(1.0, 3)));
        // All finite logits when top-k is 0; a low temperature all but picks the largest.
        assert!(draws(&sampling(1.0, 0)).iter().all(|&t| t != 2));
        let cold = draws(&sampling(0.05, 0));
        assert!(cold.iter().filter(|&&t| t == 1).count() > 190);
    }
}
