mod common;
use burn::tensor::DType;
use burn_fused_ce::{CrossEntropyOptions, Reduction, fused_cross_entropy};
use common::*;
#[test]
fn dbg() {
    let device = Device::default();
    let poison = std::env::var("POISON").is_ok();
    burn_fused_ce::diagnostics::set_poison_outputs(poison);
    let (rows, vocab) = (37usize, 64usize);
    let mut r = rng(1);
    let values = random_logits(&mut r, rows, vocab);
    let targets = random_targets(&mut r, rows, vocab, Ignore::SomeRows, 3);
    let (logits, seen) = logits_tensor::<CubeBackend>(values, rows, vocab, DType::F32, &device);
    let loss = fused_cross_entropy(logits, targets_tensor::<CubeBackend>(&targets, &device), &CrossEntropyOptions { reduction: Reduction::None, ignore_index: 3 });
    let refr: Vec<f64> = reference_rows(&seen, vocab, &targets, 3).iter().map(|r| r.0).collect();
    let e = relative_l2(&to_f64(loss), &refr);
    assert!(e < 1e-5, "err {e}");
}
