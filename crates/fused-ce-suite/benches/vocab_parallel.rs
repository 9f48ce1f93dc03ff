//! The vocabulary-parallel loss: one training step (forward + backward) of logits whose
//! classes are cut over the devices, one shard per device (one thread and one
//! exchange between them), against one device computing the loss of one shard's
//! logits alone (our loss, default config, and the two-pass plan: the sharded loss reads
//! its logits twice as the two passes do) and of the whole vocabulary; then, to show where
//! the sharded step's time goes, its forward alone and its exchange alone (one all-reduce
//! of `[2K + 3, N]` f32 statistics, `K` shards). With autodiff on the cube devices
//! (`Device::autodiff()`; their tensors run on Burn's fusion backend), steady steps: `reps`
//! steps queued back to back, one sync, the median over `rounds`. The shards exchange
//! through Burn's collective all-reduce (`DistributedExchange`) when each has a GPU of its
//! own, and between their threads (`InProcessExchange`) when they share one device.
//!
//! `cargo bench --bench vocab_parallel` (Vulkan: two logical shards on one device, small
//! sizes) or, on a machine with several GPUs, `CUDARC_CUDA_VERSION=13000 cargo bench
//! --bench vocab_parallel --no-default-features --features cuda,autotune` (one shard per
//! GPU). `FUSED_CE_BENCH_OUT` (default target/fused-ce-bench): where
//! `vocab_parallel.md` goes.

use std::time::Instant;

use burn::tensor::distributed::{DistributedConfig, DistributedContext, ReduceOperation};
use burn::tensor::{DType, Device, Distribution, Int, Tensor, TensorData};
use burn_fused_ce::vocab_parallel::{
    DistributedExchange, InProcessExchange, ShardExchange, VocabShard,
    try_vocab_parallel_cross_entropy,
};
use burn_fused_ce::{
    CrossEntropyOptions, FusedCrossEntropyLossConfig, GradientPlan, Reduction, TargetCheck,
    fused_cross_entropy,
};
use fused_ce_suite::RUNTIME_NAME;
use rand::{Rng, SeedableRng, rngs::SmallRng};

/// Median per-step milliseconds of `rounds` runs of `reps` steps, each run synced once,
/// after `warmup` steps. Each step's output (its gradients, its loss) is dropped only
/// once the device's queue has been flushed: Burn's fusion backend skips writing what
/// nothing holds.
fn steady_ms<O>(
    device: &Device,
    warmup: usize,
    reps: usize,
    rounds: usize,
    mut step: impl FnMut() -> O,
) -> f64 {
    let sync = || device.sync().expect("the device runs");
    let mut step = || {
        let output = step();
        // A flush that fails leaves the error to the next sync, which reports it.
        let _ = device.flush();
        drop(output);
    };
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

/// Random logits on `device` (an autodiff device: they are the steps' leaves).
fn logits(rows: usize, vocab: usize, dtype: DType, device: &Device) -> Tensor<2> {
    Tensor::<2>::random([rows, vocab], Distribution::Uniform(-6.0, 6.0), device).cast(dtype)
}

fn main() {
    let cuda = cfg!(feature = "cuda");
    let count = fused_ce_suite::device_count();
    let (rows, shard_vocab, dtype, shards) = if cuda {
        (8192, 128_256, DType::BF16, count.max(1))
    } else {
        (256, 4096, DType::F32, 2)
    };
    // One GPU per shard where there are enough, exchanging through Burn's collective;
    // otherwise the shards share the first device and exchange between their threads.
    let one_per_shard = cuda && count >= shards && shards > 1;
    let devices: Vec<Device> = if one_per_shard {
        fused_ce_suite::devices(shards)
    } else {
        vec![fused_ce_suite::device(); shards]
    };
    // The same devices with autodiff: the steps' tensors live there.
    let autodiff: Vec<Device> = devices.iter().map(|d| d.clone().autodiff()).collect();
    let vocab = shard_vocab * shards;
    let (warmup, reps, rounds) = (3, 10, 5);
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    let labels: Vec<i64> = (0..rows)
        .map(|_| rng.random_range(0..vocab as i64))
        .collect();
    let device = autodiff[0].clone();
    let targets_on = |device: &Device| {
        Tensor::<1, Int>::from_data(TensorData::new(labels.clone(), [rows]), device)
    };
    println!(
        "vocabulary-parallel loss on {RUNTIME_NAME}: {rows} x {vocab} {dtype:?}, {shards} shards of {shard_vocab} on {} device(s)",
        if cuda { shards.min(count) } else { 1 }
    );

    // One device, one shard's logits: the default config and the two-pass plan.
    let shard_targets = Tensor::<1, Int>::from_data(
        TensorData::new(
            labels
                .iter()
                .map(|&y| y % shard_vocab as i64)
                .collect::<Vec<_>>(),
            [rows],
        ),
        &device,
    );
    let loss_fn = FusedCrossEntropyLossConfig::new().init(&device);
    let one_shard = logits(rows, shard_vocab, dtype, &device).require_grad();
    let default_ms = steady_ms(&device, warmup, reps, rounds, || {
        let loss = loss_fn.forward(one_shard.clone(), shard_targets.clone());
        loss.backward()
    });
    let two_pass = CrossEntropyOptions::new(Reduction::Mean)
        .with_gradient_plan(GradientPlan::TwoPass)
        .with_target_check(TargetCheck::Off);
    let two_pass_ms = steady_ms(&device, warmup, reps, rounds, || {
        let loss = fused_cross_entropy(one_shard.clone(), shard_targets.clone(), &two_pass);
        loss.backward()
    });
    drop(one_shard);
    // One device, the whole vocabulary.
    let whole = logits(rows, vocab, dtype, &device).require_grad();
    let whole_targets = targets_on(&device);
    let whole_ms = steady_ms(&device, warmup, reps, rounds, || {
        let loss = loss_fn.forward(whole.clone(), whole_targets.clone());
        loss.backward()
    });
    drop(whole);

    // The shards, one thread each, and the exchange they share: Burn's collective between
    // the GPUs (the communication runs while `_communication` lives), or the threads'.
    let options = CrossEntropyOptions::new(Reduction::Mean).with_target_check(TargetCheck::Off);
    let (_communication, exchange): (Option<DistributedContext>, Box<dyn ShardExchange + Sync>) =
        if one_per_shard {
            let config = DistributedConfig {
                all_reduce_op: ReduceOperation::Sum,
            };
            (
                Some(DistributedContext::init(devices.clone(), config)),
                Box::new(DistributedExchange::new(devices.clone())),
            )
        } else {
            (None, Box::new(InProcessExchange::new(shards)))
        };
    let exchange = &*exchange;
    // Per shard: the step, its forward alone, the exchange alone.
    let sharded_ms: Vec<[f64; 3]> = std::thread::scope(|scope| {
        let workers: Vec<_> = autodiff
            .iter()
            .enumerate()
            .map(|(index, device)| {
                let (options, targets) = (options.clone(), targets_on(device));
                scope.spawn(move || {
                    let shard = VocabShard::new(index, shards, vocab).expect("a valid shard");
                    let logits = logits(rows, shard_vocab, dtype, device).require_grad();
                    let loss = || {
                        try_vocab_parallel_cross_entropy(
                            logits.clone(),
                            targets.clone(),
                            None,
                            &shard,
                            &options,
                            exchange,
                        )
                        .expect("the sharded loss runs")
                    };
                    let step_ms =
                        steady_ms(device, warmup, reps, rounds, || loss().loss.backward());
                    let forward_ms = steady_ms(device, warmup, reps, rounds, loss);
                    // The statistics without autodiff, as the loss exchanges them.
                    let plain = device.clone().without_autodiff();
                    let exchange_ms = steady_ms(device, warmup, reps, rounds, || {
                        let stats = Tensor::<2>::ones([2 * shards + 3, rows], (&plain, DType::F32));
                        exchange.sum(stats).expect("the exchange runs")
                    });
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
    let out = fused_ce_suite::bench_out();
    std::fs::create_dir_all(&out).expect("the results folder");
    std::fs::write(format!("{out}/vocab_parallel.md"), table).expect("writes the table");
    println!("results: {out}/vocab_parallel.md");
}
