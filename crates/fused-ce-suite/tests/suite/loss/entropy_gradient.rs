//! The entropy output's gradient, as an RL objective uses it (`a * loss - b * entropy`
//! with per-row `a` and `b`): the loss and the fused linear cross-entropy, every
//! reduction in the plans that read the logits in backward (`Reduction::None`,
//! `GradientPlan::TwoPass`), every option, f32/f16/bf16 where the runtime has them,
//! against the f64 reference; the reference's formula against finite differences; an
//! explicit one pass refusing a differentiable entropy at forward, and a metric entropy
//! costing the one pass nothing.

use burn::tensor::{DType, Distribution, Tensor};
use burn_fused_ce::test_hooks;
use burn_fused_ce::{
    CrossEntropyError, CrossEntropyOptions, CrossEntropyOutput, EntropyOutput, ExtraOutputs,
    FusedCrossEntropyLossConfig, FusedLinearCrossEntropyLossConfig, GradientPlan, LinearChunking,
    LinearCrossEntropyInputs, LmHead, Reduction, try_fused_cross_entropy,
    try_fused_linear_cross_entropy,
};
use rand::{Rng, rngs::SmallRng};

use super::contract::{REDUCTIONS, poisoned};
use crate::common::*;
use crate::linear::{DrawnHead, bound, check_close};

/// Which terms the objective has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Objective {
    /// `sum a_i loss_i - sum b_i H_i` (`a * loss - sum b_i H_i` for a reduced loss).
    LossAndEntropy,
    /// `-sum b_i H_i`: the loss is not used.
    EntropyAlone,
}

#[derive(Debug, Clone)]
struct EntropyCase {
    rows: usize,
    vocab: usize,
    dtype: DType,
    options: CrossEntropyOptions,
    class_weights: bool,
    ignore: Ignore,
    three_d: bool,
    objective: Objective,
}

impl EntropyCase {
    /// The targets, the class weights (where the case has them) and the incoming
    /// gradients, drawn in that order.
    fn draw_labels(&self, rng: &mut SmallRng) -> (Vec<i64>, Option<Vec<f32>>, Incoming) {
        let targets = random_targets(
            rng,
            self.rows,
            self.vocab,
            self.ignore,
            self.options.ignore_index,
        );
        let class_weights = self
            .class_weights
            .then(|| random_class_weights(rng, self.vocab));
        let incoming = Incoming::draw(rng, self.rows, self.options.reduction);
        (targets, class_weights, incoming)
    }
}

/// The incoming gradients: the loss's (`[N]` for `None`, one value otherwise) and the
/// entropy's `-b`, both non-uniform, never 0.
struct Incoming {
    loss: Vec<f32>,
    entropy: Vec<f32>,
}

impl Incoming {
    fn draw(rng: &mut SmallRng, rows: usize, reduction: Reduction) -> Self {
        let loss_len = if reduction == Reduction::None {
            rows
        } else {
            1
        };
        Self {
            loss: (0..loss_len)
                .map(|_| rng.random_range(0.5f32..1.5))
                .collect(),
            entropy: (0..rows).map(|_| -rng.random_range(0.2f32..2.0)).collect(),
        }
    }

    /// The objective whose gradient these are, of the loss and the entropy (`[N]` each
    /// or a reduced loss of one element).
    fn objective(&self, loss: Tensor<1>, entropy: Tensor<1>, objective: Objective) -> Tensor<1> {
        let device = entropy.device();
        let b = Tensor::<1>::from_floats(self.entropy.as_slice(), &device);
        let entropy_term = (entropy * b).sum();
        match objective {
            Objective::EntropyAlone => entropy_term,
            Objective::LossAndEntropy => {
                let a = Tensor::<1>::from_floats(self.loss.as_slice(), &device);
                let loss_term = (loss.cast(DType::F32) * a).sum();
                loss_term + entropy_term
            }
        }
    }

    /// The f64 reference gradient of the logits for this objective.
    fn reference(
        &self,
        logits: &[f64],
        vocab: usize,
        targets: &[i64],
        options: &RefOptions,
        objective: Objective,
    ) -> Vec<f64> {
        let g_entropy: Vec<f64> = self.entropy.iter().map(|&g| g as f64).collect();
        let mut grad = reference_entropy_grad(logits, vocab, targets, options, &g_entropy);
        if objective == Objective::LossAndEntropy {
            let g_loss: Vec<f64> = self.loss.iter().map(|&g| g as f64).collect();
            let loss_grad = reference_grad(logits, vocab, targets, options, &g_loss);
            grad.iter_mut().zip(loss_grad).for_each(|(g, l)| *g += l);
        }
        grad
    }
}

/// Every option in turn and all together, each reduction in a plan that reads the logits
/// in backward, both objectives, with 3-D input and class weights alternating.
fn cases(dtypes: &[DType], rows: usize, vocab: usize) -> Vec<EntropyCase> {
    let mut cases = Vec::new();
    let mut n = 0;
    for &dtype in dtypes {
        for reduction in REDUCTIONS {
            for variant in 0..6 {
                n += 1;
                let mut options = CrossEntropyOptions::new(reduction);
                // The default plan keeps the logits for a differentiable entropy itself.
                options.gradient_plan = if n % 2 == 0 {
                    GradientPlan::TwoPass
                } else {
                    GradientPlan::Auto
                };
                options.outputs = ExtraOutputs {
                    entropy: EntropyOutput::Differentiable,
                    ..ExtraOutputs::default()
                };
                match variant {
                    0 => {}
                    1 => options.temperature = Some(0.7),
                    2 => options.softcap = Some(5.0),
                    3 => options.label_smoothing = 0.1,
                    4 => options.z_loss_scale = 1e-3,
                    _ => {
                        options.temperature = Some(1.3);
                        options.softcap = Some(8.0);
                        options.label_smoothing = 0.05;
                        options.z_loss_scale = 1e-4;
                    }
                }
                cases.push(EntropyCase {
                    rows,
                    vocab,
                    dtype,
                    options,
                    class_weights: n % 3 == 0 || variant == 5,
                    ignore: Ignore::SomeRows,
                    three_d: n % 2 == 0,
                    objective: if n % 4 == 3 {
                        Objective::EntropyAlone
                    } else {
                        Objective::LossAndEntropy
                    },
                });
            }
        }
    }
    cases
}

/// A call's loss and entropy as rank 1 (the entropy asked for).
fn flat_outputs<const D: usize>(
    output: Result<CrossEntropyOutput<D>, CrossEntropyError>,
) -> Result<(Tensor<1>, Tensor<1>), CrossEntropyError> {
    let output = output?;
    let flat = |tensor: Tensor<D>| {
        let elements = tensor.shape().num_elements();
        tensor.reshape([elements])
    };
    let entropy = output.entropy.expect("the entropy was asked for");
    Ok((flat(output.loss), flat(entropy)))
}

/// The loss's logits gradient for `case` on `backend` against the f64 reference.
fn check_loss_case(backend: TestBackend, case: &EntropyCase, seed: u64) {
    let _backward = shared_device();
    let mut rng = rng(seed);
    let context = format!("{} {case:?} seed={seed}", backend.name());
    let EntropyCase {
        rows, vocab, dtype, ..
    } = *case;
    let device = backend.device().autodiff();
    let (targets, class_weights, incoming) = case.draw_labels(&mut rng);
    let (logits, seen) = logits_tensor(
        random_logits(&mut rng, rows, vocab),
        rows,
        vocab,
        dtype,
        &device,
    );
    let logits = logits.require_grad();
    let weights = class_weights
        .as_ref()
        .map(|w| Tensor::<1>::from_floats(w.as_slice(), &device));
    let targets_ad = targets_tensor(&targets, &device);
    let (loss, entropy) = if case.three_d {
        flat_outputs(try_fused_cross_entropy(
            logits.clone().reshape([2, rows / 2, vocab]),
            targets_ad.reshape([2, rows / 2]),
            weights,
            &case.options,
        ))
    } else {
        flat_outputs(try_fused_cross_entropy(
            logits.clone(),
            targets_ad,
            weights,
            &case.options,
        ))
    }
    .unwrap_or_else(|e| panic!("{context}: {e}"));
    let grads = incoming.objective(loss, entropy, case.objective).backward();
    let got = to_f64(logits.grad(&grads).expect("logits gradient"));
    let ref_options = RefOptions::new(&case.options, class_weights.as_deref());
    let expected = incoming.reference(&seen, vocab, &targets, &ref_options, case.objective);
    check_close(&got, &expected, grad_bound(dtype), &context);
}

/// The gradient's relative L2 bound: the spec's for the dtype, and for f32 a little over
/// it (the entropy's term adds one more f32 rounding per element).
fn grad_bound(dtype: DType) -> f64 {
    let (_, grad) = tolerance(dtype);
    if dtype == DType::F32 {
        4.0 * grad
    } else {
        grad
    }
}

#[test]
fn loss_entropy_gradient_on_the_default_fusion_backend() {
    poisoned();
    for case in cases(&float_dtypes(), 14, 193) {
        check_loss_case(TestBackend::Fusion, &case, fresh_seed());
    }
}

#[test]
fn loss_entropy_gradient_on_flex_through_the_portable_path() {
    for case in cases(&[DType::F32], 10, 67) {
        check_loss_case(TestBackend::Flex, &case, fresh_seed());
    }
}

/// The fused linear cross-entropy's gradients of the hidden states, the weight and the
/// bias for `case` (chunks of 4 rows) against the f64 reference.
fn check_linear_case(backend: TestBackend, case: &EntropyCase, seed: u64) {
    let _backward = shared_device();
    let mut rng = rng(seed);
    let context = format!("fused linear, {} {case:?} seed={seed}", backend.name());
    let EntropyCase {
        rows, vocab, dtype, ..
    } = *case;
    let width = 16;
    let plain = backend.device();
    let device = plain.clone().autodiff();
    let (targets, class_weights, incoming) = case.draw_labels(&mut rng);
    let dims = (rows, width, vocab);
    let head = DrawnHead::draw(&mut rng, dims, dtype, &plain);
    let (hidden, weight, bias) = head.tracked();
    let chunking = LinearChunking {
        logits_bytes: Some(4 * vocab * dtype.size()),
        ..LinearChunking::default()
    };
    let weights = class_weights
        .as_ref()
        .map(|w| Tensor::<1>::from_floats(w.as_slice(), &device));
    let targets_ad = targets_tensor(&targets, &device);
    let (loss, entropy) = if case.three_d {
        flat_outputs(try_fused_linear_cross_entropy(
            LinearCrossEntropyInputs::new(
                hidden.clone().reshape([2, rows / 2, width]),
                LmHead::new(weight.clone()).with_bias(Some(bias.clone())),
                targets_ad.reshape([2, rows / 2]),
            )
            .with_class_weights(weights),
            &case.options,
            &chunking,
        ))
    } else {
        flat_outputs(try_fused_linear_cross_entropy(
            LinearCrossEntropyInputs::new(
                hidden.clone(),
                LmHead::new(weight.clone()).with_bias(Some(bias.clone())),
                targets_ad,
            )
            .with_class_weights(weights),
            &case.options,
            &chunking,
        ))
    }
    .unwrap_or_else(|e| panic!("{context}: {e}"));
    let grads = incoming.objective(loss, entropy, case.objective).backward();

    let logits64 = head.logits_f64(dims);
    let ref_options = RefOptions::new(&case.options, class_weights.as_deref());
    let dlogits = incoming.reference(&logits64, vocab, &targets, &ref_options, case.objective);
    head.check_gradients(
        &context,
        2.0 * bound(dtype),
        (hidden.grad(&grads), weight.grad(&grads), bias.grad(&grads)),
        &dlogits,
        dims,
    );
}

#[test]
fn linear_entropy_gradient_on_the_default_fusion_backend() {
    poisoned();
    for case in cases(&float_dtypes(), 10, 67) {
        check_linear_case(TestBackend::Fusion, &case, fresh_seed());
    }
}

#[test]
fn linear_entropy_gradient_on_flex_through_the_portable_path() {
    for case in cases(&[DType::F32], 10, 67) {
        check_linear_case(TestBackend::Flex, &case, fresh_seed());
    }
}

/// The reference's `dH/dx` against central differences of the f64 entropy, through the
/// temperature and the softcap, on tiny rows: the formula itself.
#[test]
fn entropy_gradient_formula_matches_finite_differences() {
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let vocab = 7;
    for (temperature, softcap) in [
        (None, None),
        (Some(0.6), None),
        (None, Some(3.0)),
        (Some(1.7), Some(4.0)),
    ] {
        let mut options = CrossEntropyOptions::new(Reduction::None);
        options.temperature = temperature;
        options.softcap = softcap;
        let ref_options = RefOptions::new(&options, None);
        for _ in 0..4 {
            let row: Vec<f64> = (0..vocab).map(|_| rng.random_range(-4.0..4.0)).collect();
            let g = rng.random_range(0.5..1.5);
            let analytic = reference_entropy_grad(&row, vocab, &[0], &ref_options, &[g]);
            let entropy_of = |x: &[f64]| softmax_entropy(&ref_options.capped(x));
            let step = 1e-6;
            for c in 0..vocab {
                let (mut up, mut down) = (row.clone(), row.clone());
                up[c] += step;
                down[c] -= step;
                let numeric = g * (entropy_of(&up) - entropy_of(&down)) / (2.0 * step);
                assert!(
                    (numeric - analytic[c]).abs() <= 1e-7 + 1e-6 * numeric.abs(),
                    "seed={seed} T={temperature:?} cap={softcap:?} class {c}: finite \
                     differences {numeric}, formula {}",
                    analytic[c]
                );
            }
        }
    }
}

/// The message a panic carried.
/// An explicit `GradientPlan::OnePass` with a differentiable entropy is refused at
/// forward, by the functions and by the configs' `try_init`, for every reduction: the one
/// pass forms the loss's gradient alone.
#[test]
fn one_pass_with_a_differentiable_entropy_is_refused_at_forward() {
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let device = TestBackend::Fusion.device().autodiff();
    let (rows, vocab, width) = (6, 33, 8);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::NoRows, -100);
    let is_refused = |result: Result<(), CrossEntropyError>, what: &str| match result {
        Err(CrossEntropyError::InvalidOption { name, .. }) => {
            assert_eq!(name, "gradient_plan", "seed={seed}: {what}")
        }
        other => panic!("seed={seed}: {what}: expected the plan refused, got {other:?}"),
    };
    for reduction in REDUCTIONS {
        let options = CrossEntropyOptions::new(reduction)
            .with_gradient_plan(GradientPlan::OnePass)
            .with_outputs(ExtraOutputs {
                entropy: EntropyOutput::Differentiable,
                ..ExtraOutputs::default()
            });
        let (logits, _) = logits_tensor(
            random_logits(&mut rng, rows, vocab),
            rows,
            vocab,
            DType::F32,
            &device,
        );
        let result = try_fused_cross_entropy(
            logits.require_grad(),
            targets_tensor(&targets, &device),
            None,
            &options,
        );
        is_refused(result.map(drop), "the loss");
        let hidden = Tensor::<2>::random([rows, width], Distribution::Default, &device);
        let weight = Tensor::<2>::random([width, vocab], Distribution::Default, &device);
        let inputs = LinearCrossEntropyInputs::new(
            hidden.require_grad(),
            LmHead::new(weight.require_grad()),
            targets_tensor(&targets, &device),
        );
        let result = try_fused_linear_cross_entropy(inputs, &options, &LinearChunking::default());
        is_refused(result.map(drop), "the fused linear cross-entropy");
        let config = FusedCrossEntropyLossConfig::new()
            .with_reduction(reduction)
            .with_gradient_plan(GradientPlan::OnePass)
            .with_outputs(options.outputs);
        is_refused(config.try_init(&device).map(drop), "the loss's config");
        let linear = FusedLinearCrossEntropyLossConfig::new().with_loss(config);
        is_refused(linear.try_init(&device).map(drop), "the linear config");
    }
}

/// A metric entropy is a constant: under the default plan `Mean` keeps the one pass (the
/// fused linear op forms no logits in backward), the entropy is the reference's, and an
/// objective that uses it anyway differentiates as the loss alone does. A differentiable
/// entropy under the same default plan takes the two passes.
#[test]
fn a_metric_entropy_has_no_gradient_and_keeps_the_one_pass() {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let device = TestBackend::Fusion.device().autodiff();
    let (rows, vocab, width) = (6, 33, 8);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    let hidden = Tensor::<2>::random([rows, width], Distribution::Default, &device);
    let weight = Tensor::<2>::random([width, vocab], Distribution::Default, &device);
    let bonus = Tensor::<1>::from_floats(
        (0..rows)
            .map(|_| rng.random_range(0.2f32..2.0))
            .collect::<Vec<_>>()
            .as_slice(),
        &device,
    );
    // The objective `loss - sum_i b_i H_i`, its gradient of the hidden states, and the
    // logits products the call asked for.
    let run = |entropy: EntropyOutput| {
        let hidden = hidden.clone().require_grad();
        let options = CrossEntropyOptions::new(Reduction::Mean).with_outputs(ExtraOutputs {
            entropy,
            ..ExtraOutputs::default()
        });
        let before = test_hooks::linear_product_counts().logits;
        let inputs = LinearCrossEntropyInputs::new(
            hidden.clone(),
            LmHead::new(weight.clone()),
            targets_tensor(&targets, &device),
        );
        let out = try_fused_linear_cross_entropy(inputs, &options, &LinearChunking::default())
            .expect("valid input");
        let entropy = out.entropy.expect("asked for");
        let objective = out.loss - (entropy.clone() * bonus.clone()).sum();
        let grads = objective.backward();
        let grad = data_to_f64(hidden.grad(&grads).expect("tracked").into_data());
        let products = test_hooks::linear_product_counts().logits - before;
        (data_to_f64(entropy.into_data()), grad, products)
    };
    let (metric, metric_grad, metric_products) = run(EntropyOutput::Metric);
    let (differentiable, differentiable_grad, differentiable_products) =
        run(EntropyOutput::Differentiable);
    assert_eq!(
        metric_products, 1,
        "seed={seed}: the one pass forms the logits once"
    );
    assert_eq!(
        differentiable_products, 2,
        "seed={seed}: two passes form them again in backward"
    );
    for (a, b) in metric.iter().zip(&differentiable) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "seed={seed}: entropies {a} {b}"
        );
    }
    // The loss alone, with no entropy asked for.
    let loss_alone = {
        let hidden = hidden.clone().require_grad();
        let inputs = LinearCrossEntropyInputs::new(
            hidden.clone(),
            LmHead::new(weight.clone()),
            targets_tensor(&targets, &device),
        );
        let options = CrossEntropyOptions::new(Reduction::Mean);
        let out = try_fused_linear_cross_entropy(inputs, &options, &LinearChunking::default())
            .expect("valid input");
        let grads = out.loss.backward();
        data_to_f64(hidden.grad(&grads).expect("tracked").into_data())
    };
    let mut entropy_moved_it = false;
    for ((m, l), d) in metric_grad
        .iter()
        .zip(&loss_alone)
        .zip(&differentiable_grad)
    {
        assert!(
            (m - l).abs() <= 1e-5 * (1.0 + l.abs()),
            "seed={seed}: a metric entropy adds no gradient: {m} against {l}"
        );
        entropy_moved_it |= (d - l).abs() > 1e-3 * (1.0 + l.abs());
    }
    assert!(
        entropy_moved_it,
        "seed={seed}: a differentiable entropy changes the gradient"
    );
}
