//! Where a deferred target check's read lands. The op that runs the check starts reading
//! its `[row, target]` result as it runs and leaves the read here; the host looks at it
//! calls later. On a cube device the copy is queued on the check's own stream right
//! behind its kernel, from wherever the op runs (under Fusion: when its stream reaches
//! it): registering the check waits for nothing and runs no queued work early, and a
//! later wait waits for that one copy only.

use std::sync::{Arc, Mutex, PoisonError};

use crate::loss::pending_read::PendingRead;

/// The slot a deferred check's op hands the read of its result to. Clones share it.
#[derive(Clone, Default)]
pub struct TargetCheckRead {
    slot: Arc<Mutex<Option<PendingRead>>>,
}

impl TargetCheckRead {
    /// An empty slot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Hands over the read of the check's result (the op does this as it runs).
    pub fn start(&self, read: PendingRead) {
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(read);
    }

    /// The read, once the op has run and handed it over.
    pub(crate) fn take(&self) -> Option<PendingRead> {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl core::fmt::Debug for TargetCheckRead {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("TargetCheckRead")
    }
}

/// The read of a small contiguous cube tensor, its copy queued now on the current stream
/// behind the work already queued there; the read only waits for that copy.
#[cfg(feature = "cube")]
pub(crate) fn queued_cube_read(tensor: &burn_cubecl::tensor::CubeTensor) -> PendingRead {
    use burn::tensor::TensorData;
    use cubecl::server::CopyDescriptor;

    let (shape, dtype) = (tensor.meta.shape().clone(), tensor.dtype);
    let descriptor = CopyDescriptor::new(
        tensor.handle.clone().binding(),
        shape.clone(),
        tensor.meta.strides().clone(),
        tensor.elem_size(),
    );
    let read = device_client(tensor).read_one_tensor_async(descriptor);
    PendingRead::queued(async move {
        let bytes = read
            .await
            .map_err(|error| burn::backend::ExecutionError::with_context(format!("{error}")))?;
        Ok(TensorData::from_bytes(bytes, shape, dtype))
    })
}

/// The tensor's device's client, kept for the process (one per device, as cubecl keeps
/// its own): a read's future borrows the client it was started on, and outlives the op.
#[cfg(feature = "cube")]
fn device_client(tensor: &burn_cubecl::tensor::CubeTensor) -> &'static cubecl::prelude::Client {
    use burn_cubecl::CubeDevice;

    type Clients = Vec<(CubeDevice, &'static cubecl::prelude::Client)>;
    static CLIENTS: Mutex<Clients> = Mutex::new(Vec::new());
    let mut clients = CLIENTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, client)) = clients.iter().find(|(device, _)| *device == tensor.device) {
        return client;
    }
    let client: &'static cubecl::prelude::Client = Box::leak(Box::new(tensor.client.clone()));
    clients.push((tensor.device.clone(), client));
    client
}
