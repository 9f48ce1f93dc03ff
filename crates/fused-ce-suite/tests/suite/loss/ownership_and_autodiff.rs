//! Autodiff through an upstream op, checked against Burn's stock `CrossEntropyLoss`, and
//! the config. (Buffer ownership is `in_place.rs`.)

use burn::{
    config::Config,
    nn::loss::CrossEntropyLossConfig,
    tensor::{Distribution, Tensor},
};
use burn_fused_ce::{FusedCrossEntropyLossConfig, Reduction};

use crate::common::*;

/// `logits = x.matmul(w)`: the gradient of `w` through our loss matches the one Burn's
/// stock `CrossEntropyLoss` gives (Mean, no ignored rows, where both agree). On a cube
/// device under autodiff: `Autodiff<Fusion<CubeBackend>>` in this build.
#[test]
fn gradient_through_matmul_matches_burn_stock_loss() {
    let _backward = shared_device();
    let seed = fresh_seed();
    let device = device().autodiff();
    let mut rng = rng(seed);
    let (rows, hidden, vocab) = (48, 32, 301);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::NoRows, -100);
    device.seed(seed);
    let x = Tensor::<2>::random([rows, hidden], Distribution::Uniform(-1.0, 1.0), &device);
    let w_init = Tensor::<2>::random([hidden, vocab], Distribution::Uniform(-1.0, 1.0), &device);

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
    let device = device();
    let config = FusedCrossEntropyLossConfig::new()
        .with_reduction(Reduction::None)
        .with_ignore_index(7);
    let json = config.to_string();
    assert!(json.contains("\"reduction\""), "serialises as JSON: {json}");
    let back =
        FusedCrossEntropyLossConfig::load_binary(json.as_bytes()).expect("config parses back");
    assert_eq!(back, config);
    let logits = Tensor::<2>::random([5, 9], Distribution::Uniform(-2.0, 2.0), &device);
    let targets = targets_tensor(&[1, 7, 3, 0, 8], &device);
    let losses = back.init(&device).forward(logits.clone(), targets.clone());
    assert_eq!(losses.dims(), [5]);
    assert_eq!(to_f64(losses)[1], 0.0, "ignore_index 7 zeroes row 1");
    let mean = FusedCrossEntropyLossConfig::new()
        .init(&device)
        .forward(logits, targets);
    assert_eq!(mean.dims(), [1]);
}

/// The logits also feed another op whose backward reads them (`aux = (logits * o).sum()`
/// needs the logits for `o`'s gradient): the loss must not write its gradient over them,
/// in either autodiff plan, on the fusion backend and Flex. Autodiff through another op
/// needs `Tensor<D>`, which the plain cube backend has not in this build: its side of
/// this, never writing over logits something else holds, is `in_place.rs`'s held case on
/// its primitives.
#[test]
fn logits_another_op_still_needs_are_not_overwritten() {
    check_shared_logits(TestBackend::Fusion);
    check_shared_logits(TestBackend::Flex);
}

fn check_shared_logits(backend: TestBackend) {
    use burn::tensor::DType;
    use burn_fused_ce::{CrossEntropyOptions, fused_cross_entropy, test_hooks};

    test_hooks::set_poison_outputs(true);
    let _backward = shared_device();
    let seed = fresh_seed();
    let device = backend.device().autodiff();
    let mut rng = rng(seed);
    let (rows, vocab) = (19, 77);
    let values = random_logits(&mut rng, rows, vocab);
    let other = random_logits(&mut rng, rows, vocab);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        for one_pass in [true, false] {
            let context = format!(
                "{} {reduction:?} one_pass={one_pass} seed={seed}",
                backend.name()
            );
            let options = CrossEntropyOptions::new(reduction).with_gradient_plan(plan(one_pass));
            let (leaf, seen) = logits_tensor(values.clone(), rows, vocab, DType::F32, &device);
            let (o, o_seen) = logits_tensor(other.clone(), rows, vocab, DType::F32, &device);
            let leaf = leaf.require_grad();
            let o = o.require_grad();
            let logits = leaf.clone() * 1.0;
            let loss =
                fused_cross_entropy(logits.clone(), targets_tensor(&targets, &device), &options);
            let aux = (logits * o.clone()).sum();
            let objective = loss.sum() + aux;
            let grads = objective.backward();
            let grad_o = to_f64(o.grad(&grads).expect("o gets a gradient"));
            assert_eq!(grad_o, seen, "{context}: d aux / d o must be the logits");
            let grad = to_f64(leaf.grad(&grads).expect("logits get a gradient"));
            let g = vec![
                1.0;
                if reduction == Reduction::None {
                    rows
                } else {
                    1
                }
            ];
            let reference = RefOptions::new(&options, None);
            let expected: Vec<f64> = reference_grad(&seen, vocab, &targets, &reference, &g)
                .iter()
                .zip(&o_seen)
                .map(|(ce, o)| ce + o)
                .collect();
            let err = relative_l2(&grad, &expected);
            assert!(err <= 1e-5, "{context}: gradient error {err:e}");
        }
    }
}
