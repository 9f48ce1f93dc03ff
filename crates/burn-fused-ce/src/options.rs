//! The loss options and the errors bad input gets, shared by every layer (kernels get
//! plain numbers from them).

use fused_ce_kernels::KernelTuning;
use serde::{Deserialize, Serialize};

use crate::mean_denominators::MeanDenominators;

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
/// logits). Only the entropy has a gradient (see [`ExtraOutputs::entropy`]).
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
    /// The per-row entropy of the softmax, `-sum_c p_c ln p_c`, after temperature and
    /// softcap (what RL trainers log), 0 on ignored rows. Differentiable: an objective
    /// that uses it (an entropy bonus, `a * loss - b * entropy` per row) gets its
    /// gradient in the same backward pass as the loss's, where backward reads the logits:
    /// `Reduction::None` or [`GradientPlan::TwoPass`]. The one pass forms the loss's
    /// gradient alone in forward; using the entropy in its objective panics in backward.
    pub entropy: bool,
}

impl ExtraOutputs {
    /// Every extra output.
    pub fn all() -> Self {
        Self {
            z_loss: true,
            accuracy: true,
            predicted: true,
            lse: true,
            entropy: true,
        }
    }

    /// Whether the kernel must track the argmax.
    pub(crate) fn needs_argmax(&self) -> bool {
        self.accuracy || self.predicted
    }
}

/// How the gradient is formed under autodiff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum GradientPlan {
    /// `Mean` and `Sum`: forward also writes the gradient in the same pass over the
    /// logits (rows cut into chunks, each held on chip while its row's chunks exchange
    /// their statistics; over the logits when nothing else holds them), formed for a
    /// guessed incoming gradient: the last one this loss saw (1 at first; a loss module
    /// remembers it between calls, the functions guess 1). Backward does nothing when the
    /// guess was right, as it is in a training loop with a constant scale
    /// (`loss.backward()`, `(loss / steps).backward()`), and rescales the gradient once
    /// when it was not. No host read either way. `Reduction::None`, whose per-row
    /// gradient is unknown at forward, uses [`GradientPlan::TwoPass`]. The fused linear
    /// cross-entropy forms the hidden states', weight's and bias's gradients in forward
    /// the same way, chunk by chunk.
    #[default]
    OnePass,
    /// Forward keeps per-row statistics (`O(N)`); backward reads the logits again and
    /// writes the gradient (over them when nothing else holds them). Any reduction, any
    /// incoming gradient, the entropy's too (an entropy bonus), at the cost of a second
    /// read of the logits. The fused linear cross-entropy computes each chunk's logits
    /// again in backward: one more matmul of the three a step runs.
    TwoPass,
}

/// How targets outside `[0, V)` that are not the ignore index are reported. Whatever
/// the check, such a row gets a NaN loss and a zero gradient, and is never used as an
/// address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum TargetCheck {
    /// No check.
    Off,
    /// The device checks every call's targets and the host reads the result later,
    /// without waiting for the call's kernels: a bad target makes the second later call
    /// of the loss on the same thread return [`CrossEntropyError::TargetOutOfRange`]
    /// (panic in `forward`) before it computes anything;
    /// [`crate::wait_for_target_checks`] waits for every pending check and returns the
    /// error at once. The call that received the bad target, and the one after it, run
    /// as with the check off.
    #[default]
    Deferred,
    /// The device checks the targets and the host waits for the result: the call itself
    /// returns the error. One device-to-host read per call, which stalls a training
    /// loop's queue.
    Immediate,
}

/// Fast-math switches that change results slightly, for speed. Effective on the CUDA
/// runtime only; other runtimes always compute the accurate way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FastMath {
    /// The streaming loops' exponential as `ex2.approx.ftz.f32`: results below 2^-126
    /// (probabilities under 1.2e-38) become 0, as they would in bf16 storage anyway;
    /// every other result is the hardware's fast exponential either way (a few ulp).
    pub exp_flush_to_zero: bool,
    /// Softcap's `tanh` as the hardware's `tanh.approx.f32` for bf16 logits (relative
    /// error about 2^-11, below bf16's own rounding of 2^-8); f32 and f16 logits always
    /// use the accurate `tanh`.
    pub approximate_tanh: bool,
}

impl Default for FastMath {
    fn default() -> Self {
        Self {
            exp_flush_to_zero: true,
            approximate_tanh: true,
        }
    }
}

impl FastMath {
    /// Both switches off: the accurate functions everywhere.
    pub fn off() -> Self {
        Self {
            exp_flush_to_zero: false,
            approximate_tanh: false,
        }
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
    /// Logits are divided by `T` before everything else, softcap included (sampling's
    /// temperature, for RL trainers); `T > 0`. `None` is `T = 1`.
    pub temperature: Option<f32>,
    /// Logits become `c * tanh(x / c)` before everything else but the temperature (Gemma
    /// 2); `c > 0`.
    pub softcap: Option<f32>,
    /// How targets that are neither a class nor the ignore index are reported (see
    /// [`TargetCheck`]).
    pub target_check: TargetCheck,
    /// How the gradient is formed under autodiff (see [`GradientPlan`]).
    pub gradient_plan: GradientPlan,
    /// Extra outputs computed in the same pass.
    pub outputs: ExtraOutputs,
    /// See [`FastMath`].
    pub fast_math: FastMath,
    /// `Reduction::Mean`'s denominators given for this call instead of its own: a whole
    /// batch's, when its parts are separate calls (see [`MeanDenominators`]).
    pub mean_denominators: Option<MeanDenominators>,
    /// Launch shapes of the kernels; `None`: the device's defaults. Changes speed, never
    /// results. For benches and tuning sweeps.
    #[doc(hidden)]
    #[serde(skip)]
    pub tuning: Option<KernelTuning>,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        Self {
            reduction: Reduction::Mean,
            ignore_index: -100,
            label_smoothing: 0.0,
            z_loss_scale: 0.0,
            temperature: None,
            softcap: None,
            target_check: TargetCheck::default(),
            gradient_plan: GradientPlan::default(),
            outputs: ExtraOutputs::default(),
            fast_math: FastMath::default(),
            mean_denominators: None,
            tuning: None,
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
        let invalid = |name, value: f32, expected| {
            Err(CrossEntropyError::invalid_option(name, value, expected))
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
        if let Some(temperature) = self.temperature
            && !(temperature.is_finite() && temperature > 0.0 && (1.0 / temperature).is_finite())
        {
            return invalid("temperature", temperature, "a finite number > 0");
        }
        if let Some(denominators) = &self.mean_denominators {
            validate_mean_denominators(denominators, self.reduction)?;
        }
        if let Some(tuning) = &self.tuning
            && let Err(error) = tuning.validate()
        {
            return Err(CrossEntropyError::invalid_option(
                "tuning",
                error.setting,
                error.expected,
            ));
        }
        Ok(())
    }

    /// Whether the one pass applies to a call under autodiff (asked for, a scalar incoming
    /// gradient).
    pub(crate) fn one_pass(&self) -> bool {
        self.gradient_plan == GradientPlan::OnePass && self.reduction != Reduction::None
    }

    /// The ignore index as the kernels compare it (targets are read as i32 there). An
    /// index outside i32 can equal no i32 target, so any out-of-range class stands for it.
    pub(crate) fn kernel_ignore_index(&self) -> i32 {
        i32::try_from(self.ignore_index).unwrap_or(i32::MIN)
    }
}

/// Why the loss refused its input. Every variant but a deferred target check's is
/// detected before any kernel of the call runs.
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
        /// Found by a deferred check: the row is one of an earlier call's targets.
        earlier_call: bool,
    },
    /// The vocabulary-parallel loss's exchange between shards failed.
    Exchange(String),
}

impl CrossEntropyError {
    /// [`Self::InvalidOption`]: option `name` is `value`, `expected` says what it may be.
    pub(crate) fn invalid_option(
        name: &'static str,
        value: impl ToString,
        expected: &'static str,
    ) -> Self {
        Self::InvalidOption {
            name,
            value: value.to_string(),
            expected,
        }
    }
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
            Self::TargetOutOfRange {
                row,
                value,
                vocab,
                earlier_call,
            } => write!(
                f,
                "fused cross-entropy: target {value} at row {row}{} is not a class in [0, {vocab}) nor the ignore index",
                if *earlier_call {
                    " of an earlier call (checked after it ran)"
                } else {
                    ""
                }
            ),
            Self::Exchange(why) => write!(
                f,
                "fused cross-entropy: the shards' exchange of row statistics failed: {why}"
            ),
        }
    }
}

impl std::error::Error for CrossEntropyError {}

/// Refuses mean denominators that are negative, not finite, or given to a reduction
/// other than `Mean`.
fn validate_mean_denominators(
    denominators: &MeanDenominators,
    reduction: Reduction,
) -> Result<(), CrossEntropyError> {
    let invalid = |value: String, expected| {
        Err(CrossEntropyError::invalid_option(
            "mean_denominators",
            value,
            expected,
        ))
    };
    if reduction != Reduction::Mean {
        return invalid(
            format!("{denominators:?}"),
            "none, except with Reduction::Mean",
        );
    }
    for value in [denominators.weight_total, denominators.rows] {
        if !(value.is_finite() && value >= 0.0) {
            return invalid(value.to_string(), "finite numbers >= 0");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(options: CrossEntropyOptions) -> &'static str {
        match options.validate() {
            Err(CrossEntropyError::InvalidOption { name, .. }) => name,
            other => panic!("expected an invalid option, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_pytorchs_and_valid() {
        let options = CrossEntropyOptions::default();
        assert_eq!(options.validate(), Ok(()));
        assert_eq!(options.reduction, Reduction::Mean);
        assert_eq!(options.ignore_index, -100);
        assert_eq!(options.label_smoothing, 0.0);
        assert_eq!(options.target_check, TargetCheck::Deferred);
        assert_eq!(options.gradient_plan, GradientPlan::OnePass);
    }

    #[test]
    fn options_out_of_their_domain_are_named() {
        let with = |f: fn(&mut CrossEntropyOptions)| {
            let mut options = CrossEntropyOptions::default();
            f(&mut options);
            options
        };
        assert_eq!(
            rejected(with(|o| o.label_smoothing = 1.5)),
            "label_smoothing"
        );
        assert_eq!(
            rejected(with(|o| o.label_smoothing = -0.1)),
            "label_smoothing"
        );
        assert_eq!(
            rejected(with(|o| o.label_smoothing = f32::NAN)),
            "label_smoothing"
        );
        assert_eq!(rejected(with(|o| o.z_loss_scale = -1.0)), "z_loss_scale");
        assert_eq!(
            rejected(with(|o| o.z_loss_scale = f32::INFINITY)),
            "z_loss_scale"
        );
        assert_eq!(rejected(with(|o| o.softcap = Some(0.0))), "softcap");
        assert_eq!(rejected(with(|o| o.softcap = Some(f32::NAN))), "softcap");
        let mut tuning = KernelTuning::defaults(true, true);
        tuning.row_loads = 0;
        let options = CrossEntropyOptions {
            tuning: Some(tuning),
            ..Default::default()
        };
        assert_eq!(rejected(options), "tuning");
        assert_eq!(with(|o| o.label_smoothing = 1.0).validate(), Ok(()));
        assert_eq!(with(|o| o.softcap = Some(30.0)).validate(), Ok(()));
    }

    #[test]
    fn one_pass_only_for_reduced_losses() {
        let mut options = CrossEntropyOptions::default();
        assert!(options.one_pass());
        options.gradient_plan = GradientPlan::TwoPass;
        assert!(!options.one_pass());
        options.gradient_plan = GradientPlan::OnePass;
        options.reduction = Reduction::Sum;
        assert!(options.one_pass());
        options.reduction = Reduction::None;
        assert!(!options.one_pass());
    }

    #[test]
    fn ignore_index_outside_i32_matches_no_target() {
        let mut options = CrossEntropyOptions::default();
        assert_eq!(options.kernel_ignore_index(), -100);
        options.ignore_index = i64::from(i32::MAX) + 1;
        assert_eq!(options.kernel_ignore_index(), i32::MIN);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let error = CrossEntropyError::TargetOutOfRange {
            row: 7,
            value: 50_000,
            vocab: 32_000,
            earlier_call: false,
        };
        let text = error.to_string();
        assert!(text.contains("row 7") && text.contains("50000") && text.contains("32000"));
        let error = CrossEntropyError::TargetOutOfRange {
            row: 7,
            value: 50_000,
            vocab: 32_000,
            earlier_call: true,
        };
        assert!(error.to_string().contains("earlier call"));
    }
}
