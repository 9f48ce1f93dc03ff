//! The vocabulary-parallel loss: the logits' classes cut into shards, one thread per
//! shard, the shards summing their statistics through an exchange: [`InProcessExchange`]
//! for logical shards on one device (and for one shard per device in one process), Burn's
//! all-reduce ([`DistributedExchange`]) for one shard per GPU on CUDA with several GPUs.
//! Each shard is compared with the f64 reference of the whole vocabulary and with the
//! single-device loss: every reduction with non-uniform incoming gradients, every option,
//! class weights, ignored and all-ignored rows, uneven shards, 3-D logits, f16, outputs
//! poisoned before the kernels run.

mod non_finite;

use burn::tensor::{
    DType, Device, Int, Tensor, TensorData,
    distributed::{DistributedConfig, DistributedContext, ReduceOperation},
};
use burn_fused_ce::vocab_parallel::{
    DistributedExchange, InProcessExchange, ShardExchange, VocabShard,
    try_vocab_parallel_cross_entropy,
};
use burn_fused_ce::{
    CrossEntropyError, CrossEntropyOptions, EntropyOutput, ExtraOutputs, Reduction,
    try_fused_cross_entropy,
};
use rand::Rng;

use crate::common::*;
use crate::loss::contract::{describe_grad_error, poisoned};
use crate::vocab_shards::{Flat, columns};

#[derive(Debug, Clone)]
pub(crate) struct ShardCase {
    pub(crate) rows: usize,
    pub(crate) vocab: usize,
    pub(crate) shards: usize,
    pub(crate) dtype: DType,
    pub(crate) options: CrossEntropyOptions,
    pub(crate) class_weights: bool,
    pub(crate) ignore: Ignore,
    /// `[2, rows / 2, V_s]` logits.
    pub(crate) three_d: bool,
    /// Added to every logit: rows far from 0 (f32's log-sum-exps then round by 5e-4 at
    /// 1e4, which the shards must exchange).
    pub(crate) shift: f32,
}

impl ShardCase {
    pub(crate) fn new(rows: usize, vocab: usize, shards: usize, reduction: Reduction) -> Self {
        Self {
            rows,
            vocab,
            shards,
            dtype: DType::F32,
            options: CrossEntropyOptions::new(reduction),
            class_weights: false,
            ignore: Ignore::SomeRows,
            three_d: false,
            shift: 0.0,
        }
    }
}

/// How the shards of a case sum their statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exchange {
    /// [`InProcessExchange`]: the shards' threads meet in this process.
    InProcess,
    /// [`DistributedExchange`]: Burn's all-reduce over the shards' devices (distinct GPUs).
    Distributed,
}

/// What one shard computed, in f64.
pub(crate) struct ShardResult {
    pub(crate) loss: Vec<f64>,
    pub(crate) z_loss: Option<Vec<f64>>,
    pub(crate) accuracy: Option<f64>,
    pub(crate) predicted: Option<Vec<i64>>,
    pub(crate) lse: Option<Vec<f64>>,
    /// `[N, V_s]`, row-major.
    pub(crate) grad: Vec<f64>,
}

fn shard_call<E: ShardExchange + ?Sized, const DL: usize, const DT: usize>(
    logits: Tensor<DL>,
    targets: Tensor<DT, Int>,
    weights: Option<Tensor<1>>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
    exchange: &E,
) -> Flat {
    let output =
        try_vocab_parallel_cross_entropy(logits, targets, weights, shard, options, exchange)
            .unwrap_or_else(|error| panic!("shard {}: {error}", shard.index()));
    Flat::of(output)
}

/// A case's inputs over the whole vocabulary: `[N, V]` logits, targets, class weights and
/// the incoming gradient (one per row for `None`, one value otherwise).
pub(crate) struct ShardInputs<'a> {
    pub(crate) values: &'a [f32],
    pub(crate) targets: &'a [i64],
    pub(crate) weights: Option<&'a [f32]>,
    pub(crate) incoming: &'a [f32],
}

/// Runs every shard of `case`, each on a thread of its own, shard `k` on
/// `devices[k % devices.len()]`, summing through `exchange`; their results in shard
/// order. A shard that panics ends the process: the others would wait for it forever.
pub(crate) fn run_shards(
    case: &ShardCase,
    inputs: &ShardInputs,
    devices: &[Device],
    exchange: &(dyn ShardExchange + Sync),
) -> Vec<ShardResult> {
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..case.shards)
            .map(|k| {
                let shard = VocabShard::new(k, case.shards, case.vocab).expect("a valid shard");
                let device = devices[k % devices.len()].clone();
                let logits = columns(inputs.values, case.vocab, shard.classes());
                scope.spawn(move || {
                    let run = || {
                        run_shard(
                            case,
                            exchange,
                            shard,
                            logits,
                            inputs.targets,
                            inputs.weights,
                            inputs.incoming,
                            &device,
                        )
                    };
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(
                        |_| {
                            eprintln!("shard {k} of {case:?} panicked (message above)");
                            std::process::exit(101)
                        },
                    )
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
    })
}

/// One shard's loss and gradient on `device` (under autodiff), its thread one of the
/// case's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_shard<E: ShardExchange + ?Sized>(
    case: &ShardCase,
    exchange: &E,
    shard: VocabShard,
    logits: Vec<f32>,
    targets: &[i64],
    weights: Option<&[f32]>,
    incoming: &[f32],
    device: &Device,
) -> ShardResult {
    let device = device.clone().autodiff();
    let width = shard.classes().len();
    let leaf = Tensor::<2>::from_data(TensorData::new(logits, [case.rows, width]), &device)
        .cast(case.dtype)
        .require_grad();
    let weights =
        weights.map(|w| Tensor::<1>::from_data(TensorData::new(w.to_vec(), [w.len()]), &device));
    let targets = targets_tensor(targets, &device);
    let output = if case.three_d {
        shard_call(
            leaf.clone().reshape([2, case.rows / 2, width]),
            targets.reshape([2, case.rows / 2]),
            weights,
            &shard,
            &case.options,
            exchange,
        )
    } else {
        shard_call(
            leaf.clone(),
            targets,
            weights,
            &shard,
            &case.options,
            exchange,
        )
    };
    let loss_rows = output.loss.dims()[0];
    assert_eq!(
        loss_rows,
        incoming.len(),
        "one incoming gradient per loss element"
    );
    let incoming = Tensor::<1>::from_data(TensorData::new(incoming.to_vec(), [loss_rows]), &device);
    let grads = (output.loss.clone().cast(DType::F32) * incoming)
        .sum()
        .backward();
    let grad = leaf
        .grad(&grads)
        .expect("the shard's logits get a gradient");
    ShardResult {
        loss: to_f64(output.loss),
        z_loss: output.z_loss.map(to_f64),
        accuracy: output.accuracy.map(|a| to_f64(a)[0]),
        predicted: output.predicted.map(int_to_i64),
        lse: output.lse.map(to_f64),
        grad: to_f64(grad),
    }
}

/// Runs every shard of `case` on `devices[k % devices.len()]`, one thread each, summing
/// through `exchange`, and checks each shard's outputs against the f64 reference and the
/// single-device loss on `devices[0]`.
fn check_case(case: &ShardCase, backend: &str, devices: &[Device], exchange: Exchange) {
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let context = format!("{backend} {exchange:?} {case:?} seed {seed}");
    // Shown when a shard's thread fails, whatever panics.
    eprintln!("running {context}");
    let ignore_index = case.options.ignore_index;
    let mut values = random_logits(&mut rng, case.rows, case.vocab);
    values.iter_mut().for_each(|value| *value += case.shift);
    let targets = random_targets(&mut rng, case.rows, case.vocab, case.ignore, ignore_index);
    let weights = case
        .class_weights
        .then(|| random_class_weights(&mut rng, case.vocab));
    let per_row = case.options.reduction == Reduction::None;
    let incoming: Vec<f32> = if per_row {
        (0..case.rows).map(|_| rng.random_range(0.2..2.0)).collect()
    } else {
        vec![rng.random_range(0.2..2.0)]
    };
    // The values the kernels see (rounded to the case's dtype).
    let (_, seen) = logits_tensor(
        values.clone(),
        case.rows,
        case.vocab,
        case.dtype,
        &devices[0],
    );
    let reference = RefOptions::new(&case.options, weights.as_deref());
    let rows = reference_rows(&seen, case.vocab, &targets, &reference);
    let g: Vec<f64> = incoming.iter().map(|&v| v as f64).collect();
    let ref_grad = reference_grad(&seen, case.vocab, &targets, &reference, &g);
    let ref_loss = reference_loss(&rows, case.options.reduction);
    let (loss_tol, grad_tol) = tolerance(case.dtype);

    let in_process = InProcessExchange::new(case.shards);
    // Burn's communication between the devices, kept while the shards run.
    let (distributed, _communication) = match exchange {
        Exchange::InProcess => (None, None),
        Exchange::Distributed => {
            let devices: Vec<Device> = devices.to_vec();
            let communication = DistributedContext::init(
                devices.clone(),
                DistributedConfig {
                    all_reduce_op: ReduceOperation::Sum,
                },
            );
            (Some(DistributedExchange::new(devices)), Some(communication))
        }
    };
    let exchange: &(dyn ShardExchange + Sync) = match &distributed {
        Some(distributed) => distributed,
        None => &in_process,
    };
    let inputs = ShardInputs {
        values: &values,
        targets: &targets,
        weights: weights.as_deref(),
        incoming: &incoming,
    };
    let results = run_shards(case, &inputs, devices, exchange);

    // The single-device loss of the whole vocabulary, for the loss value.
    let (whole_logits, _) = logits_tensor(
        values.clone(),
        case.rows,
        case.vocab,
        case.dtype,
        &devices[0],
    );
    let whole = try_fused_cross_entropy(
        whole_logits,
        targets_tensor(&targets, &devices[0]),
        weights
            .as_ref()
            .map(|w| Tensor::<1>::from_data(TensorData::new(w.clone(), [w.len()]), &devices[0])),
        &case.options,
    )
    .unwrap_or_else(|error| panic!("{context}: single device: {error}"));
    let whole_loss = to_f64(whole.loss);

    let close = |actual: f64, expected: f64, tol: f64| {
        (actual - expected).abs() <= tol * (1.0 + expected.abs())
            || actual.to_bits() == expected.to_bits()
    };
    for (k, result) in results.iter().enumerate() {
        let shard = VocabShard::new(k, case.shards, case.vocab).expect("a valid shard");
        assert_eq!(
            result.loss.len(),
            ref_loss.len(),
            "{context}: shard {k} loss elements"
        );
        for (row, (&actual, &expected)) in result.loss.iter().zip(&ref_loss).enumerate() {
            assert!(
                // Both within `loss_tol` of the reference: within twice that of each other.
                close(actual, expected, loss_tol) && close(actual, whole_loss[row], 2.0 * loss_tol),
                "{context}: shard {k} loss[{row}] = {actual}, reference {expected}, one device {}",
                whole_loss[row]
            );
        }
        let wanted = case.options.outputs;
        if wanted.z_loss {
            let expected = reference_z_loss(&rows, case.options.reduction);
            let actual = result.z_loss.as_ref().expect("z-loss asked for");
            assert_eq!(
                actual.len(),
                expected.len(),
                "{context}: shard {k} z-loss elements"
            );
            for (a, e) in actual.iter().zip(&expected) {
                assert!(
                    close(*a, *e, loss_tol),
                    "{context}: shard {k} z-loss {a} vs {e}"
                );
            }
        }
        if wanted.accuracy {
            let expected = reference_accuracy(&rows, &targets);
            let actual = result.accuracy.expect("accuracy asked for");
            assert!(
                (actual - expected).abs() < 1e-6,
                "{context}: shard {k} accuracy {actual} vs {expected}"
            );
        }
        if wanted.predicted {
            assert_eq!(
                result.predicted.as_ref().expect("predictions asked for"),
                &reference_predicted(&rows),
                "{context}: shard {k} predictions"
            );
        }
        if wanted.lse {
            let expected = reference_lse(&rows);
            let actual = result.lse.as_ref().expect("lse asked for");
            assert_eq!(
                actual.len(),
                expected.len(),
                "{context}: shard {k} lse elements"
            );
            for (a, e) in actual.iter().zip(&expected) {
                assert!(
                    close(*a, *e, loss_tol),
                    "{context}: shard {k} lse {a} vs {e}"
                );
            }
        }
        let range = shard.classes();
        let expected: Vec<f64> = ref_grad
            .chunks(case.vocab)
            .flat_map(|row| row[range.clone()].to_vec())
            .collect();
        let error = relative_l2(&result.grad, &expected);
        assert!(
            error <= grad_tol,
            "{context}: shard {k} gradient relative L2 {error:.3e} > {grad_tol:.0e}; {}",
            describe_grad_error(&result.grad, &expected)
        );
    }
}

/// The cases: every reduction, every option, class weights, uneven shards, ignored rows
/// inside and outside the vocabulary, all rows ignored, 3-D logits, f16.
fn cases() -> Vec<ShardCase> {
    let mut cases = vec![
        ShardCase::new(24, 300, 2, Reduction::Mean),
        ShardCase::new(17, 301, 3, Reduction::Sum),
        ShardCase::new(16, 257, 2, Reduction::None),
    ];
    let mut smoothing = ShardCase::new(20, 301, 3, Reduction::Mean);
    smoothing.options.label_smoothing = 0.1;
    smoothing.class_weights = true;
    cases.push(smoothing);
    let mut everything = ShardCase::new(18, 258, 2, Reduction::None);
    everything.options.label_smoothing = 0.2;
    everything.options.z_loss_scale = 1e-3;
    everything.options.softcap = Some(5.0);
    everything.options.outputs = shard_outputs();
    everything.options.ignore_index = 7;
    everything.class_weights = true;
    cases.push(everything);
    let mut sum_outputs = ShardCase::new(22, 400, 4, Reduction::Sum);
    sum_outputs.options.z_loss_scale = 1e-2;
    sum_outputs.options.outputs = shard_outputs();
    sum_outputs.options.ignore_index = -1;
    cases.push(sum_outputs);
    let mut all_ignored = ShardCase::new(8, 200, 2, Reduction::Mean);
    all_ignored.ignore = Ignore::AllRows;
    all_ignored.options.outputs = shard_outputs();
    cases.push(all_ignored);
    let mut three_d = ShardCase::new(12, 256, 2, Reduction::Mean);
    three_d.three_d = true;
    three_d.options.label_smoothing = 0.1;
    three_d.options.outputs = shard_outputs();
    cases.push(three_d);
    let mut half = ShardCase::new(16, 300, 2, Reduction::Mean);
    half.dtype = DType::F16;
    half.options.softcap = Some(10.0);
    cases.push(half);
    let mut far = ShardCase::new(20, 301, 3, Reduction::None);
    far.shift = 1e4;
    far.options.label_smoothing = 0.1;
    far.class_weights = true;
    cases.push(far);
    let mut far_below = ShardCase::new(16, 300, 2, Reduction::Mean);
    far_below.shift = -1e4;
    cases.push(far_below);
    cases
}

#[test]
fn logical_shards_match_the_whole_vocabulary() {
    poisoned();
    let _backward = shared_device();
    let device = TestBackend::Fusion.device();
    for case in cases() {
        check_case(
            &case,
            TestBackend::Fusion.name(),
            std::slice::from_ref(&device),
            Exchange::InProcess,
        );
    }
    // The portable path on the CPU, once, with rows far from 0.
    let mut case = ShardCase::new(20, 301, 3, Reduction::Mean);
    case.options.label_smoothing = 0.1;
    case.options.outputs = shard_outputs();
    case.class_weights = true;
    case.shift = 1e4;
    let flex = TestBackend::Flex.device();
    check_case(
        &case,
        TestBackend::Flex.name(),
        std::slice::from_ref(&flex),
        Exchange::InProcess,
    );
}

/// The shards' devices as the runtime lists them (on wgpu: replicas of the one device;
/// on CUDA: one GPU each, replicas where it has fewer), summing in this process: each shard moves the others'
/// statistics to its own device.
#[test]
fn shards_on_the_runtimes_devices_through_the_in_process_exchange() {
    poisoned();
    let _backward = shared_device();
    let count = fused_ce_suite::device_count().max(2);
    let devices = fused_ce_suite::devices(count);
    let name = TestBackend::Fusion.name();
    let mut case = ShardCase::new(24, 300, count, Reduction::Mean);
    case.options.label_smoothing = 0.1;
    case.options.z_loss_scale = 1e-3;
    case.options.outputs = shard_outputs();
    check_case(&case, name, &devices, Exchange::InProcess);
    let mut case = ShardCase::new(17, 301, count + 1, Reduction::None);
    case.options.softcap = Some(8.0);
    case.options.z_loss_scale = 1e-3;
    check_case(&case, name, &devices, Exchange::InProcess);
}

/// One shard per GPU through Burn's all-reduce when the machine has several (CUDA); on
/// one device the tests above cover the loss.
#[test]
fn one_shard_per_device_through_burn_all_reduce() {
    poisoned();
    let count = fused_ce_suite::device_count();
    if count < 2 {
        return;
    }
    let devices = fused_ce_suite::devices(count);
    let _backward = shared_device();
    let _peers = collective_peers();
    let name = TestBackend::Fusion.name();
    let mut case = ShardCase::new(64, 4096, devices.len(), Reduction::Mean);
    case.options.label_smoothing = 0.1;
    case.options.z_loss_scale = 1e-4;
    case.options.outputs = shard_outputs();
    case.class_weights = true;
    check_case(&case, name, &devices, Exchange::Distributed);
    let mut case = ShardCase::new(64, 4096, devices.len(), Reduction::None);
    case.dtype = if SUPPORTS_BF16 {
        DType::BF16
    } else {
        DType::F16
    };
    case.options.softcap = Some(30.0);
    check_case(&case, name, &devices, Exchange::Distributed);
}

/// Every extra output the vocabulary-parallel loss has (all but the entropy).
fn shard_outputs() -> ExtraOutputs {
    ExtraOutputs {
        entropy: EntropyOutput::Off,
        ..ExtraOutputs::all()
    }
}

/// The options the vocabulary-parallel loss has no exchange for are refused before any
/// kernel runs: a temperature, given mean denominators and the entropy output.
#[test]
fn vocab_parallel_refuses_temperature_given_denominators_and_entropy() {
    let device = TestBackend::Flex.device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let (rows, vocab) = (4, 10);
    let shard = VocabShard::new(0, 1, vocab).expect("one shard");
    let exchange = InProcessExchange::new(1);
    let refused = |options: CrossEntropyOptions, name: &str, rng: &mut rand::rngs::SmallRng| {
        let logits = Tensor::<2>::from_data(
            TensorData::new(random_logits(rng, rows, vocab), [rows, vocab]),
            &device,
        );
        let result = try_vocab_parallel_cross_entropy(
            logits,
            targets_tensor(&[1, 2, 3, 4], &device),
            None,
            &shard,
            &options,
            &exchange,
        );
        matches!(result, Err(CrossEntropyError::InvalidOption { name: n, .. }) if n == name)
    };
    let temperature = CrossEntropyOptions::default().with_temperature(Some(0.7));
    assert!(
        refused(temperature, "temperature", &mut rng),
        "seed {seed}: temperature"
    );
    let given = CrossEntropyOptions::default()
        .with_mean_denominators(Some(burn_fused_ce::MeanDenominators::rows(4)));
    assert!(
        refused(given, "mean_denominators", &mut rng),
        "seed {seed}: denominators"
    );
    for entropy in [EntropyOutput::Metric, EntropyOutput::Differentiable] {
        let options = CrossEntropyOptions::default().with_outputs(ExtraOutputs {
            entropy,
            ..ExtraOutputs::default()
        });
        assert!(
            refused(options, "outputs.entropy", &mut rng),
            "seed {seed}: {entropy:?} entropy"
        );
    }
}
