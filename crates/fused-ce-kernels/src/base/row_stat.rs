//! Rows of the per-row statistics matrix `[COUNT, N]` (f32) that forward writes; each row
//! of it is contiguous. Ignored rows are 0 in every statistic.

/// `ce + z`: the per-row loss (NaN for a target that is not a class).
pub const LOSS: usize = 0;
/// `s * lse^2`.
pub const Z_LOSS: usize = 1;
/// The target's class weight (1 without weights): the mean's `D` is their sum.
pub const WEIGHT: usize = 2;
/// 1: the mean's `n` is their sum.
pub const VALID: usize = 3;
/// 1 when the argmax is the target (only when the argmax is tracked).
pub const CORRECT: usize = 4;
/// Log-sum-exp of the (soft-capped) logits, rounded to f32.
pub const LSE: usize = 5;
/// `p_y - 1`, formed without cancellation.
pub const TARGET_GRAD: usize = 6;
/// The softmax's entropy `-sum_c p_c ln p_c` of the (transformed) logits (only when
/// asked for; 0 otherwise).
pub const ENTROPY: usize = 7;
/// The row's maximum `m` of the (transformed) logits.
pub const MAX: usize = 8;
/// `ln sum_c exp(x'_c - m)`: the log-sum-exp is `MAX + LOG_SUM`, which `LSE` rounds
/// (by up to 5e-4 near 1e4). The gradient forms `p_c = exp(x'_c - MAX) exp(-LOG_SUM)`,
/// whose first argument is exact for the columns that matter, so its error does not
/// grow with the logits' scale.
pub const LOG_SUM: usize = 9;
/// Number of statistics.
pub const COUNT: usize = 10;
