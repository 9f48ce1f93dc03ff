//! The language-model example's training loop: the fused loss and Burn's stock loss give
//! the same loss curve, step by step, from the same seeded start.

use burn::backend::Autodiff;
use fused_ce_suite::{
    DefaultBackend,
    lm::{LmConfig, LossKind, initial_model, train},
};

use crate::common::*;

#[test]
fn fused_and_stock_training_agree_step_by_step() {
    let _backward = shared_device();
    let seed = fresh_seed();
    let config = LmConfig {
        d_model: 32,
        layers: 1,
        heads: 2,
        seq_len: 16,
        batch: 8,
        steps: 4,
        lr: 3e-3,
        seed,
    };
    let device = Default::default();
    let start = initial_model::<Autodiff<DefaultBackend>>(&config, &device);
    let (fused, _) = train(&config, LossKind::Fused, start.clone(), &device, |_, _| {});
    let (stock, _) = train(&config, LossKind::Stock, start, &device, |_, _| {});
    for (step, (a, b)) in fused.iter().zip(&stock).enumerate() {
        let diff = (a.loss - b.loss).abs() / b.loss.abs();
        assert!(
            diff <= 1e-4,
            "seed={seed} step {step}: fused {} vs stock {}",
            a.loss,
            b.loss
        );
    }
    assert!(
        fused[0].loss > 4.0,
        "seed={seed}: starts near ln(256): {}",
        fused[0].loss
    );
}
