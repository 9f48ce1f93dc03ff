//! LLM-sized shapes on a GPU (CUDA builds only; lavapipe is too small and too slow).
//! The f64 reference is computed for a random sample of rows read back from the device,
//! so the check stays cheap while the kernels run over the whole (8192, 128256) tensor.
//! Through `Tensor<D>` on the GPU (`Fusion<CubeBackend>`, `Autodiff` of it when tracked):
//! the plain cube backend has no `Tensor<D>` in a fusion build, and these shapes are
//! about the kernels' indexing, which both reach alike.
#![cfg(feature = "cuda")]

use crate::common::*;
use burn::tensor::{DType, Distribution, Tensor};
use burn_fused_ce::{CrossEntropyOptions, Reduction, fused_cross_entropy, test_hooks};
use rand::Rng;

fn check_llm_shape(rows: usize, vocab: usize, dtype: DType, reduction: Reduction, one_pass: bool) {
    test_hooks::set_poison_outputs(true);
    let _backward = shared_device();
    let seed = fresh_seed();
    let device = device();
    let mut rng = rng(seed);
    let context = format!("{rows}x{vocab} {dtype:?} {reduction:?} one_pass={one_pass} seed={seed}");
    device.seed(seed);
    let inner =
        Tensor::<2>::random([rows, vocab], Distribution::Uniform(-6.0, 6.0), &device).cast(dtype);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    let sample: Vec<usize> = (0..48)
        .map(|_| rng.random_range(0..rows))
        .chain([0, rows - 1])
        .collect();
    let sample_rows = |t: &Tensor<2>| -> Vec<Vec<f64>> {
        sample
            .iter()
            .map(|&r| to_f64(t.clone().slice([r..r + 1, 0..vocab])))
            .collect()
    };
    let seen = sample_rows(&inner);

    let leaf = inner.autodiff().require_grad();
    let options = CrossEntropyOptions::new(reduction).with_gradient_plan(plan(one_pass));
    // `leaf * 1.0` is an intermediate nobody holds: backward writes over it in place.
    let loss = fused_cross_entropy(
        leaf.clone() * 1.0,
        targets_tensor(&targets, &device.clone().autodiff()),
        &options,
    );
    let weights: Vec<f32> = (0..rows).map(|_| rng.random_range(0.25..4.0)).collect();
    let (objective, g) = match reduction {
        Reduction::None => {
            let (w, g) = logits_tensor(weights, 1, rows, dtype, &device.clone().autodiff());
            (loss.clone() * w.reshape([rows]), g)
        }
        _ => (
            loss.clone() * 3.7,
            to_f64(Tensor::<1>::from_floats([3.7], &device).cast(dtype)),
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
        let reference = reference_rows(
            &seen[k],
            vocab,
            &[y],
            &RefOptions::plain(Reduction::None, -100),
        )[0]
        .loss();
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
        let ref_grad = reference_grad(
            &seen[k],
            vocab,
            &[y],
            &RefOptions::plain(Reduction::Sum, -100),
            &[row_g],
        );
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

/// Both autodiff plans for `Mean` and `Sum` (on a GPU the one-pass kernel cuts these rows
/// into several chunks).
#[test]
fn bf16_8192_x_128256_every_reduction() {
    for reduction in [Reduction::None, Reduction::Mean, Reduction::Sum] {
        for one_pass in [false, true] {
            check_llm_shape(8192, 128256, DType::BF16, reduction, one_pass);
        }
    }
}

#[test]
fn f32_and_f16_8192_x_128256() {
    check_llm_shape(8192, 128256, DType::F32, Reduction::None, false);
    check_llm_shape(8192, 128256, DType::F32, Reduction::Mean, true);
    check_llm_shape(8192, 128256, DType::F16, Reduction::None, false);
    check_llm_shape(8192, 128256, DType::F16, Reduction::Sum, true);
}

#[test]
fn bf16_4096_x_256000_mean() {
    check_llm_shape(4096, 256000, DType::BF16, Reduction::Mean, false);
    check_llm_shape(4096, 256000, DType::BF16, Reduction::Mean, true);
}

/// More than 2^31 elements: (32768, 128256) and (65536, 128256) bf16 (8.4 and 16.8 GB of
/// logits). Every index into the logits must be 64-bit. The loss of the first and last 16
/// rows (the last ones lie past 2^31 elements) and their gradient rows are checked
/// against the f64 reference; the Mean loss against the mean of the per-row losses.
fn check_big_index(rows: usize, vocab: usize, reduction: Reduction, one_pass: bool) {
    test_hooks::set_poison_outputs(true);
    // Up to 67 GB at the peak: alone on the device.
    let _only_us = exclusive_device();
    let seed = fresh_seed();
    let device = device();
    let mut rng = rng(seed);
    let dtype = DType::BF16;
    let context = format!("{rows}x{vocab} {dtype:?} {reduction:?} one_pass={one_pass} seed={seed}");
    assert!(
        rows * vocab > 1 << 31,
        "{context}: the shape must pass 2^31 elements"
    );
    device.seed(seed);
    // Drawn in f32 a quarter of the rows at a time, each cast before the next is drawn:
    // one f32 draw of the whole shape (33.6 GB) passes the largest buffer cubecl's pool
    // gives on an 80 GB card.
    let quarter = rows.div_ceil(4);
    let inner = Tensor::cat(
        (0..rows)
            .step_by(quarter)
            .map(|start| {
                let block = quarter.min(rows - start);
                Tensor::<2>::random([block, vocab], Distribution::Uniform(-6.0, 6.0), &device)
                    .cast(dtype)
            })
            .collect(),
        0,
    );
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    let sample: Vec<usize> = (0..16).chain(rows - 16..rows).collect();
    let sample_rows = |t: &Tensor<2>| -> Vec<Vec<f64>> {
        let head = to_f64(t.clone().slice([0..16, 0..vocab]));
        let tail = to_f64(t.clone().slice([rows - 16..rows, 0..vocab]));
        head.chunks(vocab)
            .chain(tail.chunks(vocab))
            .map(|row| row.to_vec())
            .collect()
    };
    let seen = sample_rows(&inner);
    let (loss_tol, grad_tol) = tolerance(dtype);
    let plain = RefOptions::plain(Reduction::None, -100);

    // Per-row losses, untracked: the sampled rows against the reference.
    let per_row = to_f64(fused_cross_entropy(
        inner.clone(),
        targets_tensor(&targets, &device),
        &CrossEntropyOptions::new(Reduction::None),
    ));
    assert_eq!(per_row.len(), rows, "{context}");
    for (k, &row) in sample.iter().enumerate() {
        let reference = reference_rows(&seen[k], vocab, &[targets[row]], &plain)[0].loss();
        let err = ((per_row[row] - reference) / reference.abs().max(1e-3)).abs();
        assert!(
            err <= loss_tol,
            "{context}: row {row} loss {} vs {reference}",
            per_row[row]
        );
    }
    assert!(
        per_row.iter().all(|v| v.is_finite()),
        "{context}: every per-row loss is finite"
    );
    let count = targets.iter().filter(|&&y| y != -100).count() as f64;

    // Tracked: `leaf * 1.0` is an intermediate nobody holds, so backward writes over it.
    let leaf = inner.autodiff().require_grad();
    let loss = fused_cross_entropy(
        leaf.clone() * 1.0,
        targets_tensor(&targets, &device.clone().autodiff()),
        &CrossEntropyOptions::new(reduction).with_gradient_plan(plan(one_pass)),
    );
    let (objective, g) = match reduction {
        Reduction::None => {
            let weights: Vec<f32> = (0..rows).map(|_| rng.random_range(0.25..4.0)).collect();
            let (w, g) = logits_tensor(weights, 1, rows, dtype, &device.clone().autodiff());
            (loss.clone() * w.reshape([rows]), g)
        }
        _ => (
            loss.clone() * 3.7,
            to_f64(Tensor::<1>::from_floats([3.7], &device).cast(dtype)),
        ),
    };
    let losses = to_f64(loss.inner());
    match reduction {
        Reduction::None => {
            for &row in &sample {
                assert_eq!(
                    losses[row], per_row[row],
                    "{context}: row {row} tracked loss"
                );
            }
        }
        _ => {
            let mean = per_row.iter().sum::<f64>() / count;
            let err = ((losses[0] - mean) / mean).abs();
            assert!(
                err <= loss_tol,
                "{context}: mean loss {} vs mean of per-row losses {mean}",
                losses[0]
            );
        }
    }
    let grads = objective.sum().backward();
    let grad = leaf.grad(&grads).expect("gradient");
    drop(leaf);
    let grad_rows = sample_rows(&grad);
    drop(grad);
    // Give the pool's tens of GB back before the next test allocates (later LLM-shape
    // tests failed on the H200 after this one without it).
    device.memory_cleanup();
    for (k, &row) in sample.iter().enumerate() {
        let y = targets[row];
        if y == -100 {
            assert!(
                grad_rows[k].iter().all(|v| *v == 0.0),
                "{context}: ignored row {row} not zero"
            );
            continue;
        }
        let row_g = match reduction {
            Reduction::None => g[row],
            _ => g[0] / count,
        };
        let ref_grad = reference_grad(
            &seen[k],
            vocab,
            &[y],
            &RefOptions::plain(Reduction::Sum, -100),
            &[row_g],
        );
        let err = relative_l2(&grad_rows[k], &ref_grad);
        assert!(
            err <= grad_tol,
            "{context}: row {row} gradient error {err:e}"
        );
    }
    eprintln!("{context}: ok on rows 0..16 and {}..{rows}", rows - 16);
}

#[test]
fn bf16_32768_x_128256_past_2_pow_31_elements() {
    check_big_index(32768, 128256, Reduction::Mean, true);
    check_big_index(32768, 128256, Reduction::None, false);
}

#[test]
fn bf16_65536_x_128256_past_2_pow_32_elements() {
    check_big_index(65536, 128256, Reduction::Mean, false);
    check_big_index(65536, 128256, Reduction::Mean, true);
    check_big_index(65536, 128256, Reduction::None, false);
}
