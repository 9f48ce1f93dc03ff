//! The vocabulary-parallel loss: one training step (forward + backward) of logits whose
//! classes are cut over the devices, one shard per device (one thread and one
//! burn-collective peer each), against one device computing the loss of one shard's
//! logits alone (our loss, default config, and the two-pass plan: the sharded loss reads
//! its logits twice as the two passes do) and of the whole vocabulary; then, to show where
//! the sharded step's time goes, its forward alone and its exchange alone (one all-reduce
//! of the `[2K + 3, N]` f32 statistics, `K` shards). On `Autodiff<Cuda>`
//! / `Autodiff<Wgpu>` (Burn's fusion backend), steady steps: `reps` steps queued back to
//! back, one sync, the median over `rounds`.
//!
//! `cargo bench --bench vocab_parallel` (Vulkan: two logical shards on one device, small
//! sizes) or, on a machine with several GPUs, `CUDARC_CUDA_VERSION=13000 cargo bench
//! --bench vocab_parallel --no-default-features --features cuda,autotune` (one shard per
//! GPU). `FUSED_CE_BENCH_OUT` (default target/fused-ce-bench): where
//! `vocab_parallel.md` goes.

use std::time::Instant;

use burn::backend::Autodiff;
use burn::collective::{self, AllReduceStrategy, CollectiveConfig, PeerId};
use burn::tensor::{DType, Distribution, Int, Tensor, TensorData, backend::Backend};
use burn_fused_ce::{
    CollectiveExchange, CrossEntropyOptions, FusedCrossEntropyLossConfig, GradientPlan, Reduction,
    ShardExchange, TargetCheck, VocabShard, fused_cross_entropy, try_vocab_parallel_cross_entropy,
};
use fused_ce_suite::{DefaultBackend, Device, RUNTIME_NAME};
use rand::{Rng, SeedableRng, rngs::SmallRng};

type B = Autodiff<DefaultBackend>;

/// Median per-step milliseconds of `rounds` runs of `reps` steps, each run synced once,
/// after `warmup` steps.
fn steady_ms(
    device: &Device,
    warmup: usize,
    reps: usize,
    rounds: usize,
    mut step: impl FnMut(),
) -> f64 {
    let sync = || <B as Backend>::sync(device).expect("the device runs");
    for _ in 0..warmup {
        step();
    }
    sync();
    let mut times: Vec<f64> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..reps {
                step();
            }
            sync();
            started.elapsed().as_secs_f64() * 1e3 / reps as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn logits(rows: usize, vocab: usize, dtype: DType, device: &Device) -> Tensor<B, 2> {
    Tensor::<B, 2>::random([rows, vocab], Distribution::Uniform(-6.0, 6.0), device).cast(dtype)
}

fn main() {
    let cuda = cfg!(feature = "cuda");
    let count = fused_ce_suite::device_count();
    let (rows, shard_vocab, dtype, shards) = if cuda {
        (8192, 128_256, DType::BF16, count.max(1))
    } else {
        (256, 4096, DType::F32, 2)
    };
    let devices: Vec<Device> = if count >= shards && cuda {
        fused_ce_suite::devices(shards)
    } else {
        vec![Device::default(); shards]
    };
    let vocab = shard_vocab * shards;
    let (warmup, reps, rounds) = (3, 10, 5);
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    let labels: Vec<i64> = (0..rows)
        .map(|_| rng.random_range(0..vocab as i64))
        .collect();
    let device = devices[0].clone();
    let targets_on = |device: &Device| {
        Tensor::<B, 1, Int>::from_data(TensorData::new(labels.clone(), [rows]), device)
    };
    println!(
        "vocabulary-parallel loss on {RUNTIME_NAME}: {rows} x {vocab} {dtype:?}, {shards} shards of {shard_vocab} on {} device(s)",
        if cuda { shards.min(count) } else { 1 }
    );

    // One device, one shard's logits: the default config and the two-pass plan.
    let shard_targets = Tensor::<B, 1, Int>::from_data(
        TensorData::new(
            labels
                .iter()
                .map(|&y| y % shard_vocab as i64)
                .collect::<Vec<_>>(),
            [rows],
        ),
        &device,
    );
    let loss_fn = FusedCrossEntropyLossConfig::new().init::<B>(&device);
    let one_shard = logits(rows, shard_vocab, dtype, &device).require_grad();
    let default_ms = steady_ms(&device, warmup, reps, rounds, || {
        let loss = loss_fn.forward(one_shard.clone(), shard_targets.clone());
        let _ = loss.backward();
    });
    let two_pass = CrossEntropyOptions {
        gradient_plan: GradientPlan::TwoPass,
        target_check: TargetCheck::Off,
        ..CrossEntropyOptions::new(Reduction::Mean)
    };
    let two_pass_ms = steady_ms(&device, warmup, reps, rounds, || {
        let loss = fused_cross_entropy(one_shard.clone(), shard_targets.clone(), &two_pass);
        let _ = loss.backward();
    });
    drop(one_shard);
    // One device, the whole vocabulary.
    let whole = logits(rows, vocab, dtype, &device).require_grad();
    let whole_targets = targets_on(&device);
    let whole_ms = steady_ms(&device, warmup, reps, rounds, || {
        let loss = loss_fn.forward(whole.clone(), whole_targets.clone());
        let _ = loss.backward();
    });
    drop(whole);

    // The shards, one thread and one collective peer each.
    let options = CrossEntropyOptions {
        target_check: TargetCheck::Off,
        ..CrossEntropyOptions::new(Reduction::Mean)
    };
    collective::reset_collective::<DefaultBackend>();
    let config = CollectiveConfig::default()
        .with_num_devices(shards)
        .with_local_all_reduce_strategy(AllReduceStrategy::Tree(2));
    // Per shard: the step, its forward alone, the exchange alone.
    let sharded_ms: Vec<[f64; 3]> = std::thread::scope(|scope| {
        let workers: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(index, device)| {
                let (config, options, targets) =
                    (config.clone(), options.clone(), targets_on(device));
                scope.spawn(move || {
                    let peer = PeerId::from(index);
                    collective::register::<DefaultBackend>(peer, device.clone(), config)
                        .expect("registers with the collective");
                    let shard = VocabShard::new(index, shards, vocab).expect("a valid shard");
                    let exchange = CollectiveExchange { peer };
                    let logits = logits(rows, shard_vocab, dtype, device).require_grad();
                    let loss = || {
                        try_vocab_parallel_cross_entropy(
                            logits.clone(),
                            targets.clone(),
                            None,
                            &shard,
                            &options,
                            &exchange,
                        )
                        .expect("the sharded loss runs")
                    };
                    let step_ms = steady_ms(device, warmup, reps, rounds, || {
                        let _ = loss().loss.backward();
                    });
                    let forward_ms = steady_ms(device, warmup, reps, rounds, || drop(loss()));
                    let exchange_ms = steady_ms(device, warmup, reps, rounds, || {
                        let stats = Tensor::<DefaultBackend, 2>::ones(
                            [2 * shards + 3, rows],
                            (device, DType::F32),
                        );
                        drop(
                            exchange
                                .sum::<DefaultBackend>(stats.into_primitive().tensor())
                                .expect("the exchange runs"),
                        );
                    });
                    fused_ce_suite::lm::leave_collective::<DefaultBackend>(peer, device)
                        .expect("leaves the collective");
                    [step_ms, forward_ms, exchange_ms]
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
            })
            .collect()
    });
    // The slowest shard's time of each.
    let slowest = |part: usize| sharded_ms.iter().map(|ms| ms[part]).fold(0.0, f64::max);
    let (sharded, sharded_forward, exchange) = (slowest(0), slowest(1), slowest(2));
    let parallel = if cuda && count >= shards {
        "one shard per device, vocabulary-parallel"
    } else {
        "logical shards on one device, vocabulary-parallel"
    };

    let shape = format!("{rows} x {vocab}");
    let mut table = String::from(
        "| N x V | dtype | way | step ms | vs one shard, default | vs one shard, two-pass |\n|---|---|---|---:|---:|---:|\n",
    );
    for (way, ms) in [
        ("one device, one shard's logits, default", default_ms),
        ("one device, one shard's logits, two-pass", two_pass_ms),
        ("one device, the whole vocabulary, default", whole_ms),
        (parallel, sharded),
        (&format!("{parallel}: forward alone"), sharded_forward),
        (
            &format!(
                "{parallel}: the exchange alone ([{}, N] f32)",
                2 * shards + 3
            ),
            exchange,
        ),
    ] {
        let line = format!(
            "| {shape} | {dtype:?} | {way} | {ms:.3} | {:.2} | {:.2} |\n",
            ms / default_ms,
            ms / two_pass_ms
        );
        print!("{line}");
        table.push_str(&line);
    }
    let out =
        std::env::var("FUSED_CE_BENCH_OUT").unwrap_or_else(|_| "target/fused-ce-bench".into());
    std::fs::create_dir_all(&out).expect("the results folder");
    std::fs::write(format!("{out}/vocab_parallel.md"), table).expect("writes the table");
    println!("results: {out}/vocab_parallel.md");
}
