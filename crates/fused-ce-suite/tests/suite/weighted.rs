//! The weighted objective `R(w_r loss_r - c_r H_r)`: the rows' weights given with the
//! targets ([`Targets`]). Its value and gradient against the f64 reference, through the
//! loss (module and function) and the fused linear cross-entropy, every reduction, the
//! default plan (the one pass for `Mean` and `Sum`), `OnePass` and `TwoPass`, on the cube
//! device and Flex, with and without entropy weights; weights negative, all zero, and NaN
//! on ignored rows (which stay exactly 0); every option mixed in. The reference's
//! gradient against finite differences; micro-batches over the whole batch's denominators
//! against the whole batch; the one pass forming the weighted gradient with no logits
//! formed again in backward; weights of the wrong shape refused by variant.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_fused_ce::{
    CrossEntropyError, CrossEntropyOptions, FusedCrossEntropyLossConfig, GradientPlan, Input,
    LinearChunking, LinearCrossEntropyInputs, LmHead, MeanDenominators, Reduction, Targets,
    test_hooks, try_fused_cross_entropy, try_fused_linear_cross_entropy,
};
use rand::{Rng, rngs::SmallRng};

use crate::common::*;
use crate::linear::{DrawnHead, bound, check_close};
use crate::loss::contract::{REDUCTIONS, poisoned};

/// How a case's loss weights are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LossWeights {
    /// None given (each row's loss counts once).
    Absent,
    /// In `[-1, 2)`: some negative, as advantages are.
    Signed,
    /// All 0.
    Zero,
}

#[derive(Debug, Clone)]
struct WeightedCase {
    rows: usize,
    vocab: usize,
    dtype: DType,
    options: CrossEntropyOptions,
    class_weights: bool,
    loss_weights: LossWeights,
    entropy_weights: bool,
    three_d: bool,
    /// The first this many columns of every even row are `-inf` (the target's kept).
    masked_columns: usize,
}

/// One case's labels and weights: targets (some ignored), class weights, the rows'
/// weights (NaN on the ignored rows: they must not matter), and the incoming gradient.
struct Labels {
    targets: Vec<i64>,
    class_weights: Option<Vec<f32>>,
    loss_weights: Option<Vec<f32>>,
    entropy_weights: Option<Vec<f32>>,
    incoming: Vec<f32>,
}

impl WeightedCase {
    fn draw(&self, rng: &mut SmallRng) -> Labels {
        let targets = random_targets(
            rng,
            self.rows,
            self.vocab,
            Ignore::SomeRows,
            self.options.ignore_index,
        );
        let class_weights = self
            .class_weights
            .then(|| random_class_weights(rng, self.vocab));
        let ignored = |row: usize| targets[row] == self.options.ignore_index;
        let per_row = |range: std::ops::Range<f32>, rng: &mut SmallRng| -> Vec<f32> {
            (0..self.rows)
                .map(|row| {
                    let value = rng.random_range(range.clone());
                    if ignored(row) { f32::NAN } else { value }
                })
                .collect()
        };
        let loss_weights = match self.loss_weights {
            LossWeights::Absent => None,
            LossWeights::Signed => Some(per_row(-1.0..2.0, rng)),
            // Exact zeros on the counted rows (NaN on the others, as every case).
            LossWeights::Zero => Some(per_row(0.0..1.0, rng)).map(|w| {
                w.iter()
                    .map(|&v| if v.is_nan() { v } else { 0.0 })
                    .collect()
            }),
        };
        let entropy_weights = self.entropy_weights.then(|| per_row(0.01..0.5, rng));
        let incoming_len = if self.options.reduction == Reduction::None {
            self.rows
        } else {
            1
        };
        let incoming = (0..incoming_len)
            .map(|_| rng.random_range(0.5f32..1.5))
            .collect();
        Labels {
            targets,
            class_weights,
            loss_weights,
            entropy_weights,
            incoming,
        }
    }
}

impl Labels {
    /// The targets with the weights, shaped `dims` (`[N]` or `[B, T]`), on `device`.
    fn targets<const D: usize>(&self, dims: [usize; D], device: &Device) -> Targets<D> {
        let classes =
            Tensor::<D, Int>::from_data(TensorData::new(self.targets.clone(), dims), device);
        let floats = |values: &Option<Vec<f32>>| {
            values
                .as_ref()
                .map(|v| Tensor::<D>::from_data(TensorData::new(v.clone(), dims), device))
        };
        Targets::new(classes)
            .with_weights(floats(&self.loss_weights))
            .with_entropy_weights(floats(&self.entropy_weights))
    }

    fn class_weights(&self, device: &Device) -> Option<Tensor<1>> {
        self.class_weights
            .as_ref()
            .map(|w| Tensor::<1>::from_floats(w.as_slice(), device))
    }

    /// The f64 reference of the weighted objective on `logits [rows, vocab]` under
    /// `options`: its value (the loss output), the size of its terms (see
    /// [`objective_terms`]) and its gradient for the incoming gradient.
    fn reference(
        &self,
        options: &CrossEntropyOptions,
        logits: &[f64],
        vocab: usize,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let rows = self.targets.len();
        // The weights as the reference takes them: `w` (1 without), `c` (0 without).
        let as_f64 = |values: &Option<Vec<f32>>, default: f64| -> Vec<f64> {
            values.as_ref().map_or(vec![default; rows], |v| {
                v.iter().map(|&x| x as f64).collect()
            })
        };
        let (w, c) = (
            as_f64(&self.loss_weights, 1.0),
            as_f64(&self.entropy_weights, 0.0),
        );
        let ref_options = RefOptions::new(options, self.class_weights.as_deref());
        let ref_rows = reference_rows(logits, vocab, &self.targets, &ref_options);
        let loss = reference_weighted_loss(&ref_rows, options.reduction, &w, &c);
        let terms = objective_terms(&ref_rows, options.reduction, &w, &c);
        let g: Vec<f64> = self.incoming.iter().map(|&g| g as f64).collect();
        let grad = reference_weighted_grad(logits, vocab, &self.targets, &ref_options, &g, &w, &c);
        (loss, terms, grad)
    }

    /// The objective whose gradient is taken: the loss times the incoming gradient.
    fn objective(&self, loss: Tensor<1>) -> Tensor<1> {
        let device = loss.device();
        let g = Tensor::<1>::from_floats(self.incoming.as_slice(), &device);
        (loss.cast(DType::F32) * g).sum()
    }
}

/// Every reduction, every plan the objective allows, loss weights and entropy weights in
/// turn and together, every option mixed in on some cases.
fn cases(dtypes: &[DType], rows: usize, vocab: usize) -> Vec<WeightedCase> {
    let mut cases = Vec::new();
    let mut n = 0;
    for &dtype in dtypes {
        for reduction in REDUCTIONS {
            for plan in [
                GradientPlan::Auto,
                GradientPlan::OnePass,
                GradientPlan::TwoPass,
            ] {
                for (loss_weights, entropy_weights) in [
                    (LossWeights::Signed, false),
                    (LossWeights::Absent, true),
                    (LossWeights::Signed, true),
                    (LossWeights::Zero, true),
                ] {
                    n += 1;
                    let mut options = CrossEntropyOptions::new(reduction).with_gradient_plan(plan);
                    match n % 4 {
                        0 => {}
                        1 => options.temperature = Some(0.7),
                        2 => {
                            options.label_smoothing = 0.1;
                            options.z_loss_scale = 1e-3;
                        }
                        _ => {
                            options.temperature = Some(1.3);
                            options.softcap = Some(8.0);
                            options.label_smoothing = 0.05;
                            options.z_loss_scale = 1e-4;
                        }
                    }
                    cases.push(WeightedCase {
                        rows,
                        vocab,
                        dtype,
                        options,
                        class_weights: n % 3 == 0,
                        loss_weights,
                        entropy_weights,
                        three_d: n % 2 == 0,
                        masked_columns: 0,
                    });
                }
            }
        }
    }
    cases
}

/// The gradient's bound: the spec's for the dtype, a little over it for f32 (the
/// entropy's term adds one more rounding per element).
fn grad_bound(dtype: DType) -> f64 {
    let (_, grad) = tolerance(dtype);
    if dtype == DType::F32 {
        4.0 * grad
    } else {
        grad
    }
}

/// The loss's value and logits gradient for `case` on `backend`, through the function or
/// the module, against the f64 reference.
/// The size of the weighted objective's terms: the reference with `|w|` and `-|c|`, which
/// bounds the objective's value and adds its terms without cancelling.
fn objective_terms(rows: &[RefRow], reduction: Reduction, w: &[f64], c: &[f64]) -> Vec<f64> {
    let abs_w: Vec<f64> = w.iter().map(|v| v.abs()).collect();
    let minus_abs_c: Vec<f64> = c.iter().map(|v| -v.abs()).collect();
    reference_weighted_loss(rows, reduction, &abs_w, &minus_abs_c)
}

/// The objective's loss within `bound` of the reference, relative to the size of its terms:
/// weights of both signs and the entropy's bonus can sum to nearly 0, where the terms'
/// f32 rounding would be a large error relative to the value itself.
fn check_objective(got: &[f64], expected: &[f64], terms: &[f64], bound: f64, context: &str) {
    let err = relative_l2_to(got, expected, terms);
    assert!(
        err <= bound,
        "{context}: loss error {err:e} > {bound:e} of the terms' size\ngot {got:?}\nexpected {expected:?}"
    );
}

fn check_loss_case(backend: TestBackend, case: &WeightedCase, via_module: bool, seed: u64) {
    let _backward = shared_device();
    let mut rng = rng(seed);
    let context = format!(
        "{} module={via_module} {case:?} seed={seed}",
        backend.name()
    );
    let WeightedCase {
        rows, vocab, dtype, ..
    } = *case;
    let device = backend.device().autodiff();
    let labels = case.draw(&mut rng);
    let mut values = random_logits(&mut rng, rows, vocab);
    for row in (0..rows).step_by(2) {
        let target = labels.targets[row];
        for col in 0..case.masked_columns.min(vocab) {
            if col as i64 != target {
                values[row * vocab + col] = f32::NEG_INFINITY;
            }
        }
    }
    let (logits, seen) = logits_tensor(values, rows, vocab, dtype, &device);
    let logits = logits.require_grad();
    let run = |logits: Tensor<2>| -> Result<Tensor<1>, CrossEntropyError> {
        let module = || {
            let options = &case.options;
            FusedCrossEntropyLossConfig::new()
                .with_reduction(options.reduction)
                .with_label_smoothing(options.label_smoothing)
                .with_z_loss_scale(options.z_loss_scale)
                .with_temperature(options.temperature)
                .with_softcap(options.softcap)
                .with_gradient_plan(options.gradient_plan)
                .with_class_weights(labels.class_weights.clone())
                .try_init(&device)
        };
        let loss = if case.three_d {
            let logits = logits.reshape([2, rows / 2, vocab]);
            let targets = labels.targets([2, rows / 2], &device);
            if via_module {
                module()?.try_forward(logits, targets)?
            } else {
                let weights = labels.class_weights(&device);
                try_fused_cross_entropy(logits, targets, weights, &case.options)?.loss
            }
            .reshape([loss_len(case)])
        } else {
            let targets = labels.targets([rows], &device);
            if via_module {
                module()?.try_forward(logits, targets)?
            } else {
                let weights = labels.class_weights(&device);
                try_fused_cross_entropy(logits, targets, weights, &case.options)?.loss
            }
            .reshape([loss_len(case)])
        };
        Ok(loss)
    };
    let loss = run(logits.clone()).unwrap_or_else(|e| panic!("{context}: {e}"));
    let got_loss = to_f64(loss.clone());
    let grads = labels.objective(loss).backward();
    let got_grad = to_f64(logits.grad(&grads).expect("logits gradient"));

    let (expected_loss, terms, expected_grad) = labels.reference(&case.options, &seen, vocab);
    let (loss_tol, _) = tolerance(dtype);
    check_objective(&got_loss, &expected_loss, &terms, loss_tol, &context);
    check_close(
        &got_grad,
        &expected_grad,
        grad_bound(dtype),
        &format!("{context}: grad"),
    );
    // Ignored rows are exactly 0, whatever their (NaN) weights.
    for (row, &y) in labels.targets.iter().enumerate() {
        if y == case.options.ignore_index {
            let grad_row = &got_grad[row * vocab..(row + 1) * vocab];
            assert!(
                grad_row.iter().all(|&v| v == 0.0),
                "{context}: ignored row {row} has a gradient"
            );
            if case.options.reduction == Reduction::None {
                assert_eq!(got_loss[row], 0.0, "{context}: ignored row {row}'s loss");
            }
        }
    }
}

/// The loss's length: the rows for `None`, one otherwise.
fn loss_len(case: &WeightedCase) -> usize {
    if case.options.reduction == Reduction::None {
        case.rows
    } else {
        1
    }
}

#[test]
fn weighted_loss_on_the_default_fusion_backend() {
    poisoned();
    for (i, case) in cases(&float_dtypes(), 14, 193).iter().enumerate() {
        check_loss_case(TestBackend::Fusion, case, i % 2 == 0, fresh_seed());
    }
}

/// Rows longer than a one-pass cube's stage (on lavapipe and CUDA, every dtype): the
/// gradient of a chunk's staged part is formed from its kept exponentials, the entropy's
/// part from their logarithms, and the rest from the logits read again. Half the cases
/// mask each even row's first 17000 columns, so that whole stages hold only `-inf`.
#[test]
fn weighted_loss_on_rows_longer_than_the_stage() {
    poisoned();
    let mut n = 0;
    for dtype in float_dtypes() {
        for reduction in REDUCTIONS {
            for masked_columns in [0, 17_000] {
                n += 1;
                let mut options =
                    CrossEntropyOptions::new(reduction).with_gradient_plan(GradientPlan::OnePass);
                if n % 3 == 0 {
                    options.z_loss_scale = 1e-3;
                }
                let case = WeightedCase {
                    rows: 6,
                    vocab: 20_011,
                    dtype,
                    options,
                    class_weights: n % 2 == 0,
                    loss_weights: if n % 4 == 1 {
                        LossWeights::Absent
                    } else {
                        LossWeights::Signed
                    },
                    entropy_weights: true,
                    three_d: n % 2 == 1,
                    masked_columns,
                };
                check_loss_case(TestBackend::Fusion, &case, n % 3 == 1, fresh_seed());
            }
        }
    }
}

#[test]
fn weighted_loss_on_flex_through_the_portable_path() {
    for (i, case) in cases(&[DType::F32], 10, 67).iter().enumerate() {
        check_loss_case(TestBackend::Flex, case, i % 2 == 1, fresh_seed());
    }
}

/// The fused linear cross-entropy's loss and gradients of the hidden states, the weight
/// and the bias for `case` (chunks of 4 rows, so that the weights are cut with them)
/// against the f64 reference.
fn check_linear_case(backend: TestBackend, case: &WeightedCase, seed: u64) {
    let _backward = shared_device();
    let mut rng = rng(seed);
    let context = format!("fused linear, {} {case:?} seed={seed}", backend.name());
    let WeightedCase {
        rows, vocab, dtype, ..
    } = *case;
    let width = 16;
    let plain = backend.device();
    let device = plain.clone().autodiff();
    let labels = case.draw(&mut rng);
    let dims = (rows, width, vocab);
    let drawn = DrawnHead::draw(&mut rng, dims, dtype, &plain);
    let (hidden, weight, bias) = drawn.tracked();
    let chunking = LinearChunking {
        logits_bytes: Some(4 * vocab * dtype.size()),
        ..LinearChunking::default()
    };
    let head = LmHead::new(weight.clone()).with_bias(Some(bias.clone()));
    let class_weights = labels.class_weights(&device);
    let loss = if case.three_d {
        let inputs = LinearCrossEntropyInputs::new(
            hidden.clone().reshape([2, rows / 2, width]),
            head,
            labels.targets([2, rows / 2], &device),
        );
        try_fused_linear_cross_entropy(
            inputs.with_class_weights(class_weights),
            &case.options,
            &chunking,
        )
        .map(|out| out.loss.reshape([loss_len(case)]))
    } else {
        let inputs =
            LinearCrossEntropyInputs::new(hidden.clone(), head, labels.targets([rows], &device));
        try_fused_linear_cross_entropy(
            inputs.with_class_weights(class_weights),
            &case.options,
            &chunking,
        )
        .map(|out| out.loss.reshape([loss_len(case)]))
    }
    .unwrap_or_else(|e| panic!("{context}: {e}"));
    let got_loss = to_f64(loss.clone());
    let grads = labels.objective(loss).backward();

    let (expected_loss, terms, dlogits) =
        labels.reference(&case.options, &drawn.logits_f64(dims), vocab);
    let bound = 2.0 * bound(dtype);
    check_objective(&got_loss, &expected_loss, &terms, bound, &context);
    drawn.check_gradients(
        &context,
        bound,
        (hidden.grad(&grads), weight.grad(&grads), bias.grad(&grads)),
        &dlogits,
        dims,
    );
}

#[test]
fn weighted_linear_on_the_default_fusion_backend() {
    poisoned();
    for case in cases(&float_dtypes(), 10, 67) {
        check_linear_case(TestBackend::Fusion, &case, fresh_seed());
    }
}

#[test]
fn weighted_linear_on_flex_through_the_portable_path() {
    for case in cases(&[DType::F32], 10, 67) {
        check_linear_case(TestBackend::Flex, &case, fresh_seed());
    }
}

/// The reference's gradient of the weighted objective against central differences of its
/// f64 value, every reduction, with the temperature, the softcap, label smoothing, z-loss
/// and class weights: the formula itself.
#[test]
fn weighted_gradient_formula_matches_finite_differences() {
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let (rows, vocab) = (3, 6);
    for reduction in REDUCTIONS {
        let options = CrossEntropyOptions::new(reduction)
            .with_temperature(Some(0.8))
            .with_softcap(Some(4.0))
            .with_label_smoothing(0.1)
            .with_z_loss_scale(0.05);
        let class_weights: Vec<f32> = (0..vocab).map(|_| rng.random_range(0.5..1.5)).collect();
        let ref_options = RefOptions::new(&options, Some(&class_weights));
        let logits: Vec<f64> = (0..rows * vocab)
            .map(|_| rng.random_range(-3.0..3.0))
            .collect();
        let targets = vec![1, 4, 0];
        let w: Vec<f64> = (0..rows).map(|_| rng.random_range(-1.0..2.0)).collect();
        let c: Vec<f64> = (0..rows).map(|_| rng.random_range(0.1..0.9)).collect();
        let g: Vec<f64> = if reduction == Reduction::None {
            (0..rows).map(|_| rng.random_range(0.5..1.5)).collect()
        } else {
            vec![rng.random_range(0.5..1.5)]
        };
        let objective = |x: &[f64]| -> f64 {
            let rows = reference_rows(x, vocab, &targets, &ref_options);
            reference_weighted_loss(&rows, reduction, &w, &c)
                .iter()
                .zip(&g)
                .map(|(l, g)| l * g)
                .sum()
        };
        let analytic = reference_weighted_grad(&logits, vocab, &targets, &ref_options, &g, &w, &c);
        let h = 1e-6;
        for i in 0..logits.len() {
            let mut up = logits.clone();
            up[i] += h;
            let mut down = logits.clone();
            down[i] -= h;
            let numeric = (objective(&up) - objective(&down)) / (2.0 * h);
            assert!(
                (numeric - analytic[i]).abs() <= 1e-6 * (1.0 + numeric.abs()),
                "seed={seed} {reduction:?} element {i}: finite differences {numeric}, formula {}",
                analytic[i]
            );
        }
    }
}

/// A batch passed in three parts with `Mean` over the whole batch's denominators and the
/// rows' weights (the entropy's too): the parts' losses sum to the whole batch's weighted
/// objective and the parts' gradients are its rows, with both plans.
#[test]
fn weighted_micro_batches_add_up_to_the_whole_batch() {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let vocab = 29;
    let parts = [
        (6, Ignore::SomeRows),
        (4, Ignore::AllRows),
        (5, Ignore::NoRows),
    ];
    let device = TestBackend::Fusion.device().autodiff();
    for plan in [GradientPlan::Auto, GradientPlan::TwoPass] {
        let context = format!("{plan:?} seed={seed}");
        let mut all_targets = Vec::new();
        let mut all_seen = Vec::new();
        let mut all_w = Vec::new();
        let mut all_c = Vec::new();
        let mut inputs = Vec::new();
        for &(rows, ignore) in &parts {
            let targets = random_targets(&mut rng, rows, vocab, ignore, -100);
            let w: Vec<f32> = (0..rows).map(|_| rng.random_range(-1.0..2.0)).collect();
            let c: Vec<f32> = (0..rows).map(|_| rng.random_range(0.01..0.5)).collect();
            let (logits, seen) = logits_tensor(
                random_logits(&mut rng, rows, vocab),
                rows,
                vocab,
                DType::F32,
                &device,
            );
            all_targets.extend_from_slice(&targets);
            all_seen.extend(seen);
            all_w.extend(w.iter().map(|&v| v as f64));
            all_c.extend(c.iter().map(|&v| v as f64));
            inputs.push((logits.require_grad(), targets, w, c));
        }
        let denominators = inputs
            .iter()
            .map(|(_, targets, _, _)| MeanDenominators::of_targets(targets, -100, None))
            .reduce(|sum, part| sum + part)
            .expect("parts");
        let options = CrossEntropyOptions::new(Reduction::Mean)
            .with_gradient_plan(plan)
            .with_z_loss_scale(1e-3)
            .with_mean_denominators(Some(denominators));
        let mut total = 0.0;
        let mut grads = Vec::new();
        for (logits, targets, w, c) in &inputs {
            let targets = Targets::new(targets_tensor(targets, &device))
                .with_weights(Some(Tensor::<1>::from_floats(w.as_slice(), &device)))
                .with_entropy_weights(Some(Tensor::<1>::from_floats(c.as_slice(), &device)));
            let out = try_fused_cross_entropy(logits.clone(), targets, None, &options)
                .unwrap_or_else(|e| panic!("{context}: {e}"));
            total += to_f64(out.loss.clone())[0];
            let g = (out.loss * 0.7).backward();
            grads.extend(to_f64(logits.grad(&g).expect("logits gradient")));
        }
        let whole = CrossEntropyOptions::new(Reduction::Mean).with_z_loss_scale(1e-3);
        let ref_options = RefOptions::new(&whole, None);
        let ref_rows = reference_rows(&all_seen, vocab, &all_targets, &ref_options);
        let expected = reference_weighted_loss(&ref_rows, Reduction::Mean, &all_w, &all_c);
        let terms = objective_terms(&ref_rows, Reduction::Mean, &all_w, &all_c);
        check_objective(&[total], &expected, &terms, 1e-5, &context);
        let expected_grad = reference_weighted_grad(
            &all_seen,
            vocab,
            &all_targets,
            &ref_options,
            &[0.7],
            &all_w,
            &all_c,
        );
        check_close(
            &grads,
            &expected_grad,
            grad_bound(DType::F32),
            &format!("{context}: grad"),
        );
    }
}

/// Under the default plan the fused linear cross-entropy forms the weighted objective's
/// gradients in forward, the entropy's included: backward forms no logits again.
#[test]
fn the_one_pass_forms_the_weighted_gradient_in_forward() {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let (rows, width, vocab) = (12, 8, 41);
    let device = TestBackend::Fusion.device().autodiff();
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    let values = |n: usize, rng: &mut SmallRng| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    };
    let hidden = Tensor::<2>::from_data(
        TensorData::new(values(rows * width, &mut rng), [rows, width]),
        &device,
    )
    .require_grad();
    let weight = Tensor::<2>::from_data(
        TensorData::new(values(width * vocab, &mut rng), [width, vocab]),
        &device,
    )
    .require_grad();
    let w = Tensor::<1>::from_floats(values(rows, &mut rng).as_slice(), &device);
    let c = Tensor::<1>::from_floats(values(rows, &mut rng).as_slice(), &device).abs();
    for reduction in [Reduction::Mean, Reduction::Sum] {
        let inputs = LinearCrossEntropyInputs::new(
            hidden.clone(),
            LmHead::new(weight.clone()),
            Targets::new(targets_tensor(&targets, &device))
                .with_weights(Some(w.clone()))
                .with_entropy_weights(Some(c.clone())),
        );
        let before = test_hooks::linear_product_counts().logits;
        let out = try_fused_linear_cross_entropy(
            inputs,
            &CrossEntropyOptions::new(reduction),
            &LinearChunking::default(),
        )
        .unwrap_or_else(|e| panic!("seed={seed}: {e}"));
        let grads = out.loss.backward();
        assert!(hidden.grad(&grads).is_some() && weight.grad(&grads).is_some());
        assert_eq!(
            test_hooks::linear_product_counts().logits - before,
            1,
            "seed={seed} {reduction:?}: one chunk's logits, formed once"
        );
    }
}

/// Weights of another shape than the targets' are refused by variant, through the loss
/// and the fused linear cross-entropy, on the cube device and Flex.
#[test]
fn weights_of_another_shape_are_refused() {
    for backend in [TestBackend::Fusion, TestBackend::Flex] {
        let device = backend.device();
        let (rows, vocab, width) = (6, 11, 4);
        let logits = Tensor::<2>::ones([rows, vocab], &device);
        let classes = targets_tensor(&[1, 2, 3, 4, 5, 6], &device);
        let short = Tensor::<1>::ones([rows - 1], &device);
        for (input, targets) in [
            (
                Input::RowWeights,
                Targets::new(classes.clone()).with_weights(Some(short.clone())),
            ),
            (
                Input::EntropyWeights,
                Targets::new(classes.clone()).with_entropy_weights(Some(short.clone())),
            ),
        ] {
            let context = format!("{} {input}", backend.name());
            let expect = |error: Option<CrossEntropyError>, op: &str| match error {
                Some(CrossEntropyError::ShapeMismatch {
                    input: got, found, ..
                }) => assert_eq!((got, found), (input, vec![rows - 1]), "{context}: {op}"),
                other => panic!("{context}: {op}: expected a shape mismatch, got {other:?}"),
            };
            expect(
                try_fused_cross_entropy(
                    logits.clone(),
                    targets.clone(),
                    None,
                    &CrossEntropyOptions::default(),
                )
                .err(),
                "loss",
            );
            let inputs = LinearCrossEntropyInputs::new(
                Tensor::<2>::ones([rows, width], &device),
                LmHead::new(Tensor::<2>::ones([width, vocab], &device)),
                targets,
            );
            expect(
                try_fused_linear_cross_entropy(
                    inputs,
                    &CrossEntropyOptions::default(),
                    &LinearChunking::default(),
                )
                .err(),
                "fused linear",
            );
        }
    }
}
