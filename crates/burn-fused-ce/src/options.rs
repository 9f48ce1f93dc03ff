//! The loss options and the errors bad input gets, shared by every layer (kernels get
//! plain numbers from them).

use serde::{Deserialize, Serialize};

/// How per-row losses are combined; it decides the output's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Reduction {
    /// One loss per row (the targets' shape); ignored rows are exactly 0.
    None,
    /// `sum ce / D + sum z / n` (PyTorch's weighted mean; `D` is the sum of the targets'
    /// class weights over non-ignored rows, `n` their count). 0 when every row is ignored.
    #[default]
    Mean,
    /// Sum over rows.
    Sum,
}

/// Which extra outputs the forward pass also produces (same pass, no extra read of the
/// logits). None of them has a gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct ExtraOutputs {
    /// The z-loss part alone, reduced like the loss (for logging).
    pub z_loss: bool,
    /// Token accuracy: share of non-ignored rows whose argmax is the target.
    pub accuracy: bool,
    /// The predicted class (argmax, first on ties) per row, -1 on ignored rows.
    pub predicted: bool,
    /// The per-row log-sum-exp of the (soft-capped) logits, 0 on ignored rows.
    pub lse: bool,
}

impl ExtraOutputs {
    /// Every extra output.
    pub fn all() -> Self {
        Self {
            z_loss: true,
            accuracy: true,
            predicted: true,
            lse: true,
        }
    }

    /// Whether the kernel must track the argmax.
    pub(crate) fn needs_argmax(&self) -> bool {
        self.accuracy || self.predicted
    }
}

/// Everything the op needs besides the tensors (class weights are a tensor and travel
/// beside it). Defaults are PyTorch's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossEntropyOptions {
    /// See [`Reduction`].
    pub reduction: Reduction,
    /// Rows whose target equals this contribute no loss, no gradient, no count. May be
    /// negative or inside `[0, V)`.
    pub ignore_index: i64,
    /// PyTorch's `label_smoothing`, in `[0, 1]`.
    pub label_smoothing: f32,
    /// PaLM's z-loss `s * lse^2` per row (Liger's `lse_square_scale`), `>= 0`; never
    /// class-weighted, divided by the count of non-ignored rows under `Mean`.
    pub z_loss_scale: f32,
    /// Logits become `c * tanh(x / c)` before everything else (Gemma 2); `c > 0`.
    pub softcap: Option<f32>,
    /// Check that every target is a class or the ignore index and return an error naming
    /// the first bad row otherwise. Costs one small device-to-host read per call (a sync
    /// point); off, a bad row gets a NaN loss and a zero gradient, never an
    /// out-of-bounds access.
    pub check_targets: bool,
    /// Under autodiff with `Mean` or `Sum`, write the gradient during forward, for an
    /// incoming gradient of 1, in one pass over the logits (rows cut into chunks, each
    /// held on chip while its row's chunks exchange their statistics; over the logits
    /// when nothing else holds them); backward then only rescales it, and does nothing at
    /// all when the incoming gradient is 1 (`loss.backward()`). On the H200, bf16, a
    /// training loop's steady step: 1.11 ms against 1.62 for the default plan at 8192 x
    /// 128256, 1.11 against 1.64 at 4096 x 256000, 0.31 against 0.47 at 8192 x 32000;
    /// f32 8192 x 128256 2.21 against 3.17; label smoothing + z-loss + softcap 1.54
    /// against 1.75. But an incoming gradient other than 1 pays a rescaling pass (2.21
    /// against 1.63 ms); see docs/performance.md. Off (the default): forward keeps
    /// per-row statistics and backward writes the gradient. `Reduction::None` always
    /// uses the latter.
    pub gradient_in_forward: bool,
    /// Extra outputs computed in the same pass.
    pub outputs: ExtraOutputs,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        Self {
            reduction: Reduction::Mean,
            ignore_index: -100,
            label_smoothing: 0.0,
            z_loss_scale: 0.0,
            softcap: None,
            check_targets: true,
            gradient_in_forward: false,
            outputs: ExtraOutputs::default(),
        }
    }
}

impl CrossEntropyOptions {
    /// Options with this reduction and PyTorch's defaults otherwise.
    pub fn new(reduction: Reduction) -> Self {
        Self {
            reduction,
            ..Self::default()
        }
    }

    /// Rejects options outside their domain (before any kernel runs).
    pub fn validate(&self) -> Result<(), CrossEntropyError> {
        let invalid = |name: &'static str, value: f32, expected: &'static str| {
            Err(CrossEntropyError::InvalidOption {
                name,
                value: value.to_string(),
                expected,
            })
        };
        let ls = self.label_smoothing;
        if !(0.0..=1.0).contains(&ls) {
            return invalid("label_smoothing", ls, "a number in [0, 1]");
        }
        let s = self.z_loss_scale;
        if !(s.is_finite() && s >= 0.0) {
            return invalid("z_loss_scale", s, "a finite number >= 0");
        }
        if let Some(cap) = self.softcap
            && !(cap.is_finite() && cap > 0.0)
        {
            return invalid("softcap", cap, "a finite number > 0");
        }
        Ok(())
    }

    /// The ignore index as the kernels compare it (targets are read as i32 there). An
    /// index outside i32 can equal no i32 target, so any out-of-range class stands for it.
    pub(crate) fn kernel_ignore_index(&self) -> i32 {
        i32::try_from(self.ignore_index).unwrap_or(i32::MIN)
    }
}

/// Why the loss refused its input. Every variant is detected before any kernel runs.
#[derive(Debug, Clone, PartialEq)]
pub enum CrossEntropyError {
    /// An option outside its domain.
    InvalidOption {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    /// Tensors whose shapes do not fit together.
    ShapeMismatch(String),
    /// A class weight that is negative or not finite.
    InvalidClassWeight { class: usize, value: f32 },
    /// A target that is neither a class in `[0, vocab)` nor the ignore index.
    TargetOutOfRange {
        row: usize,
        value: i64,
        vocab: usize,
    },
}

impl core::fmt::Display for CrossEntropyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::InvalidOption {
                name,
                value,
                expected,
            } => write!(
                f,
                "fused cross-entropy: option `{name}` is {value}, expected {expected}"
            ),
            Self::ShapeMismatch(what) => write!(f, "fused cross-entropy: {what}"),
            Self::InvalidClassWeight { class, value } => write!(
                f,
                "fused cross-entropy: class weight {class} is {value}, expected a finite number >= 0"
            ),
            Self::TargetOutOfRange { row, value, vocab } => write!(
                f,
                "fused cross-entropy: target {value} at row {row} is not a class in [0, {vocab}) nor the ignore index"
            ),
        }
    }
}

impl std::error::Error for CrossEntropyError {}
