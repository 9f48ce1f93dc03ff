//! Where backward writes the gradient: over the logits only when nothing else holds them.
//! (The in-place counter is process-wide: these tests hold `exclusive_device()`.)

use crate::common::*;
use burn::{
    backend::Autodiff,
    tensor::{DType, Tensor},
};
use burn_fused_ce::{
    CrossEntropyOptions, FusedCrossEntropyBackend, Reduction, test_hooks, try_fused_cross_entropy,
};
use fused_ce_suite::DefaultBackend;

/// Logits nobody else holds (the usual `model.forward(x)` output) become the gradient:
/// backward allocates no N x V buffer.
#[test]
fn exclusive_logits_become_the_gradient() {
    check_ownership::<CubeBackend>(false);
    check_ownership::<DefaultBackend>(false);
}

/// A logits tensor the caller still holds is unchanged by forward and backward, and
/// backward then writes a separate gradient buffer.
#[test]
fn held_logits_are_never_overwritten() {
    check_ownership::<CubeBackend>(true);
    check_ownership::<DefaultBackend>(true);
}

/// Every reduction, with an incoming gradient of 1 and another; `held`: the caller keeps a
/// clone of the logits (an intermediate, as a model output is).
fn check_ownership<B: FusedCrossEntropyBackend>(held: bool)
where
    B::Device: Default,
{
    let backend = std::any::type_name::<B>();
    let _only_us = exclusive_device();
    test_hooks::set_poison_outputs(true);
    let seed = fresh_seed();
    let device = B::Device::default();
    let mut rng = rng(seed);
    let (rows, vocab) = (33, 515);
    let values = random_logits(&mut rng, rows, vocab);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    let weights = random_class_weights(&mut rng, vocab);
    for (reduction, g, options_on) in [
        (Reduction::Mean, 2.5, false),
        (Reduction::Mean, 1.0, false),
        (Reduction::Sum, 1.0, false),
        (Reduction::None, 1.0, false),
        // Every option and extra output: still in place.
        (Reduction::Mean, 2.5, true),
        (Reduction::None, 1.0, true),
    ] {
        let context =
            format!("{backend} seed={seed} {reduction:?} g={g} held={held} options={options_on}");
        let (inner, seen) = logits_tensor::<B>(values.clone(), rows, vocab, DType::F32, &device);
        let leaf = Tensor::<Autodiff<B>, 2>::from_inner(inner).require_grad();
        let logits = leaf.clone() * 1.0;
        let kept = held.then(|| logits.clone());
        let before = test_hooks::in_place_backward_count();
        let (options, weights) = if options_on {
            (
                CrossEntropyOptions {
                    ignore_index: -100,
                    ..crate::options::all_options(reduction, vocab)
                },
                Some(weights.as_slice()),
            )
        } else {
            (CrossEntropyOptions::new(reduction), None)
        };
        let loss = try_fused_cross_entropy(
            logits,
            targets_tensor(&targets, &device),
            weights.map(|w| Tensor::from_floats(w, &device)),
            &options,
        )
        .unwrap_or_else(|e| panic!("{context}: refused: {e}"))
        .loss;
        let grads = (loss * g).sum().backward();
        // Read first: a fusion backend runs the queued ops only now.
        let grad = to_f64(leaf.grad(&grads).expect("gradient"));
        if let Some(kept) = kept {
            assert_eq!(to_f64(kept.inner()), seen, "{context}: held logits changed");
        }
        let expected_in_place = if held { 0 } else { 1 };
        assert_eq!(
            test_hooks::in_place_backward_count() - before,
            expected_in_place,
            "{context}: in-place backward launches"
        );
        let g = vec![
            g;
            if reduction == Reduction::None {
                rows
            } else {
                1
            }
        ];
        let ref_grad = reference_grad(
            &seen,
            vocab,
            &targets,
            &RefOptions::new(&options, weights),
            &g,
        );
        let err = relative_l2(&grad, &ref_grad);
        assert!(err <= 1e-5, "{context}: gradient error {err:e}");
    }
}
