//! One call of the loss as the tests describe it ([`Call`]), the incoming gradient its
//! objective feeds it ([`Incoming`]), and what it gives back, read to the host
//! ([`HostOutput`], [`Tracked`]). `run_call.rs` runs a call on a backend.
#![allow(dead_code)]

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_fused_ce::{CrossEntropyOptions, CrossEntropyOutput, Reduction};
use rand::{Rng, rngs::SmallRng};

use crate::common::{int_to_i64, to_f64};

/// A tensor read back: values, shape, dtype.
#[derive(Debug, Clone)]
pub struct HostTensor {
    pub values: Vec<f64>,
    pub dims: Vec<usize>,
    pub dtype: DType,
}

impl HostTensor {
    pub fn read<const D: usize>(tensor: &Tensor<D>) -> Self {
        Self {
            dims: tensor.dims().to_vec(),
            dtype: tensor.dtype(),
            values: to_f64(tensor.clone()),
        }
    }

    pub fn read_int<const D: usize>(tensor: &Tensor<D, Int>) -> Self {
        Self {
            dims: tensor.dims().to_vec(),
            dtype: tensor.dtype(),
            values: int_to_i64(tensor.clone())
                .into_iter()
                .map(|v| v as f64)
                .collect(),
        }
    }
}

/// Every output of one call read back. `target_dims`: the shape per-row outputs have
/// (the targets' through `Tensor<D>`; `[N]` on primitives, which the function layer
/// reshapes).
#[derive(Debug, Clone)]
pub struct HostOutput {
    pub target_dims: Vec<usize>,
    pub loss: HostTensor,
    pub z_loss: Option<HostTensor>,
    pub accuracy: Option<HostTensor>,
    pub predicted: Option<HostTensor>,
    pub lse: Option<HostTensor>,
    pub entropy: Option<HostTensor>,
}

impl HostOutput {
    /// Reads every output (tracked ones through a clone, so backward can still run).
    pub fn read<const D: usize>(out: &CrossEntropyOutput<D>, target_dims: Vec<usize>) -> Self {
        Self {
            target_dims,
            loss: HostTensor::read(&out.loss),
            z_loss: out.z_loss.as_ref().map(HostTensor::read),
            accuracy: out.accuracy.as_ref().map(HostTensor::read),
            predicted: out.predicted.as_ref().map(HostTensor::read_int),
            lse: out.lse.as_ref().map(HostTensor::read),
            entropy: out.entropy.as_ref().map(HostTensor::read),
        }
    }
}

/// One call of the loss, to run on any [`TestBackend`] (see `calls.rs`).
#[derive(Debug, Clone)]
pub struct Call<'a> {
    /// Logits `[rows, vocab]` row-major, before the cast to `dtype`.
    pub values: Vec<f32>,
    pub rows: usize,
    pub vocab: usize,
    pub dtype: DType,
    pub targets: &'a [i64],
    pub weights: Option<&'a [f32]>,
    pub options: &'a CrossEntropyOptions,
    /// The incoming gradient of a tracked call.
    pub incoming: Incoming,
    /// Logits nobody else holds (backward may write over them), or a leaf the test keeps
    /// (backward must write a new buffer, checked unchanged afterwards).
    pub exclusive: bool,
    /// `Some(b)`: logits `[b, rows / b, V]` with targets `[b, rows / b]`.
    pub batch: Option<usize>,
    /// Through `FusedCrossEntropyLossConfig::try_init(..).try_forward_with_outputs`
    /// instead of `try_fused_cross_entropy` (`Tensor<D>` only: the module is a function
    /// of tensors).
    pub via_module: bool,
}

impl<'a> Call<'a> {
    /// Held 2-D logits through the function, an incoming gradient of 1.
    pub fn new(
        values: Vec<f32>,
        (rows, vocab): (usize, usize),
        dtype: DType,
        targets: &'a [i64],
        weights: Option<&'a [f32]>,
        options: &'a CrossEntropyOptions,
    ) -> Self {
        Self {
            values,
            rows,
            vocab,
            dtype,
            targets,
            weights,
            options,
            incoming: Incoming::Unit,
            exclusive: false,
            batch: None,
            via_module: false,
        }
    }

    /// The targets' shape.
    pub fn target_dims(&self) -> Vec<usize> {
        match self.batch {
            Some(b) => vec![b, self.rows / b],
            None => vec![self.rows],
        }
    }

    /// The logits' shape.
    pub fn logits_dims(&self) -> Vec<usize> {
        let mut dims = self.target_dims();
        dims.push(self.vocab);
        dims
    }
}

/// A tracked call's results: the logits as the kernel saw them (f64), the outputs, the
/// logits' gradient (the logits' shape) and the incoming gradient as the loss's dtype
/// rounds it (`[N]` for None, `[1]` otherwise).
#[derive(Debug, Clone)]
pub struct Tracked {
    pub seen: Vec<f64>,
    pub out: HostOutput,
    pub grad: HostTensor,
    pub g: Vec<f64>,
}

/// The incoming gradient a test's objective feeds the loss.
#[derive(Debug, Clone)]
pub enum Incoming {
    /// `loss.sum()`: exactly 1 per element (which the one pass does not rescale).
    Unit,
    /// `(loss * w).sum()` with per-row `w` (Reduction::None).
    PerRow(Vec<f32>),
    /// `(loss * s).sum()` (Mean, Sum).
    Scale(f32),
}

impl Incoming {
    /// What the contract tests use: random per-row `w` in [0.25, 4) for None, 3.7
    /// otherwise.
    pub fn draw(reduction: Reduction, rows: usize, rng: &mut SmallRng) -> Self {
        match reduction {
            Reduction::None => {
                Self::PerRow((0..rows).map(|_| rng.random_range(0.25..4.0)).collect())
            }
            _ => Self::Scale(3.7),
        }
    }

    /// The incoming gradient's values for a loss of `len` elements, before rounding.
    pub fn values(&self, len: usize) -> Vec<f32> {
        match self {
            Self::Unit => vec![1.0; len],
            Self::PerRow(w) => {
                assert_eq!(w.len(), len, "one weight per row");
                w.clone()
            }
            Self::Scale(s) => vec![*s; len],
        }
    }

    /// The incoming gradient as the loss's dtype rounds it (read back from `device`).
    pub fn rounded(&self, len: usize, dtype: DType, device: &Device) -> Vec<f64> {
        let values = self.values(len);
        if values.is_empty() {
            return Vec::new();
        }
        to_f64(Tensor::<1>::from_data(TensorData::new(values, [len]), device).cast(dtype))
    }

    /// The objective whose gradient with respect to the tracked `loss` (rank 1) is this.
    pub fn objective(&self, loss: Tensor<1>) -> Tensor<1> {
        match self {
            Self::Unit => loss.sum(),
            Self::PerRow(w) => {
                let [len] = loss.dims();
                let weights =
                    Tensor::<1>::from_data(TensorData::new(w.clone(), [len]), &loss.device())
                        .cast(loss.dtype());
                (loss * weights).sum()
            }
            Self::Scale(s) => (loss * *s).sum(),
        }
    }
}

/// Asserts two tensors' values are the same, NaN matching NaN (non-finite logits stay in
/// held tensors), naming the first difference.
pub fn assert_same_values(got: &[f64], expected: &[f64], context: &str) {
    assert_eq!(got.len(), expected.len(), "{context}: length");
    let differs = |(a, b): (&f64, &f64)| !(a == b || (a.is_nan() && b.is_nan()));
    if let Some(i) = got.iter().zip(expected).position(differs) {
        panic!(
            "{context}: element {i} is {} instead of {}",
            got[i], expected[i]
        );
    }
}
