//! Shared by the tests, the bench and the example: which cube runtime this build runs on.
//! The `cuda` feature picks CUDA; otherwise Vulkan through wgpu (lavapipe on a machine
//! with no GPU).

pub mod lm;

#[cfg(feature = "cuda")]
mod runtime {
    pub use cubecl::cuda::CudaDevice as Device;
    pub type Runtime = cubecl::cuda::CudaRuntime;
    pub const NAME: &str = "cuda";

    /// The first `count` GPUs.
    pub fn devices(count: usize) -> Vec<Device> {
        (0..count).map(|index| Device { index }).collect()
    }

    /// How many GPUs this machine has.
    pub fn device_count() -> usize {
        <Runtime as cubecl::Runtime>::client(&Device::default()).device_count_total()
    }
}

#[cfg(not(feature = "cuda"))]
mod runtime {
    pub use burn::backend::wgpu::WgpuDevice as Device;
    pub type Runtime = burn::backend::wgpu::WgpuRuntime;
    pub const NAME: &str = "vulkan (wgpu)";

    /// `count` times the default device: replicas that share it (cubecl 0.10's wgpu
    /// runtime has no transfer between two devices).
    pub fn devices(count: usize) -> Vec<Device> {
        vec![Device::default(); count]
    }

    /// Devices that can exchange tensors: one.
    pub fn device_count() -> usize {
        1
    }
}

pub use runtime::{Device, NAME as RUNTIME_NAME, Runtime, device_count, devices};

/// The plain cube backend on this build's runtime (no fusion). Its float parameter only
/// seeds the device's default dtype: tensors are cast explicitly where dtype matters.
pub type CubeBackend = burn_cubecl::CubeBackend<Runtime, f32, i32, u32>;
/// The same with autodiff.
pub type AutodiffCube = burn::backend::Autodiff<CubeBackend>;

/// The same with bf16 as the default float type (CUDA only: lavapipe has no bf16).
#[cfg(feature = "cuda")]
pub type DefaultBackendBf16 = burn::backend::Cuda<burn::tensor::bf16>;
/// The plain cube backend with bf16 as the default float type (CUDA only).
#[cfg(feature = "cuda")]
pub type CubeBackendBf16 = burn_cubecl::CubeBackend<Runtime, burn::tensor::bf16, i32, u32>;

/// What a user of this runtime has with Burn's default features: `burn::backend::Wgpu` or
/// `burn::backend::Cuda`, both `Fusion<CubeBackend<..>>`.
#[cfg(feature = "cuda")]
pub type DefaultBackend = burn::backend::Cuda;
#[cfg(not(feature = "cuda"))]
pub type DefaultBackend = burn::backend::Wgpu;

/// Whether this build's runtime can compute in bf16 (CUDA yes; lavapipe has no bf16).
pub const SUPPORTS_BF16: bool = cfg!(feature = "cuda");

/// A float tensor of the plain cube backend as a kernel's operand: its binding and its
/// dtype, as `fused_ce_kernels`' launch functions take them.
pub fn kernel_operand<const D: usize>(
    tensor: burn::tensor::Tensor<CubeBackend, D>,
) -> (
    cubecl::prelude::TensorBinding<Runtime>,
    cubecl::ir::StorageType,
) {
    let tensor = tensor.into_primitive().tensor();
    let dtype = tensor.dtype.into();
    (tensor.binding(), dtype)
}
