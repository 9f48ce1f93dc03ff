//! The loss module users put in their model, configured like Burn's own losses.

use core::marker::PhantomData;

use burn::{
    config::Config,
    module::Module,
    tensor::{Int, Tensor, backend::Backend},
};

use crate::{
    backend::{FusedCrossEntropyBackend, fused_cross_entropy},
    options::{CrossEntropyOptions, Reduction},
};

/// Configuration of [`FusedCrossEntropyLoss`] (serde-serialisable, like Burn's configs).
#[derive(Config, Debug, PartialEq)]
pub struct FusedCrossEntropyLossConfig {
    /// How per-row losses are combined: `None` gives `[N]`, `Mean` and `Sum` give `[1]`.
    #[config(default = "Reduction::Mean")]
    pub reduction: Reduction,
    /// Rows whose target equals this are ignored (PyTorch's default, -100).
    #[config(default = -100)]
    pub ignore_index: i64,
}

impl FusedCrossEntropyLossConfig {
    /// Builds the loss. The device is unused; it is taken so the call reads like
    /// `CrossEntropyLossConfig::new().init(&device)`.
    pub fn init<B: Backend>(&self, _device: &B::Device) -> FusedCrossEntropyLoss<B> {
        FusedCrossEntropyLoss {
            options: self.options(),
            _backend: PhantomData,
        }
    }

    /// The op-level options this config stands for.
    pub fn options(&self) -> CrossEntropyOptions {
        CrossEntropyOptions {
            reduction: self.reduction,
            ignore_index: self.ignore_index,
        }
    }
}

/// Cross-entropy of logits against class indices, computed by fused kernels.
#[derive(Module, Debug)]
pub struct FusedCrossEntropyLoss<B: Backend> {
    #[module(skip)]
    options: CrossEntropyOptions,
    _backend: PhantomData<B>,
}

impl<B: FusedCrossEntropyBackend> FusedCrossEntropyLoss<B> {
    /// Loss of `logits [N, V]` against `targets [N]`: length N for `Reduction::None`,
    /// length 1 otherwise, in the logits' dtype.
    pub fn forward(&self, logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        fused_cross_entropy(logits, targets, &self.options)
    }
}
