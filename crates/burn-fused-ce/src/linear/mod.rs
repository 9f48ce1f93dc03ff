//! The fused linear cross-entropy's helpers beside the op itself (which is at the crate
//! root): passing only the rows that count, the device's largest buffer that bounds a
//! chunk, and whether cuBLASLt loaded.
//!
//! Inside: the LM head and the loss as one op over chunks of rows; its module, its
//! function, its backend extension and that extension on each backend.

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
pub(crate) mod inputs;
pub(crate) mod module;
mod products;
mod rows;
pub(crate) mod types;

pub use buffer_limit::max_buffer_bytes;
pub use counted_rows::CountedRows;
/// For the project's tests: one product through cuBLASLt with the algorithm its heuristic
/// lists at a rank, not the one measured for the kind (nothing measured, kept or
/// counted), to compare the two.
#[cfg(all(feature = "cuda", feature = "test-hooks"))]
#[doc(hidden)]
pub use cublaslt::cublaslt_listed_product;
#[cfg(feature = "cuda")]
pub use cublaslt::cublaslt_version;
