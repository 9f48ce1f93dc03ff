//! LLM-sized shapes on a GPU (CUDA builds only; lavapipe is too small and too slow).
//! The f64 reference is computed for a random sample of rows read back from the device,
//! so the check stays cheap while the kernels run over the whole (8192, 128256) tensor.
#![cfg(feature = "cuda")]

use crate::common::*;
use burn::tensor::{DType, Distribution, Tensor, backend::Backend};
use burn_fused_ce::{CrossEntropyOptions, Reduction, diagnostics, fused_cross_entropy};
use rand::Rng;

fn check_llm_shape(rows: usize, vocab: usize, dtype: DType, reduction: Reduction) {
    diagnostics::set_poison_outputs(true);
    let _backward = shared_device();
    let seed = fresh_seed();
    let device = Device::default();
    let mut rng = rng(seed);
    let context = format!("{rows}x{vocab} {dtype:?} {reduction:?} seed={seed}");
    CubeBackend::seed(&device, seed);
    let inner =
        Tensor::<CubeBackend, 2>::random([rows, vocab], Distribution::Uniform(-6.0, 6.0), &device)
            .cast(dtype);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    let sample: Vec<usize> = (0..48)
        .map(|_| rng.random_range(0..rows))
        .chain([0, rows - 1])
        .collect();
    let sample_rows = |t: &Tensor<CubeBackend, 2>| -> Vec<Vec<f64>> {
        sample
            .iter()
            .map(|&r| to_f64(t.clone().slice([r..r + 1, 0..vocab])))
            .collect()
    };
    let seen = sample_rows(&inner);

    let leaf = Tensor::<AutodiffCube, 2>::from_inner(inner).require_grad();
    let options = CrossEntropyOptions {
        reduction,
        ignore_index: -100,
    };
    // `leaf * 1.0` is an intermediate nobody holds: backward writes over it in place.
    let loss = fused_cross_entropy(
        leaf.clone() * 1.0,
        targets_tensor(&targets, &device),
        &options,
    );
    let weights: Vec<f32> = (0..rows).map(|_| rng.random_range(0.25..4.0)).collect();
    let (objective, g) = match reduction {
        Reduction::None => {
            let (w, g) = logits_tensor::<AutodiffCube>(weights, 1, rows, dtype, &device);
            (loss.clone() * w.reshape([rows]), g)
        }
        _ => (
            loss.clone() * 3.7,
            to_f64(Tensor::<CubeBackend, 1>::from_floats([3.7], &device).cast(dtype)),
        ),
    };
    let losses = to_f64(loss.inner());
    let grads = objective.sum().backward();
    let grad = leaf.grad(&grads).expect("gradient");
    let grad_rows = sample_rows(&grad);

    let (loss_tol, grad_tol) = tolerance(dtype);
    let count = targets.iter().filter(|&&y| y != -100).count() as f64;
    for (k, &row) in sample.iter().enumerate() {
        let y = targets[row];
        let reference = reference_rows(&seen[k], vocab, &[y], -100)[0].0;
        if reduction == Reduction::None {
            let err = ((losses[row] - reference) / reference.abs().max(1e-3)).abs();
            assert!(
                err <= loss_tol,
                "{context}: row {row} loss {} vs {reference}",
                losses[row]
            );
        }
        let row_g = match reduction {
            Reduction::None => g[row],
            Reduction::Sum => g[0],
            Reduction::Mean => g[0] / count,
        };
        let ref_grad = reference_grad(&seen[k], vocab, &[y], -100, Reduction::Sum, &[row_g]);
        if y == -100 {
            assert!(
                grad_rows[k].iter().all(|v| *v == 0.0),
                "{context}: ignored row {row} not zero"
            );
        } else {
            let err = relative_l2(&grad_rows[k], &ref_grad);
            assert!(
                err <= grad_tol,
                "{context}: row {row} gradient error {err:e}"
            );
        }
    }
    eprintln!("{context}: ok on {} sampled rows", sample.len());
}

#[test]
fn bf16_8192_x_128256_every_reduction() {
    for reduction in [Reduction::None, Reduction::Mean, Reduction::Sum] {
        check_llm_shape(8192, 128256, DType::BF16, reduction);
    }
}

#[test]
fn f32_and_f16_8192_x_128256_none() {
    check_llm_shape(8192, 128256, DType::F32, Reduction::None);
    check_llm_shape(8192, 128256, DType::F16, Reduction::None);
}

#[test]
fn bf16_4096_x_256000_mean() {
    check_llm_shape(4096, 256000, DType::BF16, Reduction::Mean);
}
