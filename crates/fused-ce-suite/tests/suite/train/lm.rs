//! The language-model example's training loop on real text with GPT-2's vocabulary: Burn's
//! stock loss, our fused loss and the fused linear cross-entropy give the same loss curve,
//! step by step, from the same seeded start; and data-parallel training (two replicas on
//! one device, and one replica per GPU where there are several, through Burn's
//! all-reduce) follows the one-device curve, and ends at its weights, with the fused loss
//! and with the fused linear cross-entropy.

use burn::{
    module::{Module, ModuleVisitor, Param},
    tensor::{Device, Int, Tensor, TensorData},
};
use burn_fused_ce::LinearChunking;
use fused_ce_suite::lm::{
    Corpus, Gpt, GptConfig, LossKind, RunConfig, SAMPLE_TEXT, Vocabulary, initial_model, sample,
    train, train_data_parallel,
};

use crate::common::*;

/// A tiny model on the first 20,000 bytes of the example text with GPT-2's vocabulary:
/// the corpus, the model's config and a run of `steps` steps of 4 sequences.
pub(crate) fn tiny_run(seed: u64, steps: usize) -> (Corpus, GptConfig, RunConfig) {
    let corpus = Corpus::new(&SAMPLE_TEXT[..20_000], Vocabulary::Gpt2);
    let config = GptConfig {
        vocab: Vocabulary::Gpt2.size(),
        d_model: 32,
        layers: 1,
        heads: 2,
        seq_len: 16,
    };
    let run = RunConfig {
        batch: 4,
        steps,
        lr: 3e-3,
        seed,
        chunking: LinearChunking::default(),
    };
    (corpus, config, run)
}

/// The cube device of this build, recording gradients (what the example trains on).
fn training_device() -> Device {
    device().autodiff()
}

/// Each step's loss of `run` on one (autodiff) device from `start`.
fn loss_curve(
    corpus: &Corpus,
    config: &GptConfig,
    run: &RunConfig,
    kind: LossKind,
    start: &Gpt,
    device: &Device,
) -> Vec<f64> {
    let (logs, _) = train(config, run, kind, start.clone(), corpus, device, |_, _| {});
    logs.iter().map(|l| l.loss).collect()
}

#[test]
fn the_three_losses_train_alike_step_by_step() {
    let _backward = shared_device();
    let seed = fresh_seed();
    let (corpus, config, run) = tiny_run(seed, 4);
    let device = training_device();
    let start = initial_model(&config, seed, &device);
    let curves: Vec<Vec<f64>> = LossKind::ALL
        .iter()
        .map(|&kind| loss_curve(&corpus, &config, &run, kind, &start, &device))
        .collect();
    // AdamW's first steps move a weight by about the learning rate whatever its
    // gradient's size, so rounding differences between the losses' gradients (the fused
    // linear cross-entropy sums its matmuls by chunks) reach the loss.
    for (kind, curve) in LossKind::ALL.iter().zip(&curves).skip(1) {
        assert_eq!(curve.len(), run.steps, "seed={seed}: one loss per step");
        for (step, (a, b)) in curves[0].iter().zip(curve).enumerate() {
            let diff = (a - b).abs() / a.abs();
            assert!(
                diff <= 1e-3,
                "seed={seed} step {step}: Burn's loss {a} vs {} {b}",
                kind.name()
            );
        }
    }
    assert!(
        curves[0][0] > 9.0,
        "seed={seed}: starts near ln(50257) = 10.8: {}",
        curves[0][0]
    );
}

/// Another thread's backward during training leaves the curve as it is. Burn's autodiff
/// frees unreferenced steps of every graph whenever any thread's backward ends: an op
/// that lets go of its inputs before registering its own node can lose the graph above
/// it, and the model then trains its head alone.
#[test]
fn another_threads_backward_leaves_the_curve() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _backward = shared_device();
    let seed = fresh_seed();
    let (corpus, config, run) = tiny_run(seed, 2);
    let device = training_device();
    let start = initial_model(&config, seed, &device);
    for kind in LossKind::ALL {
        let curve = || loss_curve(&corpus, &config, &run, kind, &start, &device);
        let alone = curve();
        // Twice: a run beside the other thread misses the window now and then.
        for attempt in 0..2 {
            let stop = AtomicBool::new(false);
            let beside = std::thread::scope(|scope| {
                scope.spawn(|| {
                    let device = training_device();
                    while !stop.load(Ordering::Relaxed) {
                        let x = Tensor::<1>::ones([4], &device).require_grad();
                        let _ = (x * 2.0).sum().backward();
                    }
                });
                let beside = curve();
                stop.store(true, Ordering::Relaxed);
                beside
            });
            assert_eq!(
                alone,
                beside,
                "seed={seed} {} (run {attempt}): alone vs beside another thread's backward",
                kind.name()
            );
        }
    }
}

#[test]
fn two_replicas_train_the_one_device_curve() {
    let _backward = shared_device();
    let _peers = collective_peers();
    let seed = fresh_seed();
    let (corpus, config, run) = tiny_run(seed, 3);
    let device = training_device();
    let start = initial_model(&config, seed, &device);
    let devices = [device.clone(), device.clone()];
    for kind in [LossKind::Fused, LossKind::FusedLinear] {
        // Same device, same batches: only the gradients' summation order differs, and
        // AdamW's first steps carry that to the loss as in the test above (the half
        // batches' matmuls may run other kernels; on CUDA with TF32 operands).
        check_replicas_follow_one_device(
            &Setup {
                corpus: &corpus,
                config: &config,
                run: &run,
                start: &start,
                seed,
            },
            kind,
            &devices,
            1e-3,
        );
    }
    let uneven = RunConfig { batch: 3, ..run };
    assert!(
        train_data_parallel(
            &config,
            &uneven,
            LossKind::Fused,
            start,
            &corpus,
            &devices,
            |_, _| {}
        )
        .is_err(),
        "a batch of 3 does not split over 2 devices"
    );
}

/// One replica per GPU where the machine has several (CUDA: Burn's all-reduce of the
/// gradients); on one device the test above covers the loop.
#[test]
fn one_replica_per_device_trains_the_one_device_curve() {
    let count = fused_ce_suite::device_count();
    if count < 2 {
        return;
    }
    let _backward = shared_device();
    let _peers = collective_peers();
    let seed = fresh_seed();
    let (corpus, config, run) = tiny_run(seed, 3);
    let run = RunConfig {
        batch: 2 * count,
        ..run
    };
    let devices: Vec<Device> = fused_ce_suite::devices(count)
        .into_iter()
        .map(Device::autodiff)
        .collect();
    let start = initial_model(&config, seed, &devices[0]);
    let setup = Setup {
        corpus: &corpus,
        config: &config,
        run: &run,
        start: &start,
        seed,
    };
    for kind in [LossKind::Fused, LossKind::FusedLinear] {
        // Within the bound of the test of the three losses: AdamW's first steps turn
        // rounding differences of the gradients (here summed over devices) into
        // differences of the weights of about the learning rate.
        check_replicas_follow_one_device(&setup, kind, &devices, 1e-3);
    }
}

/// What a data-parallel test trains: the corpus, the model, the run and its seeded start.
struct Setup<'a> {
    corpus: &'a Corpus,
    config: &'a GptConfig,
    run: &'a RunConfig,
    start: &'a Gpt,
    seed: u64,
}

/// Trains `setup` on the first device alone and data-parallel over `devices`, and checks
/// that every step's loss agrees to `tolerance` (relative) and counts the global batch.
fn check_replicas_follow_one_device(
    setup: &Setup<'_>,
    kind: LossKind,
    devices: &[Device],
    tolerance: f64,
) {
    let Setup {
        corpus,
        config,
        run,
        start,
        seed,
    } = setup;
    let (one, one_model) = train(
        config,
        run,
        kind,
        (*start).clone(),
        corpus,
        &devices[0],
        |_, _| {},
    );
    let (many, many_model) = train_data_parallel(
        config,
        run,
        kind,
        (*start).clone(),
        corpus,
        devices,
        |_, _| {},
    )
    .unwrap_or_else(|e| panic!("seed={seed} {}: {e}", kind.name()));
    assert_eq!(many.len(), run.steps, "seed={seed}: one log per step");
    for (step, (a, b)) in one.iter().zip(&many).enumerate() {
        let diff = (a.loss - b.loss).abs() / a.loss.abs();
        assert!(
            diff <= tolerance,
            "seed={seed} {} step {step}: one device {} vs {} replicas {}",
            kind.name(),
            a.loss,
            devices.len(),
            b.loss
        );
        assert_eq!(
            b.tokens,
            run.batch * config.seq_len,
            "seed={seed}: the global batch's tokens"
        );
    }
    // The weights: AdamW's first steps move nearly every weight by the learning rate
    // whatever its gradient's size, so the losses above barely tell the global batch's
    // gradient from one replica's; the weights do. Replicas that each step on their own
    // half of the batch end far from the one device's weights; replicas that average
    // right differ only where a gradient is near 0.
    let (start, one, many) = (
        parameters(start),
        parameters(&one_model),
        parameters(&many_model),
    );
    assert_eq!(one.len(), many.len(), "seed={seed}: the same parameters");
    let moved: Vec<f64> = one.iter().zip(&start).map(|(a, s)| a - s).collect();
    let apart: Vec<f64> = one.iter().zip(&many).map(|(a, b)| a - b).collect();
    let ratio = norm(&apart) / norm(&moved);
    assert!(
        ratio <= 0.05,
        "seed={seed} {}: the replicas' weights are {ratio:.3} of training's move away from the one device's",
        kind.name()
    );
}

/// Every float parameter of `model`, in the order the module visits them.
fn parameters(model: &Gpt) -> Vec<f64> {
    struct Collect(Vec<f64>);
    impl ModuleVisitor for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.extend(to_f64(param.val()));
        }
    }
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

fn norm(values: &[f64]) -> f64 {
    values.iter().map(|v| v * v).sum::<f64>().sqrt()
}

/// The example's greedy sampling feeds one padded window shape for every token (so that
/// autotune tunes it once): it continues a prompt as feeding each exact context does, also
/// once the context slides past the model's sequence length.
#[test]
fn sampling_through_a_padded_window_continues_as_exact_contexts_do() {
    let seed = fresh_seed();
    let (corpus, config, _) = tiny_run(seed, 1);
    let device = device();
    let model = initial_model(&config, seed, &device);
    // 12 + 8 tokens: past the 16-token sequence length.
    let (prompt, len) = (&corpus.tokens[..12], 8);
    let mut tokens = prompt.to_vec();
    for _ in 0..len {
        let context: Vec<i64> = tokens[tokens.len().saturating_sub(config.seq_len)..]
            .iter()
            .map(|&t| i64::from(t))
            .collect();
        let seq = context.len();
        let input = Tensor::<2, Int>::from_data(TensorData::new(context, [1, seq]), &device);
        let next = model
            .forward(input)
            .slice([seq - 1..seq, 0..config.vocab])
            .argmax(1)
            .into_scalar::<i64>();
        tokens.push(next as u32);
    }
    assert_eq!(
        sample(&model, &config, &corpus, prompt, len, &device),
        corpus.decode(&tokens),
        "seed={seed}"
    );
}
