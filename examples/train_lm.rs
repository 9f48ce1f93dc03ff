//! The main example: train a small causal language model on bytes with the fused loss.
//!
//!   scripts/with-vulkan.sh cargo run --release --example train_lm                  # CPU (lavapipe), a few minutes
//!   scripts/with-vulkan.sh cargo run --release --example train_lm -- --compare-stock
//!   CUDARC_CUDA_VERSION=13000 cargo run --release --no-default-features --features cuda \
//!       --example train_lm -- --big --compare-stock                                  # a GPU
//!
//! Text: English-like sentences the repository generates. Tokens: bytes. Targets: the input
//! shifted by one; padding targets are ignored (`ignore_index = 0`). AdamW with a cosine
//! learning-rate schedule. `--compare-stock` trains the same seeded model with Burn's stock
//! `CrossEntropyLoss` and prints both loss curves side by side, step time and memory.

use burn::backend::Autodiff;
use cubecl::Runtime as _;
use fused_ce_suite::{
    DefaultBackend, Device, RUNTIME_NAME, Runtime,
    lm::{LmConfig, LossKind, StepLog, TinyGpt, initial_model, sample, train},
};

type B = Autodiff<DefaultBackend>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let mut config = if flag("--big") {
        LmConfig::big()
    } else {
        LmConfig::small()
    };
    if let Some(steps) = args
        .iter()
        .position(|a| a == "--steps")
        .and_then(|i| args.get(i + 1))
    {
        config.steps = steps.parse().unwrap_or(config.steps);
    }
    let device = Device::default();
    println!("training a byte-level transformer on {RUNTIME_NAME}: {config:?}");

    // Both runs start from the same weights.
    let start = initial_model::<B>(&config, &device);
    let (fused, model) = run(&config, LossKind::Fused, start.clone(), &device);
    println!(
        "sample: {:?}",
        sample(&model, &config, "the old man ", 80, &device)
    );

    if flag("--compare-stock") {
        let (stock, _) = run(&config, LossKind::Stock, start, &device);
        println!("\n step   fused loss   stock loss   rel diff");
        let mut worst: f64 = 0.0;
        for (step, (a, b)) in fused.iter().zip(&stock).enumerate() {
            let diff = (a.loss - b.loss).abs() / b.loss.abs().max(1e-12);
            worst = worst.max(diff);
            if step % 10 == 0 || step + 1 == fused.len() {
                println!("{step:5}   {:10.5}   {:10.5}   {diff:.2e}", a.loss, b.loss);
            }
        }
        println!(
            "median step: fused {:.2} ms, stock {:.2} ms; largest relative loss difference {worst:.2e}",
            median_ms(&fused),
            median_ms(&stock)
        );
    }
}

/// One training run with per-step logs, and the device memory it reserved.
fn run(
    config: &LmConfig,
    kind: LossKind,
    start: TinyGpt<B>,
    device: &Device,
) -> (Vec<StepLog>, TinyGpt<B>) {
    let client = Runtime::client(device);
    client.memory_cleanup();
    let tokens = (config.batch * config.seq_len) as f64;
    let (logs, model) = train::<B>(config, kind, start, device, |step, log| {
        if step % 10 == 0 || step + 1 == config.steps {
            println!(
                "[{kind:?}] step {step:4}  loss {:.4}  {:.0} tokens/s",
                log.loss,
                tokens / log.seconds
            );
        }
    });
    if let Ok(usage) = client.memory_usage() {
        println!(
            "[{kind:?}] device memory reserved after training: {:.1} MiB",
            usage.bytes_reserved as f64 / 1048576.0
        );
    }
    (logs, model)
}

fn median_ms(logs: &[StepLog]) -> f64 {
    let mut times: Vec<f64> = logs.iter().skip(2).map(|l| l.seconds * 1e3).collect();
    if times.is_empty() {
        return 0.0;
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}
