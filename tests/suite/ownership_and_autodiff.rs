//! Memory ownership (the gradient goes over the logits only when nothing else holds them)
//! and autodiff through an upstream op, checked against Burn's stock `CrossEntropyLoss`.

use std::sync::Mutex;

use crate::common::*;
use burn::{
    backend::Autodiff,
    config::Config,
    nn::loss::CrossEntropyLossConfig,
    tensor::{DType, Distribution, Tensor},
};
use burn_fused_ce::{
    CrossEntropyOptions, FusedCrossEntropyBackend, FusedCrossEntropyLossConfig, Reduction,
    diagnostics, fused_cross_entropy,
};
use fused_ce_suite::DefaultBackend;

/// The in-place counter is process-wide: tests that read it run one at a time.
static COUNTER_LOCK: Mutex<()> = Mutex::new(());

/// A logits tensor the caller still holds is unchanged by forward and backward, and
/// backward then writes a separate gradient buffer.
#[test]
fn held_logits_are_never_overwritten() {
    held_logits_are_never_overwritten_on::<CubeBackend>();
    held_logits_are_never_overwritten_on::<DefaultBackend>();
}

fn held_logits_are_never_overwritten_on<B: FusedCrossEntropyBackend>()
where
    B::Device: Default,
{
    let backend = std::any::type_name::<B>();
    let _guard = COUNTER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    diagnostics::set_poison_outputs(true);
    let seed = fresh_seed();
    let device = B::Device::default();
    let mut rng = rng(seed);
    let (rows, vocab) = (33, 515);
    let values = random_logits(&mut rng, rows, vocab);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    for reduction in [Reduction::None, Reduction::Mean, Reduction::Sum] {
        let (inner, seen) = logits_tensor::<B>(values.clone(), rows, vocab, DType::F32, &device);
        let leaf = Tensor::<Autodiff<B>, 2>::from_inner(inner).require_grad();
        // An intermediate the caller keeps a clone of.
        let logits = leaf.clone() * 1.0;
        let held = logits.clone();
        let before = diagnostics::in_place_backward_count();
        let options = CrossEntropyOptions {
            reduction,
            ignore_index: -100,
        };
        let loss = fused_cross_entropy(logits, targets_tensor(&targets, &device), &options);
        let grads = loss.sum().backward();
        // Read first: a fusion backend runs the queued ops only now.
        let grad = to_f64(leaf.grad(&grads).expect("gradient"));
        assert_eq!(
            to_f64(held.inner()),
            seen,
            "{backend} seed={seed} {reduction:?}: held logits changed"
        );
        assert_eq!(
            diagnostics::in_place_backward_count(),
            before,
            "{backend} seed={seed} {reduction:?}: a held buffer was chosen for in-place backward"
        );
        let g = vec![
            1.0;
            if reduction == Reduction::None {
                rows
            } else {
                1
            }
        ];
        let ref_grad = reference_grad(&seen, vocab, &targets, -100, reduction, &g);
        let err = relative_l2(&grad, &ref_grad);
        assert!(
            err <= 1e-5,
            "{backend} seed={seed} {reduction:?}: gradient error {err:e}"
        );
    }
}

/// Logits nobody else holds (the usual `model.forward(x)` output) become the gradient:
/// backward allocates no N x V buffer.
#[test]
fn exclusive_logits_become_the_gradient() {
    exclusive_logits_become_the_gradient_on::<CubeBackend>();
    exclusive_logits_become_the_gradient_on::<DefaultBackend>();
}

fn exclusive_logits_become_the_gradient_on<B: FusedCrossEntropyBackend>()
where
    B::Device: Default,
{
    let backend = std::any::type_name::<B>();
    let _guard = COUNTER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    diagnostics::set_poison_outputs(true);
    let seed = fresh_seed();
    let device = B::Device::default();
    let mut rng = rng(seed);
    let (rows, vocab) = (17, 256);
    let values = random_logits(&mut rng, rows, vocab);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    let (inner, seen) = logits_tensor::<B>(values, rows, vocab, DType::F32, &device);
    let leaf = Tensor::<Autodiff<B>, 2>::from_inner(inner).require_grad();
    let before = diagnostics::in_place_backward_count();
    let loss = fused_cross_entropy(
        leaf.clone() * 1.0,
        targets_tensor(&targets, &device),
        &CrossEntropyOptions::default(),
    );
    let grads = (loss * 2.5).sum().backward();
    // Read first: a fusion backend runs the queued ops only now.
    let grad = to_f64(leaf.grad(&grads).expect("gradient"));
    assert_eq!(
        diagnostics::in_place_backward_count(),
        before + 1,
        "{backend} seed={seed}: exclusive logits were not reused for the gradient"
    );
    let ref_grad = reference_grad(&seen, vocab, &targets, -100, Reduction::Mean, &[2.5]);
    let err = relative_l2(&grad, &ref_grad);
    assert!(err <= 1e-5, "{backend} seed={seed}: gradient error {err:e}");
}

/// `logits = x.matmul(w)`: the gradient of `w` through our loss matches the one Burn's
/// stock `CrossEntropyLoss` gives (Mean, no ignored rows, where both agree).
#[test]
fn gradient_through_matmul_matches_burn_stock_loss() {
    let seed = fresh_seed();
    let device = Device::default();
    let mut rng = rng(seed);
    let (rows, hidden, vocab) = (48, 32, 301);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::NoRows, -100);
    <CubeBackend as burn::tensor::backend::Backend>::seed(&device, seed);
    let x = Tensor::<AutodiffCube, 2>::random(
        [rows, hidden],
        Distribution::Uniform(-1.0, 1.0),
        &device,
    );
    let w_init = Tensor::<AutodiffCube, 2>::random(
        [hidden, vocab],
        Distribution::Uniform(-1.0, 1.0),
        &device,
    );

    let grad_of_w = |ours: bool| {
        let w = w_init.clone().detach().require_grad();
        let logits = x.clone().matmul(w.clone());
        let targets = targets_tensor(&targets, &device);
        let loss = if ours {
            FusedCrossEntropyLossConfig::new()
                .init(&device)
                .forward(logits, targets)
        } else {
            CrossEntropyLossConfig::new()
                .init(&device)
                .forward(logits, targets)
        };
        let value = to_f64(loss.clone().inner())[0];
        let grads = loss.backward();
        (value, to_f64(w.grad(&grads).expect("w gets a gradient")))
    };
    let (our_loss, our_grad) = grad_of_w(true);
    let (stock_loss, stock_grad) = grad_of_w(false);
    let loss_err = ((our_loss - stock_loss) / stock_loss).abs();
    assert!(
        loss_err <= 1e-5,
        "seed={seed}: loss {our_loss} vs stock {stock_loss}"
    );
    let err = relative_l2(&our_grad, &stock_grad);
    assert!(
        err <= 1e-4,
        "seed={seed}: grad(w) differs from stock by {err:e}"
    );
}

/// The config serialises with serde and decides the output rank.
#[test]
fn config_round_trips_and_decides_rank() {
    let device = Device::default();
    let config = FusedCrossEntropyLossConfig::new()
        .with_reduction(Reduction::None)
        .with_ignore_index(7);
    let json = config.to_string();
    assert!(json.contains("\"reduction\""), "serialises as JSON: {json}");
    let back =
        FusedCrossEntropyLossConfig::load_binary(json.as_bytes()).expect("config parses back");
    assert_eq!(back, config);
    let logits =
        Tensor::<CubeBackend, 2>::random([5, 9], Distribution::Uniform(-2.0, 2.0), &device);
    let targets = targets_tensor::<CubeBackend>(&[1, 7, 3, 0, 8], &device);
    let losses = back.init(&device).forward(logits.clone(), targets.clone());
    assert_eq!(losses.dims(), [5]);
    assert_eq!(to_f64(losses)[1], 0.0, "ignore_index 7 zeroes row 1");
    let mean = FusedCrossEntropyLossConfig::new()
        .init(&device)
        .forward(logits, targets);
    assert_eq!(mean.dims(), [1]);
}
