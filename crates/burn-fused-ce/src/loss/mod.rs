//! The fused cross-entropy of logits: its module, its functions, its backend extension and
//! that extension on each backend.

pub(crate) mod api;
mod autodiff;
pub(crate) mod check_read;
pub(crate) mod checks;
#[cfg(feature = "cube")]
mod cube;
pub(crate) mod entropy_incoming;
pub(crate) mod entropy_node;
pub(crate) mod extension;
#[cfg(feature = "flex")]
mod flex;
#[cfg(all(feature = "fusion", feature = "cube"))]
mod fusion_meta;
pub(crate) mod incoming_guess;
pub(crate) mod module;
pub(crate) mod pending_read;
pub mod portable;
pub(crate) mod reduce;
pub(crate) mod target_check;
pub(crate) mod types;
