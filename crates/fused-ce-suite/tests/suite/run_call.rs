//! Runs one [`Call`] of the loss on any [`TestBackend`]: through `Tensor<D>` (the function or the
//! module, 2-D or 3-D logits, on a cube device or Flex), or on the plain cube backend's
//! primitives (`cube_primitives.rs`). Untracked, or tracked with its backward.

use burn::tensor::{Int, Tensor};
use burn_fused_ce::{
    CrossEntropyError, CrossEntropyOutput, FusedCrossEntropyLossConfig, try_fused_cross_entropy,
};

use crate::call::*;
use crate::common::*;
use crate::cube_primitives;

/// Forward through the function or the module, with 2-D or 3-D logits (`call.batch`):
/// the outputs read back and the loss flattened to rank 1.
pub(crate) fn forward(
    logits: Tensor<2>,
    targets: Tensor<1, Int>,
    call: &Call,
) -> Result<(HostOutput, Tensor<1>), CrossEntropyError> {
    let device = logits.device();
    let [rows, vocab] = logits.dims();
    let options = call.options;
    let target_dims = call.target_dims();
    // The module takes no kernel tuning: a call that forces one runs through the function.
    if call.via_module && options.tuning().is_none() {
        let o = options.clone();
        let module = FusedCrossEntropyLossConfig::new()
            .with_reduction(o.reduction)
            .with_ignore_index(o.ignore_index)
            .with_label_smoothing(o.label_smoothing)
            .with_z_loss_scale(o.z_loss_scale)
            .with_temperature(o.temperature)
            .with_softcap(o.softcap)
            .with_class_weights(call.weights.map(|w| w.to_vec()))
            .with_target_check(o.target_check)
            .with_gradient_plan(o.gradient_plan)
            .with_outputs(o.outputs)
            .with_fast_math(o.fast_math)
            .try_init(&device)?;
        assert_eq!(module.options(), options, "the module keeps its options");
        return Ok(match call.batch {
            None => split(
                module.try_forward_with_outputs(logits, targets)?,
                target_dims,
            ),
            Some(b) => split(
                module.try_forward_with_outputs(
                    logits.reshape([b, rows / b, vocab]),
                    targets.reshape([b, rows / b]),
                )?,
                target_dims,
            ),
        });
    }
    let weights = call.weights.map(|w| Tensor::<1>::from_floats(w, &device));
    Ok(match call.batch {
        None => split(
            try_fused_cross_entropy(logits, targets, weights, options)?,
            target_dims,
        ),
        Some(b) => split(
            try_fused_cross_entropy(
                logits.reshape([b, rows / b, vocab]),
                targets.reshape([b, rows / b]),
                weights,
                options,
            )?,
            target_dims,
        ),
    })
}

fn split<const D: usize>(
    out: CrossEntropyOutput<D>,
    target_dims: Vec<usize>,
) -> (HostOutput, Tensor<1>) {
    let host = HostOutput::read(&out, target_dims);
    let len = out.loss.shape().num_elements();
    (host, out.loss.reshape([len]))
}

/// The call untracked: the logits as the kernel saw them (f64) and the outputs.
pub(crate) fn untracked_call(
    backend: TestBackend,
    call: &Call,
) -> Result<(Vec<f64>, HostOutput), CrossEntropyError> {
    if backend == TestBackend::Cube {
        return Ok(cube_primitives::untracked_call(call));
    }
    let device = backend.device();
    let (logits, seen) = logits_tensor(
        call.values.clone(),
        call.rows,
        call.vocab,
        call.dtype,
        &device,
    );
    let (out, _) = forward(logits, targets_tensor(call.targets, &device), call)?;
    Ok((seen, out))
}

/// The call under autodiff and its backward for `call.incoming`: logits that are an
/// intermediate nobody else holds (`leaf * 1.0`) when `call.exclusive`, else the leaf
/// itself, then checked unchanged.
pub(crate) fn tracked_call(
    backend: TestBackend,
    call: &Call,
) -> Result<Tracked, CrossEntropyError> {
    if backend == TestBackend::Cube {
        return Ok(cube_primitives::tracked_call(call));
    }
    let device = backend.device().autodiff();
    let (logits, seen) = logits_tensor(
        call.values.clone(),
        call.rows,
        call.vocab,
        call.dtype,
        &device,
    );
    let leaf = logits.require_grad();
    let logits = if call.exclusive {
        leaf.clone() * 1.0
    } else {
        leaf.clone()
    };
    let (out, loss) = forward(logits, targets_tensor(call.targets, &device), call)?;
    let [len] = loss.dims();
    let g = call.incoming.rounded(len, call.dtype, &device);
    let grads = call.incoming.objective(loss).backward();
    let grad = leaf.grad(&grads).expect("the logits get a gradient");
    let grad = HostTensor::read(&grad);
    if !call.exclusive {
        let context = format!("{}: backward changed held logits", backend.name());
        assert_same_values(&to_f64(leaf.inner()), &seen, &context);
    }
    Ok(Tracked { seen, out, grad, g })
}
