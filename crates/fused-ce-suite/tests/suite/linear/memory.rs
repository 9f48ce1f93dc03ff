//! The fused linear cross-entropy's memory, read where it peaks: at each product
//! (`test_hooks::set_probe_memory`), the bytes in use hold at least one chunk's logits and
//! the weight gradient's sum beside the inputs, and grow with the chunk budget by about
//! the logits it adds.

use burn::tensor::{DType, Tensor, TensorData};
use burn_fused_ce::{
    CrossEntropyOptions, LinearChunking, LinearCrossEntropyInputs, LmHead, Reduction, test_hooks,
};
use rand::Rng;

use crate::common::*;

/// Bytes in use beyond those before it at the products of one training step of
/// `rows x width x vocab` f32 in chunks of `chunk_rows`, the weight tracked or frozen.
pub(crate) fn probed_step(
    (rows, width, vocab): (usize, usize, usize),
    chunk_rows: usize,
    weight_tracked: bool,
    seed: u64,
) -> u64 {
    let device = TestBackend::Fusion.device().autodiff();
    let mut rng = rng(seed);
    let mut uniform =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let hidden = Tensor::<2>::from_data(
        TensorData::new(uniform(rows * width), [rows, width]),
        &device,
    )
    .require_grad();
    let weight = Tensor::<2>::from_data(
        TensorData::new(uniform(width * vocab), [width, vocab]),
        &device,
    );
    let weight = if weight_tracked {
        weight.require_grad()
    } else {
        weight
    };
    let targets: Vec<i64> = (0..rows as i64).map(|row| row * 7 % vocab as i64).collect();
    let targets = targets_tensor(&targets, &device);
    let chunking = LinearChunking {
        logits_bytes: Some(chunk_rows * vocab * DType::F32.size()),
        ..LinearChunking::default()
    };
    let before = device
        .memory_pool_usage()
        .expect("a cube device reports its pool")
        .bytes_in_use;
    test_hooks::set_probe_memory(true);
    let loss = burn_fused_ce::try_fused_linear_cross_entropy(
        LinearCrossEntropyInputs::new(hidden.clone(), LmHead::new(weight.clone()), targets),
        &CrossEntropyOptions::new(Reduction::Mean),
        &chunking,
    )
    .unwrap_or_else(|e| panic!("seed={seed}: {e}"))
    .loss;
    let grads = (loss * 0.75).backward();
    let _ = (hidden.grad(&grads), weight.grad(&grads));
    device.sync().expect("the step runs");
    let peak = test_hooks::probed_peak_bytes_in_use();
    test_hooks::set_probe_memory(false);
    peak.saturating_sub(before)
}

#[test]
fn probed_peak_holds_a_chunk_and_follows_the_budget() {
    // Alone on the device: other tests' buffers would count.
    let _alone = exclusive_device();
    let seed = fresh_seed();
    let (rows, width, vocab) = (256, 64, 4096);
    let logits_row = (vocab * DType::F32.size()) as u64;
    let weight_sum = (width * vocab * DType::F32.size()) as u64;
    let small = probed_step((rows, width, vocab), 16, true, seed);
    let large = probed_step((rows, width, vocab), 128, true, seed);
    println!(
        "bytes in use beyond the inputs at the products: {small} (16-row chunks), {large} (128-row chunks); one row of logits {logits_row}, the weight gradient's sum {weight_sum}"
    );
    assert!(
        small >= 16 * logits_row + weight_sum,
        "seed={seed}: {small} bytes at the products of 16-row chunks, below one chunk's \
         logits and the weight gradient's sum ({} bytes)",
        16 * logits_row + weight_sum
    );
    let added = 112 * logits_row;
    assert!(
        large >= small + added / 2,
        "seed={seed}: 128-row chunks peaked at {large} bytes, 16-row ones at {small}: \
         the larger chunks' {added} bytes of logits are not seen"
    );
}
