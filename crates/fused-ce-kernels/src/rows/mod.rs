//! The per-row kernels: forward (one cube reads a row once and writes its statistics) and
//! backward (the row's gradient from them, one more read of the logits), with the pieces
//! the one pass builds on: the row state a unit folds vectors into, the cube's merge of
//! its units' states, a row's loss from its state, and the gradient of its vectors.

pub(crate) mod backward;
pub(crate) mod cube_merge;
pub(crate) mod forward;
pub(crate) mod gradient;
pub(crate) mod gradient_span;
mod launch;
pub(crate) mod reduce_span;
pub(crate) mod row_state;

pub use backward::{GradOptions, cross_entropy_backward_kernel};
pub use forward::cross_entropy_forward_kernel;
pub use launch::{IncomingGradient, launch_backward, launch_forward};
