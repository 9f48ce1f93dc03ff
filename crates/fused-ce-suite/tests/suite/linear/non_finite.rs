//! Non-finite hidden states in the fused linear cross-entropy: a NaN or an infinity in a
//! row of `h` makes that row's logits non-finite, so its loss and its hidden-state
//! gradient are NaN or infinite, and the weight's and bias's gradients, which sum over
//! every row, are NaN, as in PyTorch. Every other row's loss and hidden-state gradient
//! stay those of the f64 reference, whichever chunk the bad rows fall in.

use burn::tensor::DType;
use burn_fused_ce::{LinearCrossEntropyInputs, LmHead, Reduction, try_fused_linear_cross_entropy};

use crate::common::*;
use crate::linear::{LinearCase, LinearValues, bound, check_close, linear_reference, objective_of};

#[test]
fn non_finite_hidden_rows_poison_only_their_rows() {
    for backend in [TestBackend::Fusion, TestBackend::Flex] {
        check_non_finite_hidden(backend);
    }
}

fn check_non_finite_hidden(backend: TestBackend) {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let context = format!("{} seed={seed}", backend.name());
    let (rows, width, vocab) = (24, 16, 67);
    let mut case = LinearCase::new(rows, width, vocab, DType::F32, Reduction::None);
    // Three chunks of 8 rows: the bad rows in the first and the second.
    case.chunk_rows = 8;
    let mut values = LinearValues::draw(&case, &mut rng);
    let bad = [3, 13];
    // Bad rows are not ignored: an ignored row's loss and gradient are exactly 0.
    values.targets[3] = 7;
    values.targets[13] = 21;
    values.hidden[3 * width + 5] = f32::NAN;
    values.hidden[13 * width] = f32::INFINITY;

    let plain = backend.device();
    let device = plain.clone().autodiff();
    let (hidden, weight, bias) = values.tensors(&case, DType::F32, &plain);
    let h64: Vec<f64> = values.hidden.iter().map(|&v| v as f64).collect();
    let w64: Vec<f64> = values.weight.iter().map(|&v| v as f64).collect();
    let b64: Vec<f64> = values.bias.iter().map(|&v| v as f64).collect();
    let reference = linear_reference(&case, &values, (&h64, &w64, &b64));

    let hidden_ad = hidden.autodiff().require_grad();
    let weight_ad = weight.autodiff().require_grad();
    let bias_ad = bias.autodiff().require_grad();
    let loss = try_fused_linear_cross_entropy(
        LinearCrossEntropyInputs::new(
            hidden_ad.clone(),
            LmHead::new(weight_ad.clone()).with_bias(Some(bias_ad.clone())),
            targets_tensor(&values.targets, &device),
        ),
        &case.options,
        &case.chunking(),
    )
    .unwrap_or_else(|e| panic!("{context}: refused: {e}"))
    .loss;
    let grads = objective_of(loss.clone(), Reduction::None, &values.row_grad, 1.0).backward();
    let losses = to_f64(loss.inner());
    let grad_hidden = to_f64(hidden_ad.grad(&grads).expect("hidden gradient"));
    let grad_weight = to_f64(weight_ad.grad(&grads).expect("weight gradient"));
    let grad_bias = to_f64(bias_ad.grad(&grads).expect("bias gradient"));

    let good: Vec<usize> = (0..rows).filter(|row| !bad.contains(row)).collect();
    let rows_of = |v: &[f64], len: usize, which: &[usize]| -> Vec<f64> {
        which
            .iter()
            .flat_map(|&row| v[row * len..(row + 1) * len].to_vec())
            .collect()
    };
    for &row in &bad {
        assert!(
            !losses[row].is_finite(),
            "{context}: row {row}'s loss {} must be NaN or infinite",
            losses[row]
        );
        let grad_row = &grad_hidden[row * width..(row + 1) * width];
        assert!(
            grad_row.iter().all(|g| !g.is_finite()),
            "{context}: row {row}'s hidden-state gradient must be NaN: {grad_row:?}"
        );
    }
    check_close(
        &rows_of(&losses, 1, &good),
        &rows_of(&reference.loss, 1, &good),
        bound(DType::F32),
        &format!("{context}: the finite rows' losses"),
    );
    check_close(
        &rows_of(&grad_hidden, width, &good),
        &rows_of(&reference.hidden, width, &good),
        bound(DType::F32),
        &format!("{context}: the finite rows' hidden-state gradients"),
    );
    for (name, grad) in [("weight", &grad_weight), ("bias", &grad_bias)] {
        assert!(
            grad.iter().all(|g| g.is_nan()),
            "{context}: the {name} gradient sums the bad rows: NaN everywhere"
        );
    }
}
