//! Non-finite logits in the vocabulary-parallel loss: a NaN or a `+inf` in one shard's
//! columns of a row reaches every shard through the exchanged statistics, so that row's
//! loss is NaN or infinite on every shard, as on one device; a `-inf` is a probability
//! of 0. Every other row's loss and gradient stay those of the f64 reference.

use burn::tensor::DType;
use burn_fused_ce::Reduction;
use burn_fused_ce::vocab_parallel::{InProcessExchange, VocabShard};
use rand::Rng;

use super::{ShardCase, ShardInputs, run_shards};
use crate::common::*;

#[test]
fn non_finite_logits_poison_only_their_rows_on_every_shard() {
    let _backward = shared_device();
    let device = TestBackend::Fusion.device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let case = ShardCase::new(12, 300, 2, Reduction::None);
    let context = format!("{case:?} seed {seed}");
    let vocab = case.vocab;
    let mut values = random_logits(&mut rng, case.rows, vocab);
    let mut targets = random_targets(&mut rng, case.rows, vocab, Ignore::NoRows, -100);
    // Row 2: NaN in the first shard's columns; row 7: +inf in the second's (not the
    // target); row 9: -inf in the first's (not the target), a finite row.
    targets[7] = 3;
    targets[9] = 290;
    values[2 * vocab + 10] = f32::NAN;
    values[7 * vocab + 200] = f32::INFINITY;
    values[9 * vocab + 20] = f32::NEG_INFINITY;
    let bad = [2, 7];
    let incoming: Vec<f32> = (0..case.rows).map(|_| rng.random_range(0.2..2.0)).collect();

    let seen: Vec<f64> = values.iter().map(|&v| v as f64).collect();
    let reference = RefOptions::new(&case.options, None);
    let rows = reference_rows(&seen, vocab, &targets, &reference);
    let g: Vec<f64> = incoming.iter().map(|&v| v as f64).collect();
    let ref_grad = reference_grad(&seen, vocab, &targets, &reference, &g);
    let ref_loss = reference_loss(&rows, Reduction::None);
    let (loss_tol, grad_tol) = tolerance(DType::F32);

    let exchange = InProcessExchange::new(case.shards);
    let inputs = ShardInputs {
        values: &values,
        targets: &targets,
        weights: None,
        incoming: &incoming,
    };
    let results = run_shards(&case, &inputs, &[device], &exchange);

    for (k, result) in results.iter().enumerate() {
        let shard = VocabShard::new(k, case.shards, vocab).expect("a valid shard");
        let width = shard.classes().len();
        for row in 0..case.rows {
            let loss = result.loss[row];
            if bad.contains(&row) {
                assert!(
                    !loss.is_finite(),
                    "{context}: shard {k} row {row}'s loss {loss} must be NaN or infinite"
                );
                continue;
            }
            let expected = ref_loss[row];
            assert!(
                (loss - expected).abs() <= loss_tol * (1.0 + expected.abs()),
                "{context}: shard {k} row {row}'s loss {loss}, reference {expected}"
            );
            let got = &result.grad[row * width..(row + 1) * width];
            let wanted = &ref_grad[row * vocab..(row + 1) * vocab][shard.classes()];
            let error = relative_l2(got, wanted);
            assert!(
                error <= grad_tol,
                "{context}: shard {k} row {row}'s gradient relative L2 {error:.3e}"
            );
        }
    }
}
