//! The loss options, shared by every layer (kernels get plain numbers from them).

use fused_ce_kernels::KernelTuning;
use serde::{Deserialize, Serialize};

use crate::error::CrossEntropyError;
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
/// logits). Only a [`EntropyOutput::Differentiable`] entropy has a gradient.
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
    /// softcap, 0 on ignored rows: a metric, or a differentiable output for an objective
    /// that uses it (see [`EntropyOutput`]).
    pub entropy: EntropyOutput,
}

impl ExtraOutputs {
    /// Every extra output, the entropy as a metric.
    pub fn all() -> Self {
        Self {
            z_loss: true,
            accuracy: true,
            predicted: true,
            lse: true,
            entropy: EntropyOutput::Metric,
        }
    }

    /// Whether the kernel must track the argmax.
    pub(crate) fn needs_argmax(&self) -> bool {
        self.accuracy || self.predicted
    }
}

/// Whether the forward pass also gives each row's entropy, and whether that entropy has
/// a gradient. Decided at forward, so that the gradient plan can keep what backward needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum EntropyOutput {
    /// No entropy.
    #[default]
    Off,
    /// The entropy as a metric (what RL trainers log): computed in the same pass at no
    /// extra cost, with no gradient.
    Metric,
    /// The entropy with a gradient, for an objective that uses it (an entropy bonus, `a *
    /// loss - b * entropy` per row): its gradient joins the loss's in the one backward
    /// step that reads the logits. [`GradientPlan::Auto`] then takes two passes;
    /// [`GradientPlan::OnePass`], which forms the loss's gradient alone in forward, is
    /// refused.
    Differentiable,
}

impl EntropyOutput {
    /// Whether the entropy is computed at all.
    pub fn is_on(self) -> bool {
        self != Self::Off
    }
}

/// How the gradient is formed under autodiff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum GradientPlan {
    /// [`GradientPlan::OnePass`] for `Mean` and `Sum`, [`GradientPlan::TwoPass`] for
    /// `Reduction::None` (whose per-row incoming gradient is unknown at forward) or with a
    /// [`EntropyOutput::Differentiable`] entropy.
    #[default]
    Auto,
    /// `Mean` and `Sum`: forward also writes the gradient in the same pass over the
    /// logits (rows cut into chunks, each held on chip while its row's chunks exchange
    /// their statistics; over the logits when nothing else holds them), formed for a
    /// guessed incoming gradient: the last one this loss saw (1 at first; a loss module
    /// remembers it between calls, the functions guess 1). Backward does nothing when the
    /// guess was right, as it is in a training loop with a constant scale
    /// (`loss.backward()`, `(loss / steps).backward()`), and rescales the gradient once
    /// when it was not. No host read either way. `Reduction::None` takes two passes all
    /// the same. The fused linear cross-entropy forms the hidden states', weight's and
    /// bias's gradients in forward the same way, chunk by chunk. Refused with a
    /// differentiable entropy.
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
    /// [`crate::target_check::wait_for_target_checks`] waits for every pending check and returns the
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
    /// Also the logarithm the entropy weights' gradient takes of kept exponentials, as
    /// `lg2.approx.ftz.f32`.
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
/// beside it). Defaults are PyTorch's. Built with [`CrossEntropyOptions::new`] or
/// `default()` and the `with_*` setters, as Burn's configs are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossEntropyOptions {
    /// See [`Reduction`].
    pub reduction: Reduction,
    /// Rows whose target equals this contribute no loss, no gradient, no count. May be
    /// negative or inside `[0, V)`; within `[-2^31, 2^31 - 2]`, as the kernels read
    /// targets as 32-bit integers.
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
    /// results.
    #[serde(skip)]
    tuning: Option<KernelTuning>,
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

/// Setters that return the options changed, one per field, named as Burn's configs name
/// theirs.
macro_rules! setters {
    ($($(#[$doc:meta])* $setter:ident: $field:ident: $ty:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $setter(mut self, $field: $ty) -> Self {
                self.$field = $field;
                self
            }
        )*
    };
}

impl CrossEntropyOptions {
    /// Options with this reduction and PyTorch's defaults otherwise.
    pub fn new(reduction: Reduction) -> Self {
        Self {
            reduction,
            ..Self::default()
        }
    }

    setters! {
        /// Sets [`Self::reduction`].
        with_reduction: reduction: Reduction;
        /// Sets [`Self::ignore_index`].
        with_ignore_index: ignore_index: i64;
        /// Sets [`Self::label_smoothing`].
        with_label_smoothing: label_smoothing: f32;
        /// Sets [`Self::z_loss_scale`].
        with_z_loss_scale: z_loss_scale: f32;
        /// Sets [`Self::temperature`].
        with_temperature: temperature: Option<f32>;
        /// Sets [`Self::softcap`].
        with_softcap: softcap: Option<f32>;
        /// Sets [`Self::target_check`].
        with_target_check: target_check: TargetCheck;
        /// Sets [`Self::gradient_plan`].
        with_gradient_plan: gradient_plan: GradientPlan;
        /// Sets [`Self::outputs`].
        with_outputs: outputs: ExtraOutputs;
        /// Sets [`Self::fast_math`].
        with_fast_math: fast_math: FastMath;
        /// Sets [`Self::mean_denominators`].
        with_mean_denominators: mean_denominators: Option<MeanDenominators>;
    }

    /// The kernels' launch shapes instead of the device's defaults (`None`: the
    /// defaults). Changes speed, never results; for benches and tuning sweeps.
    #[doc(hidden)]
    pub fn with_tuning(mut self, tuning: Option<KernelTuning>) -> Self {
        self.tuning = tuning;
        self
    }

    /// The launch shapes set by [`Self::with_tuning`], if any.
    #[doc(hidden)]
    pub fn tuning(&self) -> Option<&KernelTuning> {
        self.tuning.as_ref()
    }

    /// Rejects options outside their domain, or that do not go together (before any
    /// kernel runs).
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
        if !(i64::from(i32::MIN) <= self.ignore_index && self.ignore_index < i64::from(i32::MAX)) {
            return Err(CrossEntropyError::invalid_option(
                "ignore_index",
                self.ignore_index,
                "an integer in [-2^31, 2^31 - 2]",
            ));
        }
        if self.gradient_plan == GradientPlan::OnePass
            && self.outputs.entropy == EntropyOutput::Differentiable
        {
            return Err(CrossEntropyError::invalid_option(
                "gradient_plan",
                "OnePass",
                "Auto or TwoPass with a differentiable entropy (the one pass forms the \
                 loss's gradient alone, in forward)",
            ));
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

    /// Whether the one pass applies to a call under autodiff: `Mean` or `Sum`, a plan
    /// other than `TwoPass`, and no differentiable entropy (which [`Self::validate`]
    /// refuses with `OnePass`; a backend called directly gets two passes then).
    pub(crate) fn one_pass(&self) -> bool {
        self.reduction != Reduction::None
            && self.gradient_plan != GradientPlan::TwoPass
            && self.outputs.entropy != EntropyOutput::Differentiable
    }

    /// Whether the entropy output is tracked by autodiff.
    pub(crate) fn differentiable_entropy(&self) -> bool {
        self.outputs.entropy == EntropyOutput::Differentiable
    }

    /// The ignore index as the kernels compare it (targets are read as i32 there, a
    /// target outside i32 as `i32::MAX`, which no valid ignore index equals;
    /// [`Self::validate`] keeps the index in range).
    #[cfg(feature = "cube")]
    pub(crate) fn kernel_ignore_index(&self) -> i32 {
        i32::try_from(self.ignore_index).unwrap_or(i32::MIN)
    }
}

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
        assert_eq!(options.gradient_plan, GradientPlan::Auto);
        assert_eq!(options.outputs.entropy, EntropyOutput::Off);
        assert_eq!(options.tuning(), None);
    }

    #[test]
    fn setters_set_their_field() {
        let denominators = MeanDenominators {
            weight_total: 3.0,
            rows: 4.0,
        };
        let options = CrossEntropyOptions::new(Reduction::Sum)
            .with_reduction(Reduction::Mean)
            .with_ignore_index(7)
            .with_label_smoothing(0.25)
            .with_z_loss_scale(1e-3)
            .with_temperature(Some(0.5))
            .with_softcap(Some(30.0))
            .with_target_check(TargetCheck::Off)
            .with_gradient_plan(GradientPlan::TwoPass)
            .with_outputs(ExtraOutputs::all())
            .with_fast_math(FastMath::off())
            .with_mean_denominators(Some(denominators));
        assert_eq!(options.reduction, Reduction::Mean);
        assert_eq!(options.ignore_index, 7);
        assert_eq!(options.label_smoothing, 0.25);
        assert_eq!(options.z_loss_scale, 1e-3);
        assert_eq!(options.temperature, Some(0.5));
        assert_eq!(options.softcap, Some(30.0));
        assert_eq!(options.target_check, TargetCheck::Off);
        assert_eq!(options.gradient_plan, GradientPlan::TwoPass);
        assert_eq!(options.outputs, ExtraOutputs::all());
        assert_eq!(options.fast_math, FastMath::off());
        assert_eq!(options.mean_denominators, Some(denominators));
        let tuning = KernelTuning::defaults(true, true);
        assert_eq!(options.with_tuning(Some(tuning)).tuning(), Some(&tuning));
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
        for index in [i64::from(i32::MIN) - 1, i64::from(i32::MAX), i64::MAX] {
            let options = CrossEntropyOptions::default().with_ignore_index(index);
            assert_eq!(rejected(options), "ignore_index", "{index}");
        }
        for index in [i64::from(i32::MIN), i64::from(i32::MAX) - 1, 0, -100] {
            let options = CrossEntropyOptions::default().with_ignore_index(index);
            assert_eq!(options.validate(), Ok(()), "{index}");
        }
        let mut tuning = KernelTuning::defaults(true, true);
        tuning.row_loads = 0;
        let options = CrossEntropyOptions::default().with_tuning(Some(tuning));
        assert_eq!(rejected(options), "tuning");
        assert_eq!(with(|o| o.label_smoothing = 1.0).validate(), Ok(()));
        assert_eq!(with(|o| o.softcap = Some(30.0)).validate(), Ok(()));
    }

    #[test]
    fn a_differentiable_entropy_refuses_only_an_explicit_one_pass() {
        let differentiable = ExtraOutputs {
            entropy: EntropyOutput::Differentiable,
            ..ExtraOutputs::default()
        };
        for reduction in [Reduction::None, Reduction::Mean, Reduction::Sum] {
            let options = CrossEntropyOptions::new(reduction).with_outputs(differentiable);
            assert_eq!(options.validate(), Ok(()));
            assert!(!options.one_pass(), "{reduction:?}: Auto keeps the logits");
            let one_pass = options.clone().with_gradient_plan(GradientPlan::OnePass);
            assert!(
                !one_pass.one_pass(),
                "{reduction:?}: never without the logits"
            );
            let two_pass = options.clone().with_gradient_plan(GradientPlan::TwoPass);
            assert_eq!(two_pass.validate(), Ok(()));
            let one_pass = options.with_gradient_plan(GradientPlan::OnePass);
            assert_eq!(rejected(one_pass), "gradient_plan", "{reduction:?}");
        }
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
        options.gradient_plan = GradientPlan::Auto;
        assert!(!options.one_pass());
        options.reduction = Reduction::Mean;
        options.outputs.entropy = EntropyOutput::Metric;
        assert!(
            options.one_pass(),
            "a metric entropy costs the one pass nothing"
        );
    }

    #[test]
    #[cfg(feature = "cube")]
    fn ignore_index_as_the_kernels_compare_it() {
        let options = CrossEntropyOptions::default();
        assert_eq!(options.kernel_ignore_index(), -100);
        let options = options.with_ignore_index(i64::from(i32::MIN));
        assert_eq!(options.kernel_ignore_index(), i32::MIN);
    }
}
