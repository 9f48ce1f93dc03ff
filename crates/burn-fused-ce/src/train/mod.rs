//! burn-train's `Learner` with our losses: a step's output that burn-train's loss,
//! accuracy and perplexity metrics take, with no `[N, V]` logits kept for them.

pub(crate) mod metric_rows;
pub(crate) mod sequence_output;
