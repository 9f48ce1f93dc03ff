//! The denominators of `Reduction::Mean` given for a call: those of a whole batch whose
//! parts are separate calls (gradient accumulation).

use core::ops::Add;

use serde::{Deserialize, Serialize};

/// What `Reduction::Mean` divides by, given instead of the call's own: the denominators
/// of a whole batch that is passed in parts, one call each (gradient accumulation over
/// micro-batches). Each part's loss is then its share of the whole batch's mean, so the
/// parts' losses, and their gradients, add up to the whole batch's, whatever each part's
/// count of ignored rows. Set it per call with
/// [`FusedCrossEntropyLoss::with_mean_denominators`](crate::FusedCrossEntropyLoss::with_mean_denominators)
/// (or the linear loss's), or in [`CrossEntropyOptions::mean_denominators`](crate::CrossEntropyOptions::mean_denominators).
///
/// The mean is PyTorch's: the cross-entropy part is divided by `weight_total`, the
/// z-loss by `rows`. Both are clamped as the call's own are (`weight_total` to at least
/// `f32::MIN_POSITIVE`, `rows` to at least 1), so an all-ignored batch gives 0.
///
/// # Example
///
/// Two micro-batches, their denominators counted on the host and summed:
///
/// ```rust
/// # use burn::tensor::{Device, DeviceKind, Distribution, Int, Tensor};
/// # let device = Device::wgpu(DeviceKind::DefaultDevice).autodiff();
/// # let loss_fn = burn_fused_ce::FusedCrossEntropyLossConfig::new().init(&device);
/// use burn_fused_ce::MeanDenominators;
///
/// let parts: Vec<Vec<i64>> = vec![vec![1, 2, -100, 9], vec![-100, -100, 3, 4]];
/// let whole = parts
///     .iter()
///     .map(|targets| MeanDenominators::of_targets(targets, -100, None))
///     .fold(MeanDenominators::rows(0), |sum, part| sum + part); // 5 counted rows
/// let part_loss = loss_fn.with_mean_denominators(Some(whole));
/// for targets in &parts {
///     let logits = Tensor::<2>::random([4, 10], Distribution::Default, &device).require_grad();
///     let targets = Tensor::<1, Int>::from_ints(targets.as_slice(), &device);
///     let loss = part_loss.forward(logits.clone(), targets);
///     let _grad = logits.grad(&loss.backward()).unwrap(); // this part's share of the whole
/// }
/// # device.sync().unwrap(); // exiting with work in flight can crash lavapipe
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MeanDenominators {
    /// `D`: the targets' class weights summed over the whole batch's counted rows (rows
    /// whose target is not the ignore index; a target outside the classes weighs 1);
    /// without class weights, the count of those rows.
    pub weight_total: f64,
    /// `n`: the whole batch's counted rows.
    pub rows: f64,
}

impl MeanDenominators {
    /// `rows` counted rows, without class weights.
    pub fn rows(rows: usize) -> Self {
        Self {
            weight_total: rows as f64,
            rows: rows as f64,
        }
    }

    /// The denominators of one part's `targets` on the host, as the loss counts them
    /// with this ignore index and class weights; add the parts' together for the whole
    /// batch.
    pub fn of_targets(targets: &[i64], ignore_index: i64, class_weights: Option<&[f32]>) -> Self {
        let counted = targets.iter().filter(|&&target| target != ignore_index);
        let weight_total = match class_weights {
            None => counted.clone().count() as f64,
            Some(weights) => counted
                .clone()
                .map(|&target| {
                    usize::try_from(target)
                        .ok()
                        .and_then(|class| weights.get(class))
                        .map_or(1.0, |&weight| weight as f64)
                })
                .sum(),
        };
        Self {
            weight_total,
            rows: counted.count() as f64,
        }
    }
}

impl Add for MeanDenominators {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            weight_total: self.weight_total + other.weight_total,
            rows: self.rows + other.rows,
        }
    }
}

/// The least `n` (counted rows) the mean divides by: an all-ignored batch gives 0, not
/// NaN, as in PyTorch.
pub(crate) const LEAST_ROWS: f64 = 1.0;

/// The least `D` (class-weight total) the mean divides by: f32's smallest normal, so that
/// an all-ignored batch or all-zero weights give 0, not NaN.
pub(crate) const LEAST_WEIGHT_TOTAL: f64 = f32::MIN_POSITIVE as f64;
