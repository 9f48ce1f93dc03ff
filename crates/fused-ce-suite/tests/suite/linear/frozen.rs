//! The fused linear cross-entropy forms only the gradients autodiff tracks: for each way
//! a model trains through it (the hidden states alone: a frozen head, as adapter
//! fine-tuning has it; the weight alone; the weight and bias: a frozen body, as linear
//! probing has it; all; none: evaluation), in both plans, the products that ran, the
//! gradients that exist, their values against the f64 reference, and the memory a frozen
//! head no longer holds. The module case freezes `nn::Linear` through Burn's own API.

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{DType, Tensor};
use burn_fused_ce::test_hooks::{self, LinearProductCounts};
use burn_fused_ce::{
    FusedLinearCrossEntropyLossConfig, GradientPlan, LinearCrossEntropyInputs, LmHead, Reduction,
    try_fused_linear_cross_entropy,
};

use super::memory::probed_step;
use crate::common::*;
use crate::linear::{
    LinearCase, LinearValues, bound, check_close, objective_of, reference_as_seen,
};
use crate::loss::contract::poisoned;

/// Which of the op's inputs require a gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tracked {
    hidden: bool,
    weight: bool,
    bias: bool,
}

const WAYS: [(&str, Tracked); 5] = [
    (
        "frozen head (hidden states only)",
        Tracked {
            hidden: true,
            weight: false,
            bias: false,
        },
    ),
    (
        "weight only",
        Tracked {
            hidden: false,
            weight: true,
            bias: false,
        },
    ),
    (
        "frozen body (weight and bias)",
        Tracked {
            hidden: false,
            weight: true,
            bias: true,
        },
    ),
    (
        "all",
        Tracked {
            hidden: true,
            weight: true,
            bias: true,
        },
    ),
    (
        "none (evaluation)",
        Tracked {
            hidden: false,
            weight: false,
            bias: false,
        },
    ),
];

/// The products one step asks for: `chunks` logits products in forward (again in
/// backward for the two-pass plan), and one product of each tracked gradient per chunk.
fn expected_counts(tracked: Tracked, chunks: usize, two_pass: bool) -> LinearProductCounts {
    let any = tracked.hidden || tracked.weight || tracked.bias;
    let per = |needed: bool| if needed { chunks } else { 0 };
    LinearProductCounts {
        logits: if any && two_pass { 2 * chunks } else { chunks },
        hidden_gradient: per(tracked.hidden),
        weight_gradient: per(tracked.weight),
        bias_gradient: per(tracked.bias),
    }
}

fn since(before: LinearProductCounts) -> LinearProductCounts {
    let now = test_hooks::linear_product_counts();
    LinearProductCounts {
        logits: now.logits - before.logits,
        hidden_gradient: now.hidden_gradient - before.hidden_gradient,
        weight_gradient: now.weight_gradient - before.weight_gradient,
        bias_gradient: now.bias_gradient - before.bias_gradient,
    }
}

/// One way of training (`tracked`) on `backend` for `case`: the products, the gradients
/// that exist and their values.
fn check_way(backend: TestBackend, case: &LinearCase, name: &str, tracked: Tracked) {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let context = format!("{} {name} {case:?} seed={seed}", backend.name());
    let plain = backend.device();
    let device = plain.clone().autodiff();
    let values = LinearValues::draw(case, &mut rng);
    let (hidden, weight, bias) = values.tensors(case, case.dtype, &plain);
    let reference = reference_as_seen(case, &values, (&hidden, &weight, &bias));
    let leaf = |tensor: Tensor<2>, grad: bool| {
        let tensor = tensor.autodiff();
        if grad { tensor.require_grad() } else { tensor }
    };
    let hidden = leaf(hidden, tracked.hidden);
    let weight = leaf(weight, tracked.weight);
    let bias = match tracked.bias {
        true => bias.autodiff().require_grad(),
        false => bias.autodiff(),
    };
    let reduction = case.options.reduction;
    let before = test_hooks::linear_product_counts();
    let loss = try_fused_linear_cross_entropy(
        LinearCrossEntropyInputs::new(
            hidden.clone(),
            LmHead::new(weight.clone()).with_bias(Some(bias.clone())),
            targets_tensor(&values.targets, &device),
        ),
        &case.options,
        &case.chunking(),
    )
    .unwrap_or_else(|e| panic!("{context}: {e}"))
    .loss;
    let chunks = case.rows.div_ceil(case.chunk_rows);
    let two_pass =
        !(case.options.gradient_plan == GradientPlan::OnePass && reduction != Reduction::None);
    let any = tracked.hidden || tracked.weight || tracked.bias;
    let grads =
        any.then(|| objective_of(loss, reduction, &values.row_grad, values.loss_scale).backward());
    assert_eq!(
        since(before),
        expected_counts(tracked, chunks, two_pass),
        "{context}: the products that ran"
    );
    let Some(grads) = grads else {
        return;
    };
    let bound = bound(case.dtype);
    let check =
        |name: &str, wanted: bool, got: Option<Tensor<2>>, expected: &[f64]| match (wanted, got) {
            (true, Some(got)) => {
                check_close(&to_f64(got), expected, bound, &format!("{context}: {name}"))
            }
            (false, None) => {}
            (true, None) => panic!("{context}: no {name} gradient"),
            (false, Some(_)) => panic!("{context}: a {name} gradient for a frozen input"),
        };
    check(
        "hidden",
        tracked.hidden,
        hidden.grad(&grads),
        &reference.hidden,
    );
    check(
        "weight",
        tracked.weight,
        weight.grad(&grads),
        &reference.weight,
    );
    match (tracked.bias, bias.grad(&grads)) {
        (true, Some(got)) => check_close(
            &to_f64(got),
            &reference.bias,
            bound,
            &format!("{context}: bias"),
        ),
        (false, None) => {}
        (wanted, got) => panic!(
            "{context}: bias gradient wanted {wanted}, got {}",
            got.is_some()
        ),
    }
}

/// Both plans (the one pass for `Mean` and `Sum`, rows and backward for `None` and for
/// `Mean` under `GradientPlan::TwoPass`), with the in-place weight-gradient sum and
/// without, 3 chunks.
fn plan_cases(dtype: DType) -> Vec<LinearCase> {
    let mut cases = Vec::new();
    for (reduction, plan) in [
        (Reduction::Mean, GradientPlan::OnePass),
        (Reduction::Sum, GradientPlan::OnePass),
        (Reduction::None, GradientPlan::OnePass),
        (Reduction::Mean, GradientPlan::TwoPass),
    ] {
        let mut case = LinearCase::new(36, 16, 45, dtype, reduction);
        case.options.gradient_plan = plan;
        case.chunk_rows = 13;
        case.in_place = reduction == Reduction::Sum;
        case.options.label_smoothing = if plan == GradientPlan::TwoPass {
            0.1
        } else {
            0.0
        };
        cases.push(case);
    }
    cases
}

#[test]
fn frozen_inputs_form_no_gradient_on_the_default_fusion_backend() {
    poisoned();
    for dtype in float_dtypes() {
        for case in plan_cases(dtype) {
            for (name, tracked) in WAYS {
                check_way(TestBackend::Fusion, &case, name, tracked);
            }
        }
    }
}

#[test]
fn frozen_inputs_form_no_gradient_on_flex_through_the_portable_path() {
    for case in plan_cases(DType::F32) {
        for (name, tracked) in WAYS {
            check_way(TestBackend::Flex, &case, name, tracked);
        }
    }
}

/// A frozen head's step holds no `[H, V]` weight gradient: its peak in use drops by that
/// buffer.
#[test]
fn frozen_head_holds_no_weight_gradient() {
    // Alone on the device: other tests' buffers would count.
    let _alone = exclusive_device();
    let seed = fresh_seed();
    let (rows, width, vocab) = (128, 64, 4096);
    let weight_gradient = (width * vocab * DType::F32.size()) as u64;
    let full = probed_step((rows, width, vocab), 32, true, seed);
    let frozen = probed_step((rows, width, vocab), 32, false, seed);
    println!(
        "bytes in use beyond the inputs at the products: {full} (all tracked), {frozen} (frozen head); the weight gradient {weight_gradient}"
    );
    assert!(
        frozen + weight_gradient <= full,
        "seed={seed}: a frozen head peaked at {frozen} bytes, the full step at {full}: the \
         weight gradient's {weight_gradient} bytes are still held"
    );
}

/// `nn::Linear` frozen through Burn's API (`no_grad()` on the module, or
/// `Param::set_require_grad(false)`) in the module: no weight or bias gradient, and none
/// formed; the hidden states' gradient as the reference's.
#[test]
fn frozen_module_head() {
    let _backward = shared_device();
    let case = LinearCase::new(20, 16, 45, DType::F32, Reduction::Mean);
    for freeze in ["no_grad", "set_require_grad"] {
        let seed = fresh_seed();
        let mut rng = rng(seed);
        let context = format!("{freeze} seed={seed}");
        let plain = TestBackend::Fusion.device();
        let device = plain.clone().autodiff();
        let values = LinearValues::draw(&case, &mut rng);
        let (hidden, weight, bias) = values.tensors(&case, case.dtype, &plain);
        let reference = reference_as_seen(&case, &values, (&hidden, &weight, &bias));
        let head = Linear {
            weight: Param::from_tensor(weight.autodiff()),
            bias: Some(Param::from_tensor(bias.autodiff())),
        };
        let head = match freeze {
            "no_grad" => head.no_grad(),
            _ => Linear {
                weight: head.weight.set_require_grad(false),
                bias: head.bias.map(|bias| bias.set_require_grad(false)),
            },
        };
        let hidden = hidden.autodiff().require_grad();
        let loss_fn = FusedLinearCrossEntropyLossConfig::new()
            .with_chunking(case.chunking())
            .init(&device);
        let before = test_hooks::linear_product_counts();
        let loss = loss_fn.forward(
            hidden.clone(),
            &head,
            targets_tensor(&values.targets, &device),
        );
        let grads = (loss * values.loss_scale).backward();
        let counts = since(before);
        assert_eq!(
            (counts.weight_gradient, counts.bias_gradient),
            (0, 0),
            "{context}: a frozen head's gradients are not formed"
        );
        assert!(
            counts.hidden_gradient > 0,
            "{context}: the hidden states' is"
        );
        assert!(
            head.weight.val().grad(&grads).is_none(),
            "{context}: weight gradient"
        );
        let got = to_f64(hidden.grad(&grads).expect("hidden gradient"));
        check_close(&got, &reference.hidden, bound(case.dtype), &context);
    }
}
