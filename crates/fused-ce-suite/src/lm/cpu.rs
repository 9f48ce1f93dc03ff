//! Whether the example trains on a CPU: lavapipe, llvmpipe or WARP behind wgpu, where Burn's
//! autotune compiles every candidate kernel of every shape and finds nothing worth it.

use cubecl::device::WgpuDeviceKind;

/// Whether this build trains on a CPU: a wgpu build where every adapter wgpu finds is a
/// CPU. Asks wgpu's adapters alone, before any device is set up.
pub fn device_is_cpu() -> bool {
    if cfg!(feature = "cuda") {
        return false;
    }
    let kinds: Vec<WgpuDeviceKind> = cubecl::Device::enumerate_all()
        .into_iter()
        .filter_map(|device| match device {
            cubecl::Device::Wgpu(device) => Some(device.kind),
            _ => None,
        })
        .collect();
    !kinds.is_empty() && kinds.iter().all(|kind| matches!(kind, WgpuDeviceKind::Cpu))
}
