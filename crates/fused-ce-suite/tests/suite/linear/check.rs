//! One case checked through `Tensor<D>` under autodiff ([`check_linear_case`]): the loss
//! and the three gradients against the f64 reference, the loss against the unfused
//! composition.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn_fused_ce::{
    FusedCrossEntropyLossConfig, FusedLinearCrossEntropyLossConfig, LinearCrossEntropyInputs,
    LmHead, Reduction, try_fused_linear_cross_entropy,
};

use super::{
    LinearCase, LinearValues, bound, case_bound, check_close, check_gradients, loss_len,
    reference_as_seen,
};
use crate::common::*;

/// The module's config for `case`: its options, `class_weights` and chunking.
pub(crate) fn module_config(
    case: &LinearCase,
    class_weights: Option<Vec<f32>>,
) -> FusedLinearCrossEntropyLossConfig {
    let options = &case.options;
    FusedLinearCrossEntropyLossConfig::new()
        .with_loss(
            FusedCrossEntropyLossConfig::new()
                .with_reduction(options.reduction)
                .with_ignore_index(options.ignore_index)
                .with_label_smoothing(options.label_smoothing)
                .with_z_loss_scale(options.z_loss_scale)
                .with_temperature(options.temperature)
                .with_softcap(options.softcap)
                .with_class_weights(class_weights),
        )
        .with_chunking(case.chunking())
}

/// Checks one case through `Tensor<D>` on `backend` (`Fusion` or `Flex`) under autodiff:
/// the loss and the gradients of the hidden states, the weight and the bias against the
/// f64 reference, and the loss against the unfused composition.
pub(crate) fn check_linear_case(backend: TestBackend, case: LinearCase) {
    check_linear_case_seeded(backend, case, fresh_seed());
}

/// [`check_linear_case`] on the inputs `seed` draws.
pub(crate) fn check_linear_case_seeded(backend: TestBackend, case: LinearCase, seed: u64) {
    assert_ne!(
        backend,
        TestBackend::Cube,
        "the plain backend runs on primitives"
    );
    let _backward = shared_device();
    let mut rng = rng(seed);
    let plain = backend.device();
    let device = plain.clone().autodiff();
    let LinearCase {
        rows, width, dtype, ..
    } = case;
    let context = format!("{} {case:?} seed={seed}", backend.name());
    let reduction = case.options.reduction;
    let values = LinearValues::draw(&case, &mut rng);

    let (hidden, weight, bias) = values.tensors(&case, dtype, &plain);
    let reference = reference_as_seen(&case, &values, (&hidden, &weight, &bias));
    let row_grad = values.row_grad.as_slice();

    // Ours under autodiff.
    let hidden_ad = hidden.clone().autodiff().require_grad();
    let weight_ad = weight.clone().autodiff().require_grad();
    let bias_ad = bias.clone().autodiff().require_grad();
    let targets_ad = targets_tensor(&values.targets, &device);
    let weights_ad = values
        .class_weights
        .as_ref()
        .map(|w| Tensor::<1>::from_floats(w.as_slice(), &device));
    let (loss, grads) = if case.via_module {
        let loss_fn = module_config(&case, values.class_weights.clone()).init(&device);
        let head = Linear {
            weight: Param::from_tensor(weight_ad.clone()),
            bias: case.bias.then(|| Param::from_tensor(bias_ad.clone())),
        };
        let loss = if case.three_d {
            loss_fn
                .forward(
                    hidden_ad.clone().reshape([2, rows / 2, width]),
                    &head,
                    targets_ad.reshape([2, rows / 2]),
                )
                .reshape([loss_len(reduction, rows)])
        } else {
            loss_fn.forward(hidden_ad.clone(), &head, targets_ad)
        };
        let grads = objective_of(loss.clone(), reduction, row_grad, values.loss_scale).backward();
        // The parameters are new leaves: read their gradients from the module.
        let grad_weight = to_f64(head.weight.val().grad(&grads).expect("weight gradient"));
        let grad_bias = head
            .bias
            .as_ref()
            .map(|b| to_f64(b.val().grad(&grads).expect("bias gradient")));
        let grad_hidden = to_f64(hidden_ad.grad(&grads).expect("hidden gradient"));
        (loss, (grad_hidden, grad_weight, grad_bias))
    } else {
        let bias_in = case.bias.then(|| bias_ad.clone());
        let loss = if case.three_d {
            try_fused_linear_cross_entropy(
                LinearCrossEntropyInputs::new(
                    hidden_ad.clone().reshape([2, rows / 2, width]),
                    LmHead::new(weight_ad.clone()).with_bias(bias_in),
                    targets_ad.reshape([2, rows / 2]),
                )
                .with_class_weights(weights_ad),
                &case.options,
                &case.chunking(),
            )
            .unwrap_or_else(|e| panic!("{context}: {e}"))
            .loss
            .reshape([loss_len(reduction, rows)])
        } else {
            try_fused_linear_cross_entropy(
                LinearCrossEntropyInputs::new(
                    hidden_ad.clone(),
                    LmHead::new(weight_ad.clone()).with_bias(bias_in),
                    targets_ad,
                )
                .with_class_weights(weights_ad),
                &case.options,
                &case.chunking(),
            )
            .unwrap_or_else(|e| panic!("{context}: {e}"))
            .loss
        };
        let grads = objective_of(loss.clone(), reduction, row_grad, values.loss_scale).backward();
        let grad_hidden = to_f64(hidden_ad.grad(&grads).expect("hidden gradient"));
        let grad_weight = to_f64(weight_ad.grad(&grads).expect("weight gradient"));
        let grad_bias = case
            .bias
            .then(|| to_f64(bias_ad.grad(&grads).expect("bias gradient")));
        (loss, (grad_hidden, grad_weight, grad_bias))
    };
    let (grad_hidden, grad_weight, grad_bias) = grads;
    check_gradients(
        &context,
        case_bound(&case),
        (&grad_hidden, &grad_weight, grad_bias.as_deref()),
        (
            &reference.hidden,
            &reference.weight,
            case.bias.then_some(reference.bias.as_slice()),
        ),
    );
    let (loss_tol, _) = tolerance(dtype);
    let got = to_f64(loss.inner());
    check_close(
        &got,
        &reference.loss,
        loss_tol.max(case_bound(&case) / 2.0),
        &format!("{context}: loss"),
    );

    // The unfused composition on the same inputs, in the same dtype: Burn's matmul, then
    // our loss.
    let logits = match case.bias {
        true => hidden.matmul(weight) + bias.unsqueeze_dim(0),
        false => hidden.matmul(weight),
    };
    let weights = values
        .class_weights
        .as_ref()
        .map(|w| Tensor::<1>::from_floats(w.as_slice(), &plain));
    let unfused = burn_fused_ce::try_fused_cross_entropy(
        logits,
        targets_tensor(&values.targets, &plain),
        weights,
        &case.options,
    )
    .unwrap_or_else(|e| panic!("{context}: unfused: {e}"))
    .loss;
    check_close(
        &got,
        &to_f64(unfused),
        bound(dtype),
        &format!("{context}: against the unfused loss"),
    );
}

/// The training objective: `sum(loss * g)` with a non-uniform `g` per row for `None`,
/// `loss * s` otherwise.
pub(crate) fn objective_of(
    loss: Tensor<1>,
    reduction: Reduction,
    row_grad: &[f32],
    scale: f32,
) -> Tensor<1> {
    match reduction {
        Reduction::None => {
            let g = Tensor::<1>::from_floats(row_grad, &loss.device()).cast(loss.dtype());
            (loss * g).sum()
        }
        _ => loss * scale,
    }
}
