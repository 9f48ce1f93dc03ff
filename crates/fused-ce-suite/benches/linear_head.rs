//! The LM head and its loss, one training step (`logits = h W`, the loss, backward to `h`
//! and `W`), three ways with autodiff on the cube device (`Device::autodiff()`; its tensors
//! run on Burn's fusion backend with its autotuned matmuls, as users run it): Burn's matmul and stock `CrossEntropyLoss`,
//! Burn's matmul and our fused loss, and our fused linear cross-entropy (chunked, logits
//! never whole). Per case: the median step time, its matmul rate (6 N H V flops a step),
//! the device memory one step adds to the pool beyond its inputs, and the most bytes seen
//! in use beyond its inputs while it runs: read at each of the fused linear
//! cross-entropy's products as it runs (`test_hooks::set_probe_memory`: its operands,
//! output and cuBLASLt's workspace allocated, where its peak is) and, for every way, from a
//! second thread between kernels (a lower bound). Then each matmul of
//! the step alone, on all rows and on one chunk of the fused linear cross-entropy's rows,
//! to show where the fused step's time goes, and the chunk `grad_h` with its inner
//! dimension split as the fused op splits it (split-K). On CUDA, the chunk's in-place
//! matmuls: the weight gradient's sum, and `grad_h` (unsplit) into a random start.
//!
//! `cargo bench --bench linear_head` (Vulkan; small sizes) or, on a GPU,
//! `CUDARC_CUDA_VERSION=13000 cargo bench --bench linear_head --no-default-features
//! --features cuda,autotune` (LLM sizes; the first step of each shape autotunes its
//! matmuls, which takes minutes the first time and is cached in `target/environment` of
//! the workspace run from, else in the user's cache directory).
//! `FUSED_CE_BENCH_OUT` (default target/fused-ce-bench): where `linear_head.md` and
//! `linear_head.csv` go. Shapes after `--`, as `NxHxV` (f32 on Vulkan, bf16 on CUDA),
//! replace the default cases, and `logits=M` sets the fused linear cross-entropy's chunk
//! budget to M MiB, `wblock=M` its weight-gradient blocks
//! (`LinearChunking::weight_gradient_block_bytes`) to M MiB, and `inplace=0` or `inplace=1`
//! turns off or on the in-place weight-gradient sum (`ChunkProducts::weight_gradient_in_place`,
//! on by default), and `splitk=0` or `splitk=1` the hidden-state gradient by the library's
//! own kernel, split along the vocabulary where that fills more of the device
//! (`ChunkProducts::hidden_gradient_split_k`, on by default):
//! `cargo bench --bench linear_head -- 4096x256x8000 logits=16 wblock=4`. `ways=fused,linear`
//! runs only the ways named (`stock`, `fused`, `linear`, `linear-cubecl`,
//! `linear-counted`, `linear-frozen-head`, `linear-frozen-body`, `linear-none`,
//! `linear-none-entropy`, `linear-weighted`), `breakdown=0`
//! leaves out the matmuls alone. `cublaslt=0` turns off cuBLASLt for the chunks' products
//! (`ChunkProducts::cublaslt`, on by default); with it on, on CUDA, the fused linear
//! cross-entropy also runs with CubeCL's products (`linear-cubecl`) and the breakdown
//! times each chunk product through cuBLASLt. cuBLASLt's algorithm for each kind of
//! product is the fastest of its heuristic's first few, timed the first time the kind runs
//! (in the warm-up steps, or read from the store kept beside Burn's autotune cache).
//! `ignored=P` ignores the last P% of each
//! sequence of 1024 rows (padding) and adds the fused linear cross-entropy on only the
//! counted rows (`CountedRows`, built from the host's targets inside the step; its
//! TFLOP/s count the counted rows' flops).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use burn::backend::Dispatch;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::{DType, Device, Distribution, Int, Tensor, TensorData};
use burn_fused_ce::backend::LinearCrossEntropyBackend;
use burn_fused_ce::linear::CountedRows;
use burn_fused_ce::{
    ChunkProducts, EntropyOutput, ExtraOutputs, FusedCrossEntropyLossConfig,
    FusedLinearCrossEntropyLossConfig, LinearChunking, Reduction, Targets, test_hooks,
};
use fused_ce_suite::RUNTIME_NAME;
use rand::{Rng, SeedableRng, rngs::SmallRng};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    /// Burn's matmul, then Burn's stock loss.
    Stock,
    /// Burn's matmul, then our loss (default config).
    Fused,
    /// Our fused linear cross-entropy (default config).
    FusedLinear,
    /// The same with its products on CubeCL's kernels (`ChunkProducts::cublaslt` off).
    FusedLinearCubecl,
    /// The fused linear cross-entropy on the counted rows alone (`CountedRows`).
    FusedLinearCounted,
    /// The fused linear cross-entropy with the head frozen (its weight not tracked, as in
    /// adapter fine-tuning): no weight gradient.
    FrozenHead,
    /// The fused linear cross-entropy with the body frozen (the hidden states not
    /// tracked, as in linear probing): no hidden-state gradient.
    FrozenBody,
    /// The fused linear cross-entropy under `Reduction::None` with a per-row incoming
    /// gradient (RL's per-token log-probs).
    FusedLinearRows,
    /// The same with an entropy bonus in the objective: `(loss * w).sum() - (entropy *
    /// w').sum()`.
    FusedLinearRowsEntropy,
    /// The same objective with the weights given at forward (`Targets`): the default plan
    /// forms its gradient in the one pass.
    FusedLinearWeighted,
}

impl Way {
    fn label(self) -> &'static str {
        match self {
            Way::Stock => "matmul + Burn's loss",
            Way::Fused => "matmul + fused loss",
            Way::FusedLinear => "fused linear CE",
            Way::FusedLinearCubecl => "fused linear CE, CubeCL products",
            Way::FusedLinearCounted => "fused linear CE, counted rows only",
            Way::FrozenHead => "fused linear CE, frozen head",
            Way::FrozenBody => "fused linear CE, frozen body",
            Way::FusedLinearRows => "fused linear CE, none/row",
            Way::FusedLinearRowsEntropy => "fused linear CE, none/row -entropy",
            Way::FusedLinearWeighted => "fused linear CE, weighted -entropy",
        }
    }
}

/// Rows, width and vocabulary of the head, and its dtype.
type Case = (usize, usize, usize, DType);

struct Measured {
    median_ms: f64,
    pool_growth_mib: f64,
    /// Most `bytes_in_use` seen during a step beyond what was in use before it: read at
    /// each of the fused linear cross-entropy's products as it runs, and from a second
    /// thread between kernels.
    peak_in_use_mib: f64,
}

/// Steps whose bytes in use are sampled; the most seen in any of them is reported.
const PEAK_SAMPLED_STEPS: usize = 3;

/// The highest `bytes_in_use` of the device seen while `step` runs and is synced, read
/// over and over from a second thread (`Device::memory_pool_usage` sums every stream of
/// the device, the stepping thread's included; the sampler's own stream holds no work).
/// The pool's growth counts whole pages (on CUDA up to a quarter of the device's memory
/// each), so it cannot tell a 1.3 GB step from a 2.2 GB one; the bytes in use can. A lower
/// bound: each read waits its turn behind the work the step has queued, so a buffer that
/// lives between two reads is missed.
fn sampled_peak_in_use(device: &Device, step: impl FnOnce() -> Option<()>) -> Option<u64> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut peak = 0;
            while !done.load(Ordering::Acquire) {
                if let Some(usage) = device.memory_pool_usage() {
                    peak = peak.max(usage.bytes_in_use);
                }
            }
            peak
        });
        let stepped = step();
        done.store(true, Ordering::Release);
        let peak = sampler.join().ok()?;
        stepped.map(|()| peak)
    })
}

/// Median of `reps` synced steps after `warmup` (the first autotunes), the pool growth
/// of one step after the pool's free pages are released, and the most bytes seen in use.
/// Each step's output (its gradients, its product) is dropped only once the device's queue
/// has been flushed: Burn's fusion backend skips writing what nothing holds.
fn measure<O>(
    device: &Device,
    warmup: usize,
    reps: usize,
    mut step: impl FnMut() -> O,
) -> Option<Measured> {
    let sync = || device.sync().ok();
    let mut step = || {
        let output = step();
        // A flush that fails leaves the error to the next sync, which reports it.
        let _ = device.flush();
        drop(output);
    };
    let run = AssertUnwindSafe(|| -> Option<Measured> {
        for _ in 0..warmup {
            step();
            sync()?;
        }
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            sync()?;
            let started = Instant::now();
            step();
            sync()?;
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        sync()?;
        device.memory_cleanup();
        let before = device.memory_pool_usage()?.bytes_reserved;
        step();
        sync()?;
        let usage = device.memory_pool_usage()?;
        let (after, in_use) = (usage.bytes_reserved, usage.bytes_in_use);
        // Read at each of the fused linear cross-entropy's products, as they run, and from
        // a second thread between kernels: the most of both.
        test_hooks::set_probe_memory(true);
        let mut peak = 0;
        for _ in 0..PEAK_SAMPLED_STEPS {
            peak = peak.max(sampled_peak_in_use(device, || {
                step();
                sync()
            })?);
        }
        peak = peak.max(test_hooks::probed_peak_bytes_in_use());
        test_hooks::set_probe_memory(false);
        Some(Measured {
            median_ms: times[times.len() / 2],
            pool_growth_mib: after.saturating_sub(before) as f64 / 1048576.0,
            peak_in_use_mib: peak.saturating_sub(in_use) as f64 / 1048576.0,
        })
    });
    catch_unwind(run).ok().flatten()
}

fn main() {
    let llm = cfg!(feature = "cuda");
    // (rows N, width H, vocabulary V, dtype), warm-up steps, timed steps.
    let (cases, warmup, reps): (Vec<Case>, usize, usize) = if llm {
        (
            vec![
                (8192, 4096, 128_256, DType::BF16),
                // Qwen-like: a wide vocabulary on a narrower model.
                (16384, 2048, 151_936, DType::BF16),
            ],
            3,
            7,
        )
    } else {
        (vec![(256, 64, 4096, DType::F32)], 1, 3)
    };
    let dtype = if llm { DType::BF16 } else { DType::F32 };
    let asked: Vec<Case> = std::env::args()
        .skip(1)
        .filter_map(|arg| {
            let sizes: Vec<usize> = arg.split('x').map_while(|n| n.parse().ok()).collect();
            match sizes[..] {
                [rows, width, vocab] => Some((rows, width, vocab, dtype)),
                _ => None,
            }
        })
        .collect();
    let cases = if asked.is_empty() { cases } else { asked };
    // `NAME=M` in MiB, as bytes.
    let mib_arg = |name: &str| {
        std::env::args()
            .find_map(|arg| {
                arg.strip_prefix(name)?
                    .strip_prefix('=')?
                    .parse::<usize>()
                    .ok()
            })
            .map(|mib| mib << 20)
    };
    // `NAME=0` or `NAME=1`.
    let on_off_arg = |name: &str| {
        std::env::args().find_map(|arg| match arg.strip_prefix(name)?.strip_prefix('=')? {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        })
    };
    // `ways=fused,linear` runs only those ways (`stock`, `fused`, `linear`; all by
    // default), and `breakdown=0` leaves out the matmul breakdown: for chunk-budget sweeps.
    let ways: Vec<Way> = std::env::args()
        .find_map(|arg| arg.strip_prefix("ways=").map(str::to_owned))
        .map_or_else(
            || {
                vec![
                    Way::Fused,
                    Way::FusedLinear,
                    Way::FrozenHead,
                    Way::FrozenBody,
                    Way::FusedLinearRows,
                    Way::FusedLinearRowsEntropy,
                    Way::FusedLinearWeighted,
                    Way::FusedLinearCubecl,
                    Way::FusedLinearCounted,
                    Way::Stock,
                ]
            },
            |list| {
                list.split(',')
                    .filter_map(|name| match name {
                        "stock" => Some(Way::Stock),
                        "fused" => Some(Way::Fused),
                        "linear" => Some(Way::FusedLinear),
                        "linear-cubecl" => Some(Way::FusedLinearCubecl),
                        "linear-counted" => Some(Way::FusedLinearCounted),
                        "linear-frozen-head" => Some(Way::FrozenHead),
                        "linear-frozen-body" => Some(Way::FrozenBody),
                        "linear-none" => Some(Way::FusedLinearRows),
                        "linear-none-entropy" => Some(Way::FusedLinearRowsEntropy),
                        "linear-weighted" => Some(Way::FusedLinearWeighted),
                        _ => None,
                    })
                    .collect()
            },
        );
    let defaults = ChunkProducts::default();
    let chunking = LinearChunking {
        logits_bytes: mib_arg("logits"),
        weight_gradient_block_bytes: mib_arg("wblock"),
        products: ChunkProducts {
            weight_gradient_in_place: on_off_arg("inplace")
                .unwrap_or(defaults.weight_gradient_in_place),
            hidden_gradient_split_k: on_off_arg("splitk")
                .unwrap_or(defaults.hidden_gradient_split_k),
            cublaslt: on_off_arg("cublaslt").unwrap_or(defaults.cublaslt),
            ..defaults
        },
    };
    // Percent of each sequence's rows ignored (padding at its end).
    let ignored_percent = std::env::args()
        .find_map(|arg| arg.strip_prefix("ignored=")?.parse::<usize>().ok())
        .unwrap_or(0)
        .min(100);
    // CubeCL's products beside cuBLASLt's, only where cuBLASLt can run; the counted rows
    // alone only where some are ignored.
    let ways: Vec<Way> = ways
        .into_iter()
        .filter(|&way| way != Way::FusedLinearCubecl || (llm && chunking.products.cublaslt))
        .filter(|&way| way != Way::FusedLinearCounted || ignored_percent > 0)
        .collect();
    const SEQUENCE_ROWS: usize = 1024;
    const IGNORE_INDEX: i64 = -100;
    // The cube device (its tensors run on Burn's fusion backend), and the same with
    // autodiff for the training steps.
    let device = fused_ce_suite::device();
    let autodiff = device.clone().autodiff();
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    println!(
        "LM head and loss, one training step on {RUNTIME_NAME} (autodiff over Burn's fusion backend)"
    );
    println!("fused linear CE: {chunking:?}");
    #[cfg(feature = "cuda")]
    println!("cuBLASLt: {:?}", burn_fused_ce::linear::cublaslt_version());
    let mut table = format!(
        "fused linear CE: `{chunking:?}`\n\n| N x H x V | dtype | way | step ms | TFLOP/s | vs matmul + fused loss | vs fused linear CE | pool growth MiB | peak in use MiB |\n|---|---|---|---:|---:|---:|---:|---:|---:|\n"
    );
    let mut csv =
        String::from("rows,width,vocab,dtype,way,step_ms,tflops,pool_growth_mib,peak_in_use_mib\n");
    for &(rows, width, vocab, dtype) in &cases {
        let hidden = Tensor::<2>::random([rows, width], Distribution::Uniform(-1.0, 1.0), &device)
            .cast(dtype);
        let scale = 2.0 / (width as f64).sqrt();
        let weight = Tensor::<2>::random(
            [width, vocab],
            Distribution::Uniform(-scale, scale),
            &device,
        )
        .cast(dtype);
        let padding_from = SEQUENCE_ROWS - SEQUENCE_ROWS * ignored_percent / 100;
        let labels: Vec<i64> = (0..rows)
            .map(|row| match row % SEQUENCE_ROWS >= padding_from {
                true => IGNORE_INDEX,
                false => rng.random_range(0..vocab as i64),
            })
            .collect();
        let counted_rows = labels.iter().filter(|&&y| y != IGNORE_INDEX).count();
        let targets =
            Tensor::<1, Int>::from_data(TensorData::new(labels.clone(), [rows]), &autodiff);
        let hidden = hidden.autodiff().require_grad();
        let weight = weight.autodiff().require_grad();
        let flops = 6.0 * rows as f64 * width as f64 * vocab as f64;
        let stock_loss = CrossEntropyLossConfig::new().init(&autodiff);
        let fused_loss = FusedCrossEntropyLossConfig::new().init(&autodiff);
        let linear_loss = FusedLinearCrossEntropyLossConfig::new()
            .with_chunking(chunking)
            .init(&autodiff);
        let linear_cubecl_loss = FusedLinearCrossEntropyLossConfig::new()
            .with_chunking(LinearChunking {
                products: ChunkProducts {
                    cublaslt: false,
                    ..chunking.products
                },
                ..chunking
            })
            .init(&autodiff);
        let weighted_loss = FusedLinearCrossEntropyLossConfig::new()
            .with_loss(FusedCrossEntropyLossConfig::new().with_reduction(Reduction::Sum))
            .with_chunking(chunking)
            .init(&autodiff);
        let rows_loss = FusedLinearCrossEntropyLossConfig::new()
            .with_loss(
                FusedCrossEntropyLossConfig::new()
                    .with_reduction(Reduction::None)
                    .with_outputs(ExtraOutputs {
                        entropy: EntropyOutput::Differentiable,
                        ..ExtraOutputs::default()
                    }),
            )
            .with_chunking(chunking)
            .init(&autodiff);
        // Per-row weights of the loss (its dtype) and of the entropy bonus (f32).
        let row_weights = Tensor::<1>::random([rows], Distribution::Uniform(0.5, 1.5), &autodiff);
        let entropy_weights = row_weights.clone().mul_scalar(-0.01);
        let row_weights = row_weights.cast(dtype);
        let mut head = burn::nn::LinearConfig::new(width, vocab)
            .with_bias(false)
            .init(&autodiff);
        head.weight = burn::module::Param::from_tensor(weight.clone());
        // Frozen as users freeze them: `Param::from_tensor` turns gradients on and
        // `detach` keeps a leaf's `require_grad`, so both are turned off explicitly.
        let frozen_head = burn::nn::Linear {
            weight: burn::module::Param::from_tensor(weight.clone().detach())
                .set_require_grad(false),
            bias: None,
        };
        let frozen_hidden = hidden.clone().detach().set_require_grad(false);
        assert!(
            !frozen_head.weight.val().is_require_grad() && !frozen_hidden.is_require_grad(),
            "the frozen ways' weight and hidden states are untracked"
        );
        let mut fused_ms = None;
        let mut linear_ms = None;
        for way in [
            Way::Fused,
            Way::FusedLinear,
            Way::FrozenHead,
            Way::FrozenBody,
            Way::FusedLinearRows,
            Way::FusedLinearRowsEntropy,
            Way::FusedLinearWeighted,
            Way::FusedLinearCubecl,
            Way::FusedLinearCounted,
            Way::Stock,
        ]
        .into_iter()
        .filter(|way| ways.contains(way))
        {
            let step = || {
                let loss = match way {
                    Way::Stock => {
                        stock_loss.forward(hidden.clone().matmul(weight.clone()), targets.clone())
                    }
                    Way::Fused => {
                        fused_loss.forward(hidden.clone().matmul(weight.clone()), targets.clone())
                    }
                    Way::FusedLinear => linear_loss.forward(hidden.clone(), &head, targets.clone()),
                    Way::FusedLinearCubecl => {
                        linear_cubecl_loss.forward(hidden.clone(), &head, targets.clone())
                    }
                    Way::FusedLinearCounted => {
                        let counted =
                            CountedRows::from_host_targets(&labels, IGNORE_INDEX, &autodiff);
                        let counted_hidden = counted.hidden(hidden.clone()).ok()?;
                        let counted_targets = counted.targets(targets.clone()).ok()?;
                        linear_loss.forward(counted_hidden, &head, counted_targets)
                    }
                    Way::FrozenHead => {
                        linear_loss.forward(hidden.clone(), &frozen_head, targets.clone())
                    }
                    Way::FrozenBody => {
                        linear_loss.forward(frozen_hidden.clone(), &head, targets.clone())
                    }
                    Way::FusedLinearRows | Way::FusedLinearRowsEntropy => {
                        let output = rows_loss
                            .try_forward_with_outputs(hidden.clone(), &head, targets.clone())
                            .ok()?;
                        let objective = (output.loss * row_weights.clone()).sum();
                        match (way, output.entropy) {
                            (Way::FusedLinearRowsEntropy, Some(entropy)) => {
                                objective.cast(DType::F32)
                                    + (entropy * entropy_weights.clone()).sum()
                            }
                            _ => objective,
                        }
                    }
                    Way::FusedLinearWeighted => {
                        // `sum w loss - sum c H` with `c = -entropy_weights` (a bonus), as
                        // the per-row way above, under `Sum`.
                        let targets = Targets::new(targets.clone())
                            .with_weights(Some(row_weights.clone()))
                            .with_entropy_weights(Some(entropy_weights.clone().neg()));
                        weighted_loss.forward(hidden.clone(), &head, targets)
                    }
                };
                let grads = loss.backward();
                Some((hidden.grad(&grads), weight.grad(&grads)))
            };
            let measured = measure(&device, warmup, reps, step);
            if way == Way::Fused {
                fused_ms = measured.as_ref().map(|m| m.median_ms);
            }
            if way == Way::FusedLinear {
                linear_ms = measured.as_ref().map(|m| m.median_ms);
            }
            let case = format!("{rows} x {width} x {vocab}");
            let dtype_name = format!("{dtype:?}").to_lowercase();
            match measured {
                Some(m) => {
                    let flops = match way {
                        Way::FusedLinearCounted => flops * counted_rows as f64 / rows as f64,
                        _ => flops,
                    };
                    let tflops = flops / (m.median_ms / 1e3) / 1e12;
                    let ratio_to = |base: Option<f64>| {
                        base.map_or("-".to_string(), |b| format!("{:.3}", m.median_ms / b))
                    };
                    let (ratio, linear_ratio) = (ratio_to(fused_ms), ratio_to(linear_ms));
                    println!(
                        "{case:<22} {dtype_name:<5} {:<22} {:>9.2} ms {tflops:>7.1} TFLOP/s  x{ratio:<6} x{linear_ratio:<6} {:>8.0} MiB pool {:>8.0} MiB peak",
                        way.label(),
                        m.median_ms,
                        m.pool_growth_mib,
                        m.peak_in_use_mib
                    );
                    table += &format!(
                        "| {case} | {dtype_name} | {} | {:.2} | {tflops:.1} | {ratio} | {linear_ratio} | {:.0} | {:.0} |\n",
                        way.label(),
                        m.median_ms,
                        m.pool_growth_mib,
                        m.peak_in_use_mib
                    );
                    csv += &format!(
                        "{rows},{width},{vocab},{dtype_name},{},{:.3},{tflops:.2},{:.1},{:.1}\n",
                        way.label(),
                        m.median_ms,
                        m.pool_growth_mib,
                        m.peak_in_use_mib
                    );
                }
                None => {
                    println!(
                        "{case:<22} {dtype_name:<5} {:<22} did not run (out of memory?)",
                        way.label()
                    );
                    table += &format!(
                        "| {case} | {dtype_name} | {} | - | - | - | - | - | - |\n",
                        way.label()
                    );
                }
            }
            device.memory_cleanup();
        }
    }
    if on_off_arg("breakdown") != Some(false) {
        table += &matmul_breakdown(&cases, &chunking, warmup, reps, &device);
    }
    let out = fused_ce_suite::bench_out();
    let written = std::fs::create_dir_all(&out)
        .and_then(|()| std::fs::write(format!("{out}/linear_head.md"), &table))
        .and_then(|()| std::fs::write(format!("{out}/linear_head.csv"), &csv));
    match written {
        Ok(()) => println!("results: {out}/linear_head.{{md,csv}}"),
        Err(error) => println!("could not write the results to {out}: {error}"),
    }
}

/// Each matmul of the head's training step alone, without autodiff: on all `N`
/// rows (the unfused head) and on one chunk of the rows the fused linear cross-entropy
/// takes at a time (its chunking), written as the fused op writes them; the
/// weight gradient's chunk product also with the add into the running sum.
fn matmul_breakdown(
    cases: &[Case],
    chunking: &LinearChunking,
    warmup: usize,
    reps: usize,
    device: &Device,
) -> String {
    type Run<'a> = dyn Fn() -> Tensor<2> + 'a;
    let mut table =
        String::from("\n| N x H x V | rows | matmul | ms | TFLOP/s |\n|---|---:|---|---:|---:|\n");
    println!("each matmul of the step alone (the weight gradient's add included where named)");
    for &(rows, width, vocab, dtype) in cases {
        let chunk = chunking.rows_per_chunk(rows, vocab, dtype);
        let uniform = Distribution::Uniform(-1.0, 1.0);
        let weight = Tensor::<2>::random([width, vocab], uniform, device).cast(dtype);
        let sum = Tensor::<2>::random([width, vocab], uniform, device).cast(dtype);
        let case = format!("{rows} x {width} x {vocab}");
        for part in [rows, chunk] {
            let hidden = Tensor::<2>::random([part, width], uniform, device).cast(dtype);
            let grad = Tensor::<2>::random([part, vocab], uniform, device).cast(dtype);
            let flops = 2.0 * part as f64 * width as f64 * vocab as f64;
            let matmuls: [(&str, Box<Run>); 4] = [
                (
                    "logits = h W",
                    Box::new(|| hidden.clone().matmul(weight.clone())),
                ),
                (
                    "grad_h = dlogits W^T",
                    Box::new(|| grad.clone().matmul(weight.clone().transpose())),
                ),
                (
                    "grad_W = h^T dlogits",
                    Box::new(|| hidden.clone().transpose().matmul(grad.clone())),
                ),
                (
                    "grad_W = sum + h^T dlogits",
                    Box::new(|| sum.clone() + hidden.clone().transpose().matmul(grad.clone())),
                ),
            ];
            for (name, run) in matmuls {
                let timed = measure(device, warmup, reps, &*run).map(|m| m.median_ms);
                matmul_row(&mut table, &case, part, name, flops, timed.ok_or(None), "");
            }
            if part == chunk {
                // The library's split of the chunk's `grad_h` along the vocabulary.
                let plain = grad.clone().matmul(weight.clone().transpose());
                let split = || split_k_hidden_gradient(&grad, &weight);
                let error = relative_distance(split(), plain);
                let timed = measure(device, warmup, reps, split).map(|m| m.median_ms);
                let name = format!(
                    "grad_h = dlogits W^T, split-K{}",
                    slices_note(part, width, vocab, dtype, device)
                );
                let note = format!("  (error vs unsplit: {error:.1e})");
                matmul_row(
                    &mut table,
                    &case,
                    part,
                    &name,
                    flops,
                    timed.ok_or(None),
                    &note,
                );
                #[cfg(feature = "cuda")]
                if chunking.products.cublaslt {
                    // The weight gradient's sum, held by nothing but the step: summed
                    // in place, step after step.
                    let mut running = Some(sum.clone().add_scalar(0.0));
                    type Stepped<'a> = Box<dyn FnMut() -> Tensor<2> + 'a>;
                    let products: [(&str, Tensor<2>, Stepped); 3] = [
                        (
                            "logits = h W, cuBLASLt",
                            hidden.clone().matmul(weight.clone()),
                            Box::new(|| cublaslt_product(&hidden, &weight)),
                        ),
                        (
                            "grad_h = dlogits W^T, cuBLASLt",
                            grad.clone().matmul(weight.clone().transpose()),
                            Box::new(|| cublaslt_product(&grad, &weight.clone().transpose())),
                        ),
                        (
                            "grad_W += h^T dlogits, cuBLASLt",
                            sum.clone() + hidden.clone().transpose().matmul(grad.clone()),
                            Box::new(|| {
                                let taken = running.take().unwrap_or_else(|| sum.clone());
                                let next =
                                    cublaslt_accumulate(taken, &hidden.clone().transpose(), &grad);
                                running = Some(next.clone());
                                next
                            }),
                        ),
                    ];
                    for (name, expected, mut run) in products {
                        let error = relative_distance(run(), expected);
                        let timed = measure(device, warmup, reps, &mut run).map(|m| m.median_ms);
                        let note = format!("  (error vs Burn's matmul: {error:.1e})");
                        matmul_row(
                            &mut table,
                            &case,
                            part,
                            name,
                            flops,
                            timed.ok_or(None),
                            &note,
                        );
                    }
                }
                #[cfg(feature = "cuda")]
                {
                    use fused_ce_kernels::PlaneRows;
                    let shape = (part, width, vocab, dtype);
                    let timing = (warmup, reps);
                    let in_place = [
                        (
                            "grad_W += h^T dlogits, in place, 1 row",
                            in_place_weight_gradient(shape, timing, PlaneRows::One, device),
                        ),
                        (
                            "grad_W += h^T dlogits, in place, 2 rows",
                            in_place_weight_gradient(shape, timing, PlaneRows::Two, device),
                        ),
                        (
                            "grad_h += dlogits W^T, in place, 1 row",
                            in_place_hidden_gradient(shape, timing, PlaneRows::One, device),
                        ),
                        (
                            "grad_h += dlogits W^T, in place, 2 rows",
                            in_place_hidden_gradient(shape, timing, PlaneRows::Two, device),
                        ),
                    ];
                    for (name, measured) in in_place {
                        let note = match &measured {
                            Ok((_, error)) => format!("  (error vs product + add: {error:.1e})"),
                            Err(_) => String::new(),
                        };
                        let timed = measured.map(|(ms, _)| ms).map_err(Some);
                        matmul_row(&mut table, &case, part, name, flops, timed, &note);
                    }
                }
                break;
            }
        }
        device.memory_cleanup();
    }
    table
}

/// One row of the matmul breakdown: `timed` (the median ms, or why it did not run when
/// known) printed with `note`, and added to `table` when it ran.
fn matmul_row(
    table: &mut String,
    case: &str,
    part: usize,
    name: &str,
    flops: f64,
    timed: Result<f64, Option<String>>,
    note: &str,
) {
    match timed {
        Ok(ms) => {
            let tflops = flops / (ms / 1e3) / 1e12;
            println!(
                "{case:<22} {part:>6} rows  {name:<36} {ms:>8.3} ms {tflops:>7.1} TFLOP/s{note}"
            );
            *table += &format!("| {case} | {part} | {name} | {ms:.3} | {tflops:.1} |\n");
        }
        Err(None) => println!("{case:<22} {part:>6} rows  {name:<36} did not run"),
        Err(Some(why)) => println!("{case:<22} {part:>6} rows  {name:<36} did not run: {why}"),
    }
}

/// `grad_h = dlogits W^T` for one chunk as the fused linear cross-entropy forms it
/// (`ChunkProducts::hidden_gradient_split_k`): the vocabulary cut into slices multiplied
/// side by side and summed in f32 where that fills more of the device
/// (`LinearCrossEntropyBackend::matmul_split_k`).
fn split_k_hidden_gradient(grad: &Tensor<2>, weight: &Tensor<2>) -> Tensor<2> {
    let product = <Dispatch as LinearCrossEntropyBackend>::matmul_split_k(
        grad.clone().into_dispatch(),
        weight.clone().transpose().into_dispatch(),
        false,
    );
    Tensor::from_dispatch(product)
}

/// `lhs rhs` by the fused linear cross-entropy's chunk product with cuBLASLt asked for
/// (`LinearCrossEntropyBackend::chunk_product`).
#[cfg(feature = "cuda")]
fn cublaslt_product(lhs: &Tensor<2>, rhs: &Tensor<2>) -> Tensor<2> {
    Tensor::from_dispatch(<Dispatch as LinearCrossEntropyBackend>::chunk_product(
        lhs.clone().into_dispatch(),
        rhs.clone().into_dispatch(),
        true,
    ))
}

/// `sum + lhs rhs` by the weight gradient's in-place sum with cuBLASLt asked for
/// (`LinearCrossEntropyBackend::accumulate_product`); `sum` is held by nothing else.
#[cfg(feature = "cuda")]
fn cublaslt_accumulate(sum: Tensor<2>, lhs: &Tensor<2>, rhs: &Tensor<2>) -> Tensor<2> {
    Tensor::from_dispatch(<Dispatch as LinearCrossEntropyBackend>::accumulate_product(
        sum.into_dispatch(),
        lhs.clone().into_dispatch(),
        rhs.clone().into_dispatch(),
        true,
    ))
}

/// How many slices the split takes for a chunk's `grad_h` (` (K slices)`), on CUDA.
fn slices_note(rows: usize, width: usize, vocab: usize, dtype: DType, device: &Device) -> String {
    #[cfg(feature = "cuda")]
    {
        use fused_ce_suite::kernel_operand;
        // The count depends on the operands' shapes, layouts and dtype, not their values.
        let cube = fused_ce_suite::cube_device(device);
        let grad = cube_only::empty([rows, vocab], dtype, &cube);
        let weight = cube_only::empty([width, vocab], dtype, &cube);
        let (lhs, rhs) = (
            kernel_operand(grad),
            kernel_operand(cube_only::transpose(weight)),
        );
        let (slices, _) = fused_ce_kernels::split_k_slices(
            &fused_ce_suite::client(device),
            (&lhs.0, lhs.1),
            (&rhs.0, rhs.1),
            burn::backend::cubecl::dtype_to_elem_type(DType::F32),
        );
        format!(" ({slices} slices)")
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (rows, width, vocab, dtype, device);
        String::new()
    }
}

/// `|got - expected| / |expected|` (L2, in f32).
fn relative_distance(got: Tensor<2>, expected: Tensor<2>) -> f64 {
    let (got, expected) = (got.cast(DType::F32), expected.cast(DType::F32));
    let distance = (got - expected.clone())
        .powi_scalar(2)
        .sum()
        .sqrt()
        .into_scalar::<f32>();
    let norm = expected.powi_scalar(2).sum().sqrt().into_scalar::<f32>();
    f64::from(distance) / f64::from(norm).max(f64::MIN_POSITIVE)
}

/// The weight gradient's chunk product summed in place (`sum += h_c^T dlogits_c`, one
/// kernel: cubek-matmul's specialized TMA matmul whose writer adds `sum`), on the
/// plain cube backend ([`in_place_product`]), with `plane_rows` rows of tiles per plane.
/// The fused linear cross-entropy sums with it under
/// `ChunkProducts::weight_gradient_in_place`.
#[cfg(feature = "cuda")]
fn in_place_weight_gradient(
    (rows, width, vocab, dtype): (usize, usize, usize, DType),
    (warmup, reps): (usize, usize),
    plane_rows: fused_ce_kernels::PlaneRows,
    device: &Device,
) -> Result<(f64, f64), String> {
    let cube = fused_ce_suite::cube_device(device);
    let hidden = cube_only::random([rows, width], dtype, &cube);
    let grad = cube_only::random([rows, vocab], dtype, &cube);
    let start = cube_only::random([width, vocab], dtype, &cube);
    in_place_product(
        (cube_only::transpose(hidden), grad, start),
        (warmup, reps),
        plane_rows,
        device,
    )
}

/// A chunk's hidden-state gradient by the same in-place kernel (`out += dlogits_c W^T`
/// into a random `out`, [`in_place_product`]), unsplit, with `plane_rows` rows of tiles
/// per plane: the rate the split (`ChunkProducts::hidden_gradient_split_k`) starts from.
#[cfg(feature = "cuda")]
fn in_place_hidden_gradient(
    (rows, width, vocab, dtype): (usize, usize, usize, DType),
    (warmup, reps): (usize, usize),
    plane_rows: fused_ce_kernels::PlaneRows,
    device: &Device,
) -> Result<(f64, f64), String> {
    let cube = fused_ce_suite::cube_device(device);
    let grad = cube_only::random([rows, vocab], dtype, &cube);
    let weight = cube_only::random([width, vocab], dtype, &cube);
    let start = cube_only::random([rows, width], dtype, &cube);
    in_place_product(
        (grad, cube_only::transpose(weight), start),
        (warmup, reps),
        plane_rows,
        device,
    )
}

/// The plain cube backend's ops the in-place launches need, on its primitives: a cube
/// device's `Tensor`s run on Burn's fusion backend, whose handles our launch functions do
/// not take.
#[cfg(feature = "cuda")]
mod cube_only {
    use burn::backend::{ops::FloatTensorOps, read_sync};
    use burn::tensor::{DType, Distribution, FloatDType, Scalar, Shape};
    use burn_cubecl::{CubeBackend, CubeDevice, tensor::CubeTensor};

    pub fn random(shape: [usize; 2], dtype: DType, device: &CubeDevice) -> CubeTensor {
        let uniform = Distribution::Uniform(-1.0, 1.0);
        let values =
            CubeBackend::float_random(Shape::from(shape), uniform, device, FloatDType::F32);
        CubeBackend::float_cast(values, FloatDType::from(dtype))
    }

    pub fn empty(shape: [usize; 2], dtype: DType, device: &CubeDevice) -> CubeTensor {
        CubeBackend::float_empty(Shape::from(shape), device, FloatDType::from(dtype))
    }

    pub fn transpose(tensor: CubeTensor) -> CubeTensor {
        CubeBackend::float_transpose(tensor)
    }

    /// A copy in a buffer of its own.
    pub fn copy(tensor: &CubeTensor) -> CubeTensor {
        CubeBackend::float_add_scalar(tensor.clone(), Scalar::from(0.0))
    }

    /// `sum + lhs rhs` by Burn's matmul and add.
    pub fn product_added(sum: &CubeTensor, lhs: &CubeTensor, rhs: &CubeTensor) -> CubeTensor {
        let product = CubeBackend::float_matmul(lhs.clone(), rhs.clone());
        CubeBackend::float_add(sum.clone(), product)
    }

    /// `|got - expected| / |expected|` (L2, in f32).
    pub fn relative_distance(got: CubeTensor, expected: CubeTensor) -> f64 {
        let f32 = FloatDType::F32;
        let (got, expected) = (
            CubeBackend::float_cast(got, f32),
            CubeBackend::float_cast(expected, f32),
        );
        let norm = |tensor: CubeTensor| -> f64 {
            let squares = CubeBackend::float_mul(tensor.clone(), tensor);
            let total = CubeBackend::float_sum(squares);
            read_sync(CubeBackend::float_into_data(total))
                .ok()
                .and_then(|data| data.iter::<f32>().next())
                .map_or(f64::NAN, |total| f64::from(total).sqrt())
        };
        let distance = norm(CubeBackend::float_sub(got, expected.clone()));
        distance / norm(expected).max(f64::MIN_POSITIVE)
    }
}

/// `sum += lhs rhs` in place by `fused_ce_kernels::launch_matmul_accumulate` on the plain
/// cube backend, tiled with `plane_rows` rows per plane: the median of `reps` synced
/// launches after `warmup` ([`measure`]), and the relative L2 distance of one launch's
/// result from `start + lhs rhs` formed by Burn's matmul.
#[cfg(feature = "cuda")]
fn in_place_product(
    (lhs, rhs, start): (
        burn_cubecl::tensor::CubeTensor,
        burn_cubecl::tensor::CubeTensor,
        burn_cubecl::tensor::CubeTensor,
    ),
    (warmup, reps): (usize, usize),
    plane_rows: fused_ce_kernels::PlaneRows,
    device: &Device,
) -> Result<(f64, f64), String> {
    use fused_ce_suite::kernel_operand;
    let client = fused_ce_suite::client(device);
    let launch = |sum: &burn_cubecl::tensor::CubeTensor| -> Result<(), String> {
        fused_ce_kernels::launch_matmul_accumulate(
            &client,
            kernel_operand(lhs.clone()),
            kernel_operand(rhs.clone()),
            kernel_operand(sum.clone()),
            plane_rows,
        )
        .map_err(|e| format!("{e:?}"))
    };
    // One launch on a copy of `start`, against Burn's product and add.
    let sum = cube_only::copy(&start);
    launch(&sum)?;
    let expected = cube_only::product_added(&start, &lhs, &rhs);
    let error = cube_only::relative_distance(sum, expected);
    // The launch above succeeded: the timed ones, of the same shapes, launch alike.
    let sum = cube_only::copy(&start);
    let measured =
        measure(device, warmup, reps, || launch(&sum)).ok_or("the timed launches did not run")?;
    Ok((measured.median_ms, error))
}
