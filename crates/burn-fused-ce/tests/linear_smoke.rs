//! A first check of the fused linear cross-entropy on burn 0.22: the loss and the
//! gradients of the hidden states, the weight and the bias against an f64 host reference
//! of `hidden @ W + b` and the loss, for small shapes in several chunks (a partial last
//! one), every reduction with non-uniform incoming gradients, ignored rows, class
//! weights, label smoothing and z-loss, 3-D hidden states, the weight gradient summed in
//! place, in blocks of columns and in f32, through the function and through the module
//! with Burn's `Linear`, on Flex, on a Vulkan device and on wgpu. The full suite checks
//! much more.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_fused_ce::{
    ChunkProducts, CrossEntropyOptions, FusedCrossEntropyLossConfig,
    FusedLinearCrossEntropyLossConfig, LinearChunking, LinearCrossEntropyInputs, LmHead, Reduction,
    try_fused_linear_cross_entropy,
};

const IGNORE: i64 = -100;

/// SplitMix64: fresh seeded inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[low, high)`.
    fn uniform(&mut self, low: f32, high: f32) -> f32 {
        let unit = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        low + (high - low) * unit
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    nanos ^ (std::process::id() as u64) << 32
}

#[derive(Debug, Clone)]
struct Case {
    rows: usize,
    width: usize,
    vocab: usize,
    reduction: Reduction,
    bias: bool,
    class_weights: bool,
    label_smoothing: f32,
    z_loss_scale: f32,
    three_d: bool,
    via_module: bool,
    chunk_rows: usize,
    in_place: bool,
    split_k: bool,
    block_columns: Option<usize>,
    f32_weight_gradient: bool,
}

impl Case {
    fn new(reduction: Reduction) -> Self {
        Self {
            rows: 37,
            width: 24,
            vocab: 67,
            reduction,
            bias: true,
            class_weights: false,
            label_smoothing: 0.0,
            z_loss_scale: 0.0,
            three_d: false,
            via_module: false,
            chunk_rows: 16,
            in_place: false,
            split_k: true,
            block_columns: None,
            f32_weight_gradient: false,
        }
    }

    fn chunking(&self) -> LinearChunking {
        LinearChunking {
            logits_bytes: Some(self.chunk_rows * self.vocab * 4),
            weight_gradient_block_bytes: self.block_columns.map(|c| c * self.width * 4),
            products: ChunkProducts {
                f32_weight_gradient: self.f32_weight_gradient,
                weight_gradient_in_place: self.in_place,
                hidden_gradient_split_k: self.split_k,
                ..ChunkProducts::default()
            },
        }
    }

    fn options(&self) -> CrossEntropyOptions {
        CrossEntropyOptions::new(self.reduction)
            .with_label_smoothing(self.label_smoothing)
            .with_z_loss_scale(self.z_loss_scale)
    }
}

/// The f64 reference: the loss (`[N]` or `[1]`) and the gradients of the hidden states,
/// the weight and the bias for the per-row incoming gradients `incoming` (one value for
/// `Mean` and `Sum`).
struct Reference {
    loss: Vec<f64>,
    hidden: Vec<f64>,
    weight: Vec<f64>,
    bias: Vec<f64>,
}

fn reference(
    case: &Case,
    h: &[f64],
    w: &[f64],
    b: Option<&[f64]>,
    targets: &[i64],
    class_weights: Option<&[f64]>,
    incoming: &[f64],
) -> Reference {
    let (n, k, v) = (case.rows, case.width, case.vocab);
    let ls = case.label_smoothing as f64;
    let s = case.z_loss_scale as f64;
    let weight_of = |c: usize| class_weights.map_or(1.0, |cw| cw[c]);
    let total: f64 = (0..v).map(weight_of).sum();
    let mut ce = vec![0.0; n];
    let mut z = vec![0.0; n];
    let mut probs = vec![0.0; n * v];
    let mut lses = vec![0.0; n];
    let (mut d, mut count) = (0.0f64, 0.0f64);
    for i in 0..n {
        let logits: Vec<f64> = (0..v)
            .map(|c| {
                (0..k).map(|p| h[i * k + p] * w[p * v + c]).sum::<f64>() + b.map_or(0.0, |b| b[c])
            })
            .collect();
        if targets[i] == IGNORE {
            continue;
        }
        let y = targets[i] as usize;
        let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + logits.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        let smooth: f64 = (0..v).map(|c| weight_of(c) * (lse - logits[c])).sum();
        ce[i] = (1.0 - ls) * weight_of(y) * (lse - logits[y]) + ls / v as f64 * smooth;
        z[i] = s * lse * lse;
        for c in 0..v {
            probs[i * v + c] = (logits[c] - lse).exp();
        }
        lses[i] = lse;
        d += weight_of(y);
        count += 1.0;
    }
    let (d, count) = (d.max(f32::MIN_POSITIVE as f64), count.max(1.0));
    let loss = match case.reduction {
        Reduction::None => (0..n).map(|i| ce[i] + z[i]).collect(),
        Reduction::Sum => vec![ce.iter().sum::<f64>() + z.iter().sum::<f64>()],
        Reduction::Mean => vec![ce.iter().sum::<f64>() / d + z.iter().sum::<f64>() / count],
    };
    let mut dlogits = vec![0.0; n * v];
    for i in 0..n {
        if targets[i] == IGNORE {
            continue;
        }
        let y = targets[i] as usize;
        let g = if case.reduction == Reduction::None {
            incoming[i]
        } else {
            incoming[0]
        };
        let (sc, sz) = match case.reduction {
            Reduction::Mean => (g / d, g / count),
            _ => (g, g),
        };
        for c in 0..v {
            let p = probs[i * v + c];
            let target = if c == y { 1.0 } else { 0.0 };
            let dce = (1.0 - ls) * weight_of(y) * (p - target)
                + ls / v as f64 * (total * p - weight_of(c));
            dlogits[i * v + c] = sc * dce + sz * 2.0 * s * lses[i] * p;
        }
    }
    let mut hidden = vec![0.0; n * k];
    let mut weight = vec![0.0; k * v];
    let mut bias = vec![0.0; v];
    for i in 0..n {
        for c in 0..v {
            let g = dlogits[i * v + c];
            bias[c] += g;
            for p in 0..k {
                hidden[i * k + p] += g * w[p * v + c];
                weight[p * v + c] += h[i * k + p] * g;
            }
        }
    }
    Reference {
        loss,
        hidden,
        weight,
        bias,
    }
}

fn values<const D: usize>(tensor: Tensor<D>) -> Vec<f64> {
    tensor
        .into_data()
        .try_to_vec_as::<f64>()
        .expect("the tensor reads back as f64")
}

fn relative_l2(got: &[f64], expected: &[f64]) -> f64 {
    assert_eq!(got.len(), expected.len(), "lengths differ");
    let diff: f64 = got
        .iter()
        .zip(expected)
        .map(|(a, b)| (a - b) * (a - b))
        .sum();
    let norm: f64 = expected.iter().map(|b| b * b).sum();
    (diff / norm.max(1e-30)).sqrt()
}

fn check(got: &[f64], expected: &[f64], what: &str, context: &str) {
    let error = relative_l2(got, expected);
    assert!(
        error <= 1e-4 && got.iter().all(|x| x.is_finite()),
        "{what}: relative error {error:e}; {context}\n got {:?}\nwant {:?}",
        &got[..got.len().min(8)],
        &expected[..expected.len().min(8)]
    );
}

fn run_case(device: &Device, case: Case) {
    #[cfg(feature = "test-hooks")]
    burn_fused_ce::test_hooks::set_poison_outputs(true);
    let seed = fresh_seed();
    let context = format!("{case:?} seed={seed} device={device:?}");
    let mut rng = Rng(seed);
    let (n, k, v) = (case.rows, case.width, case.vocab);
    let scale = 2.0 / (k as f32).sqrt();
    let h: Vec<f32> = (0..n * k).map(|_| rng.uniform(-1.5, 1.5)).collect();
    let w: Vec<f32> = (0..k * v).map(|_| rng.uniform(-scale, scale)).collect();
    let b: Vec<f32> = (0..v).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let targets: Vec<i64> = (0..n)
        .map(|_| {
            if rng.below(5) == 0 {
                IGNORE
            } else {
                rng.below(v) as i64
            }
        })
        .collect();
    let class_weights: Option<Vec<f32>> = case
        .class_weights
        .then(|| (0..v).map(|_| rng.uniform(0.25, 2.0)).collect());
    let row_grad: Vec<f32> = (0..n).map(|_| rng.uniform(0.5, 1.5)).collect();
    let loss_scale = 0.375f32;

    let f64s = |x: &[f32]| x.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let incoming = match case.reduction {
        Reduction::None => f64s(&row_grad),
        _ => vec![loss_scale as f64],
    };
    let cw64 = class_weights.as_deref().map(f64s);
    let expected = reference(
        &case,
        &f64s(&h),
        &f64s(&w),
        case.bias.then(|| f64s(&b)).as_deref(),
        &targets,
        cw64.as_deref(),
        &incoming,
    );

    let halves = [2, n / 2, k];
    let hidden_2d = Tensor::<2>::from_data(TensorData::new(h.clone(), [n, k]), device);
    let weight = Tensor::<2>::from_data(TensorData::new(w, [k, v]), device).require_grad();
    let bias = case
        .bias
        .then(|| Tensor::<1>::from_data(TensorData::new(b, [v]), device).require_grad());
    let class_weights_tensor = class_weights
        .clone()
        .map(|cw| Tensor::<1>::from_data(TensorData::new(cw, [v]), device));
    let targets_1d = Tensor::<1, Int>::from_data(TensorData::new(targets, [n]), device);
    let row_grad_1d = Tensor::<1>::from_data(TensorData::new(row_grad, [n]), device);

    // The loss as `[N]`/`[1]`, and the hidden leaf.
    let (loss, hidden_leaf): (Tensor<1>, HiddenLeaf) = if case.three_d {
        assert!(n.is_multiple_of(2), "3-D cases take an even row count");
        let hidden = Tensor::<3>::from_data(TensorData::new(h, halves), device).require_grad();
        let targets = targets_1d.reshape([2, n / 2]);
        let loss = forward(
            &case,
            hidden.clone(),
            &weight,
            &bias,
            targets,
            &class_weights_tensor,
        );
        (loss.reshape([-1]), HiddenLeaf::Three(hidden))
    } else {
        let hidden = hidden_2d.require_grad();
        let loss = forward(
            &case,
            hidden.clone(),
            &weight,
            &bias,
            targets_1d,
            &class_weights_tensor,
        );
        (loss.reshape([-1]), HiddenLeaf::Two(hidden))
    };
    let loss_values = values(loss.clone());
    let objective = match case.reduction {
        Reduction::None => loss.mul(row_grad_1d).sum(),
        _ => loss.mul_scalar(loss_scale).sum(),
    };
    let grads = objective.backward();
    check(&loss_values, &expected.loss, "loss", &context);
    let grad_of = |tensor: &Tensor<2>| tensor.grad(&grads).map(values);
    let hidden_grad = match &hidden_leaf {
        HiddenLeaf::Two(hidden) => grad_of(hidden),
        HiddenLeaf::Three(hidden) => hidden.grad(&grads).map(values),
    };
    let hidden_grad = hidden_grad.unwrap_or_else(|| panic!("no hidden gradient; {context}"));
    check(&hidden_grad, &expected.hidden, "hidden gradient", &context);
    let weight_grad = grad_of(&weight).unwrap_or_else(|| panic!("no weight gradient; {context}"));
    check(&weight_grad, &expected.weight, "weight gradient", &context);
    if let Some(bias) = &bias {
        let bias_grad = bias
            .grad(&grads)
            .map(values)
            .unwrap_or_else(|| panic!("no bias gradient; {context}"));
        check(&bias_grad, &expected.bias, "bias gradient", &context);
    }
}

/// The hidden states the gradient is asked of, `[N, H]` or `[2, N / 2, H]`.
enum HiddenLeaf {
    Two(Tensor<2>),
    Three(Tensor<3>),
}

/// The loss through the function or the module, for hidden states of rank `DH`.
fn forward<const DH: usize, const DT: usize>(
    case: &Case,
    hidden: Tensor<DH>,
    weight: &Tensor<2>,
    bias: &Option<Tensor<1>>,
    targets: Tensor<DT, Int>,
    class_weights: &Option<Tensor<1>>,
) -> Tensor<DT> {
    if case.via_module {
        let loss_config = FusedCrossEntropyLossConfig::new()
            .with_reduction(case.reduction)
            .with_label_smoothing(case.label_smoothing)
            .with_z_loss_scale(case.z_loss_scale)
            .with_class_weights(class_weights.as_ref().map(|cw| {
                cw.to_data()
                    .try_to_vec_as::<f32>()
                    .expect("class weights read back")
            }));
        let loss = FusedLinearCrossEntropyLossConfig::new()
            .with_loss(loss_config)
            .with_chunking(case.chunking())
            .init(&weight.device());
        let head = Linear {
            weight: Param::from_tensor(weight.clone()),
            bias: bias.clone().map(Param::from_tensor),
        };
        return loss.forward(hidden, &head, targets);
    }
    try_fused_linear_cross_entropy(
        LinearCrossEntropyInputs::new(
            hidden,
            LmHead::new(weight.clone()).with_bias(bias.clone()),
            targets,
        )
        .with_class_weights(class_weights.clone()),
        &case.options(),
        &case.chunking(),
    )
    .unwrap_or_else(|error| panic!("{error}; {case:?}"))
    .loss
}

/// The cases every device runs.
fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        cases.push(Case::new(reduction));
        cases.push(Case {
            bias: false,
            in_place: true,
            ..Case::new(reduction)
        });
    }
    cases.push(Case {
        class_weights: true,
        label_smoothing: 0.1,
        z_loss_scale: 1e-2,
        block_columns: Some(20),
        ..Case::new(Reduction::Mean)
    });
    cases.push(Case {
        class_weights: true,
        split_k: false,
        f32_weight_gradient: true,
        in_place: true,
        ..Case::new(Reduction::None)
    });
    cases.push(Case {
        rows: 40,
        three_d: true,
        via_module: true,
        chunk_rows: 24,
        ..Case::new(Reduction::Mean)
    });
    cases.push(Case {
        rows: 32,
        via_module: true,
        chunk_rows: 64,
        z_loss_scale: 1e-2,
        ..Case::new(Reduction::Sum)
    });
    cases
}

#[cfg(feature = "flex")]
#[test]
fn fused_linear_cross_entropy_matches_the_reference_on_flex() {
    let device = Device::flex().autodiff();
    for case in cases() {
        run_case(&device, case);
    }
}

#[cfg(feature = "vulkan")]
#[test]
fn fused_linear_cross_entropy_matches_the_reference_on_vulkan() {
    let device = Device::vulkan(burn::tensor::DeviceKind::DefaultDevice).autodiff();
    for case in cases() {
        run_case(&device, case);
    }
}

/// The same on wgpu, whose WGSL path runs where the SPIR-V one does not (Mesa 22's
/// lavapipe crashes compiling cubecl 0.11's SPIR-V pipelines, Burn's own matmul among
/// them).
#[cfg(feature = "wgpu")]
#[test]
fn fused_linear_cross_entropy_matches_the_reference_on_wgpu() {
    let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice).autodiff();
    for case in cases() {
        run_case(&device, case);
    }
}
