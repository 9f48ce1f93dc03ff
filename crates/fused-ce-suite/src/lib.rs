//! Shared by the tests (and later the benches and the examples): which cube runtime this
//! build runs on. The `cuda` feature picks CUDA; otherwise wgpu, pinned to Vulkan with the
//! `vulkan` feature (SPIR-V) or on the API it finds with `wgpu` alone (WGSL; lavapipe on a
//! machine with no GPU).
//!
//! Burn 0.22 picks the backend by the device: a tensor made on [`device()`] runs on
//! `Fusion<CubeBackend>` (Burn's fusion is on in this build, as users have it by default),
//! one made on `Device::flex()` on Flex, and `device.autodiff()` records gradients on
//! either. The plain [`CubeBackend`] is not reachable through `Tensor<D>` in a fusion
//! build: it is used on its primitives, on [`cube_device`].

pub mod lm;

use burn::backend::DispatchDevice;
use burn::tensor::Device;

#[cfg(feature = "cuda")]
mod runtime {
    use burn::tensor::Device;

    pub const NAME: &str = "cuda";

    /// The first GPU.
    pub fn device() -> Device {
        Device::cuda(0)
    }

    /// `count` devices: one GPU each while the machine has enough, then replicas of the
    /// first ones again (a test of several shards still runs on one GPU).
    pub fn devices(count: usize) -> Vec<Device> {
        let gpus = device_count().max(1);
        (0..count).map(|index| Device::cuda(index % gpus)).collect()
    }

    /// How many GPUs this machine has.
    pub fn device_count() -> usize {
        cubecl::Device::enumerate_all()
            .iter()
            .filter(|device| matches!(device, cubecl::Device::Cuda(_)))
            .count()
    }
}

#[cfg(not(feature = "cuda"))]
mod runtime {
    use burn::tensor::{Device, DeviceKind};

    #[cfg(feature = "vulkan")]
    pub const NAME: &str = "vulkan (wgpu)";
    #[cfg(not(feature = "vulkan"))]
    pub const NAME: &str = "wgpu";

    /// Wgpu's default adapter, pinned to Vulkan (SPIR-V).
    #[cfg(feature = "vulkan")]
    pub fn device() -> Device {
        Device::vulkan(DeviceKind::DefaultDevice)
    }

    /// Wgpu's default adapter on the graphics API wgpu picks (kernels from WGSL).
    #[cfg(not(feature = "vulkan"))]
    pub fn device() -> Device {
        Device::wgpu(DeviceKind::DefaultDevice)
    }

    /// `count` times the default device: replicas that share it (the wgpu runtime has no
    /// transfer between two devices).
    pub fn devices(count: usize) -> Vec<Device> {
        vec![device(); count]
    }

    /// Devices that can exchange tensors: one.
    pub fn device_count() -> usize {
        1
    }
}

pub use runtime::{NAME as RUNTIME_NAME, device, device_count, devices};

/// The plain cube backend (no fusion): every cube runtime is this one type in Burn 0.22,
/// the device says which. Reached on its primitives only (see the crate docs).
pub use burn_cubecl::CubeBackend;

/// What a cube [`device()`]'s tensors run on in this build: `Fusion<CubeBackend>`, as Burn's
/// default features give users.
pub type DefaultBackend = burn_cubecl::Cube;

/// The cubecl device behind a cube device (autodiff or not), as the plain
/// [`CubeBackend`]'s primitives take it.
///
/// # Panics
/// When `device` is not a cube device (Flex, for one).
pub fn cube_device(device: &Device) -> burn_cubecl::CubeDevice {
    match device.as_dispatch().clone().inner() {
        DispatchDevice::Cube(device) => device,
        #[allow(unreachable_patterns)]
        other => panic!("{other:?} is not a cube device"),
    }
}

/// The compute client of a cube device (kernel tuning, launches).
pub fn client(device: &Device) -> cubecl::client::Client {
    cube_device(device).client()
}

/// Whether this build's runtime can compute in bf16 (CUDA yes; lavapipe has no bf16).
pub const SUPPORTS_BF16: bool = cfg!(feature = "cuda");

/// Whether this build's runtime holds 64-bit ints (CUDA yes; WGSL has none).
pub const SUPPORTS_I64: bool = cfg!(feature = "cuda");

/// A float tensor of the plain cube backend as a kernel's operand: its binding and its
/// element type, as `fused_ce_kernels`' launch functions take them.
pub fn kernel_operand(
    tensor: burn_cubecl::tensor::CubeTensor,
) -> (cubecl::prelude::TensorBinding, cubecl::ir::ElemType) {
    let elem = burn::backend::cubecl::dtype_to_elem_type(tensor.dtype);
    (tensor.binding(), elem)
}

/// Where the benches write their results: `FUSED_CE_BENCH_OUT`, else `target/fused-ce-bench`
/// of the workspace under `cargo bench` (which runs a bench in its package's folder,
/// `crates/fused-ce-suite/`, and names it in `CARGO_MANIFEST_DIR`), else of the working
/// folder (a bench run on its own, as from a GPU bundle).
pub fn bench_out() -> String {
    if let Ok(out) = std::env::var("FUSED_CE_BENCH_OUT") {
        return out;
    }
    match std::env::var("CARGO_MANIFEST_DIR") {
        Ok(package) => format!("{package}/../../target/fused-ce-bench"),
        Err(_) => "target/fused-ce-bench".into(),
    }
}
