//! cuBLASLt's descriptors for one product, destroyed when dropped.

use core::ffi::c_void;

use cudarc::cublaslt::{result, sys};

use super::layout::{LtProduct, StoredMatrix};

/// What a cuBLASLt call failed with, as a message for the refusal note.
pub(crate) fn failed(what: &str, error: result::CublasError) -> String {
    format!("cuBLASLt {what}: {error:?}")
}

/// A matrix layout.
pub(crate) struct Layout(pub sys::cublasLtMatrixLayout_t);

impl Layout {
    pub fn new(dtype: sys::cudaDataType, matrix: StoredMatrix) -> Result<Self, String> {
        result::create_matrix_layout(dtype, matrix.rows, matrix.cols, matrix.ld as i64)
            .map(Self)
            .map_err(|error| failed("matrix layout", error))
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { result::destroy_matrix_layout(self.0) };
    }
}

/// A product's description: f32 accumulation and scaling, and which operands are
/// transposed.
pub(crate) struct ProductDesc(pub sys::cublasLtMatmulDesc_t);

impl ProductDesc {
    pub fn new(product: &LtProduct) -> Result<Self, String> {
        let desc = result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map(Self)
        .map_err(|error| failed("matmul description", error))?;
        for (attribute, transposed) in [
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                product.a.transposed,
            ),
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                product.b.transposed,
            ),
        ] {
            // cublasOperation_t: 0 = N, 1 = T.
            let operation = i32::from(transposed);
            // SAFETY: the attribute takes one i32, read during the call.
            unsafe {
                result::set_matmul_desc_attribute(
                    desc.0,
                    attribute,
                    (&operation as *const i32).cast::<c_void>(),
                    size_of::<i32>(),
                )
            }
            .map_err(|error| failed("transpose attribute", error))?;
        }
        Ok(desc)
    }
}

impl Drop for ProductDesc {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { result::destroy_matmul_desc(self.0) };
    }
}

/// The search preference: the workspace given, the operands' real alignments.
pub(crate) struct Preference(pub sys::cublasLtMatmulPreference_t);

impl Preference {
    pub fn new(workspace_bytes: u64, alignments: [u32; 4]) -> Result<Self, String> {
        use sys::cublasLtMatmulPreferenceAttributes_t as Attribute;
        let preference = result::create_matmul_pref()
            .map(Self)
            .map_err(|error| failed("preference", error))?;
        // SAFETY: each attribute takes the value's type, read during the call.
        unsafe {
            result::set_matmul_pref_attribute(
                preference.0,
                Attribute::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&workspace_bytes as *const u64).cast::<c_void>(),
                size_of::<u64>(),
            )
            .map_err(|error| failed("workspace preference", error))?;
            for (attribute, alignment) in [
                Attribute::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                Attribute::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                Attribute::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                Attribute::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
            ]
            .into_iter()
            .zip(alignments)
            {
                result::set_matmul_pref_attribute(
                    preference.0,
                    attribute,
                    (&alignment as *const u32).cast::<c_void>(),
                    size_of::<u32>(),
                )
                .map_err(|error| failed("alignment preference", error))?;
            }
        }
        Ok(preference)
    }
}

impl Drop for Preference {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { result::destroy_matmul_pref(self.0) };
    }
}
