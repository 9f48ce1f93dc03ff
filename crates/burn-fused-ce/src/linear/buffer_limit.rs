//! The largest buffer a device may allocate, which bounds a chunk's logits. It is read at
//! the `Tensor` level from the device (an op without an input tensor cannot be an
//! extension op) and handed to the op inside its [`LinearChunking`].

use burn::backend::DispatchDevice;
use burn::tensor::Device;

#[cfg(doc)]
use crate::linear::chunking::LinearChunking;

/// The most bytes one buffer may take on `device`, where its backend says: a cube
/// device's largest allocation (on wgpu, its storage-binding limit); `None` elsewhere.
/// [`LinearChunking::within`] keeps a chunk's logits within it.
pub fn max_buffer_bytes(device: &Device) -> Option<usize> {
    dispatch_max_buffer_bytes(device.as_dispatch())
}

fn dispatch_max_buffer_bytes(device: &DispatchDevice) -> Option<usize> {
    match device {
        #[cfg(any(feature = "cuda", feature = "vulkan", feature = "wgpu"))]
        DispatchDevice::Cube(device) => {
            usize::try_from(device.client().properties().memory.max_page_size).ok()
        }
        // Autodiff changes no allocation: the device it wraps answers.
        DispatchDevice::Autodiff(device) => dispatch_max_buffer_bytes(device),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}
