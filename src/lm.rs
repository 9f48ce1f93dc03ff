//! A small causal language model trained on bytes, shared by the `train_lm` example and
//! its test: the fused loss doing its real job, next to Burn's stock loss.

use std::time::Instant;

use burn::{
    lr_scheduler::{LrScheduler, cosine::CosineAnnealingLrSchedulerConfig},
    module::Module,
    nn::{
        Embedding, EmbeddingConfig, Linear, LinearConfig,
        attention::generate_autoregressive_mask,
        loss::CrossEntropyLossConfig,
        transformer::{TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput},
    },
    optim::{AdamWConfig, GradientsParams, Optimizer},
    tensor::{Int, Tensor, TensorData, backend::AutodiffBackend},
};
use burn_fused_ce::{FusedCrossEntropyBackend, FusedCrossEntropyLossConfig};
use rand::{Rng, SeedableRng, rngs::SmallRng};

/// Bytes are tokens. Byte 0 never occurs in the text: it pads short sequences, and a
/// target of 0 is ignored (`ignore_index = 0`, a class inside `[0, V)`).
pub const VOCAB: usize = 256;
pub const PAD: i64 = 0;

/// Model and run sizes.
#[derive(Debug, Clone, Copy)]
pub struct LmConfig {
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub seq_len: usize,
    pub batch: usize,
    pub steps: usize,
    pub lr: f64,
    pub seed: u64,
}

impl LmConfig {
    /// Minutes on two CPU cores (lavapipe).
    pub fn small() -> Self {
        Self {
            d_model: 64,
            layers: 2,
            heads: 4,
            seq_len: 64,
            batch: 16,
            steps: 150,
            lr: 3e-3,
            seed: 7,
        }
    }

    /// For a GPU.
    pub fn big() -> Self {
        Self {
            d_model: 512,
            layers: 6,
            heads: 8,
            seq_len: 256,
            batch: 64,
            steps: 300,
            lr: 1e-3,
            seed: 7,
        }
    }
}

#[derive(Module, Debug)]
pub struct TinyGpt<B: burn::tensor::backend::Backend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    blocks: TransformerEncoder<B>,
    head: Linear<B>,
}

impl<B: burn::tensor::backend::Backend> TinyGpt<B> {
    pub fn new(config: &LmConfig, device: &B::Device) -> Self {
        Self {
            tokens: EmbeddingConfig::new(VOCAB, config.d_model).init(device),
            positions: EmbeddingConfig::new(config.seq_len, config.d_model).init(device),
            blocks: TransformerEncoderConfig::new(
                config.d_model,
                4 * config.d_model,
                config.heads,
                config.layers,
            )
            .with_norm_first(true)
            .with_dropout(0.0)
            .init(device),
            head: LinearConfig::new(config.d_model, VOCAB).init(device),
        }
    }

    /// Logits `[batch * seq, VOCAB]` for input bytes `[batch, seq]`.
    pub fn forward(&self, input: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let [batch, seq] = input.dims();
        let device = input.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .unsqueeze_dim::<2>(0)
            .expand([batch, seq]);
        let x = self.tokens.forward(input) + self.positions.forward(positions);
        let mask = generate_autoregressive_mask::<B>(batch, seq, &device);
        let x = self
            .blocks
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        self.head.forward(x).reshape([batch * seq, VOCAB])
    }
}

/// English-like text the repository generates (deterministic): a few hundred KB of
/// sentences from small word lists, so there is structure to learn and nothing to ship.
pub fn generated_text(bytes: usize, seed: u64) -> Vec<u8> {
    const SUBJECTS: &[&str] = &[
        "the cat",
        "a dog",
        "the old man",
        "my sister",
        "the river",
        "a small bird",
        "the teacher",
        "our neighbour",
    ];
    const VERBS: &[&str] = &[
        "sees",
        "likes",
        "follows",
        "finds",
        "watches",
        "remembers",
        "carries",
        "paints",
    ];
    const OBJECTS: &[&str] = &[
        "the moon",
        "a red ball",
        "the long road",
        "an apple",
        "the garden",
        "a quiet song",
        "the morning light",
        "a wooden box",
    ];
    const ENDINGS: &[&str] = &[
        ".",
        " every day.",
        " in the rain.",
        " after dinner.",
        " at night.",
        " by the sea.",
    ];
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut text = Vec::with_capacity(bytes + 64);
    while text.len() < bytes {
        let pick =
            |rng: &mut SmallRng, words: &[&'static str]| words[rng.random_range(0..words.len())];
        let sentence = format!(
            "{} {} {}{} ",
            pick(&mut rng, SUBJECTS),
            pick(&mut rng, VERBS),
            pick(&mut rng, OBJECTS),
            pick(&mut rng, ENDINGS)
        );
        text.extend_from_slice(sentence.as_bytes());
    }
    text
}

/// One batch: inputs `[batch, seq]` and next-byte targets `[batch * seq]` (the input
/// shifted by one). Every fourth sequence is cut short and padded: its padding targets
/// are `PAD`, ignored by the loss.
pub fn batch(text: &[u8], config: &LmConfig, rng: &mut SmallRng) -> (Vec<i64>, Vec<i64>) {
    let (b, t) = (config.batch, config.seq_len);
    let mut inputs = Vec::with_capacity(b * t);
    let mut targets = Vec::with_capacity(b * t);
    for row in 0..b {
        let start = rng.random_range(0..text.len() - t - 1);
        let window = &text[start..start + t + 1];
        let len = if row % 4 == 3 {
            rng.random_range(t / 4..t)
        } else {
            t
        };
        for i in 0..t {
            let (x, y) = if i < len {
                (window[i] as i64, window[i + 1] as i64)
            } else {
                (PAD, PAD)
            };
            inputs.push(x);
            targets.push(y);
        }
    }
    (inputs, targets)
}

/// Which loss trains the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossKind {
    Fused,
    /// Burn's `CrossEntropyLoss` with `pad_tokens = [PAD]`. It averages over all rows,
    /// padded ones included, so it is rescaled by `rows / counted` to be the same mean.
    Stock,
}

/// What a run reports per step.
#[derive(Debug, Clone)]
pub struct StepLog {
    pub loss: f64,
    pub seconds: f64,
}

/// The seeded starting model. Runs to compare start from clones of one.
pub fn initial_model<B: burn::tensor::backend::Backend>(
    config: &LmConfig,
    device: &B::Device,
) -> TinyGpt<B> {
    B::seed(device, config.seed);
    let model = TinyGpt::new(config, device);
    // Burn initialises parameters lazily, at first use, and a clone of an uninitialised
    // model initialises on its own: draw the weights now, so clones share them.
    let record = model.into_record();
    TinyGpt::new(config, device).load_record(record)
}

/// Trains `model` and returns per-step losses and times, and the trained model. The
/// batches are drawn from `config.seed` on the host, so equal starts see equal data.
pub fn train<B>(
    config: &LmConfig,
    kind: LossKind,
    mut model: TinyGpt<B>,
    device: &B::Device,
    mut on_step: impl FnMut(usize, &StepLog),
) -> (Vec<StepLog>, TinyGpt<B>)
where
    B: AutodiffBackend + FusedCrossEntropyBackend,
{
    let mut optimizer = AdamWConfig::new().init();
    let mut schedule = CosineAnnealingLrSchedulerConfig::new(config.lr, config.steps)
        .with_min_lr(config.lr / 10.0)
        .init()
        .expect("valid learning-rate schedule");
    let fused = FusedCrossEntropyLossConfig::new()
        .with_ignore_index(PAD)
        .init(device);
    let stock = CrossEntropyLossConfig::new()
        .with_pad_tokens(Some(vec![PAD as usize]))
        .init(device);
    let text = generated_text(300_000, config.seed);
    let mut rng = SmallRng::seed_from_u64(config.seed);
    let mut logs = Vec::with_capacity(config.steps);
    for step in 0..config.steps {
        let started = Instant::now();
        let (inputs, targets) = batch(&text, config, &mut rng);
        let rows = targets.len();
        let counted = targets.iter().filter(|&&y| y != PAD).count().max(1);
        let input = Tensor::<B, 2, Int>::from_data(
            TensorData::new(inputs, [config.batch, config.seq_len]),
            device,
        );
        let target = Tensor::<B, 1, Int>::from_data(TensorData::new(targets, [rows]), device);
        let logits = model.forward(input);
        let loss = match kind {
            LossKind::Fused => fused.forward(logits, target),
            LossKind::Stock => stock.forward(logits, target) * (rows as f64 / counted as f64),
        };
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(schedule.step(), model, grads);
        let value: f64 = loss.into_scalar().elem();
        let log = StepLog {
            loss: value,
            seconds: started.elapsed().as_secs_f64(),
        };
        on_step(step, &log);
        logs.push(log);
    }
    (logs, model)
}

/// Greedy continuation of `prompt` by `len` bytes.
pub fn sample<B: burn::tensor::backend::Backend>(
    model: &TinyGpt<B>,
    config: &LmConfig,
    prompt: &str,
    len: usize,
    device: &B::Device,
) -> String {
    let mut bytes: Vec<i64> = prompt.bytes().map(i64::from).collect();
    for _ in 0..len {
        let context: Vec<i64> = bytes[bytes.len().saturating_sub(config.seq_len)..].to_vec();
        let seq = context.len();
        let input = Tensor::<B, 2, Int>::from_data(TensorData::new(context, [1, seq]), device);
        let logits = model.forward(input);
        let next = logits
            .slice([seq - 1..seq, 0..VOCAB])
            .argmax(1)
            .into_scalar()
            .elem::<i64>();
        bytes.push(next);
    }
    String::from_utf8_lossy(&bytes.iter().map(|&b| b as u8).collect::<Vec<_>>()).into_owned()
}

use burn::tensor::ElementConversion as _;
