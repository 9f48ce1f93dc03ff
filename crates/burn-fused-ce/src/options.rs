//! The loss options, shared by every layer (kernels get plain numbers from them).

use serde::{Deserialize, Serialize};

/// How per-row losses are combined; it decides the output's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Reduction {
    /// One loss per row (`[N]`); ignored rows are exactly 0.
    None,
    /// Sum over non-ignored rows divided by their count (`[1]`); 0 when all are ignored.
    #[default]
    Mean,
    /// Sum over rows (`[1]`).
    Sum,
}

/// Everything the op needs besides the tensors. One struct, so that later options
/// (label smoothing, z-loss, softcap, class weights) extend it without new signatures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossEntropyOptions {
    /// See [`Reduction`].
    pub reduction: Reduction,
    /// Rows whose target equals this contribute no loss, no gradient, no count.
    pub ignore_index: i64,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        Self {
            reduction: Reduction::Mean,
            ignore_index: -100,
        }
    }
}

impl CrossEntropyOptions {
    /// The ignore index as the kernels compare it (targets are read as i32 there). An
    /// index outside i32 can equal no i32 target, so any out-of-range class stands for it.
    pub(crate) fn kernel_ignore_index(&self) -> i32 {
        i32::try_from(self.ignore_index).unwrap_or(i32::MIN)
    }
}
