//! Throughput of the fused cross-entropy against two references taken in the same run: the
//! device's own copy bandwidth (the floor no memory-bound loss can beat) and Burn's stock
//! `CrossEntropyLoss`. Everything runs on the cube device's tensors, which Burn's fusion
//! backend runs (`Fusion<CubeBackend>`, as users have it by default), with autodiff on
//! the device for training steps (`Device::autodiff()`).
//!
//! Two times per case: one step timed alone with the device synced before and after it
//! (`ours ms`: what one isolated call costs, host launch latency and sync included), and
//! the steady state of a training loop (`steady ms`: per step, from runs of 1 and of up to
//! 12 steps queued back to back with one sync each, the slope between them, so a run's
//! fixed costs cancel), each against its own floor (the copy measured the same way).
//!
//! `cargo bench --bench throughput` (Vulkan; small sizes) or, on a GPU,
//! `CUDARC_CUDA_VERSION=13000 cargo bench --bench throughput --no-default-features --features cuda,autotune`
//! (LLM sizes). `FUSED_CE_BENCH_CASES=small|llm` overrides the choice of sizes.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::{DType, Device, Distribution, Int, Tensor, TensorData, activation::log_softmax};
use burn_fused_ce::tuning::KernelTuning;
use burn_fused_ce::{
    CrossEntropyOptions, EntropyOutput, ExtraOutputs, FastMath, FusedCrossEntropyLossConfig,
    GradientPlan, Reduction, TargetCheck, Targets, fused_cross_entropy, test_hooks,
    try_fused_cross_entropy,
};
use fused_ce_suite::RUNTIME_NAME;
use rand::{Rng, SeedableRng, rngs::SmallRng};

#[path = "throughput/report.rs"]
mod report;

/// A warm-up iteration slower than this means the op is hopeless at this size (stock CE at
/// LLM sizes on a small device): report `-` rather than wait.
const TOO_SLOW_MS: f64 = 20_000.0;

/// The plan a step asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// The options' default, as a user who sets nothing gets it.
    Default,
    OnePass,
    TwoPass,
}

/// The incoming gradient of the loss in a training step.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Incoming {
    /// `loss.backward()`.
    One,
    /// `(loss * 0.25).backward()` every step.
    Scaled,
    /// `Reduction::None`, `(loss * w).sum().backward()` with a non-uniform `w` per row.
    PerRow,
    /// As `PerRow`, with an entropy bonus: `(loss * w).sum() - (entropy * w').sum()`, an
    /// RL objective (the entropy output asked for and differentiated).
    PerRowEntropyBonus,
    /// The same objective with its weights given at forward (`Targets`, `Sum`):
    /// `loss.backward()`, the gradient formed in the one pass.
    WeightedEntropyBonus,
    /// As `WeightedEntropyBonus` without the entropy's weights: what the loss's weights
    /// alone cost, apart from the entropy's term.
    Weighted,
}

/// What one row of the table times.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Forward only (`Mean`, no autodiff), with the extra outputs asked for (an
    /// evaluation step's).
    Fwd(Outputs),
    /// A training step with autodiff on the device: forward and backward.
    Step {
        plan: Plan,
        incoming: Incoming,
        /// The target check (on by default).
        checked: bool,
        /// Label smoothing 0.1, z-loss 1e-4 and softcap 30 together.
        options: bool,
        /// The extra outputs asked for.
        outputs: Outputs,
    },
}

/// Extra outputs a step asks for: the accuracy (a Learner's metric), the entropy (an RL
/// trainer's), or both.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outputs {
    None,
    Accuracy,
    Entropy,
    Both,
}

impl Outputs {
    fn label(self) -> &'static str {
        match self {
            Outputs::None => "",
            Outputs::Accuracy => " +accuracy",
            Outputs::Entropy => " +entropy",
            Outputs::Both => " +acc+entropy",
        }
    }

    fn extra_outputs(self) -> ExtraOutputs {
        ExtraOutputs {
            accuracy: matches!(self, Outputs::Accuracy | Outputs::Both),
            entropy: if matches!(self, Outputs::Entropy | Outputs::Both) {
                EntropyOutput::Metric
            } else {
                EntropyOutput::Off
            },
            ..ExtraOutputs::default()
        }
    }
}

impl Mode {
    /// A step with the default config and `loss.backward()`.
    const DEFAULT: Mode = Mode::Step {
        plan: Plan::Default,
        incoming: Incoming::One,
        checked: true,
        options: false,
        outputs: Outputs::None,
    };

    /// The default config with another incoming gradient.
    const fn default_with(incoming: Incoming) -> Mode {
        Mode::Step {
            plan: Plan::Default,
            incoming,
            checked: true,
            options: false,
            outputs: Outputs::None,
        }
    }

    /// An explicit plan, targets unchecked, `loss.backward()`.
    const fn plan(plan: Plan) -> Mode {
        Mode::Step {
            plan,
            incoming: Incoming::One,
            checked: false,
            options: false,
            outputs: Outputs::None,
        }
    }

    fn label(self) -> String {
        match self {
            Mode::Fwd(outputs) => format!("fwd{}", outputs.label()),
            Mode::Step {
                plan,
                incoming,
                checked,
                options,
                outputs,
            } => {
                let mut label = String::from("fwd+bwd");
                label += match plan {
                    Plan::Default => "",
                    Plan::OnePass => " one-pass",
                    Plan::TwoPass => " two-pass",
                };
                label += match incoming {
                    Incoming::One => "",
                    Incoming::Scaled => " g=0.25",
                    Incoming::PerRow => " none/row",
                    Incoming::PerRowEntropyBonus => " none/row -entropy",
                    Incoming::WeightedEntropyBonus => " weighted -entropy",
                    Incoming::Weighted => " weighted",
                };
                if options {
                    label += " ls+z+cap";
                }
                label += outputs.label();
                if !checked {
                    label += " unchecked";
                }
                label
            }
        }
    }
}

/// Steady state (see `Measured::steady_ms`): most steps queued back to back in the long
/// run, the device memory their prepared inputs may take, and runs of each length.
const STEADY_MAX_STEPS: usize = 12;
const STEADY_INPUT_BUDGET: usize = 48 << 30;
const STEADY_RUNS: usize = 5;

struct Bench {
    /// The cube device, and the same with autodiff (the training steps').
    device: Device,
    autodiff: Device,
    warmup: usize,
    reps: usize,
    /// f32 elements of the buffer the copy bandwidth is measured on.
    copy_elems: usize,
    /// Steps of the steady state's long run for the case being measured (its prepared
    /// inputs must fit in `STEADY_INPUT_BUDGET`): see `Bench::fit_steady_steps`.
    steady_steps: std::cell::Cell<usize>,
    cases: Vec<(usize, usize, DType, Mode)>,
    /// `FUSED_CE_TUNING`: the kernels' tuning for every call of ours (`None`: the
    /// device's defaults).
    tuning: Option<KernelTuning>,
    /// The fast-math switches for every call of ours (`FUSED_CE_TUNING` may turn them off
    /// with `exp_flush_to_zero=0` or `approximate_tanh=0`).
    fast_math: FastMath,
}

/// One case's device tensors (no autodiff): logits [N, V], targets [N], a per-row gradient
/// scale [N] (f32).
struct Inputs {
    logits: Tensor<2>,
    targets: Tensor<1, Int>,
    scale: Tensor<1>,
}

struct Measured {
    median_ms: f64,
    /// Per step in a training loop's steady state, where the host enqueues the next step
    /// while the device runs this one: runs of 1 and of `Bench::steady_steps` steps queued
    /// back to back, one sync after each (median of `STEADY_RUNS` each), and the slope
    /// between them, `(t_long - t_one) / (steps - 1)`. A run's fixed costs, the host's
    /// latency before its first kernel and the sync's wake-up after its last, cancel;
    /// dividing one run of four steps by four would still carry a quarter of them.
    steady_ms: Option<f64>,
    /// Host time per step of the long steady run: from its start until its last step was
    /// handed to the device, before the sync. Near `steady_ms`, the host bounds the loop.
    host_ms: Option<f64>,
    /// Device memory reserved by one iteration beyond what its inputs already held.
    extra_mib: Option<f64>,
    /// How many times `step` ran (to check that every backward took the in-place path).
    calls: usize,
}

/// `FUSED_CE_TUNING="chunk_bytes=49152 stage_bytes=40960"`: space-separated `field=value`
/// settings of `KernelTuning` over the device's defaults (see
/// `KernelTuning::with_settings`), and `exp_flush_to_zero=0` / `approximate_tanh=0` for
/// the fast-math switches.
fn tuning_from_env(device: &Device) -> (Option<KernelTuning>, FastMath) {
    let Ok(settings) = std::env::var("FUSED_CE_TUNING") else {
        return (None, FastMath::default());
    };
    let mut fast_math = FastMath::default();
    let mut kernel_settings = Vec::new();
    for setting in settings.split_whitespace() {
        match setting.split_once('=') {
            Some(("exp_flush_to_zero", value)) => fast_math.exp_flush_to_zero = value != "0",
            Some(("approximate_tanh", value)) => fast_math.approximate_tanh = value != "0",
            _ => kernel_settings.push(setting),
        }
    }
    let tuning = KernelTuning::for_device(&fused_ce_suite::client(device))
        .with_settings(&kernel_settings.join(" "))
        .unwrap_or_else(|error| panic!("FUSED_CE_TUNING: {error}"));
    (Some(tuning), fast_math)
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
            let one_pass = Mode::plan(Plan::OnePass);
            let two_pass = Mode::plan(Plan::TwoPass);
            let with_options = Mode::Step {
                plan: Plan::Default,
                incoming: Incoming::One,
                checked: true,
                options: true,
                outputs: Outputs::None,
            };
            let with_outputs = |outputs| Mode::Step {
                plan: Plan::Default,
                incoming: Incoming::One,
                checked: true,
                options: false,
                outputs,
            };
            let mut cases = vec![
                (8192, 128256, bf16, Mode::Fwd(Outputs::None)),
                (8192, 128256, bf16, Mode::Fwd(Outputs::Accuracy)),
                (8192, 128256, bf16, Mode::DEFAULT),
                (8192, 128256, bf16, Mode::default_with(Incoming::Scaled)),
                (8192, 128256, bf16, Mode::default_with(Incoming::PerRow)),
                (
                    8192,
                    128256,
                    bf16,
                    Mode::default_with(Incoming::PerRowEntropyBonus),
                ),
                (
                    8192,
                    128256,
                    bf16,
                    Mode::default_with(Incoming::WeightedEntropyBonus),
                ),
                (8192, 128256, bf16, Mode::default_with(Incoming::Weighted)),
                (8192, 128256, bf16, with_options),
                (8192, 128256, bf16, with_outputs(Outputs::Accuracy)),
                (8192, 128256, bf16, with_outputs(Outputs::Entropy)),
                (8192, 128256, bf16, with_outputs(Outputs::Both)),
                (8192, 128256, bf16, one_pass),
                (8192, 128256, bf16, two_pass),
            ];
            for (rows, vocab, dtype) in [
                (16384, 151936, bf16),
                (4096, 256000, bf16),
                (8192, 128256, f32),
                (8192, 32000, bf16),
            ] {
                for mode in [Mode::DEFAULT, one_pass, two_pass] {
                    cases.push((rows, vocab, dtype, mode));
                }
            }
            // 8.4e9 elements: 64-bit index arithmetic (the cost of it, per element).
            cases.push((65536, 128256, bf16, Mode::DEFAULT));
            // Copy 1 GiB of f32: large enough that launch overhead and caches do not flatter it.
            (cases, 20, 1 << 28)
        } else {
            // Lavapipe on a couple of CPU cores: small sizes and few repetitions keep the run
            // within a couple of minutes; f16 stands in for bf16, which lavapipe lacks.
            let modes = [
                Mode::Fwd(Outputs::None),
                Mode::DEFAULT,
                Mode::default_with(Incoming::Scaled),
                Mode::default_with(Incoming::PerRow),
                Mode::default_with(Incoming::PerRowEntropyBonus),
                Mode::default_with(Incoming::WeightedEntropyBonus),
                Mode::default_with(Incoming::Weighted),
                Mode::plan(Plan::OnePass),
                Mode::plan(Plan::TwoPass),
                Mode::Step {
                    plan: Plan::Default,
                    incoming: Incoming::One,
                    checked: true,
                    options: false,
                    outputs: Outputs::Both,
                },
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
        let device = fused_ce_suite::device();
        let (tuning, fast_math) = tuning_from_env(&device);
        Self {
            autodiff: device.clone().autodiff(),
            device,
            warmup: 3,
            reps,
            copy_elems,
            steady_steps: std::cell::Cell::new(STEADY_MAX_STEPS),
            cases,
            tuning,
            fast_math,
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
    /// Each step's output (the loss, the gradients) lives until the device has been handed
    /// its work ([`Bench::finish`]): Burn's fusion backend skips writing what nothing holds.
    fn measure<S, O>(
        &self,
        mut prepare: impl FnMut() -> S,
        mut step: impl FnMut(S) -> O,
    ) -> Option<Measured> {
        let sync = || self.device.sync().ok();
        let mut step = |input: S| self.finish(step(input));
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
            let mut host_ms = None;
            if last_ms <= 200.0 {
                let long = self.steady_steps.get().max(2);
                // Median wall time of `steps` steps queued back to back, one sync after them,
                // and the median time to queue them.
                let mut run_ms = |steps: usize| -> Option<(f64, f64)> {
                    let mut times = Vec::with_capacity(STEADY_RUNS);
                    let mut queued = Vec::with_capacity(STEADY_RUNS);
                    for _ in 0..STEADY_RUNS {
                        let inputs: Vec<S> = (0..steps).map(|_| prepare()).collect();
                        sync()?;
                        let start = Instant::now();
                        for input in inputs {
                            step(input);
                        }
                        queued.push(start.elapsed().as_secs_f64() * 1e3);
                        sync()?;
                        calls += steps;
                        times.push(start.elapsed().as_secs_f64() * 1e3);
                    }
                    times.sort_by(f64::total_cmp);
                    queued.sort_by(f64::total_cmp);
                    Some((times[times.len() / 2], queued[queued.len() / 2]))
                };
                let (one, _) = run_ms(1)?;
                let (many, many_queued) = run_ms(long)?;
                steady_ms = Some((many - one) / (long - 1) as f64);
                host_ms = Some(many_queued / long as f64);
            }

            // Peak extra memory. The pools' peak (`memory_pool_report`'s `pages_peak`) is
            // the process's, never reset, so a case's own peak is read as before: release
            // every free page, run one iteration, and read how far `bytes_reserved` of
            // `memory_pool_usage` grew. Pages are not given back within an iteration, so
            // this bounds its peak from above, rounded to pool pages (a small temporary
            // that fits in a partly used page shows as 0).
            let reserved = || {
                self.device
                    .memory_pool_usage()
                    .map(|usage| usage.bytes_reserved)
            };
            let input = prepare();
            sync()?;
            self.device.memory_cleanup();
            let before = reserved();
            step(input);
            sync()?;
            calls += 1;
            let after = reserved();
            let extra_mib = before
                .zip(after)
                .map(|(b, a)| a.saturating_sub(b) as f64 / 1048576.0);
            Some(Measured {
                median_ms: times[reps / 2],
                steady_ms,
                host_ms,
                extra_mib,
                calls,
            })
        });
        catch_unwind(run).ok().flatten()
    }

    /// Drops a step's output once the device's queue holding its work has been flushed
    /// (handed to the device, not waited for), so that the work runs with the output
    /// still held and steps queued back to back still overlap.
    fn finish<O>(&self, output: O) {
        // A flush that fails leaves the error to the next sync, which reports it.
        let _ = self.device.flush();
        drop(output);
    }

    /// Burn's stock loss on the same inputs. `Reduction::None` has no stock counterpart, so
    /// that row uses the ops the stock loss is built from (log_softmax, gather).
    fn stock(&self, case: &Inputs, mode: Mode) -> Option<Measured> {
        let (logits, targets, scale) = (&case.logits, &case.targets, &case.scale);
        let [rows, _] = logits.dims();
        let plain = || (logits.clone(), targets.clone());
        let autodiff = || {
            let x = logits.clone().autodiff().require_grad();
            (x, targets.clone().autodiff())
        };
        let Mode::Step {
            plan: Plan::Default,
            incoming,
            options: false,
            outputs: Outputs::None,
            ..
        } = mode
        else {
            // The forward alone, or a plan or options Burn's loss does not have.
            return match mode {
                Mode::Fwd(Outputs::None) => {
                    let loss = CrossEntropyLossConfig::new().init(&self.device);
                    self.measure(plain, |(x, y)| loss.forward(x, y))
                }
                _ => None,
            };
        };
        match incoming {
            Incoming::One => {
                let loss = CrossEntropyLossConfig::new().init(&self.autodiff);
                self.measure(autodiff, |(x, y)| loss.forward(x, y).backward())
            }
            Incoming::Scaled => {
                let loss = CrossEntropyLossConfig::new().init(&self.autodiff);
                self.measure(autodiff, |(x, y)| (loss.forward(x, y) * 0.25).backward())
            }
            Incoming::PerRowEntropyBonus | Incoming::WeightedEntropyBonus | Incoming::Weighted => {
                None
            }
            Incoming::PerRow => self.measure(autodiff, |(x, y)| {
                let row_loss = log_softmax(x, 1)
                    .gather(1, y.reshape([rows, 1]))
                    .reshape([rows])
                    .neg();
                let weight = scale.clone().cast(logits.dtype()).autodiff();
                (row_loss * weight).sum().backward()
            }),
        }
    }

    /// Ours as a user runs it: forward through the loss and `backward()` with autodiff on
    /// the device. For fwd+bwd each iteration gets a fresh, exclusively owned
    /// copy of the logits (made untimed), as a model's output is, so the gradient is
    /// written over it, and every iteration reads real random logits.
    fn ours(&self, case: &Inputs, mode: Mode) -> Option<Measured> {
        let (logits, targets, scale) = (&case.logits, &case.targets, &case.scale);
        let base = CrossEntropyOptions::default()
            .with_tuning(self.tuning)
            .with_fast_math(self.fast_math);
        let Mode::Step {
            plan,
            incoming,
            checked,
            options,
            outputs,
        } = mode
        else {
            let fwd_outputs = match mode {
                Mode::Fwd(outputs) => outputs,
                Mode::Step { .. } => Outputs::None,
            };
            let options = base
                .clone()
                .with_target_check(TargetCheck::Off)
                .with_outputs(fwd_outputs.extra_outputs());
            return self.measure(
                || logits.clone(),
                |x| fused_cross_entropy(x, targets.clone(), &options),
            );
        };
        let mut step_options = base
            .clone()
            .with_target_check(if checked {
                TargetCheck::default()
            } else {
                TargetCheck::Off
            })
            .with_reduction(match incoming {
                Incoming::PerRow | Incoming::PerRowEntropyBonus => Reduction::None,
                Incoming::One | Incoming::Scaled => Reduction::Mean,
                Incoming::WeightedEntropyBonus | Incoming::Weighted => Reduction::Sum,
            });
        match plan {
            Plan::Default => {}
            Plan::OnePass => step_options.gradient_plan = GradientPlan::OnePass,
            Plan::TwoPass => step_options.gradient_plan = GradientPlan::TwoPass,
        }
        if options {
            step_options.label_smoothing = 0.1;
            step_options.z_loss_scale = 1e-4;
            step_options.softcap = Some(30.0);
        }
        step_options.outputs = outputs.extra_outputs();
        let entropy_bonus = incoming == Incoming::PerRowEntropyBonus;
        if entropy_bonus {
            step_options.outputs.entropy = EntropyOutput::Differentiable;
        }
        let targets_ad = || targets.clone().autodiff();
        // A fresh copy per iteration, made outside the timed region and moved into the loss.
        let owned = || logits.clone().mul_scalar(1.0).autodiff().require_grad();
        // A loss module, as a training loop holds one: it remembers the incoming gradient
        // the one pass guesses. With `FUSED_CE_TUNING` the functional form, which takes
        // the tuning (and guesses 1).
        let module = FusedCrossEntropyLossConfig::new()
            .with_reduction(step_options.reduction)
            .with_label_smoothing(step_options.label_smoothing)
            .with_z_loss_scale(step_options.z_loss_scale)
            .with_softcap(step_options.softcap)
            .with_target_check(step_options.target_check)
            .with_gradient_plan(step_options.gradient_plan)
            .with_fast_math(step_options.fast_math)
            .with_outputs(step_options.outputs)
            .init(&self.autodiff);
        // The per-row weights in the loss's dtype (the logits'): Burn 0.22 multiplies
        // tensors of one dtype only.
        let row_weights = scale.clone().cast(logits.dtype()).autodiff();
        // The entropy's weights (f32, the entropy's dtype): a bonus, so negative.
        let entropy_weights = scale.clone().mul_scalar(-0.01).autodiff();
        // The weighted step's targets: the same objective's weights, given at forward.
        let weighted_targets = || {
            let targets = Targets::new(targets_ad());
            match incoming {
                Incoming::WeightedEntropyBonus => targets
                    .with_weights(Some(scale.clone().autodiff()))
                    .with_entropy_weights(Some(scale.clone().mul_scalar(0.01).autodiff())),
                Incoming::Weighted => targets.with_weights(Some(scale.clone().autodiff())),
                _ => targets,
            }
        };
        self.measure(owned, |x| {
            let output = match self.tuning {
                None => module.forward_with_outputs(x, weighted_targets()),
                Some(_) => try_fused_cross_entropy(x, weighted_targets(), None, &step_options)
                    .expect("valid input"),
            };
            let loss = output.loss;
            let objective = match incoming {
                Incoming::One | Incoming::WeightedEntropyBonus | Incoming::Weighted => loss,
                Incoming::Scaled => loss * 0.25,
                Incoming::PerRow => (loss * row_weights.clone()).sum(),
                Incoming::PerRowEntropyBonus => {
                    let entropy = output.entropy.expect("the entropy was asked for");
                    (loss * row_weights.clone()).sum().cast(DType::F32)
                        + (entropy * entropy_weights.clone()).sum()
                }
            };
            objective.backward()
        })
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
    let buffer = Tensor::<1>::random([bench.copy_elems], uniform, device);
    let copy = bench
        .measure(|| buffer.clone(), |x| x.mul_scalar(1.0))
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
        (bench.copy_elems * 4) >> 20,
        steady_bandwidth / 1e9
    );
    println!(
        "case          dtype mode                             ours ms  floor ms  %floor  steady ms  %floor  stock ms stock/ours  ours MiB stock MiB  host ms"
    );

    let mut not_in_place = false;
    let mut results = Vec::new();
    for &(rows, vocab, dtype, mode) in &bench.cases {
        // Random data made on the device: no multi-GB host buffers, and never zeros.
        let logits = Tensor::<2>::random([rows, vocab], uniform, device).cast(dtype);
        let labels: Vec<i32> = (0..rows)
            .map(|_| rng.random_range(0..vocab as i32))
            .collect();
        let targets = Tensor::<1, Int>::from_data(TensorData::new(labels, [rows]), device);
        // Non-uniform per-row gradient for `Reduction::None` (f32, as the op expects).
        let scale = Tensor::<1>::random([rows], Distribution::Uniform(0.5, 1.5), device);

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
        let in_place_before = test_hooks::in_place_backward_count();
        let ours = bench.ours(&inputs, mode);
        if let (Some(m), true) = (&ours, !matches!(mode, Mode::Fwd(_))) {
            not_in_place |= test_hooks::in_place_backward_count() - in_place_before != m.calls;
        }

        // Floor: forward must read the logits once; forward+backward must at least read them
        // and write the gradient. (Two kernels read them twice, so ~67% is their ceiling.)
        let passes = if matches!(mode, Mode::Fwd(_)) {
            1.0
        } else {
            2.0
        };
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
            "{:<13} {:<5} {label:<30} {} {} {} {} {} {} {} {} {} {}",
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
            cell(ours.as_ref().and_then(|m| m.host_ms), 8, 3),
        );
        results.push(report::Row {
            case: format!("{rows}x{vocab}"),
            dtype: format!("{dtype:?}").to_lowercase(),
            mode: label,
            single_ms: ours_ms,
            single_floor_ms: floor_ms,
            steady_ms,
            steady_floor_ms,
            stock_steady_ms: stock.as_ref().and_then(|m| m.steady_ms),
            stock_single_ms: stock_ms,
            ours_mib: ours.as_ref().and_then(|m| m.extra_mib),
            stock_mib: stock.as_ref().and_then(|m| m.extra_mib),
        });
        // Give this case's pages back before the next one is allocated.
        drop(inputs);
        device.memory_cleanup();
    }
    if not_in_place {
        println!("warning: some backward launches did not write the gradient in place");
    }
    println!(
        "MiB: device memory one iteration reserved beyond its inputs (pool pages, approximate)"
    );
    // `FUSED_CE_BENCH_OUT` (default `target/fused-ce-bench`): where the table, CSV and plot go.
    let out = fused_ce_suite::bench_out();
    let header = report::Header {
        runtime: device_name(),
        copy_gbps: bandwidth / 1e9,
        steady_copy_gbps: steady_bandwidth / 1e9,
    };
    match report::write(std::path::Path::new(&out), &header, &results) {
        Ok(()) => println!("results: {out}/results.{{md,csv,svg}}"),
        Err(error) => println!("could not write the results to {out}: {error}"),
    }
}

/// The runtime and the device's name when `FUSED_CE_BENCH_DEVICE` gives it (cubecl does not
/// report it; `gpu-bundle/run.sh` sets it from `nvidia-smi`).
fn device_name() -> String {
    match std::env::var("FUSED_CE_BENCH_DEVICE") {
        Ok(name) if !name.is_empty() => format!("{name} ({RUNTIME_NAME})"),
        _ => RUNTIME_NAME.to_string(),
    }
}
