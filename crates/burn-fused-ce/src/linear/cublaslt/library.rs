//! Finding NVIDIA's cuBLASLt at run time, once per process.
//!
//! cudarc loads it by its bare names (`libcublasLt.so.13` for CUDA 13, then older
//! majors) through the dynamic loader's search: `LD_LIBRARY_PATH`, the ld.so cache. Its
//! loader and each of its symbols panic where missing, so the library is asked for
//! first and the first call is made under `catch_unwind`; a missing library turns the
//! products back to CubeCL's kernels instead.

use std::panic::catch_unwind;
use std::sync::OnceLock;

use cudarc::cublaslt::sys;

/// cuBLASLt's version (`major * 10000 + minor * 100 + patch`) where the library loads,
/// else why it does not. Loads it on the first call.
pub fn cublaslt_version() -> Result<usize, String> {
    static VERSION: OnceLock<Result<usize, String>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            // SAFETY: only asks the dynamic loader for the library.
            if !unsafe { sys::is_culib_present() } {
                return Err(
                    "cuBLASLt (libcublasLt.so.13, or .12) is not on the dynamic \
                            loader's search path (LD_LIBRARY_PATH, the ld.so cache)"
                        .into(),
                );
            }
            // SAFETY: a query with no arguments; a missing symbol panics and is caught.
            catch_unwind(|| unsafe { sys::cublasLtGetVersion() })
                .map_err(|_| "the cuBLASLt library found lacks cublasLtGetVersion".into())
        })
        .clone()
}
