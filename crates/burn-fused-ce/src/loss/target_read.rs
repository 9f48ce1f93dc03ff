//! Starting a deferred target check's read. Burn's `into_data_async` on a cube device
//! returns bytes that copy on first access: looked at two calls later, that copy would
//! queue behind everything sent since and wait for all of it, stalling the loop once a
//! step. On cube devices the read is queued at once instead, with a fence right behind
//! it, so waiting for it later waits for that call's check only.

use burn::tensor::{Int, Tensor};

use crate::loss::target_check::PendingRead;

/// Starts reading `tensor` (a few integers) without waiting for it.
pub(crate) fn start_read(tensor: Tensor<1, Int>) -> PendingRead {
    #[cfg(feature = "cube")]
    if let Some(read) = cube::start_read(&tensor) {
        return read;
    }
    PendingRead::start(tensor.into_data_async())
}

#[cfg(feature = "cube")]
mod cube {
    use std::sync::{Mutex, PoisonError};

    use burn::backend::Cube;
    use burn::tensor::{Int, Tensor, TensorData};
    use burn_cubecl::{CubeDevice, kernel::into_contiguous, tensor::CubeTensor};
    use cubecl::prelude::Client;
    use cubecl::server::CopyDescriptor;

    use crate::loss::target_check::PendingRead;

    /// The read queued on the tensor's cube stream, or `None` off cube devices.
    pub(super) fn start_read(tensor: &Tensor<1, Int>) -> Option<PendingRead> {
        let primitive = tensor.clone().try_into_primitive::<Cube>().ok()?;
        let tensor = into_contiguous(resolve(primitive));
        let (shape, dtype) = (tensor.meta.shape().clone(), tensor.dtype);
        let descriptor = CopyDescriptor::new(
            tensor.handle.clone().binding(),
            shape.clone(),
            tensor.meta.strides().clone(),
            tensor.elem_size(),
        );
        // Queues the copy and its fence now; the future only waits for them.
        let read = device_client(&tensor).read_one_tensor_async(descriptor);
        Some(PendingRead::queued(async move {
            let bytes = read
                .await
                .map_err(|error| burn::backend::ExecutionError::with_context(format!("{error}")))?;
            Ok(TensorData::from_bytes(bytes, shape, dtype))
        }))
    }

    /// The tensor's device's client, kept for the process (one per device, as cubecl
    /// keeps its own): the read's future borrows the client it was started on.
    fn device_client(tensor: &CubeTensor) -> &'static Client {
        static CLIENTS: Mutex<Vec<(CubeDevice, &'static Client)>> = Mutex::new(Vec::new());
        let mut clients = CLIENTS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, client)) = clients.iter().find(|(device, _)| *device == tensor.device) {
            return client;
        }
        let client: &'static Client = Box::leak(Box::new(tensor.client.clone()));
        clients.push((tensor.device.clone(), client));
        client
    }

    /// The cube tensor behind a fusion handle, once the work that writes it has run.
    #[cfg(feature = "fusion")]
    fn resolve(tensor: burn::backend::tensor::IntTensor<Cube>) -> CubeTensor {
        tensor
            .client
            .clone()
            .resolve_tensor_int::<burn_cubecl::CubeBackend>(tensor)
    }

    #[cfg(not(feature = "fusion"))]
    fn resolve(tensor: CubeTensor) -> CubeTensor {
        tensor
    }
}
