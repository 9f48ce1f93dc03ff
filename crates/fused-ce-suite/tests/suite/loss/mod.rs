//! The loss (`fused_cross_entropy` and its module): the contract, the options, the
//! defaults, bad input, shapes and strides, where backward writes, the extra outputs'
//! gradients, the backends, and LLM-sized shapes on CUDA.

mod backends;
mod bad_input;
pub(crate) mod contract;
mod defaults;
mod dtypes;
mod entropy_gradient;
mod in_place;
mod llm_shapes;
mod log_probs;
mod options;
mod ownership_and_autodiff;
mod shapes;
