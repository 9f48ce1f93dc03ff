//! The chunks' products through NVIDIA's cuBLASLt on CUDA devices: the logits
//! `h_c W`, the hidden-state gradient `dlogits_c W^T` and the weight gradient's sum
//! `grad_W += h_c^T dlogits_c`, which CubeCL's kernels (no Hopper `wgmma`) run at a
//! fraction of cuBLAS's rate.
//!
//! The library is loaded at run time (`library.rs`); each product is enqueued on the
//! stream cubecl launches the caller's kernels on (`launch.rs`, `stream_scan.rs`), so
//! the loss kernels between the products keep their order with no host wait. Each kind
//! of product takes the algorithm measured fastest among the heuristic's first few the
//! first time it runs in the process (`measure.rs`: one host wait per kind), kept on
//! disk with the `persistence` feature (`store.rs`). Where the library is missing, the
//! device is not CUDA, or a product is refused (a shape cuBLASLt has no algorithm for,
//! operands it cannot read in place), the caller runs CubeCL's path and nothing was
//! written.

#[cfg(feature = "cuda")]
mod descriptors;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod launch;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod layout;
#[cfg(feature = "cuda")]
mod library;
#[cfg(feature = "cuda")]
mod measure;
mod store;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod stream_scan;

use burn_cubecl::tensor::CubeTensor;

#[cfg(feature = "cuda")]
pub use library::cublaslt_version;

/// Whether cuBLASLt can run products on `tensor`'s device: a CUDA device, the library
/// loaded, no CUDA graph being captured. Checked before an output is allocated for it.
pub(crate) fn cublaslt_may_run(tensor: &CubeTensor) -> bool {
    #[cfg(feature = "cuda")]
    {
        launch::may_run(&tensor.client)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = tensor;
        false
    }
}

/// `out = lhs rhs`, or `out += lhs rhs` when `accumulate`, through cuBLASLt (see
/// [`launch::launch_product`]). `Err` says why not; `out` is untouched then.
pub(crate) fn cublaslt_product(
    lhs: &CubeTensor,
    rhs: &CubeTensor,
    out: &CubeTensor,
    accumulate: bool,
) -> Result<(), String> {
    #[cfg(feature = "cuda")]
    {
        launch::launch_product(lhs, rhs, out, accumulate)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (lhs, rhs, out, accumulate);
        Err("built without the `cuda` feature".into())
    }
}

/// For the tests: [`cublaslt_product`] with the algorithm cuBLASLt's
/// heuristic lists at `rank` (see [`launch::launch_listed_product`]).
#[cfg(feature = "cuda")]
#[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
pub fn cublaslt_listed_product(
    lhs: &CubeTensor,
    rhs: &CubeTensor,
    out: &CubeTensor,
    accumulate: bool,
    rank: usize,
) -> Result<(), String> {
    launch::launch_listed_product(lhs, rhs, out, accumulate, rank)
}
