//! Throughput of the fused cross-entropy against two references taken in the same run: the
//! device's own copy bandwidth (the floor no memory-bound loss can beat) and Burn's stock
//! `CrossEntropyLoss`.
//!
//! Two times per case: one step timed alone with the device synced before and after it
//! (`ours ms`: what one isolated call costs, host launch latency and sync included), and
//! the steady state of a training loop (`steady ms`: per step, from runs of 1 and of up to
//! 12 steps queued back to back with one sync each, the slope between them, so a run's
//! fixed costs cancel), each against its own floor (the copy measured the same way).
//!
//! `cargo bench --bench throughput` (Vulkan; small sizes) or, on a GPU,
//! `CUDARC_CUDA_VERSION=13000 cargo bench --bench throughput --no-default-features --features cuda`
//! (LLM sizes). `FUSED_CE_BENCH_CASES=small|llm` overrides the choice of sizes.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::{
    DType, Distribution, Int, Tensor, TensorData, activation::log_softmax, backend::Backend,
};
use burn_fused_ce::{CrossEntropyOptions, Reduction, diagnostics, fused_cross_entropy};
use cubecl::Runtime as _;
use fused_ce_suite::{AutodiffCube, CubeBackend, Device, RUNTIME_NAME, Runtime};
use rand::{Rng, SeedableRng, rngs::SmallRng};

type B = CubeBackend;
type AD = AutodiffCube;

/// A warm-up iteration slower than this means the op is hopeless at this size (stock CE at
/// LLM sizes on a small device): report `-` rather than wait.
const TOO_SLOW_MS: f64 = 20_000.0;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Fwd,
    /// `Reduction::Mean`, `loss.backward()`: an incoming gradient of 1.
    FwdBwd,
    /// `Reduction::Mean`, `(loss * 0.5).backward()`: the formed gradient is rescaled.
    FwdBwdScaled,
    /// `Reduction::None` with a non-uniform per-row gradient (the project's origin case).
    FwdBwdRows,
    /// `FwdBwd` with the target check on (the default): one small read, a sync, per call.
    FwdBwdChecked,
    /// `FwdBwd` with label smoothing 0.1, z-loss 1e-4 and softcap 30 together.
    FwdBwdOptions,
    /// The other plan than the default's, for `FwdBwd`, `FwdBwdScaled`, `FwdBwdOptions`
    /// (`gradient_in_forward` flipped).
    OtherPlan(BaseMode),
}

/// The modes `Mode::OtherPlan` applies to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BaseMode {
    FwdBwd,
    FwdBwdScaled,
    FwdBwdOptions,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Fwd => "fwd",
            Mode::FwdBwd => "fwd+bwd",
            Mode::FwdBwdScaled => "fwd+bwd g=0.5",
            Mode::FwdBwdRows => "fwd+bwd none/row",
            Mode::FwdBwdChecked => "fwd+bwd checked",
            Mode::FwdBwdOptions => "fwd+bwd ls+z+cap",
            Mode::OtherPlan(BaseMode::FwdBwd) => "fwd+bwd other-plan",
            Mode::OtherPlan(BaseMode::FwdBwdScaled) => "fwd+bwd g=0.5 other-plan",
            Mode::OtherPlan(BaseMode::FwdBwdOptions) => "fwd+bwd ls+z+cap other-plan",
        }
    }
}

/// Steady state (see `Measured::steady_ms`): most steps queued back to back in the long
/// run, the device memory their prepared inputs may take, and runs of each length.
const STEADY_MAX_STEPS: usize = 12;
const STEADY_INPUT_BUDGET: usize = 48 << 30;
const STEADY_RUNS: usize = 5;

struct Bench {
    device: Device,
    warmup: usize,
    reps: usize,
    /// f32 elements of the buffer the copy bandwidth is measured on.
    copy_elems: usize,
    /// Steps of the steady state's long run for the case being measured (its prepared
    /// inputs must fit in `STEADY_INPUT_BUDGET`): see `Bench::fit_steady_steps`.
    steady_steps: std::cell::Cell<usize>,
    cases: Vec<(usize, usize, DType, Mode)>,
}

/// One case's device tensors: logits [N, V], targets [N], a per-row gradient scale [N] (f32).
struct Inputs {
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    scale: Tensor<B, 1>,
}

struct Measured {
    median_ms: f64,
    /// Per step in a training loop's steady state, where the host enqueues the next step
    /// while the device runs this one: runs of 1 and of `Bench::steady_steps` steps queued
    /// back to back, one sync after each (median of `STEADY_RUNS` each), and the slope
    /// between them, `(t_long - t_one) / (steps - 1)`. A run's fixed costs, the host's
    /// latency before its first kernel and the sync's wake-up after its last (0.1-0.2 ms
    /// on the H200), cancel; dividing one run of four steps by four (the fifth session's
    /// figures) still carried a quarter of them.
    steady_ms: Option<f64>,
    /// Device memory reserved by one iteration beyond what its inputs already held.
    extra_mib: Option<f64>,
    /// How many times `step` ran (to check that every backward took the in-place path).
    calls: usize,
}

impl Bench {
    fn new() -> Self {
        let llm = match std::env::var("FUSED_CE_BENCH_CASES").as_deref() {
            Ok("llm") => true,
            Ok("small") => false,
            _ => cfg!(feature = "cuda"),
        };
        let (bf16, f32, f16) = (DType::BF16, DType::F32, DType::F16);
        let (cases, reps, copy_elems) = if llm {
            let cases = vec![
                (8192, 128256, bf16, Mode::Fwd),
                (8192, 128256, bf16, Mode::FwdBwd),
                (8192, 128256, bf16, Mode::FwdBwdScaled),
                (8192, 128256, bf16, Mode::FwdBwdRows),
                (8192, 128256, bf16, Mode::FwdBwdChecked),
                (8192, 128256, bf16, Mode::FwdBwdOptions),
                (8192, 128256, bf16, Mode::OtherPlan(BaseMode::FwdBwd)),
                (8192, 128256, bf16, Mode::OtherPlan(BaseMode::FwdBwdScaled)),
                (8192, 128256, bf16, Mode::OtherPlan(BaseMode::FwdBwdOptions)),
                (16384, 151936, bf16, Mode::FwdBwd),
                (16384, 151936, bf16, Mode::OtherPlan(BaseMode::FwdBwd)),
                (4096, 256000, bf16, Mode::FwdBwd),
                (4096, 256000, bf16, Mode::OtherPlan(BaseMode::FwdBwd)),
                (8192, 128256, f32, Mode::FwdBwd),
                (8192, 128256, f32, Mode::OtherPlan(BaseMode::FwdBwd)),
                (8192, 32000, bf16, Mode::FwdBwd),
                (8192, 32000, bf16, Mode::OtherPlan(BaseMode::FwdBwd)),
                // 8.4e9 elements: 64-bit index arithmetic (the cost of it, per element).
                (65536, 128256, bf16, Mode::FwdBwd),
            ];
            // Copy 1 GiB of f32: large enough that launch overhead and caches do not flatter it.
            (cases, 20, 1 << 28)
        } else {
            // Lavapipe on a couple of CPU cores: small sizes and few repetitions keep the run
            // within a couple of minutes; f16 stands in for bf16, which lavapipe lacks.
            let modes = [
                Mode::Fwd,
                Mode::FwdBwd,
                Mode::FwdBwdRows,
                Mode::FwdBwdOptions,
                Mode::OtherPlan(BaseMode::FwdBwd),
            ];
            let cases = [f32, f16]
                .into_iter()
                .flat_map(|dtype| modes.map(|mode| (256, 32000, dtype, mode)))
                .collect();
            (cases, 5, 1 << 24)
        };
        // Tuning runs: `FUSED_CE_BENCH_CASE=8192x128256` keeps the cases whose label contains
        // it; `FUSED_CE_BENCH_SKIP_STOCK=1` leaves Burn's stock loss out (it is 15-60x slower).
        // `FUSED_CE_BENCH_MODE=fwd+bwd` keeps the modes whose label is exactly that (a
        // comma-separated list keeps each).
        let filter = std::env::var("FUSED_CE_BENCH_CASE").unwrap_or_default();
        let mode_filter = std::env::var("FUSED_CE_BENCH_MODE").ok();
        let cases = cases
            .into_iter()
            .filter(|(rows, vocab, _, _)| format!("{rows}x{vocab}").contains(&filter))
            .filter(|(_, _, _, mode)| {
                mode_filter
                    .as_deref()
                    .is_none_or(|m| m.split(',').any(|m| m == mode.label()))
            })
            .collect();
        let device = Device::default();
        Self {
            device,
            warmup: 3,
            reps,
            copy_elems,
            steady_steps: std::cell::Cell::new(STEADY_MAX_STEPS),
            cases,
        }
    }

    /// Steps of a steady-state long run whose prepared inputs (`input_bytes` each) fit
    /// in `STEADY_INPUT_BUDGET`: 2 to `STEADY_MAX_STEPS`.
    fn fit_steady_steps(input_bytes: usize) -> usize {
        (STEADY_INPUT_BUDGET / input_bytes.max(1)).clamp(2, STEADY_MAX_STEPS)
    }

    /// Median wall time of `step`, with the device synced before and after each iteration so
    /// the clock covers exactly its kernels. `prepare` makes each iteration's input outside
    /// the timed region. A panic or a failed sync (stock CE out of memory, say) gives `None`.
    fn measure<S>(
        &self,
        mut prepare: impl FnMut() -> S,
        mut step: impl FnMut(S),
    ) -> Option<Measured> {
        let sync = || B::sync(&self.device).ok();
        let run = AssertUnwindSafe(|| -> Option<Measured> {
            let mut calls = 0;
            let mut timed = |input: S| -> Option<f64> {
                sync()?;
                let start = Instant::now();
                step(input);
                sync()?;
                calls += 1;
                Some(start.elapsed().as_secs_f64() * 1e3)
            };
            let mut last_ms = 0.0;
            for _ in 0..self.warmup {
                last_ms = timed(prepare())?;
                if last_ms > TOO_SLOW_MS {
                    return None;
                }
            }
            let reps = if last_ms > 200.0 {
                self.reps.min(5)
            } else {
                self.reps
            };
            let mut times = (0..reps)
                .map(|_| timed(prepare()))
                .collect::<Option<Vec<_>>>()?;
            times.sort_by(f64::total_cmp);

            let mut steady_ms = None;
            if last_ms <= 200.0 {
                let long = self.steady_steps.get().max(2);
                // Median wall time of `steps` steps queued back to back, one sync after them.
                let mut run_ms = |steps: usize| -> Option<f64> {
                    let mut times = Vec::with_capacity(STEADY_RUNS);
                    for _ in 0..STEADY_RUNS {
                        let inputs: Vec<S> = (0..steps).map(|_| prepare()).collect();
                        sync()?;
                        let start = Instant::now();
                        for input in inputs {
                            step(input);
                        }
                        sync()?;
                        calls += steps;
                        times.push(start.elapsed().as_secs_f64() * 1e3);
                    }
                    times.sort_by(f64::total_cmp);
                    Some(times[times.len() / 2])
                };
                let one = run_ms(1)?;
                let many = run_ms(long)?;
                steady_ms = Some((many - one) / (long - 1) as f64);
            }

            // Peak extra memory. cubecl 0.10 reports current usage only (no peak counter):
            // release every free page, run one iteration, and read how far `bytes_reserved`
            // grew. Pages are not given back within an iteration, so this bounds its peak from
            // above, rounded to pool pages (a small temporary that fits in a partly used page
            // shows as 0).
            let client = Runtime::client(&self.device);
            let input = prepare();
            sync()?;
            client.memory_cleanup();
            let before = client.memory_usage().ok().map(|usage| usage.bytes_reserved);
            step(input);
            sync()?;
            calls += 1;
            let after = client.memory_usage().ok().map(|usage| usage.bytes_reserved);
            let extra_mib = before
                .zip(after)
                .map(|(b, a)| a.saturating_sub(b) as f64 / 1048576.0);
            Some(Measured {
                median_ms: times[reps / 2],
                steady_ms,
                extra_mib,
                calls,
            })
        });
        catch_unwind(run).ok().flatten()
    }

    /// Burn's stock loss on the same inputs. `Reduction::None` has no stock counterpart, so
    /// that row uses the ops the stock loss is built from (log_softmax, gather).
    fn stock(&self, case: &Inputs, mode: Mode) -> Option<Measured> {
        let (logits, targets, scale) = (&case.logits, &case.targets, &case.scale);
        let [rows, _] = logits.dims();
        let plain = || (logits.clone(), targets.clone());
        let autodiff = || {
            let x = Tensor::<AD, 2>::from_inner(logits.clone()).require_grad();
            (x, Tensor::<AD, 1, Int>::from_inner(targets.clone()))
        };
        match mode {
            Mode::Fwd => {
                let loss = CrossEntropyLossConfig::new().init::<B>(&self.device);
                self.measure(plain, |(x, y)| drop(loss.forward(x, y)))
            }
            // Burn's loss has no z-loss nor softcap: nothing to compare with.
            Mode::FwdBwdOptions | Mode::OtherPlan(_) => None,
            Mode::FwdBwd | Mode::FwdBwdChecked => {
                let loss = CrossEntropyLossConfig::new().init::<AD>(&self.device);
                self.measure(autodiff, |(x, y)| drop(loss.forward(x, y).backward()))
            }
            Mode::FwdBwdScaled => {
                let loss = CrossEntropyLossConfig::new().init::<AD>(&self.device);
                self.measure(autodiff, |(x, y)| {
                    drop((loss.forward(x, y) * 0.5).backward())
                })
            }
            Mode::FwdBwdRows => self.measure(autodiff, |(x, y)| {
                let row_loss = log_softmax(x, 1)
                    .gather(1, y.reshape([rows, 1]))
                    .reshape([rows])
                    .neg();
                let weight = Tensor::<AD, 1>::from_inner(scale.clone().cast(logits.dtype()));
                drop((row_loss * weight).sum().backward());
            }),
        }
    }

    /// Ours as a user runs it: forward through the loss and `backward()` under
    /// `Autodiff<CubeBackend>`. For fwd+bwd each iteration gets a fresh, exclusively owned
    /// copy of the logits (made untimed), as a model's output is, so the gradient is
    /// written over it, and every iteration reads real random logits.
    fn ours(&self, case: &Inputs, mode: Mode) -> Option<Measured> {
        let (logits, targets, scale) = (&case.logits, &case.targets, &case.scale);
        // The target check costs a device-to-host read (a sync) per call: measured apart.
        let mean = CrossEntropyOptions {
            check_targets: false,
            ..Default::default()
        };
        let checked = CrossEntropyOptions::default();
        let with_options = CrossEntropyOptions {
            label_smoothing: 0.1,
            z_loss_scale: 1e-4,
            softcap: Some(30.0),
            ..mean.clone()
        };
        let none = CrossEntropyOptions {
            reduction: Reduction::None,
            ..mean.clone()
        };
        let targets_ad = || Tensor::<AutodiffCube, 1, Int>::from_inner(targets.clone());
        // A fresh copy per iteration, made outside the timed region and moved into the loss.
        let owned =
            || Tensor::<AutodiffCube, 2>::from_inner(logits.clone().mul_scalar(1.0)).require_grad();
        match mode {
            Mode::Fwd => self.measure(
                || logits.clone(),
                |x| drop(fused_cross_entropy(x, targets.clone(), &mean)),
            ),
            Mode::FwdBwd => self.measure(owned, |x| {
                drop(fused_cross_entropy(x, targets_ad(), &mean).backward());
            }),
            Mode::FwdBwdScaled => self.measure(owned, |x| {
                drop((fused_cross_entropy(x, targets_ad(), &mean) * 0.5).backward());
            }),
            Mode::FwdBwdChecked => self.measure(owned, |x| {
                drop(fused_cross_entropy(x, targets_ad(), &checked).backward());
            }),
            Mode::FwdBwdOptions => self.measure(owned, |x| {
                drop(fused_cross_entropy(x, targets_ad(), &with_options).backward());
            }),
            Mode::FwdBwdRows => self.measure(owned, |x| {
                let loss = fused_cross_entropy(x, targets_ad(), &none);
                let weights = Tensor::<AutodiffCube, 1>::from_inner(scale.clone());
                drop((loss * weights).sum().backward());
            }),
            Mode::OtherPlan(base) => {
                let flip = |options: &CrossEntropyOptions| CrossEntropyOptions {
                    gradient_in_forward: !options.gradient_in_forward,
                    ..options.clone()
                };
                let (options, factor) = match base {
                    BaseMode::FwdBwd => (flip(&mean), 1.0),
                    BaseMode::FwdBwdScaled => (flip(&mean), 0.5),
                    BaseMode::FwdBwdOptions => (flip(&with_options), 1.0),
                };
                self.measure(owned, |x| {
                    let loss = fused_cross_entropy(x, targets_ad(), &options);
                    // As the base mode's step: no multiply when the factor is 1 (it would
                    // add two launches the base mode does not have).
                    let loss = if factor == 1.0 { loss } else { loss * factor };
                    drop(loss.backward());
                })
            }
        }
    }
}

fn cell(value: Option<f64>, width: usize, precision: usize) -> String {
    match value {
        Some(v) => format!("{v:>width$.precision$}"),
        None => format!("{:>width$}", "-"),
    }
}

fn main() {
    let bench = Bench::new();
    let device = &bench.device;
    let uniform = Distribution::Uniform(-6.0, 6.0);
    let mut rng = SmallRng::seed_from_u64(0x5eed);

    // Copy bandwidth: an elementwise op on a shared buffer reads it and writes a new one, so
    // it moves 2 x its size.
    let buffer = Tensor::<B, 1>::random([bench.copy_elems], uniform, device);
    let copy = bench
        .measure(|| buffer.clone(), |x| drop(x.mul_scalar(1.0)))
        .expect("copy bandwidth measurement");
    drop(buffer);
    let copy_bytes = (bench.copy_elems * 4) as f64;
    let bandwidth = 2.0 * copy_bytes / (copy.median_ms / 1e3);
    // The steady-state floor from the copy's steady state, so both sides pay the same.
    let steady_bandwidth = copy
        .steady_ms
        .map_or(bandwidth, |ms| 2.0 * copy_bytes / (ms / 1e3));
    println!(
        "fused cross-entropy on {RUNTIME_NAME}: copy bandwidth {:.1} GB/s (read+write, {} MiB buffer; {:.1} GB/s in steady state)",
        bandwidth / 1e9,
        bench.copy_elems * 4 >> 20,
        steady_bandwidth / 1e9
    );
    println!(
        "case          dtype mode               ours ms  floor ms  %floor  steady ms  %floor  stock ms stock/ours  ours MiB stock MiB"
    );

    let mut not_in_place = false;
    for &(rows, vocab, dtype, mode) in &bench.cases {
        // Random data made on the device: no multi-GB host buffers, and never zeros.
        let logits = Tensor::<B, 2>::random([rows, vocab], uniform, device).cast(dtype);
        let labels: Vec<i32> = (0..rows)
            .map(|_| rng.random_range(0..vocab as i32))
            .collect();
        let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(labels, [rows]), device);
        // Non-uniform per-row gradient for `Reduction::None` (f32, as the op expects).
        let scale = Tensor::<B, 1>::random([rows], Distribution::Uniform(0.5, 1.5), device);

        let inputs = Inputs {
            logits,
            targets,
            scale,
        };
        // Each step of a steady-state run gets its own copy of the logits.
        bench
            .steady_steps
            .set(Bench::fit_steady_steps(rows * vocab * dtype.size()));
        let stock = match std::env::var("FUSED_CE_BENCH_SKIP_STOCK") {
            Ok(_) => None,
            Err(_) => bench.stock(&inputs, mode),
        };
        let in_place_before = diagnostics::in_place_backward_count();
        let ours = bench.ours(&inputs, mode);
        if let (Some(m), true) = (&ours, mode != Mode::Fwd) {
            not_in_place |= diagnostics::in_place_backward_count() - in_place_before != m.calls;
        }

        // Floor: forward must read the logits once; forward+backward must at least read them
        // and write the gradient. (Two kernels read them twice, so ~67% is their ceiling.)
        let passes = if mode == Mode::Fwd { 1.0 } else { 2.0 };
        let floor_ms = passes * (rows * vocab * dtype.size()) as f64 / bandwidth * 1e3;
        let steady_floor_ms =
            passes * (rows * vocab * dtype.size()) as f64 / steady_bandwidth * 1e3;
        let (ours_ms, stock_ms) = (
            ours.as_ref().map(|m| m.median_ms),
            stock.as_ref().map(|m| m.median_ms),
        );
        let steady_ms = ours.as_ref().and_then(|m| m.steady_ms);
        let label = mode.label();
        println!(
            "{:<13} {:<5} {label:<16} {} {} {} {} {} {} {} {} {}",
            format!("{rows}x{vocab}"),
            format!("{dtype:?}").to_lowercase(),
            cell(ours_ms, 9, 3),
            cell(Some(floor_ms), 9, 3),
            cell(ours_ms.map(|ms| floor_ms / ms * 100.0), 7, 1),
            cell(steady_ms, 10, 3),
            cell(steady_ms.map(|ms| steady_floor_ms / ms * 100.0), 7, 1),
            cell(stock_ms, 9, 3),
            cell(ours_ms.zip(stock_ms).map(|(o, s)| s / o), 10, 2),
            cell(ours.as_ref().and_then(|m| m.extra_mib), 9, 1),
            cell(stock.as_ref().and_then(|m| m.extra_mib), 9, 1),
        );
        // Give this case's pages back before the next one is allocated.
        drop(inputs);
        Runtime::client(device).memory_cleanup();
    }
    if not_in_place {
        println!("warning: some backward launches did not write the gradient in place");
    }
    println!(
        "MiB: device memory one iteration reserved beyond its inputs (pool pages, approximate)"
    );
}
