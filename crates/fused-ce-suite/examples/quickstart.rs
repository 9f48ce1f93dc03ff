//! The loss doing its job in a few lines: a linear "language model head" trained for a few
//! steps with `FusedCrossEntropyLoss`, next to Burn's stock `CrossEntropyLoss` on the same
//! inputs. Runs on Vulkan (lavapipe on a machine without a GPU) or CUDA (`--features cuda`).
//!
//!   scripts/with-vulkan.sh cargo run --release --example quickstart

use burn::{
    nn::loss::CrossEntropyLossConfig,
    tensor::{Device, Distribution, Int, Tensor, TensorData},
};
use burn_fused_ce::{FusedCrossEntropyLossConfig, Reduction};

const RUNTIME_NAME: &str = if cfg!(feature = "cuda") {
    "CUDA"
} else {
    "wgpu"
};

fn main() {
    // What a Burn user has: the build's GPU device (CUDA, else wgpu) with Burn's default
    // fusion, recording gradients.
    let device = Device::default().autodiff();
    let (rows, hidden, vocab) = (256, 64, 4096);
    println!("fused cross-entropy on {RUNTIME_NAME}: {rows} rows, vocabulary {vocab}");

    let x = Tensor::<2>::random([rows, hidden], Distribution::Normal(0.0, 1.0), &device);
    let targets: Vec<i64> = (0..rows as i64)
        .map(|r| {
            if r % 10 == 9 {
                -100
            } else {
                (r * 37) % vocab as i64
            }
        })
        .collect();
    let targets = Tensor::<1, Int>::from_data(TensorData::new(targets, [rows]), &device);
    let mut w = Tensor::<2>::random([hidden, vocab], Distribution::Normal(0.0, 0.05), &device)
        .require_grad();

    // The one-line swap: `CrossEntropyLossConfig::new().init(&device)` becomes this.
    let loss_fn = FusedCrossEntropyLossConfig::new().init(&device);
    let stock = CrossEntropyLossConfig::new().init(&device);

    for step in 0..10 {
        let logits = x.clone().matmul(w.clone());
        let loss = loss_fn.forward(logits.clone(), targets.clone());
        let grads = loss.backward();
        let grad_w = w.grad(&grads).expect("w has a gradient");
        let value = loss.into_scalar::<f32>();
        println!("step {step:2}  loss {value:.5}");
        w = Tensor::from_inner(w.inner() - grad_w * 2.0).require_grad();
    }

    // Per-row losses (reduction None): ignored rows are exactly 0.
    let per_row = FusedCrossEntropyLossConfig::new()
        .with_reduction(Reduction::None)
        .init(&device)
        .forward(x.clone().matmul(w.clone()), targets.clone());
    let rows_shown: Vec<f32> = per_row
        .clone()
        .inner()
        .narrow(0, 0, 10)
        .into_data()
        .try_into_vec_as::<f32>()
        .expect("float data");
    println!("per-row losses, first 10 (row 9 is ignored): {rows_shown:.3?}");
    let ours = loss_fn
        .forward(x.clone().matmul(w.clone()), targets.clone().clamp_min(0))
        .into_scalar::<f32>();
    let theirs = stock
        .forward(x.matmul(w), targets.clamp_min(0))
        .into_scalar::<f32>();
    println!("same inputs, no ignored rows: fused {ours:.6} vs Burn stock {theirs:.6}");
}
