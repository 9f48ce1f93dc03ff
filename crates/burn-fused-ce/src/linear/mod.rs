//! The fused linear cross-entropy: the LM head and the loss as one op over chunks of
//! rows. Its module, its function, its backend extension and that extension on each
//! backend.

pub(crate) mod api;
mod autodiff;
pub(crate) mod buffer_limit;
pub(crate) mod checks;
pub(crate) mod chunk_products;
pub(crate) mod chunking;
pub(crate) mod counted_rows;
#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "cube")]
pub(crate) mod cublaslt;
pub(crate) mod extension;
#[cfg(feature = "flex")]
mod flex;
#[cfg(all(feature = "fusion", feature = "cube"))]
mod fusion_meta;
pub(crate) mod gradients;
pub(crate) mod module;
mod products;
mod rows;
pub(crate) mod types;
