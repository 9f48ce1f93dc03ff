//! Shared test harness: seeded random inputs, the f64 CPU reference from the spec, and
//! error measures. Every test draws fresh inputs; the seed is printed on failure and can
//! be pinned with `FUSED_CE_SEED=<u64>`.
#![allow(dead_code, unused_imports)]

use burn::tensor::{DType, Int, Tensor, TensorData, backend::Backend};
use burn_fused_ce::Reduction;
use rand::{Rng, SeedableRng, rngs::SmallRng};

pub use fused_ce_suite::{AutodiffCube, CubeBackend, Device, SUPPORTS_BF16};

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

/// Logits on the device in `dtype`, and the exact values the kernel will see, in f64.
pub fn logits_tensor<B: Backend>(
    values: Vec<f32>,
    rows: usize,
    vocab: usize,
    dtype: DType,
    device: &B::Device,
) -> (Tensor<B, 2>, Vec<f64>) {
    let tensor =
        Tensor::<B, 2>::from_data(TensorData::new(values, [rows, vocab]), device).cast(dtype);
    let seen = to_f64(tensor.clone());
    (tensor, seen)
}

pub fn targets_tensor<B: Backend>(targets: &[i64], device: &B::Device) -> Tensor<B, 1, Int> {
    Tensor::<B, 1, Int>::from_data(TensorData::new(targets.to_vec(), [targets.len()]), device)
}

pub fn to_f64<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f64> {
    tensor
        .into_data()
        .convert::<f64>()
        .to_vec::<f64>()
        .expect("tensor data converts to f64")
}

/// f64 reference per row: (loss, counted). Ignored rows are (0, false).
pub fn reference_rows(
    logits: &[f64],
    vocab: usize,
    targets: &[i64],
    ignore_index: i64,
) -> Vec<(f64, bool)> {
    targets
        .iter()
        .enumerate()
        .map(|(row, &y)| {
            if y == ignore_index {
                return (0.0, false);
            }
            let x = &logits[row * vocab..(row + 1) * vocab];
            (lse(x) - x[y as usize], true)
        })
        .collect()
}

pub fn lse(x: &[f64]) -> f64 {
    let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    max + x.iter().map(|v| (v - max).exp()).sum::<f64>().ln()
}

/// The reduced reference loss: `[N]` for None, `[1]` otherwise.
pub fn reference_loss(rows: &[(f64, bool)], reduction: Reduction) -> Vec<f64> {
    let sum: f64 = rows.iter().map(|r| r.0).sum();
    let count = rows.iter().filter(|r| r.1).count();
    match reduction {
        Reduction::None => rows.iter().map(|r| r.0).collect(),
        Reduction::Sum => vec![sum],
        Reduction::Mean => vec![if count == 0 { 0.0 } else { sum / count as f64 }],
    }
}

/// The f64 reference gradient for incoming gradient `g` (`[N]` for None, `[1]` otherwise).
pub fn reference_grad(
    logits: &[f64],
    vocab: usize,
    targets: &[i64],
    ignore_index: i64,
    reduction: Reduction,
    g: &[f64],
) -> Vec<f64> {
    let count = targets.iter().filter(|&&y| y != ignore_index).count();
    let mut grad = vec![0.0; logits.len()];
    for (row, &y) in targets.iter().enumerate() {
        if y == ignore_index {
            continue;
        }
        let scale = match reduction {
            Reduction::None => g[row],
            Reduction::Sum => g[0],
            Reduction::Mean => g[0] / count.max(1) as f64,
        };
        let x = &logits[row * vocab..(row + 1) * vocab];
        let l = lse(x);
        for c in 0..vocab {
            let p = (x[c] - l).exp();
            let onehot = if c == y as usize { 1.0 } else { 0.0 };
            grad[row * vocab + c] = scale * (p - onehot);
        }
    }
    grad
}

/// ||actual - expected|| / ||expected||, or the absolute norm when the expected is 0.
/// NaN anywhere makes it infinite.
pub fn relative_l2(actual: &[f64], expected: &[f64]) -> f64 {
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
    let norm: f64 = expected.iter().map(|e| e * e).sum::<f64>().sqrt();
    if norm == 0.0 { err } else { err / norm }
}

/// Process-wide device state that parallel tests would race on: the in-place counter
/// (`diagnostics::in_place_backward_count`, bumped on the fusion stream's thread under
/// fusion) and the backend's seeded RNG. Tests that run backward hold this shared; tests
/// that read the counter or need reproducible device randomness hold it exclusively.
static BACKWARD_LOCK: std::sync::RwLock<()> = std::sync::RwLock::new(());

pub fn shared_device() -> std::sync::RwLockReadGuard<'static, ()> {
    BACKWARD_LOCK.read().unwrap_or_else(|e| e.into_inner())
}

pub fn exclusive_device() -> std::sync::RwLockWriteGuard<'static, ()> {
    BACKWARD_LOCK.write().unwrap_or_else(|e| e.into_inner())
}
