//! The fused linear cross-entropy from several host threads at once on one device, each
//! thread on its own stream (cubecl's streams are per thread) with inputs of its own:
//! every iteration's loss and gradients equal, bit for bit, that thread's first ones, and
//! the device's pool reserves nothing more after a few steps of each thread.

use burn::tensor::{DType, Device};
use std::sync::{Barrier, Mutex};

use burn_fused_ce::{
    CrossEntropyOptions, LinearCrossEntropyInputs, LmHead, Reduction,
    try_fused_linear_cross_entropy,
};

use crate::common::*;
use crate::linear::{LinearCase, LinearValues};

const THREADS: usize = 4;
const ITERATIONS: usize = 20;
/// Steps each thread takes before the pool's size is noted.
const WARM_UP: usize = 5;

/// One step's loss and gradients, as bits.
type StepBits = Vec<Vec<u64>>;

fn bits(values: Vec<f64>) -> Vec<u64> {
    values.into_iter().map(f64::to_bits).collect()
}

/// One training step of the fused linear cross-entropy on `values` (chunks of 16, 16 and
/// 8 rows, bias, `Mean` with label smoothing), read back.
fn step(case: &LinearCase, values: &LinearValues, device: &Device) -> StepBits {
    let device = device.clone().autodiff();
    let (hidden, weight, bias) = values.tensors(case, case.dtype, &device);
    let (hidden, weight, bias) = (
        hidden.require_grad(),
        weight.require_grad(),
        bias.require_grad(),
    );
    let loss = try_fused_linear_cross_entropy(
        LinearCrossEntropyInputs::new(
            hidden.clone(),
            LmHead::new(weight.clone()).with_bias(Some(bias.clone())),
            targets_tensor(&values.targets, &device),
        ),
        &case.options,
        &case.chunking(),
    )
    .unwrap_or_else(|e| panic!("refused: {e}"))
    .loss;
    let grads = (loss.clone() * values.loss_scale).backward();
    vec![
        bits(to_f64(loss.inner())),
        bits(to_f64(hidden.grad(&grads).expect("hidden gradient"))),
        bits(to_f64(weight.grad(&grads).expect("weight gradient"))),
        bits(to_f64(bias.grad(&grads).expect("bias gradient"))),
    ]
}

#[test]
fn threads_get_their_first_result_every_time() {
    // Alone on the device: the pool's size counts every test's buffers.
    let _alone = exclusive_device();
    let device = TestBackend::Fusion.device();
    let seed = fresh_seed();
    let mut case = LinearCase::new(40, 16, 67, DType::F32, Reduction::Mean);
    case.chunk_rows = 16;
    case.options = CrossEntropyOptions::new(Reduction::Mean).with_label_smoothing(0.1);
    assert_eq!(
        case.chunking()
            .rows_per_chunk(case.rows, case.vocab, DType::F32),
        16,
        "three chunks: 16, 16 and 8 rows"
    );
    let inputs: Vec<LinearValues> = (0..THREADS)
        .map(|thread| LinearValues::draw(&case, &mut rng(seed.wrapping_add(thread as u64))))
        .collect();
    let reserved = || device.memory_pool_usage().map(|usage| usage.bytes_reserved);
    // Each thread steps ITERATIONS times; once every thread has taken WARM_UP steps, the
    // pool's size is noted.
    let warmed_up = Barrier::new(THREADS);
    let after_warm_up = Mutex::new(None);
    let firsts: Vec<StepBits> = std::thread::scope(|scope| {
        let workers: Vec<_> = inputs
            .iter()
            .enumerate()
            .map(|(thread, values)| {
                let (case, device, warmed_up, after_warm_up) =
                    (&case, &device, &warmed_up, &after_warm_up);
                scope.spawn(move || {
                    let first = step(case, values, device);
                    for iteration in 1..ITERATIONS {
                        if iteration == WARM_UP {
                            if warmed_up.wait().is_leader() {
                                *after_warm_up.lock().expect("not poisoned") = reserved();
                            }
                            warmed_up.wait();
                        }
                        assert!(
                            step(case, values, device) == first,
                            "seed={seed}: thread {thread}, iteration {iteration}: a result differs from the first"
                        );
                    }
                    first
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
    let (warm, end) = (*after_warm_up.lock().expect("not poisoned"), reserved());
    println!(
        "{THREADS} threads x {ITERATIONS} steps: every result equal to its thread's first; pool reserved after {WARM_UP} steps each {warm:?} bytes, at the end {end:?}"
    );
    assert_eq!(
        end, warm,
        "seed={seed}: the pool grew after {WARM_UP} steps of each thread"
    );
    // The threads' inputs differ, and so do their results.
    assert!(
        firsts[0] != firsts[1],
        "seed={seed}: two threads' inputs gave one result"
    );
}
