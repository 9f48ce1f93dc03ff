//! Shared test harness: seeded random inputs, the f64 CPU reference from the spec, error
//! measures, and the backends under test. Every test draws fresh inputs; the seed is
//! printed on failure and can be pinned with `FUSED_CE_SEED=<u64>`.
#![allow(dead_code, unused_imports)]

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_fused_ce::tuning::KernelTuning;
use burn_fused_ce::{CrossEntropyOptions, GradientPlan, Reduction};
use rand::{Rng, SeedableRng, rngs::SmallRng};

pub use fused_ce_suite::{CubeBackend, SUPPORTS_BF16, device};

/// Where a test runs the loss. Burn 0.22 picks the backend by the device, and this build
/// has Burn's fusion on, so a cube device's tensors run on `Fusion<CubeBackend>`: the plain
/// `CubeBackend` is reached on its primitives, through the extension trait, as
/// `Autodiff` would call it (`cube_primitives.rs`). `run_call.rs` runs a call on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestBackend {
    /// The plain `CubeBackend`, on its primitives.
    Cube,
    /// `Tensor<D>` on a cube device: `Fusion<CubeBackend>`, what users have by default.
    Fusion,
    /// `Tensor<D>` on Flex, Burn's CPU backend: the portable path.
    Flex,
}

impl TestBackend {
    /// The device of this backend's tensors (the plain cube backend's primitives live on
    /// the cube device too).
    pub fn device(self) -> Device {
        match self {
            Self::Cube | Self::Fusion => device(),
            Self::Flex => Device::flex(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Cube => "CubeBackend",
            Self::Fusion => "Fusion<CubeBackend>",
            Self::Flex => "Flex",
        }
    }
}

/// A fresh seed per call (or the pinned one), so each run tests new inputs.
pub fn fresh_seed() -> u64 {
    if let Ok(seed) = std::env::var("FUSED_CE_SEED") {
        return seed.parse().expect("FUSED_CE_SEED must be a u64");
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    nanos ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, std::sync::atomic::Ordering::Relaxed)
}

pub fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

/// The float dtypes this runtime computes in.
pub fn float_dtypes() -> Vec<DType> {
    let mut dtypes = vec![DType::F32, DType::F16];
    if SUPPORTS_BF16 {
        dtypes.push(DType::BF16);
    }
    dtypes
}

/// The spec's precision table: (loss, gradient relative L2) for a logits dtype.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (1e-3, 1e-2),
        DType::BF16 => (1e-2, 2e-2),
        other => panic!("no tolerance for {other:?}"),
    }
}

/// Which rows are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)]
pub enum Ignore {
    NoRows,
    SomeRows,
    AllRows,
}

/// Random logits in [-6, 6) with a few larger spikes, so rows have a clear but not
/// saturated maximum. Never zeros.
pub fn random_logits(rng: &mut SmallRng, rows: usize, vocab: usize) -> Vec<f32> {
    (0..rows * vocab)
        .map(|_| {
            let x: f32 = rng.random_range(-6.0..6.0);
            if rng.random_range(0..50) == 0 {
                x * 3.0
            } else {
                x
            }
        })
        .collect()
}

/// Random targets in `[0, vocab)`, with rows set to `ignore_index` per the pattern.
pub fn random_targets(
    rng: &mut SmallRng,
    rows: usize,
    vocab: usize,
    ignore: Ignore,
    ignore_index: i64,
) -> Vec<i64> {
    (0..rows)
        .map(|_| {
            let ignored = match ignore {
                Ignore::NoRows => false,
                Ignore::SomeRows => rng.random_range(0..10) < 3,
                Ignore::AllRows => true,
            };
            if ignored {
                ignore_index
            } else {
                loop {
                    let y = rng.random_range(0..vocab as i64);
                    // With an ignore index inside [0, V), "no rows ignored" must avoid it.
                    if y != ignore_index {
                        break y;
                    }
                    if vocab == 1 {
                        break y;
                    }
                }
            }
        })
        .collect()
}

/// Random class weights in [0.2, 3].
pub fn random_class_weights(rng: &mut SmallRng, vocab: usize) -> Vec<f32> {
    (0..vocab).map(|_| rng.random_range(0.2..3.0)).collect()
}

/// Makes every row confident: its target logit becomes the row's maximum + `margin` (the
/// spec's confident case: 10).
pub fn make_confident(values: &mut [f32], vocab: usize, targets: &[i64], margin: f32) {
    for (row, &y) in targets.iter().enumerate() {
        if y < 0 || y >= vocab as i64 {
            continue;
        }
        let x = &mut values[row * vocab..(row + 1) * vocab];
        let max = x.iter().cloned().fold(f32::MIN, f32::max);
        x[y as usize] = max + margin;
    }
}

/// Logits on `device` in `dtype`, and the exact values the kernel will see, in f64.
pub fn logits_tensor(
    values: Vec<f32>,
    rows: usize,
    vocab: usize,
    dtype: DType,
    device: &Device,
) -> (Tensor<2>, Vec<f64>) {
    let tensor = Tensor::<2>::from_data(TensorData::new(values, [rows, vocab]), device).cast(dtype);
    let seen = to_f64(tensor.clone());
    (tensor, seen)
}

pub fn targets_tensor(targets: &[i64], device: &Device) -> Tensor<1, Int> {
    Tensor::<1, Int>::from_data(TensorData::new(targets.to_vec(), [targets.len()]), device)
}

pub fn to_f64<const D: usize>(tensor: Tensor<D>) -> Vec<f64> {
    data_to_f64(tensor.into_data())
}

pub fn int_to_i64<const D: usize>(tensor: Tensor<D, Int>) -> Vec<i64> {
    tensor
        .into_data()
        .try_into_vec_as::<i64>()
        .expect("tensor data converts to i64")
}

pub fn data_to_f64(data: TensorData) -> Vec<f64> {
    data.try_into_vec_as::<f64>()
        .expect("tensor data converts to f64")
}

/// The spec's options in f64, as the kernels see them: the f32 option values and class
/// weights converted exactly.
#[derive(Debug, Clone)]
pub struct RefOptions {
    pub reduction: Reduction,
    pub ignore_index: i64,
    pub label_smoothing: f64,
    pub z_loss_scale: f64,
    /// Logits divided by it first (`None`: by 1).
    pub temperature: Option<f64>,
    pub softcap: Option<f64>,
    /// `[V]`, `None`: every `w_c = 1`.
    pub weights: Option<Vec<f64>>,
}

impl RefOptions {
    pub fn new(options: &CrossEntropyOptions, weights: Option<&[f32]>) -> Self {
        Self {
            reduction: options.reduction,
            ignore_index: options.ignore_index,
            label_smoothing: options.label_smoothing as f64,
            z_loss_scale: options.z_loss_scale as f64,
            temperature: options.temperature.map(|t| t as f64),
            softcap: options.softcap.map(|c| c as f64),
            weights: weights.map(|w| w.iter().map(|&v| v as f64).collect()),
        }
    }

    /// Plain cross-entropy: no smoothing, z-loss, softcap or weights.
    pub fn plain(reduction: Reduction, ignore_index: i64) -> Self {
        Self::new(
            &CrossEntropyOptions::new(reduction).with_ignore_index(ignore_index),
            None,
        )
    }

    pub fn weight(&self, class: usize) -> f64 {
        self.weights.as_ref().map_or(1.0, |w| w[class])
    }

    pub fn weight_total(&self, vocab: usize) -> f64 {
        self.weights
            .as_ref()
            .map_or(vocab as f64, |w| w.iter().sum())
    }

    /// `c * tanh((x / T) / c)`: the temperature, then softcap, each where given.
    pub fn cap(&self, x: f64) -> f64 {
        let x = self.temperature.map_or(x, |t| x / t);
        match self.softcap {
            Some(c) => c * (x / c).tanh(),
            None => x,
        }
    }

    pub fn capped(&self, row: &[f64]) -> Vec<f64> {
        row.iter().map(|&x| self.cap(x)).collect()
    }
}

/// The gradient plan by whether it is the one pass (tests loop over both).
pub fn plan(one_pass: bool) -> GradientPlan {
    if one_pass {
        GradientPlan::OnePass
    } else {
        GradientPlan::TwoPass
    }
}

thread_local! {
    static FORCED_CHUNKS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Runs `body` with every case's options cutting the one pass's rows into `chunks` chunks
/// (see [`with_forced_chunks`]), on this thread.
pub fn forcing_chunks(chunks: usize, body: impl FnOnce()) {
    FORCED_CHUNKS.with(|cell| cell.set(Some(chunks)));
    body();
    FORCED_CHUNKS.with(|cell| cell.set(None));
}

/// The options with the chunk count [`forcing_chunks`] asks for, on this build's device's
/// tuning; unchanged outside it.
pub fn with_forced_chunks(options: CrossEntropyOptions) -> CrossEntropyOptions {
    match FORCED_CHUNKS.with(|cell| cell.get()) {
        Some(chunks) => {
            let client = fused_ce_suite::client(&device());
            options.with_tuning(Some(KernelTuning {
                chunks: Some(chunks),
                ..KernelTuning::for_device(&client)
            }))
        }
        None => options,
    }
}

/// One row of the f64 reference.
#[derive(Debug, Clone, Copy)]
pub struct RefRow {
    /// Not the ignore index (counted in `n`, even when out of range).
    pub counted: bool,
    /// The cross-entropy part (smoothed, weighted); NaN for a target that is not a class.
    pub ce: f64,
    /// `s * lse^2`.
    pub z: f64,
    /// Log-sum-exp of the capped logits (0 on ignored rows).
    pub lse: f64,
    /// Entropy of the softmax of the capped logits (0 on ignored rows).
    pub entropy: f64,
    /// `w_y` (0 on ignored rows).
    pub weight: f64,
    /// First index of the maximum of the capped logits (-1 on ignored rows).
    pub argmax: i64,
}

impl RefRow {
    pub fn loss(&self) -> f64 {
        self.ce + self.z
    }
}

/// The f64 reference of every row (the spec's "Per-row loss").
pub fn reference_rows(
    logits: &[f64],
    vocab: usize,
    targets: &[i64],
    options: &RefOptions,
) -> Vec<RefRow> {
    let ls = options.label_smoothing;
    targets
        .iter()
        .enumerate()
        .map(|(row, &y)| {
            if y == options.ignore_index {
                return RefRow {
                    counted: false,
                    ce: 0.0,
                    z: 0.0,
                    lse: 0.0,
                    entropy: 0.0,
                    weight: 0.0,
                    argmax: -1,
                };
            }
            let x = options.capped(&logits[row * vocab..(row + 1) * vocab]);
            let l = lse(&x);
            let entropy = softmax_entropy(&x);
            let argmax = first_argmax(&x);
            let z = options.z_loss_scale * l * l;
            if y < 0 || y >= vocab as i64 {
                return RefRow {
                    counted: true,
                    ce: f64::NAN,
                    z,
                    lse: l,
                    entropy,
                    weight: f64::NAN,
                    argmax,
                };
            }
            let y = y as usize;
            let w_y = options.weight(y);
            // `lse - x_c` as `(max - x_c) + ln sum`, exact at any magnitude.
            let (max, log_sum) = max_and_log_sum(&x);
            let nll = |c: usize| (max - x[c]) + log_sum;
            let smooth: f64 = if ls > 0.0 {
                (0..vocab).map(|c| options.weight(c) * nll(c)).sum()
            } else {
                0.0
            };
            let ce = (1.0 - ls) * w_y * nll(y) + ls / vocab as f64 * smooth;
            RefRow {
                counted: true,
                ce,
                z,
                lse: l,
                entropy,
                weight: w_y,
                argmax,
            }
        })
        .collect()
}

/// First index of the maximum (NaN compares as smaller than anything).
pub fn first_argmax(x: &[f64]) -> i64 {
    let mut best = 0;
    for (c, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = c;
        }
    }
    best as i64
}

pub fn lse(x: &[f64]) -> f64 {
    let (max, log_sum) = max_and_log_sum(x);
    max + log_sum
}

/// A row's maximum and `ln sum_c exp(x_c - max)`, kept apart: near f64's largest
/// magnitudes `max + ln sum` rounds the sum away (at 1e38, `ln k` of `k` tied maxima).
/// An infinite maximum gives `(inf, 0)`.
pub fn max_and_log_sum(x: &[f64]) -> (f64, f64) {
    let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::INFINITY {
        return (f64::INFINITY, 0.0);
    }
    (max, x.iter().map(|v| (v - max).exp()).sum::<f64>().ln())
}

/// `(D, n)`: the weighted count and the count of non-ignored rows.
pub fn reference_denominators(rows: &[RefRow]) -> (f64, f64) {
    let d = rows.iter().filter(|r| r.counted).map(|r| r.weight).sum();
    let n = rows.iter().filter(|r| r.counted).count() as f64;
    (d, n)
}

/// Reduces per-row `(ce, z)` values as the spec's "Reductions": `[N]` for None, `[1]`
/// otherwise.
fn reduce(rows: &[RefRow], reduction: Reduction, part: impl Fn(&RefRow) -> (f64, f64)) -> Vec<f64> {
    match reduction {
        Reduction::None => rows
            .iter()
            .map(|r| {
                let (ce, z) = part(r);
                ce + z
            })
            .collect(),
        Reduction::Sum => vec![
            rows.iter()
                .map(|r| {
                    let (ce, z) = part(r);
                    ce + z
                })
                .sum(),
        ],
        Reduction::Mean => {
            let (d, n) = reference_denominators(rows);
            if n == 0.0 {
                return vec![0.0];
            }
            let ce: f64 = rows.iter().map(|r| part(r).0).sum();
            let z: f64 = rows.iter().map(|r| part(r).1).sum();
            vec![ce / d + z / n]
        }
    }
}

/// The reduced reference loss: `[N]` for None, `[1]` otherwise.
pub fn reference_loss(rows: &[RefRow], reduction: Reduction) -> Vec<f64> {
    reduce(rows, reduction, |r| (r.ce, r.z))
}

/// The z-loss part alone, reduced like the loss (`/ n` under Mean).
pub fn reference_z_loss(rows: &[RefRow], reduction: Reduction) -> Vec<f64> {
    reduce(rows, reduction, |r| (0.0, r.z))
}

/// Share of non-ignored rows whose argmax is the target (0 when there are none).
pub fn reference_accuracy(rows: &[RefRow], targets: &[i64]) -> f64 {
    let n = rows.iter().filter(|r| r.counted).count();
    if n == 0 {
        return 0.0;
    }
    let correct = rows
        .iter()
        .zip(targets)
        .filter(|(r, y)| r.counted && r.argmax == **y)
        .count();
    correct as f64 / n as f64
}

/// The argmax per row, -1 on ignored rows.
pub fn reference_predicted(rows: &[RefRow]) -> Vec<i64> {
    rows.iter().map(|r| r.argmax).collect()
}

/// The log-sum-exp per row, 0 on ignored rows.
pub fn reference_lse(rows: &[RefRow]) -> Vec<f64> {
    rows.iter().map(|r| r.lse).collect()
}

/// The softmax's entropy per row, 0 on ignored rows.
pub fn reference_entropy(rows: &[RefRow]) -> Vec<f64> {
    rows.iter().map(|r| r.entropy).collect()
}

/// `-sum_c p_c ln p_c` of the softmax of `x`; a class of probability 0 adds 0.
pub fn softmax_entropy(x: &[f64]) -> f64 {
    let (max, log_sum) = max_and_log_sum(x);
    x.iter()
        .map(|&v| {
            let log_p = (v - max) - log_sum;
            let p = log_p.exp();
            if p > 0.0 { -p * log_p } else { 0.0 }
        })
        .sum()
}

/// The f64 reference gradient (the spec's formula, softcap chain rule included) for the
/// incoming gradient `g` (`[N]` for None, `[1]` otherwise). Ignored rows and rows whose
/// target is not a class are 0.
pub fn reference_grad(
    logits: &[f64],
    vocab: usize,
    targets: &[i64],
    options: &RefOptions,
    g: &[f64],
) -> Vec<f64> {
    reference_grad_of_rows(logits, vocab, targets, options, g, |_| 1.0)
}

/// [`reference_grad`] with each row's incoming gradient times `row_weight(row)`.
fn reference_grad_of_rows(
    logits: &[f64],
    vocab: usize,
    targets: &[i64],
    options: &RefOptions,
    g: &[f64],
    row_weight: impl Fn(usize) -> f64,
) -> Vec<f64> {
    let rows = reference_rows(logits, vocab, targets, options);
    let (d, n) = reference_denominators(&rows);
    let (n_ce, n_z) = match options.reduction {
        Reduction::Mean => (d, n),
        _ => (1.0, 1.0),
    };
    let ls = options.label_smoothing;
    let s = options.z_loss_scale;
    let total = options.weight_total(vocab);
    let mut grad = vec![0.0; logits.len()];
    for (row, &y) in targets.iter().enumerate() {
        if y == options.ignore_index || y < 0 || y >= vocab as i64 {
            continue;
        }
        let y = y as usize;
        let g_row = row_weight(row)
            * match options.reduction {
                Reduction::None => g[row],
                _ => g[0],
            };
        let raw = &logits[row * vocab..(row + 1) * vocab];
        let x = options.capped(raw);
        let l = rows[row].lse;
        let (max, log_sum) = max_and_log_sum(&x);
        let w_y = options.weight(y);
        for c in 0..vocab {
            // Not `exp(x - lse)`: at 1e38 `lse` has lost `ln sum` (ties would each get 1).
            let p = ((x[c] - max) - log_sum).exp();
            let onehot = if c == y { 1.0 } else { 0.0 };
            let ce = (1.0 - ls) * w_y * (p - onehot)
                + ls / vocab as f64 * (total * p - options.weight(c));
            let mut dx = g_row * (ce / n_ce + 2.0 * s * l * p / n_z);
            if let Some(cap) = options.softcap {
                dx *= 1.0 - (x[c] / cap).powi(2);
            }
            if let Some(t) = options.temperature {
                dx /= t;
            }
            grad[row * vocab + c] = dx;
        }
    }
    grad
}

/// The weighted objective `R(w_r loss_r - c_r H_r)` in f64, `w` and `c` one per row
/// (rows that are not counted add nothing whatever their weights): `[N]` for None, `[1]`
/// otherwise; `Mean` divides `sum w_r ce_r` by `D` and `sum (w_r z_r - c_r H_r)` by `n`.
pub fn reference_weighted_loss(
    rows: &[RefRow],
    reduction: Reduction,
    w: &[f64],
    c: &[f64],
) -> Vec<f64> {
    // (w ce, w z - c H) per row.
    let parts: Vec<(f64, f64)> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if r.counted {
                (w[i] * r.ce, w[i] * r.z - c[i] * r.entropy)
            } else {
                (0.0, 0.0)
            }
        })
        .collect();
    match reduction {
        Reduction::None => parts.iter().map(|(ce, z)| ce + z).collect(),
        Reduction::Sum => vec![parts.iter().map(|(ce, z)| ce + z).sum()],
        Reduction::Mean => {
            let (d, n) = reference_denominators(rows);
            if n == 0.0 {
                return vec![0.0];
            }
            let ce: f64 = parts.iter().map(|p| p.0).sum();
            let z: f64 = parts.iter().map(|p| p.1).sum();
            vec![ce / d + z / n]
        }
    }
}

/// The weighted objective's logits gradient in f64 for the incoming gradient `g` (`[N]`
/// for None, `[1]` otherwise): the loss's for `w_r g` and the entropy's for `-c_r g`
/// (divided by `n` for `Mean`).
pub fn reference_weighted_grad(
    logits: &[f64],
    vocab: usize,
    targets: &[i64],
    options: &RefOptions,
    g: &[f64],
    w: &[f64],
    c: &[f64],
) -> Vec<f64> {
    let mut grad = reference_grad_of_rows(logits, vocab, targets, options, g, |row| w[row]);
    let rows = reference_rows(logits, vocab, targets, options);
    let (_, n) = reference_denominators(&rows);
    let scale = match options.reduction {
        Reduction::Mean => 1.0 / n.max(1.0),
        _ => 1.0,
    };
    let g_entropy: Vec<f64> = (0..targets.len())
        .map(|row| {
            let g_row = match options.reduction {
                Reduction::None => g[row],
                _ => g[0],
            };
            -c[row] * g_row * scale
        })
        .collect();
    let entropy = reference_entropy_grad(logits, vocab, targets, options, &g_entropy);
    grad.iter_mut().zip(entropy).for_each(|(a, b)| *a += b);
    grad
}

/// The f64 reference of the entropy's part of the logits' gradient for its incoming
/// gradient `g` (`[N]`): `g_i dH_i/dx_ic` with `dH/dx'_c = -p_c (ln p_c + H)` through the
/// softcap's derivative and the temperature. Rows that are ignored or whose target is not
/// a class are 0 (their entropy is no output of the loss's).
pub fn reference_entropy_grad(
    logits: &[f64],
    vocab: usize,
    targets: &[i64],
    options: &RefOptions,
    g: &[f64],
) -> Vec<f64> {
    let mut grad = vec![0.0; logits.len()];
    for (row, &y) in targets.iter().enumerate() {
        if y == options.ignore_index || y < 0 || y >= vocab as i64 {
            continue;
        }
        let x = options.capped(&logits[row * vocab..(row + 1) * vocab]);
        let (max, log_sum) = max_and_log_sum(&x);
        let entropy = softmax_entropy(&x);
        for c in 0..vocab {
            let log_p = (x[c] - max) - log_sum;
            let p = log_p.exp();
            let mut dx = if p > 0.0 {
                -g[row] * p * (log_p + entropy)
            } else {
                0.0
            };
            if let Some(cap) = options.softcap {
                dx *= 1.0 - (x[c] / cap).powi(2);
            }
            if let Some(t) = options.temperature {
                dx /= t;
            }
            grad[row * vocab + c] = dx;
        }
    }
    grad
}

/// ||actual - expected|| / ||expected||, or the absolute norm when the expected is 0.
/// NaN anywhere makes it infinite.
pub fn relative_l2(actual: &[f64], expected: &[f64]) -> f64 {
    relative_l2_to(actual, expected, expected)
}

/// [`relative_l2`], relative to `scale`'s norm instead of `expected`'s.
pub fn relative_l2_to(actual: &[f64], expected: &[f64], scale: &[f64]) -> f64 {
    assert_eq!(actual.len(), expected.len(), "length mismatch");
    if actual.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let err: f64 = actual
        .iter()
        .zip(expected)
        .map(|(a, e)| (a - e).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = scale.iter().map(|e| e * e).sum::<f64>().sqrt();
    if norm == 0.0 { err } else { err / norm }
}

/// Process-wide device state that parallel tests would race on: the in-place counter
/// (`test_hooks::in_place_backward_count`, bumped on the fusion stream's thread under
/// fusion) and the backend's seeded RNG. Tests that run backward hold this shared; tests
/// that read the counter or need reproducible device randomness hold it exclusively.
static BACKWARD_LOCK: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A test's shared hold of [`BACKWARD_LOCK`]. Fusion runs a stream's ops when it is
/// drained, so a backward whose results were never read could run after its test let go
/// and bump the counter inside another test's exclusive hold: the hold drains the
/// thread's stream before it lets go.
pub struct SharedDevice {
    _hold: std::sync::RwLockReadGuard<'static, ()>,
}

impl Drop for SharedDevice {
    fn drop(&mut self) {
        // A failed sync is the test's own failure, reported where it happened.
        let _ = device().sync();
    }
}

pub fn shared_device() -> SharedDevice {
    SharedDevice {
        _hold: BACKWARD_LOCK.read().unwrap_or_else(|e| e.into_inner()),
    }
}

pub fn exclusive_device() -> std::sync::RwLockWriteGuard<'static, ()> {
    BACKWARD_LOCK.write().unwrap_or_else(|e| e.into_inner())
}

/// Burn's collective keeps one set of peers per backend type: tests that register peers
/// hold this.
static PEERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn collective_peers() -> std::sync::MutexGuard<'static, ()> {
    PEERS.lock().unwrap_or_else(|e| e.into_inner())
}
