//! Where backward writes the gradient: over the logits only when nothing else holds them.
//! (The in-place counter is process-wide: these tests hold `exclusive_device()`.)

use crate::call::*;
use crate::common::*;
use crate::run_call::{forward, tracked_call};
use burn::tensor::DType;
use burn_fused_ce::{CrossEntropyOptions, Reduction, test_hooks};

/// Logits nobody else holds (the usual `model.forward(x)` output) become the gradient:
/// backward allocates no N x V buffer.
#[test]
fn exclusive_logits_become_the_gradient() {
    check_ownership(TestBackend::Cube, false);
    check_ownership(TestBackend::Fusion, false);
}

/// A logits tensor the caller still holds is unchanged by forward and backward, and
/// backward then writes a separate gradient buffer.
#[test]
fn held_logits_are_never_overwritten() {
    check_ownership(TestBackend::Cube, true);
    check_ownership(TestBackend::Fusion, true);
}

/// Every reduction, with an incoming gradient of 1 and another; `held`: the caller keeps a
/// clone of the logits (an intermediate, as a model output is; on the plain cube
/// backend's primitives a clone of the primitive), checked unchanged.
fn check_ownership(backend: TestBackend, held: bool) {
    let _only_us = exclusive_device();
    test_hooks::set_poison_outputs(true);
    let seed = fresh_seed();
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
        let context = format!(
            "{} seed={seed} {reduction:?} g={g} held={held} options={options_on}",
            backend.name()
        );
        let (options, weights) = if options_on {
            (
                super::options::all_options(reduction, vocab).with_ignore_index(-100),
                Some(weights.as_slice()),
            )
        } else {
            (CrossEntropyOptions::new(reduction), None)
        };
        // `(loss * g).sum()`.
        let incoming = match reduction {
            Reduction::None => Incoming::PerRow(vec![g; rows]),
            _ => Incoming::Scale(g),
        };
        let call = Call {
            incoming,
            exclusive: !held,
            ..Call::new(
                values.clone(),
                (rows, vocab),
                DType::F32,
                &targets,
                weights,
                &options,
            )
        };
        let before = test_hooks::in_place_backward_count();
        let tracked = match backend {
            // Held primitives are checked unchanged inside.
            TestBackend::Cube => {
                tracked_call(backend, &call).unwrap_or_else(|e| panic!("{context}: refused: {e}"))
            }
            _ => held_intermediate(backend, &call, held, &context),
        };
        let expected_in_place = if held { 0 } else { 1 };
        assert_eq!(
            test_hooks::in_place_backward_count() - before,
            expected_in_place,
            "{context}: in-place backward launches"
        );
        let ref_grad = reference_grad(
            &tracked.seen,
            vocab,
            &targets,
            &RefOptions::new(&options, weights),
            &tracked.g,
        );
        let err = relative_l2(&tracked.grad.values, &ref_grad);
        assert!(err <= 1e-5, "{context}: gradient error {err:e}");
    }
}

/// `logits = leaf * 1.0` through `Tensor<D>` under autodiff, a clone of it kept when
/// `held` (and checked unchanged after backward).
fn held_intermediate(backend: TestBackend, call: &Call, held: bool, context: &str) -> Tracked {
    let device = backend.device().autodiff();
    let (leaf, seen) = logits_tensor(
        call.values.clone(),
        call.rows,
        call.vocab,
        call.dtype,
        &device,
    );
    let leaf = leaf.require_grad();
    let logits = leaf.clone() * 1.0;
    let kept = held.then(|| logits.clone());
    let (out, loss) = forward(logits, targets_tensor(call.targets, &device), call)
        .unwrap_or_else(|e| panic!("{context}: refused: {e}"));
    let [len] = loss.dims();
    let g = call.incoming.rounded(len, call.dtype, &device);
    let grads = call.incoming.objective(loss).backward();
    // Read first: a fusion backend runs the queued ops only now.
    let grad = HostTensor::read(&leaf.grad(&grads).expect("gradient"));
    if let Some(kept) = kept {
        assert_same_values(
            &to_f64(kept.inner()),
            &seen,
            &format!("{context}: held logits changed"),
        );
    }
    Tracked { seen, out, grad, g }
}
