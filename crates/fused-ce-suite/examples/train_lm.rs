//! The main example: a GPT-style language model trained on real English text with a real
//! BPE vocabulary, its LM head and loss computed as one op by the fused linear
//! cross-entropy.
//!
//!   scripts/with-vulkan.sh cargo run --release --example train_lm            # tiny, CPU (lavapipe)
//!   scripts/with-vulkan.sh cargo run --release --example train_lm -- --compare
//!   CUDARC_CUDA_VERSION=13000 cargo run --release --no-default-features \
//!       --features cuda,autotune --example train_lm -- --size small --compare
//!   CUDARC_CUDA_VERSION=13000 cargo run --release --no-default-features \
//!       --features cuda --example train_lm -- --size gpt2 --compare --dtype bf16
//!
//! GPT-2 trains without Burn's autotune: on Burn 0.22.1 the autotune of its attention
//! matmul stops the first step (docs/performance.md says more).
//!
//! Flags: `--size tiny|small|gpt2` (model and batch; tiny by default), `--vocab
//! gpt2|cl100k` (OpenAI's BPE vocabularies shipped in `tiktoken-rs`: 50257 or 100277
//! tokens), `--data PATH` (any UTF-8 text file; default: *Around the World in Eighty
//! Days*, see examples/data/README.md), `--steps N`, `--batch N`, `--loss
//! stock|fused|linear` (default linear), `--compare` (the same seeded model trained the
//! three ways, curves and a table), `--max-batch` (the largest batch each way fits on
//! the device, by bisection, two steps per try, each try a child process), `--learner`
//! (the fused linear cross-entropy trained through burn-train's `Learner`: its loss,
//! accuracy and perplexity metrics, checkpoints and summary in `--out`/learner; its
//! terminal dashboard with the `tui` feature), `--dtype
//! f32|bf16` (bf16 on CUDA), `--chunk-mib M` (the fused linear cross-entropy's chunk
//! budget, `LinearChunking::logits_bytes`, in MiB; default: the library's), `--devices N` (data
//! parallel: each global batch split over N replicas on the first N GPUs, their gradients
//! averaged by Burn's all-reduce (`burn::tensor::distributed`) where the runtime has
//! collectives (CUDA with NCCL), else on the first device; on wgpu the replicas share the
//! device), `--out DIR` (plots and tables; default target/train_lm), `--temperature T`
//! and `--top-k K` (how the closing sample draws its tokens: default 0.8 and 40, seeded;
//! temperature 0 is greedy), `--environment FILE` (CUDA builds: CubeCL's environment,
//! Burn's autotune results and compiled kernels, read from and written to `FILE`, a
//! SQLite file, instead of `target/environment/`) and `--save-environment OUT` (with
//! `--environment`: copy its autotune results and compiled kernels into `OUT`, one file
//! with no WAL or lock files beside it, and exit; how a cold autotune is carried between
//! runs cut short on a GPU host).
//!
//! The default features (`wgpu`) leave Burn's autotune out: without a GPU, wgpu runs on
//! lavapipe, where tuning would compile every candidate kernel of every shape for minutes.
//! GPU builds turn it on for the tiny and small sizes (`--features cuda,autotune`;
//! `--features autotune` for wgpu on a GPU).
//!
//! The summary's second table tells whether a long run stays flat (a soak: `--steps
//! 10000`): the memory pool (pages reserved, bytes in use) after warm-up (step 100) and at
//! the end, the steps whose loss is not finite, and the mean loss of the first and the
//! last 100 steps.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use burn::tensor::{Device, FloatDType};
use burn_fused_ce::LinearChunking;
use fused_ce_suite::{
    RUNTIME_NAME, SUPPORTS_BF16, devices,
    lm::{
        Corpus, Gpt, GptConfig, GradientSync, LearnerRun, LossKind, RunConfig, SAMPLE_TEXT,
        Sampling, StepLog, Vocabulary, cpu, initial_model,
        plot::{Curve, loss_curves_svg},
        prose_prompt, sample_with, train, train_data_parallel_with, train_with_learner,
    },
};
use indicatif::{ProgressBar, ProgressStyle};

/// The flag of a `--max-batch` trial's child process (see [`largest_batch`]).
const FIT_TRIAL: &str = "--fit-trial";

/// The values of `--loss` and the losses they name.
const LOSS_FLAGS: [(&str, LossKind); 3] = [
    ("stock", LossKind::Stock),
    ("fused", LossKind::Fused),
    ("linear", LossKind::FusedLinear),
];

/// What the command line asks for.
struct Args {
    model: GptConfig,
    run: RunConfig,
    vocabulary: Vocabulary,
    data: Option<PathBuf>,
    kinds: Vec<LossKind>,
    max_batch: bool,
    /// Train through burn-train's `Learner` (one device, the fused linear cross-entropy).
    learner: bool,
    /// Set in the child processes of `--max-batch`: train this many sequences a batch for
    /// two steps and exit with status 0 when it fit.
    fit_trial: Option<usize>,
    bf16: bool,
    devices: usize,
    out: PathBuf,
    sampling: Sampling,
    /// CubeCL's environment file (`--environment`), and where to save a copy of it that
    /// stands alone (`--save-environment`).
    environment: Option<PathBuf>,
    save_environment: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| -> Option<&str> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let flag = |name: &str| args.iter().any(|a| a == name);
    let number = |name: &str| -> Result<Option<usize>, String> {
        value(name)
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("{name} takes a number, got {v}"))
            })
            .transpose()
    };
    let real = |name: &str| -> Result<Option<f64>, String> {
        value(name)
            .map(|v| match v.parse::<f64>() {
                Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
                _ => Err(format!("{name} takes a number of 0 or more, got {v}")),
            })
            .transpose()
    };
    let vocabulary = match value("--vocab").unwrap_or("gpt2") {
        "gpt2" => Vocabulary::Gpt2,
        "cl100k" => Vocabulary::Cl100k,
        other => return Err(format!("--vocab gpt2|cl100k, got {other}")),
    };
    let vocab = vocabulary.size();
    let (model, batch, steps, lr) = match value("--size").unwrap_or("tiny") {
        // Minutes on two CPU cores (lavapipe).
        "tiny" => (model(vocab, 64, 2, 4, 64), 8, 60, 3e-3),
        "small" => (model(vocab, 256, 4, 4, 256), 16, 300, 1e-3),
        // GPT-2 small: 124M parameters with its 50257-token vocabulary.
        "gpt2" => (model(vocab, 768, 12, 12, 1024), 8, 60, 3e-4),
        other => return Err(format!("--size tiny|small|gpt2, got {other}")),
    };
    let kinds = if flag("--compare") {
        LossKind::ALL.to_vec()
    } else {
        let asked = value("--loss").unwrap_or("linear");
        match LOSS_FLAGS.iter().find(|(flag, _)| *flag == asked) {
            Some(&(_, kind)) => vec![kind],
            None => return Err(format!("--loss stock|fused|linear, got {asked}")),
        }
    };
    if flag("--learner") && (flag("--compare") || flag("--max-batch") || flag("--devices")) {
        return Err(
            "--learner trains one way on one device: without --compare, --max-batch, --devices"
                .into(),
        );
    }
    let environment = value("--environment").map(PathBuf::from);
    let save_environment = value("--save-environment").map(PathBuf::from);
    if environment.is_some() && !cfg!(feature = "cuda") {
        return Err("--environment needs the cuda feature (Burn's persistence)".into());
    }
    if save_environment.is_some() && environment.is_none() {
        return Err("--save-environment OUT saves the --environment FILE given with it".into());
    }
    let bf16 = match value("--dtype").unwrap_or("f32") {
        "f32" => false,
        "bf16" if SUPPORTS_BF16 => true,
        "bf16" => return Err("--dtype bf16 needs the cuda feature".into()),
        other => return Err(format!("--dtype f32|bf16, got {other}")),
    };
    Ok(Args {
        model,
        run: RunConfig {
            batch: number("--batch")?.unwrap_or(batch),
            steps: number("--steps")?.unwrap_or(steps),
            lr,
            seed: 7,
            chunking: LinearChunking {
                logits_bytes: number("--chunk-mib")?
                    .map(|mib| {
                        mib.checked_mul(1 << 20)
                            .ok_or(format!("--chunk-mib {mib} is more bytes than fit"))
                    })
                    .transpose()?,
                ..LinearChunking::default()
            },
        },
        vocabulary,
        data: value("--data").map(PathBuf::from),
        kinds,
        max_batch: flag("--max-batch"),
        learner: flag("--learner"),
        fit_trial: number(FIT_TRIAL)?,
        bf16,
        devices: number("--devices")?.unwrap_or(1).max(1),
        out: PathBuf::from(value("--out").unwrap_or("target/train_lm")),
        sampling: Sampling {
            temperature: real("--temperature")?.unwrap_or(0.8),
            top_k: number("--top-k")?.unwrap_or(40),
            seed: 7,
        },
        environment,
        save_environment,
    })
}

fn model(vocab: usize, d_model: usize, layers: usize, heads: usize, seq_len: usize) -> GptConfig {
    GptConfig {
        vocab,
        d_model,
        layers,
        heads,
        seq_len,
    }
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("train_lm: {error}");
            std::process::exit(2);
        }
    };
    if let Some(file) = &args.environment {
        if let Err(error) = environment::mount(file) {
            eprintln!("train_lm: --environment {}: {error}", file.display());
            std::process::exit(1);
        }
        if let Some(out) = &args.save_environment {
            match environment::save(out) {
                Ok(summary) => println!("{summary}"),
                Err(error) => {
                    eprintln!("train_lm: --save-environment {}: {error}", out.display());
                    std::process::exit(1);
                }
            }
            return;
        }
    }
    if args.fit_trial.is_none() {
        println!("{}", autotune_note(cpu::device_is_cpu()));
    }
    // The first `--devices` devices (one by default; the first trains alone). Their default
    // float dtype is set before any tensor is made on them: Burn fixes it at the first.
    let replicas = devices(args.devices);
    if args.environment.is_some() {
        // After the devices: the file in use once they are made, which the mount kept.
        println!(
            "CubeCL's environment (autotune results, compiled kernels): {}",
            cubecl::environment::path().display()
        );
    }
    if args.bf16 {
        for (index, replica) in replicas.iter().enumerate() {
            if replicas[..index].contains(replica) {
                continue;
            }
            if let Err(error) = replica.clone().configure(FloatDType::BF16) {
                eprintln!("train_lm: --dtype bf16 on {replica:?}: {error:?}");
                std::process::exit(2);
            }
        }
    }
    let replicas: Vec<Device> = replicas.into_iter().map(Device::autodiff).collect();
    run(&args, &replicas);
}

/// CubeCL's environment in a file of the user's (`--environment`): Burn's persistence,
/// which only CUDA builds turn on.
mod environment {
    use std::path::Path;

    /// Makes `file` the environment every cache reads and writes from now on, compiled
    /// kernels included. CubeCL's configuration (`cubecl.toml` and its variables) is
    /// installed first, with its compilation cache on (off by default, so only autotune
    /// results would persist): installing it activates the configured environment, which
    /// would unmount `file` if it came later, at the first device.
    #[cfg(feature = "cuda")]
    pub fn mount(file: &Path) -> Result<(), String> {
        use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
        // SQLite would open it and keep nothing of the run.
        if std::fs::metadata(file).is_ok_and(|metadata| metadata.permissions().readonly()) {
            return Err("the file is read-only".into());
        }
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        config.compilation.cache = true;
        if !CubeClRuntimeConfig::try_set(config) {
            return Err("CubeCL's configuration was loaded before the mount".into());
        }
        cubecl::environment::load(file.to_path_buf());
        match cubecl::environment::path() {
            path if path == file => Ok(()),
            path => Err(format!("CubeCL's environment is {}", path.display())),
        }
    }

    /// Copies the mounted environment's autotune results and compiled kernels into `out`,
    /// one SQLite file that stands alone, and says what the environment holds. A run cut
    /// short then resumes without tuning again what it already had, nor compiling it again
    /// if the executable is the same (compiled kernels are keyed by its build).
    #[cfg(feature = "cuda")]
    pub fn save(out: &Path) -> Result<String, String> {
        let options = cubecl::bundle::ExportOptions {
            name: "train_lm".into(),
            // The autotune results, and the PTX the CUDA runtime compiled (with the index from
            // a kernel's source to its PTX).
            namespaces: vec!["autotune".into(), "cuda".into(), "cuda-second-line".into()],
            format: cubecl::bundle::BundleFormat::Sqlite,
            ..Default::default()
        };
        cubecl::bundle::export(&[cubecl::environment::path()], out, &options)
            .map_err(|error| error.to_string())?;
        let bytes = std::fs::metadata(out)
            .map_err(|error| error.to_string())?
            .len();
        let mut summary = format!(
            "saved {} ({bytes} bytes) from {}:",
            out.display(),
            cubecl::environment::path().display()
        );
        for namespace in cubecl::environment::namespaces() {
            summary += &format!(
                "\n  {}: {} entries, {} bytes",
                namespace.namespace, namespace.entries, namespace.bytes
            );
        }
        Ok(summary)
    }

    #[cfg(not(feature = "cuda"))]
    pub fn mount(_file: &Path) -> Result<(), String> {
        Err("needs the cuda feature".into())
    }

    #[cfg(not(feature = "cuda"))]
    pub fn save(_out: &Path) -> Result<String, String> {
        Err("needs the cuda feature".into())
    }
}

/// One way of computing the loss, trained and measured.
struct Outcome {
    kind: LossKind,
    logs: Vec<StepLog>,
    /// Growth of the device's memory pool over the run (pages reserved).
    pool_growth_mib: f64,
    largest_batch: Option<usize>,
    /// The pool after warm-up (at [`warm_step`]) and at the end of the run.
    pool_warm: PoolMib,
    pool_end: PoolMib,
}

/// The device's memory pool: pages reserved and bytes in use, in MiB.
#[derive(Clone, Copy, Default)]
struct PoolMib {
    reserved: f64,
    in_use: f64,
}

/// The step after which the memory pool should stay flat: 100, or half of a shorter run.
fn warm_step(steps: usize) -> usize {
    100.min(steps / 2)
}

/// Trains on the autodiff `replicas` (the first one alone unless `--devices` asks for more).
fn run(args: &Args, replicas: &[Device]) {
    let device = replicas[0].clone();
    let text = match &args.data {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) => {
                eprintln!("train_lm: --data {}: {error}", path.display());
                std::process::exit(2);
            }
        },
        None => SAMPLE_TEXT.to_string(),
    };
    let corpus = Corpus::new(&text, args.vocabulary);
    let (config, run) = (args.model, args.run);
    if let (Some(batch), Some(&kind)) = (args.fit_trial, args.kinds.first()) {
        fit_trial(&config, &run, kind, batch, &corpus, &device);
    }
    println!(
        "GPT-style model on {RUNTIME_NAME}{}: {} layers, d_model {}, {} heads, {:.1}M parameters; {} vocabulary ({} tokens); {} tokens of text; batch {} x {} tokens, {} steps",
        if args.bf16 { " (bf16)" } else { "" },
        config.layers,
        config.d_model,
        config.heads,
        config.parameters() as f64 / 1e6,
        args.vocabulary.name(),
        config.vocab,
        corpus.tokens.len(),
        run.batch,
        config.seq_len,
        run.steps,
    );
    #[cfg(feature = "cuda")]
    println!(
        "cuBLASLt for the fused linear cross-entropy's products: {}",
        match burn_fused_ce::linear::cublaslt_version() {
            Ok(version) => format!("version {version}"),
            Err(why) => format!("not used ({why})"),
        }
    );
    if args.learner {
        let directory = args.out.join("learner");
        let learner_run = LearnerRun {
            valid_steps: 4,
            checkpoints: true,
            summary: true,
        };
        let start = initial_model(&config, run.seed, &device);
        let result = train_with_learner(&config, &run, &learner_run, start, &corpus, &directory);
        print_sample(args, &text, &result.model.gpt, &corpus, &device);
        println!(
            "metrics, checkpoints and the summary in {}",
            directory.display()
        );
        return;
    }
    // The largest batches first, while this process holds no device memory: each try
    // is a process of its own, and this one's memory pool, once grown by training, is
    // not given back to the device.
    let largest_batches: Vec<Option<usize>> = args
        .kinds
        .iter()
        .map(|&kind| args.max_batch.then(|| largest_batch(&run, kind)))
        .collect();
    let sync = GradientSync::for_devices(replicas);
    if replicas.len() > 1 {
        println!(
            "{} replicas, gradients averaged {}",
            replicas.len(),
            match sync {
                GradientSync::AllReduce => "by Burn's all-reduce",
                GradientSync::OnFirstDevice => "on the first device",
            }
        );
    }
    let start = initial_model(&config, run.seed, &device);
    let pool = || {
        device
            .memory_pool_usage()
            .map(|usage| PoolMib {
                reserved: usage.bytes_reserved as f64 / 1048576.0,
                in_use: usage.bytes_in_use as f64 / 1048576.0,
            })
            .unwrap_or_default()
    };
    let reserved = || pool().reserved;
    let warm = warm_step(run.steps);
    let mut outcomes = Vec::new();
    let mut last_model = None;
    for (&kind, &largest_batch) in args.kinds.iter().zip(&largest_batches) {
        device.memory_cleanup();
        let before = reserved();
        let progress = ProgressBar::new(run.steps as u64);
        progress.set_style(
            ProgressStyle::with_template("{prefix:>16} [{bar:30}] {pos}/{len} {msg} (ETA {eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        progress.set_prefix(kind.name());
        let pool_warm = std::cell::Cell::new(PoolMib::default());
        let on_step = |step: usize, log: &StepLog| {
            if step == warm {
                pool_warm.set(pool());
            }
            let tokens_per_second = log.tokens as f64 / log.seconds;
            let message = format!(
                "loss {:.4}, {tokens_per_second:.0} tokens/s, {:.0} MiB",
                log.loss,
                reserved()
            );
            progress.set_message(message.clone());
            progress.inc(1);
            if step.is_multiple_of(10) || step + 1 == run.steps {
                progress.suspend(|| println!("[{}] step {step:4}: {message}", kind.name()));
            }
        };
        let (logs, model) = if replicas.len() > 1 {
            match train_data_parallel_with(
                sync,
                &config,
                &run,
                kind,
                start.clone(),
                &corpus,
                replicas,
                on_step,
            ) {
                Ok(trained) => trained,
                Err(error) => {
                    eprintln!("train_lm: {error}");
                    std::process::exit(2);
                }
            }
        } else {
            train(
                &config,
                &run,
                kind,
                start.clone(),
                &corpus,
                &device,
                on_step,
            )
        };
        progress.finish_and_clear();
        let pool_end = pool();
        outcomes.push(Outcome {
            kind,
            logs,
            pool_growth_mib: pool_end.reserved - before,
            largest_batch,
            pool_warm: pool_warm.get(),
            pool_end,
        });
        last_model = Some(model);
    }
    if let Some(model) = &last_model {
        print_sample(args, &text, model, &corpus, &device);
    }
    report(args, &outcomes);
}

/// What this run does about Burn's autotune, which tunes each matmul and reduction shape at
/// its first use when the build has it (`--features autotune`).
fn autotune_note(on_cpu: bool) -> &'static str {
    match (cfg!(feature = "autotune"), on_cpu) {
        (true, true) => {
            "The device is a CPU (wgpu finds no GPU: lavapipe, software Vulkan), and this build has Burn's autotune (`--features autotune`): the first step compiles and measures every candidate kernel of every shape (many minutes) and finds nothing worth it on a CPU. Builds without it (the default features) skip that."
        }
        (true, false) => {
            "Burn autotunes its matmuls and reductions at the first use of each shape (on a GPU, minutes for a large LM head); this workspace's CUDA builds keep the results on disk for later runs (Burn's `persistence` feature: in target/environment of the Cargo workspace run from, else in the user cache directory)."
        }
        (false, true) => {
            "The device is a CPU (wgpu finds no GPU: lavapipe, software Vulkan): Burn's default kernels, without its autotune (not in the default features), which on a CPU would compile every candidate kernel of every shape for minutes."
        }
        (false, false) => {
            "Burn's autotune is not in this build: Burn's default kernels. On a GPU, `--features autotune` tunes each matmul and reduction shape at its first use."
        }
    }
}

/// A continuation of the text's first words of prose, drawn as `--temperature` and
/// `--top-k` say (seeded: the same text on every run of the same model).
fn print_sample(args: &Args, text: &str, model: &Gpt, corpus: &Corpus, device: &Device) {
    let prompt = corpus.vocabulary.encode(&prose_prompt(text, 6));
    let prompt = if prompt.is_empty() {
        &corpus.tokens[..corpus.tokens.len().min(8)]
    } else {
        &prompt[..]
    };
    let sampling = &args.sampling;
    let how = if sampling.temperature > 0.0 {
        format!(
            "temperature {}, top-k {}, seed {}",
            sampling.temperature, sampling.top_k, sampling.seed
        )
    } else {
        "greedy".to_string()
    };
    let text = sample_with(model, &args.model, corpus, prompt, 40, sampling, device);
    println!("sample ({how}):\n{text}\n");
}

/// The value of `--loss` that names `kind`.
fn loss_flag(kind: LossKind) -> &'static str {
    LOSS_FLAGS
        .iter()
        .find(|(_, named)| *named == kind)
        .map(|(flag, _)| *flag)
        .expect("LOSS_FLAGS names every loss")
}

/// The largest batch that trains (two steps) without running out of device memory:
/// doubling from the run's batch, then bisecting. Each try is a child process (this
/// executable with [`FIT_TRIAL`]): running out of memory panics on the device's own thread
/// and leaves its memory pool unusable (on CUDA), so no try may follow another in one
/// process. A try that cannot be started counts as not fitting.
fn largest_batch(run: &RunConfig, kind: LossKind) -> usize {
    // The model, vocabulary, data and dtype flags, as given; the loss and the batch are
    // the try's own.
    let mut passed = Vec::new();
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        match arg.as_str() {
            "--compare" | "--max-batch" => {}
            "--loss" | "--batch" | "--steps" | "--out" | "--devices" | FIT_TRIAL => {
                given.next();
            }
            _ => passed.push(arg),
        }
    }
    let executable = std::env::current_exe();
    let fits = |batch: usize| {
        let tried = executable
            .as_ref()
            .map_err(|e| e.to_string())
            .and_then(|executable| {
                Command::new(executable)
                    .args(&passed)
                    .args(["--loss", loss_flag(kind), FIT_TRIAL, &batch.to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .output()
                    .map_err(|e| e.to_string())
            });
        let outcome = match &tried {
            Ok(output) if output.status.success() => Ok(()),
            Ok(output) => Err(String::from_utf8_lossy(&output.stderr)
                .lines()
                .filter(|line| !line.trim().is_empty())
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")),
            Err(error) => Err(error.clone()),
        };
        match &outcome {
            Ok(()) => println!("[{}] batch {batch}: fits", kind.name()),
            Err(why) => println!("[{}] batch {batch}: does not fit ({why})", kind.name()),
        }
        outcome.is_ok()
    };
    let (mut good, mut bad) = (0, run.batch.max(1));
    while fits(bad) {
        good = bad;
        bad *= 2;
        if bad > 1 << 16 {
            return good;
        }
    }
    while bad - good > (good / 16).max(1) {
        let mid = (good + bad) / 2;
        if fits(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    good
}

/// One try of [`largest_batch`], in a process of its own: trains `batch` sequences a
/// batch for two steps, then exits with status 0; any panic, on any thread (running out
/// of device memory panics on the device's), exits at once with status 3.
fn fit_trial(
    config: &GptConfig,
    run: &RunConfig,
    kind: LossKind,
    batch: usize,
    corpus: &Corpus,
    device: &Device,
) -> ! {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("{FIT_TRIAL}: {info}");
        std::process::exit(3)
    }));
    let trial = RunConfig {
        batch,
        steps: 2,
        ..*run
    };
    let start = initial_model(config, run.seed, device);
    train(config, &trial, kind, start, corpus, device, |_, _| {});
    std::process::exit(if device.sync().is_ok() { 0 } else { 3 })
}

/// Median step time after the first steps (autotune and warm-up).
fn median_seconds(logs: &[StepLog]) -> f64 {
    let skip = (logs.len() / 5)
        .clamp(1, 10)
        .min(logs.len().saturating_sub(1));
    let mut times: Vec<f64> = logs.iter().skip(skip).map(|l| l.seconds).collect();
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(0.0)
}

/// Whether a long run stays flat: the memory pool after warm-up and at the end, the steps
/// whose loss is not finite, and the mean loss of the first and the last 100 steps (of
/// each half of a shorter run).
fn stability_table(steps: usize, outcomes: &[Outcome]) -> String {
    let warm = warm_step(steps);
    let window = 100.min(steps / 2).max(1);
    let mut table = format!(
        "| loss | pool MiB at step {warm} | at the end | growth | in use MiB at step {warm} | at the end | non-finite losses | mean loss, first {window} steps | last {window} |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    let mean =
        |logs: &[StepLog]| logs.iter().map(|l| l.loss).sum::<f64>() / logs.len().max(1) as f64;
    for o in outcomes {
        let window = window.min(o.logs.len());
        table += &format!(
            "| {} | {:.0} | {:.0} | {:+.0} | {:.0} | {:.0} | {} | {:.4} | {:.4} |\n",
            o.kind.name(),
            o.pool_warm.reserved,
            o.pool_end.reserved,
            o.pool_end.reserved - o.pool_warm.reserved,
            o.pool_warm.in_use,
            o.pool_end.in_use,
            o.logs.iter().filter(|l| !l.loss.is_finite()).count(),
            mean(&o.logs[..window]),
            mean(&o.logs[o.logs.len() - window..]),
        );
    }
    table
}

/// Prints and writes the curves and the table.
fn report(args: &Args, outcomes: &[Outcome]) {
    let mut table = String::from(
        "| loss | first step s | step ms (median) | tokens/s | whole run s | pool growth MiB | largest batch | first loss | final loss |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for o in outcomes {
        let seconds = median_seconds(&o.logs);
        let tokens = o.logs.first().map_or(0, |l| l.tokens) as f64;
        table += &format!(
            "| {} | {:.1} | {:.1} | {:.0} | {:.0} | {:.0} | {} | {:.4} | {:.4} |\n",
            o.kind.name(),
            o.logs.first().map_or(f64::NAN, |l| l.seconds),
            seconds * 1e3,
            tokens / seconds.max(1e-12),
            o.logs.iter().map(|l| l.seconds).sum::<f64>(),
            o.pool_growth_mib,
            o.largest_batch.map_or("-".to_string(), |b| b.to_string()),
            o.logs.first().map_or(f64::NAN, |l| l.loss),
            o.logs.last().map_or(f64::NAN, |l| l.loss),
        );
    }
    let mut agreement = String::new();
    if let [first, rest @ ..] = outcomes {
        for other in rest {
            let worst = first
                .logs
                .iter()
                .zip(&other.logs)
                .map(|(a, b)| (a.loss - b.loss).abs() / a.loss.abs().max(1e-12))
                .fold(0.0f64, f64::max);
            agreement += &format!(
                "largest relative difference of the loss curves, {} against {}: {worst:.2e}\n",
                other.kind.name(),
                first.kind.name()
            );
        }
    }
    let stability = stability_table(args.run.steps, outcomes);
    println!("\n{table}\n{agreement}\n{stability}");
    let curves: Vec<Curve> = outcomes
        .iter()
        .map(|o| Curve {
            name: o.kind.name(),
            values: o.logs.iter().map(|l| l.loss).collect(),
        })
        .collect();
    let title = format!(
        "GPT-style LM, {} layers, d_model {}, {} vocabulary: training loss per step",
        args.model.layers,
        args.model.d_model,
        args.vocabulary.name()
    );
    let mut csv = String::from("step");
    for o in outcomes {
        csv += &format!(",{}", o.kind.name());
    }
    csv.push('\n');
    for step in 0..args.run.steps {
        csv += &step.to_string();
        for o in outcomes {
            csv += &format!(",{}", o.logs.get(step).map_or(f64::NAN, |l| l.loss));
        }
        csv.push('\n');
    }
    let written = std::fs::create_dir_all(&args.out)
        .and_then(|()| std::fs::write(args.out.join("loss.svg"), loss_curves_svg(&title, &curves)))
        .and_then(|()| std::fs::write(args.out.join("loss.csv"), csv))
        .and_then(|()| {
            std::fs::write(
                args.out.join("summary.md"),
                format!("{table}\n{agreement}\n{stability}"),
            )
        });
    match written {
        Ok(()) => println!(
            "curves and table: {}/{{loss.svg,loss.csv,summary.md}}",
            args.out.display()
        ),
        Err(error) => println!("could not write to {}: {error}", args.out.display()),
    }
}
