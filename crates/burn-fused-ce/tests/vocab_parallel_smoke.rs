//! Smoke test of the vocabulary-parallel loss: the classes of one logits matrix cut into
//! two logical shards on one device, one thread each, summing through
//! [`InProcessExchange`], against the plain loss on the whole matrix under autodiff: the
//! loss (the same on both shards), every extra output and the shards' gradients put side
//! by side, with label smoothing, class weights and z-loss (with and without softcap, 2-D
//! and 3-D logits), every reduction with a non-uniform incoming gradient, on a cube
//! device (wgpu or Vulkan; lavapipe on machines without a GPU) and on Flex. Inputs are fresh seeded random numbers; the seed is printed on
//! failure.

use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_fused_ce::vocab_parallel::{
    InProcessExchange, VocabShard, try_vocab_parallel_cross_entropy,
};
use burn_fused_ce::{
    CrossEntropyOptions, EntropyOutput, ExtraOutputs, Reduction, TargetCheck,
    try_fused_cross_entropy,
};

#[path = "support/vocab_shards.rs"]
mod vocab_shards;

use vocab_shards::{Flat, columns};

/// xorshift64*: reproducible from its seed, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `[low, high)`.
    fn uniform(&mut self, low: f32, high: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        low + (high - low) * unit
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound as u64) as usize
    }
}

fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|time| time.as_nanos() as u64)
        .unwrap_or(0x5eed)
}

#[derive(Debug, Clone)]
struct Case {
    rows: usize,
    vocab: usize,
    options: CrossEntropyOptions,
    /// `[2, rows / 2, V]` logits.
    three_d: bool,
}

/// One run's outputs, read back.
#[derive(Debug)]
struct Outcome {
    loss: Vec<f32>,
    z_loss: Vec<f32>,
    accuracy: Vec<f32>,
    predicted: Vec<i64>,
    lse: Vec<f32>,
    /// `[rows, columns]`, row-major.
    grad: Vec<f32>,
}

struct Inputs {
    /// `[rows, vocab]`, row-major.
    logits: Vec<f32>,
    targets: Vec<i32>,
    weights: Vec<f32>,
    /// One per loss element.
    incoming: Vec<f32>,
}

const IGNORE: i64 = -100;

fn inputs(case: &Case, rng: &mut Rng) -> Inputs {
    let logits = (0..case.rows * case.vocab)
        .map(|_| rng.uniform(-4.0, 4.0))
        .collect();
    let targets = (0..case.rows)
        .map(|row| {
            // A few ignored rows, never all of them.
            if row % 5 == 3 {
                IGNORE as i32
            } else {
                rng.below(case.vocab) as i32
            }
        })
        .collect();
    let weights = (0..case.vocab).map(|_| rng.uniform(0.25, 2.0)).collect();
    let elements = if case.options.reduction == Reduction::None {
        case.rows
    } else {
        1
    };
    let incoming = (0..elements).map(|_| rng.uniform(0.3, 1.7)).collect();
    Inputs {
        logits,
        targets,
        weights,
        incoming,
    }
}

fn floats<const D: usize>(tensor: Tensor<D>) -> Vec<f32> {
    tensor
        .into_data()
        .try_into_vec_as::<f32>()
        .expect("float values")
}

fn ints<const D: usize>(tensor: Tensor<D, Int>) -> Vec<i64> {
    tensor
        .into_data()
        .try_into_vec_as::<i64>()
        .expect("int values")
}

/// Which loss a run computes.
#[derive(Clone, Copy)]
enum Loss<'a> {
    Plain,
    Shard(&'a VocabShard, &'a InProcessExchange),
}

fn call<const DL: usize, const DT: usize>(
    loss: Loss<'_>,
    logits: Tensor<DL>,
    targets: Tensor<DT, Int>,
    weights: Tensor<1>,
    options: &CrossEntropyOptions,
) -> Flat {
    let output = match loss {
        Loss::Plain => try_fused_cross_entropy(logits, targets, Some(weights), options)
            .unwrap_or_else(|error| panic!("plain loss: {error}")),
        Loss::Shard(shard, exchange) => try_vocab_parallel_cross_entropy(
            logits,
            targets,
            Some(weights),
            shard,
            options,
            exchange,
        )
        .unwrap_or_else(|error| panic!("shard {}: {error}", shard.index())),
    };
    Flat::of(output)
}

/// `loss` of `logits` (`[rows, width]` values), then backward with the case's incoming
/// gradient.
fn run_loss(
    case: &Case,
    inputs: &Inputs,
    logits: Vec<f32>,
    width: usize,
    device: &Device,
    loss: Loss<'_>,
) -> Outcome {
    let device = device.clone().autodiff();
    let rows = case.rows;
    let leaf =
        Tensor::<2>::from_data(TensorData::new(logits, [rows, width]), &device).require_grad();
    let targets =
        Tensor::<1, Int>::from_data(TensorData::new(inputs.targets.clone(), [rows]), &device);
    let weights = Tensor::<1>::from_data(
        TensorData::new(inputs.weights.clone(), [case.vocab]),
        &device,
    );
    let output = if case.three_d {
        let logits = leaf.clone().reshape([2, rows / 2, width]);
        call(
            loss,
            logits,
            targets.reshape([2, rows / 2]),
            weights,
            &case.options,
        )
    } else {
        call(loss, leaf.clone(), targets, weights, &case.options)
    };
    let elements = inputs.incoming.len();
    let incoming = Tensor::<1>::from_data(
        TensorData::new(inputs.incoming.clone(), [elements]),
        &device,
    );
    let grads = (output.loss.clone() * incoming).sum().backward();
    let grad = leaf.grad(&grads).expect("the logits get a gradient");
    let values = |tensor: Option<Tensor<1>>| tensor.map(floats).unwrap_or_default();
    Outcome {
        loss: floats(output.loss),
        z_loss: values(output.z_loss),
        accuracy: values(output.accuracy),
        predicted: output.predicted.map(ints).unwrap_or_default(),
        lse: values(output.lse),
        grad: floats(grad),
    }
}

/// Every shard on its own thread; each shard's outcome.
fn sharded(case: &Case, inputs: &Inputs, device: &Device, shards: usize) -> Vec<Outcome> {
    let exchange = InProcessExchange::new(shards);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..shards)
            .map(|index| {
                let exchange = &exchange;
                scope.spawn(move || {
                    let shard = VocabShard::new(index, shards, case.vocab).expect("a shard");
                    let width = shard.classes().len();
                    let logits = columns(&inputs.logits, case.vocab, shard.classes());
                    let loss = Loss::Shard(&shard, exchange);
                    run_loss(case, inputs, logits, width, device, loss)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("a shard's thread"))
            .collect()
    })
}

fn assert_close(what: &str, got: &[f32], expected: &[f32], context: &str) {
    assert_eq!(
        got.len(),
        expected.len(),
        "{what}: lengths differ; {context}"
    );
    for (at, (&got, &expected)) in got.iter().zip(expected).enumerate() {
        let tolerance = 2e-5 + 2e-4 * expected.abs();
        let both_nan = got.is_nan() && expected.is_nan();
        assert!(
            both_nan || (got - expected).abs() <= tolerance,
            "{what}[{at}]: {got} against {expected} (plain loss); {context}"
        );
    }
}

fn check_case(case: &Case, device: &Device, seed: u64) {
    let mut rng = Rng::new(seed);
    let inputs = inputs(case, &mut rng);
    let context = format!("seed {seed}, case {case:?}");
    // Shown when the test fails, whatever panics.
    eprintln!("running {context}");
    let plain = run_loss(
        case,
        &inputs,
        inputs.logits.clone(),
        case.vocab,
        device,
        Loss::Plain,
    );
    let shards = sharded(case, &inputs, device, 2);
    for (index, outcome) in shards.iter().enumerate() {
        let context = format!("shard {index}; {context}");
        assert_close("loss", &outcome.loss, &plain.loss, &context);
        assert_close("z_loss", &outcome.z_loss, &plain.z_loss, &context);
        assert_close("accuracy", &outcome.accuracy, &plain.accuracy, &context);
        assert_close("lse", &outcome.lse, &plain.lse, &context);
        assert_eq!(outcome.predicted, plain.predicted, "predicted; {context}");
    }
    assert_eq!(
        shards[0].loss, shards[1].loss,
        "the shards' losses differ; {context}"
    );
    // The shards' gradients side by side are the whole matrix's.
    let mut grad = Vec::with_capacity(case.rows * case.vocab);
    let widths: Vec<usize> = shards.iter().map(|s| s.grad.len() / case.rows).collect();
    for row in 0..case.rows {
        for (outcome, &width) in shards.iter().zip(&widths) {
            grad.extend_from_slice(&outcome.grad[row * width..(row + 1) * width]);
        }
    }
    assert_close("grad", &grad, &plain.grad, &context);
}

fn cases(target_check: TargetCheck) -> Vec<Case> {
    let mut cases = Vec::new();
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        for softcap in [None, Some(6.0)] {
            for three_d in [false, true] {
                cases.push(Case {
                    rows: 10,
                    // Uneven shards: 19 and 18 classes.
                    vocab: 37,
                    options: CrossEntropyOptions::new(reduction)
                        .with_label_smoothing(0.1)
                        .with_z_loss_scale(1e-2)
                        .with_softcap(softcap)
                        // All but the entropy, which this loss refuses.
                        .with_outputs(ExtraOutputs {
                            entropy: EntropyOutput::Off,
                            ..ExtraOutputs::all()
                        })
                        .with_target_check(target_check),
                    three_d,
                });
            }
        }
    }
    cases
}

fn check_device(device: Device, target_check: TargetCheck) {
    burn_fused_ce::test_hooks::set_poison_outputs(true);
    let seed = fresh_seed();
    for (at, case) in cases(target_check).iter().enumerate() {
        check_case(case, &device, seed.wrapping_add(at as u64));
    }
}

/// The cube device of the build: wgpu's own shader path with the `wgpu` feature, SPIR-V
/// with `vulkan` alone.
#[cfg(feature = "wgpu")]
fn cube_device() -> Device {
    Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)
}

#[cfg(all(feature = "vulkan", not(feature = "wgpu")))]
fn cube_device() -> Device {
    Device::vulkan(burn::tensor::DeviceKind::DefaultDevice)
}

#[cfg(any(feature = "wgpu", feature = "vulkan"))]
#[test]
fn two_shards_match_the_plain_loss_on_a_cube_device() {
    check_device(cube_device(), TargetCheck::Deferred);
}

#[test]
fn two_shards_match_the_plain_loss_on_flex() {
    check_device(Device::flex(), TargetCheck::Deferred);
}
