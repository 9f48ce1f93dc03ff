//! The vocabulary-parallel loss: the logits' classes cut into shards, one peer of Burn's
//! collective (burn-collective) per shard, here all on one device (logical shards, one
//! thread each), compared with the f64 reference of the whole vocabulary and with the
//! single-device loss: every reduction with non-uniform incoming gradients, every option,
//! class weights, ignored and all-ignored rows, uneven shards, 3-D logits. On CUDA with
//! two GPUs the same test also runs one shard per GPU.

use burn::{
    backend::{Autodiff, NdArray},
    collective::{self, AllReduceStrategy, CollectiveConfig, PeerId},
    tensor::{DType, Tensor, TensorData, TensorPrimitive, backend::Backend, ops::FloatTensor},
};
use burn_fused_ce::{
    CollectiveExchange, CrossEntropyError, CrossEntropyOptions, ExtraOutputs,
    FusedCrossEntropyBackend, Reduction, ShardExchange, VocabShard, try_fused_cross_entropy,
    try_vocab_parallel_cross_entropy,
};
use fused_ce_suite::DefaultBackend;
use rand::Rng;

use crate::common::*;
use crate::contract::{describe_grad_error, short_name};

#[derive(Debug, Clone)]
struct ShardCase {
    rows: usize,
    vocab: usize,
    shards: usize,
    dtype: DType,
    options: CrossEntropyOptions,
    class_weights: bool,
    ignore: Ignore,
    /// `[2, rows / 2, V_s]` logits.
    three_d: bool,
}

impl ShardCase {
    fn new(rows: usize, vocab: usize, shards: usize, reduction: Reduction) -> Self {
        Self {
            rows,
            vocab,
            shards,
            dtype: DType::F32,
            options: CrossEntropyOptions::new(reduction),
            class_weights: false,
            ignore: Ignore::SomeRows,
            three_d: false,
        }
    }
}

/// What one shard computed, in f64.
struct ShardResult {
    loss: Vec<f64>,
    z_loss: Option<Vec<f64>>,
    accuracy: Option<f64>,
    predicted: Option<Vec<i64>>,
    lse: Option<Vec<f64>>,
    /// `[N, V_s]`, row-major.
    grad: Vec<f64>,
}

/// The columns `range` of a row-major `[rows, vocab]` matrix.
fn columns(values: &[f32], vocab: usize, range: std::ops::Range<usize>) -> Vec<f32> {
    values
        .chunks(vocab)
        .flat_map(|row| row[range.clone()].to_vec())
        .collect()
}

/// One shard's loss and gradient on `device` (its thread is peer `shard.index()`).
#[allow(clippy::too_many_arguments)]
fn run_shard<B: Backend + FusedCrossEntropyBackend, E: ShardExchange>(
    case: &ShardCase,
    exchange: &E,
    shard: VocabShard,
    logits: Vec<f32>,
    targets: &[i64],
    weights: Option<&[f32]>,
    incoming: &[f32],
    device: &B::Device,
) -> ShardResult {
    type A<B> = Autodiff<B>;
    let width = shard.classes().len();
    let logits = Tensor::<A<B>, 2>::from_data(TensorData::new(logits, [case.rows, width]), device)
        .cast(case.dtype)
        .require_grad();
    let weights = weights
        .map(|w| Tensor::<A<B>, 1>::from_data(TensorData::new(w.to_vec(), [w.len()]), device));
    let targets = targets_tensor::<A<B>>(targets, device);
    let (output, loss_rows) = if case.three_d {
        let output = try_vocab_parallel_cross_entropy(
            logits.clone().reshape([2, case.rows / 2, width]),
            targets.reshape([2, case.rows / 2]),
            weights,
            &shard,
            &case.options,
            exchange,
        )
        .unwrap_or_else(|error| panic!("shard {}: {error}", shard.index()));
        let rows = output.loss.dims().iter().product::<usize>();
        (
            (
                output.loss.reshape([rows]),
                output.z_loss.map(|z| z.reshape([rows])),
                output.accuracy,
                output.predicted.map(|p| p.reshape([case.rows])),
                output.lse.map(|l| l.reshape([case.rows])),
            ),
            rows,
        )
    } else {
        let output = try_vocab_parallel_cross_entropy(
            logits.clone(),
            targets,
            weights,
            &shard,
            &case.options,
            exchange,
        )
        .unwrap_or_else(|error| panic!("shard {}: {error}", shard.index()));
        let rows = output.loss.dims()[0];
        (
            (
                output.loss,
                output.z_loss,
                output.accuracy,
                output.predicted,
                output.lse,
            ),
            rows,
        )
    };
    let (loss, z_loss, accuracy, predicted, lse) = output;
    let incoming =
        Tensor::<A<B>, 1>::from_data(TensorData::new(incoming.to_vec(), [loss_rows]), device);
    let grads = (loss.clone().cast(DType::F32) * incoming).sum().backward();
    let grad = logits
        .grad(&grads)
        .expect("the shard's logits get a gradient");
    ShardResult {
        loss: to_f64(loss.inner()),
        z_loss: z_loss.map(|z| to_f64(z.inner())),
        accuracy: accuracy.map(|a| to_f64(a.inner())[0]),
        predicted: predicted.map(|p| {
            p.inner()
                .into_data()
                .convert::<i64>()
                .to_vec::<i64>()
                .expect("ints")
        }),
        lse: lse.map(|l| to_f64(l.inner())),
        grad: to_f64(grad),
    }
}

/// The logical shards' exchange: each shard's statistics read to the host, summed there,
/// and the sum sent back to every shard (threads meet at barriers). burn-collective's
/// all-reduce between peers that share one device failed under Burn's fusion backend (a
/// stream lost a tensor), so shards on one device sum this way.
struct HostSum {
    sum: std::sync::Mutex<Vec<f32>>,
    barrier: std::sync::Barrier,
}

impl HostSum {
    fn new(shards: usize) -> Self {
        Self {
            sum: std::sync::Mutex::new(Vec::new()),
            barrier: std::sync::Barrier::new(shards),
        }
    }
}

impl ShardExchange for HostSum {
    fn sum<B: Backend>(&self, stats: FloatTensor<B>) -> Result<FloatTensor<B>, CrossEntropyError> {
        let stats = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(stats));
        let (shape, device) = (stats.dims(), stats.device());
        let values = stats
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .map_err(|error| CrossEntropyError::Exchange(format!("{error:?}")))?;
        {
            let mut sum = self.sum.lock().unwrap_or_else(|e| e.into_inner());
            if sum.is_empty() {
                *sum = values;
            } else {
                sum.iter_mut().zip(&values).for_each(|(s, v)| *s += v);
            }
        }
        self.barrier.wait();
        let total = self.sum.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // Every shard has read the sum before it is cleared for the next call.
        if self.barrier.wait().is_leader() {
            self.sum.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
        self.barrier.wait();
        let sum = Tensor::<B, 2>::from_data(TensorData::new(total, shape), &device);
        Ok(sum.into_primitive().tensor())
    }
}

/// Runs every shard of `case` on `devices[k % devices.len()]`, one thread each, summing
/// through burn-collective (one peer per shard) when `across_devices`, else on the host,
/// and checks each shard's outputs against the f64 reference and the single-device loss.
fn check_case<B: Backend + FusedCrossEntropyBackend>(
    case: &ShardCase,
    devices: &[B::Device],
    across_devices: bool,
) {
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let context = format!("{} {case:?} seed {seed}", short_name::<B>());
    let ignore_index = case.options.ignore_index;
    let values = random_logits(&mut rng, case.rows, case.vocab);
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
    let seen = to_f64(
        Tensor::<B, 2>::from_data(
            TensorData::new(values.clone(), [case.rows, case.vocab]),
            &devices[0],
        )
        .cast(case.dtype),
    );
    let reference = RefOptions::new(&case.options, weights.as_deref());
    let rows = reference_rows(&seen, case.vocab, &targets, &reference);
    let g: Vec<f64> = incoming.iter().map(|&v| v as f64).collect();
    let ref_grad = reference_grad(&seen, case.vocab, &targets, &reference, &g);
    let ref_loss = reference_loss(&rows, case.options.reduction);
    let (loss_tol, grad_tol) = tolerance(case.dtype);

    let host_sum = HostSum::new(case.shards);
    if across_devices {
        // A fresh collective for this case's peers (an earlier case may have had another
        // number of them).
        collective::reset_collective::<B>();
    }
    let config = CollectiveConfig::default()
        .with_num_devices(case.shards)
        .with_local_all_reduce_strategy(AllReduceStrategy::Tree(2));
    let results: Vec<ShardResult> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..case.shards)
            .map(|k| {
                let shard = VocabShard::new(k, case.shards, case.vocab).expect("a valid shard");
                let device = devices[k % devices.len()].clone();
                let logits = columns(&values, case.vocab, shard.classes());
                let (config, targets, weights, incoming, host_sum) = (
                    config.clone(),
                    &targets,
                    weights.as_deref(),
                    &incoming,
                    &host_sum,
                );
                scope.spawn(move || {
                    let run = |exchange: &dyn Fn() -> ShardResult| {
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(exchange))
                            .unwrap_or_else(|_| {
                                // The other shards would wait for this one forever.
                                eprintln!("shard {k} of {case:?} panicked (message above)");
                                std::process::exit(101)
                            })
                    };
                    if !across_devices {
                        return run(&|| {
                            run_shard::<B, _>(
                                case,
                                host_sum,
                                shard,
                                logits.clone(),
                                targets,
                                weights,
                                incoming,
                                &device,
                            )
                        });
                    }
                    let peer = PeerId::from(k);
                    collective::register::<B>(peer, device.clone(), config)
                        .expect("registers with the collective");
                    let exchange = CollectiveExchange { peer };
                    let result = run(&|| {
                        run_shard::<B, _>(
                            case,
                            &exchange,
                            shard,
                            logits.clone(),
                            targets,
                            weights,
                            incoming,
                            &device,
                        )
                    });
                    fused_ce_suite::lm::leave_collective::<B>(peer, &device)
                        .expect("leaves the collective");
                    result
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

    // The single-device loss of the whole vocabulary, for the loss value.
    let whole = try_fused_cross_entropy(
        Tensor::<B, 2>::from_data(
            TensorData::new(values.clone(), [case.rows, case.vocab]),
            &devices[0],
        )
        .cast(case.dtype),
        targets_tensor::<B>(&targets, &devices[0]),
        weights
            .as_ref()
            .map(|w| Tensor::<B, 1>::from_data(TensorData::new(w.clone(), [w.len()]), &devices[0])),
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
        for (row, (&actual, &expected)) in result.loss.iter().zip(&ref_loss).enumerate() {
            assert!(
                close(actual, expected, loss_tol) && close(actual, whole_loss[row], loss_tol),
                "{context}: shard {k} loss[{row}] = {actual}, reference {expected}, one device {}",
                whole_loss[row]
            );
        }
        let wanted = case.options.outputs;
        if wanted.z_loss {
            let expected = reference_z_loss(&rows, case.options.reduction);
            let actual = result.z_loss.as_ref().expect("z-loss asked for");
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
    everything.options.outputs = ExtraOutputs::all();
    everything.options.ignore_index = 7;
    everything.class_weights = true;
    cases.push(everything);
    let mut sum_outputs = ShardCase::new(22, 400, 4, Reduction::Sum);
    sum_outputs.options.z_loss_scale = 1e-2;
    sum_outputs.options.outputs = ExtraOutputs::all();
    sum_outputs.options.ignore_index = -1;
    cases.push(sum_outputs);
    let mut all_ignored = ShardCase::new(8, 200, 2, Reduction::Mean);
    all_ignored.ignore = Ignore::AllRows;
    all_ignored.options.outputs = ExtraOutputs::all();
    cases.push(all_ignored);
    let mut three_d = ShardCase::new(12, 256, 2, Reduction::Mean);
    three_d.three_d = true;
    three_d.options.label_smoothing = 0.1;
    three_d.options.outputs = ExtraOutputs::all();
    cases.push(three_d);
    let mut half = ShardCase::new(16, 300, 2, Reduction::Mean);
    half.dtype = DType::F16;
    half.options.softcap = Some(10.0);
    cases.push(half);
    cases
}

#[test]
fn logical_shards_match_the_whole_vocabulary() {
    let _backward = shared_device();
    let device = Default::default();
    for case in cases() {
        check_case::<DefaultBackend>(&case, std::slice::from_ref(&device), false);
    }
    // The plain cube backend and the portable path on the CPU, once each.
    let mut case = ShardCase::new(20, 301, 3, Reduction::Mean);
    case.options.label_smoothing = 0.1;
    case.options.outputs = ExtraOutputs::all();
    case.class_weights = true;
    check_case::<CubeBackend>(&case, std::slice::from_ref(&device), false);
    check_case::<NdArray>(&case, &[Default::default()], false);
}

/// Logical shards on one device summing through burn-collective, as on several devices:
/// its tree all-reduce hands every peer of one device the same tensor.
#[test]
fn logical_shards_through_burn_collective() {
    let _backward = shared_device();
    let _peers = collective_peers();
    let device: fused_ce_suite::Device = Default::default();
    let devices = [device.clone(), device];
    let mut case = ShardCase::new(24, 300, 2, Reduction::Mean);
    case.options.label_smoothing = 0.1;
    case.options.z_loss_scale = 1e-3;
    case.options.outputs = ExtraOutputs::all();
    check_case::<DefaultBackend>(&case, &devices, true);
    let mut case = ShardCase::new(17, 301, 3, Reduction::None);
    case.options.softcap = Some(8.0);
    case.options.z_loss_scale = 1e-3;
    check_case::<DefaultBackend>(&case, &devices, true);
}

/// One shard per device when the machine has several (CUDA); on one device it is the
/// test above.
#[test]
fn one_shard_per_device() {
    let count = fused_ce_suite::device_count();
    if count < 2 {
        return;
    }
    let devices = fused_ce_suite::devices(count);
    let _backward = shared_device();
    let _peers = collective_peers();
    let mut case = ShardCase::new(64, 4096, devices.len(), Reduction::Mean);
    case.options.label_smoothing = 0.1;
    case.options.z_loss_scale = 1e-4;
    case.options.outputs = ExtraOutputs::all();
    case.class_weights = true;
    check_case::<DefaultBackend>(&case, &devices, true);
    let mut case = ShardCase::new(64, 4096, devices.len(), Reduction::None);
    case.dtype = if SUPPORTS_BF16 {
        DType::BF16
    } else {
        DType::F16
    };
    case.options.softcap = Some(30.0);
    check_case::<DefaultBackend>(&case, &devices, true);
}
