//! Per CUDA device: cuBLASLt's handle, cubecl's streams by slot, and the algorithm
//! chosen for each kind of product (`measure.rs`). Used only inside tasks on the device's
//! thread, which cubecl runs one at a time.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use cubecl::device::DeviceId;
use cudarc::cublaslt::{result, sys};
use cudarc::driver::{result as driver_result, sys as driver};

use super::descriptors::failed;
use super::layout::StoredMatrix;
use super::library::cublaslt_version;
use super::measure::Algorithm;
use super::store::StoreKey;
use super::stream_scan::{regular_slots, stream_of_slot};

/// A kind of product, for which one algorithm is chosen: the product, the operands' types
/// and alignments, and whether it sums into its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct AlgorithmKey {
    pub product: super::layout::LtProduct,
    pub types: [u32; 3],
    pub alignments: [u32; 4],
    pub accumulate: bool,
}

impl AlgorithmKey {
    /// The key as the store writes it (`store.rs`): every field, as words.
    pub fn store_words(&self) -> Vec<u64> {
        let matrix = |m: StoredMatrix| [u64::from(m.transposed), m.rows, m.cols, m.ld];
        let product = &self.product;
        let mut words = Vec::with_capacity(26);
        for m in [product.a, product.b, product.d] {
            words.extend(matrix(m));
        }
        words.extend([product.m, product.n, product.k]);
        words.extend(self.types.map(u64::from));
        words.extend(self.alignments.map(u64::from));
        words.push(u64::from(self.accumulate));
        words
    }
}

/// What tells one device's algorithms from another's in the store.
#[derive(Debug, Clone)]
struct DeviceIdentity {
    name: String,
    compute_capability: [u32; 2],
    multiprocessors: u32,
}

impl DeviceIdentity {
    /// The current context's device, where the driver tells.
    fn current() -> Option<Self> {
        use driver::CUdevice_attribute as A;
        let mut device: driver::CUdevice = 0;
        // SAFETY: writes one handle; the device's context is current in its tasks.
        unsafe { driver::cuCtxGetDevice(&mut device) }
            .result()
            .ok()?;
        let attribute = |attribute| {
            // SAFETY: a device of the current context.
            unsafe { driver_result::device::get_attribute(device, attribute) }
                .ok()
                .and_then(|value| u32::try_from(value).ok())
        };
        Some(Self {
            name: driver_result::device::get_name(device).ok()?,
            compute_capability: [
                attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ],
            multiprocessors: attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        })
    }
}

/// One device's cuBLASLt state.
pub(crate) struct LtDevice {
    pub handle: sys::cublasLtHandle_t,
    streams: HashMap<u64, sys::cudaStream_t>,
    /// The algorithm chosen for each kind of product run so far and its workspace, or
    /// why none was found.
    algorithms: HashMap<AlgorithmKey, Result<Algorithm, String>>,
    /// The device, for the store (`None` where the driver did not tell: nothing stored).
    identity: Option<DeviceIdentity>,
}

// SAFETY: the raw handles are only used inside the device's tasks, one at a time.
unsafe impl Send for LtDevice {}

/// Each device's state, or why cuBLASLt is off on it (then for the whole process).
static DEVICES: LazyLock<Mutex<HashMap<DeviceId, Result<LtDevice, String>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Runs `task` with `device`'s state, made on first use (the device's context must be
/// current: the task runs after cubecl resolved the operands). A [`Refusal::Device`]
/// from `task` turns cuBLASLt off for the device.
pub(crate) fn with_device<R>(
    device: DeviceId,
    task: impl FnOnce(&mut LtDevice) -> Result<R, Refusal>,
) -> Result<R, String> {
    let mut devices = DEVICES
        .lock()
        .map_err(|_| "cuBLASLt's device table was poisoned".to_string())?;
    let entry = devices.entry(device).or_insert_with(|| {
        result::create_handle()
            .map(|handle| LtDevice {
                handle,
                streams: HashMap::new(),
                algorithms: HashMap::new(),
                identity: DeviceIdentity::current(),
            })
            .map_err(|error| failed("handle", error))
    });
    let state = entry.as_mut().map_err(|why| why.clone())?;
    match task(state) {
        Ok(value) => Ok(value),
        Err(Refusal::ThisCall(why)) => Err(why),
        Err(Refusal::Device(why)) => {
            // Once per device: the entry keeps the reason from now on.
            log::warn!(
                "burn-fused-ce: cuBLASLt is off on CUDA device {device:?} for this process: \
                 {why}. The fused linear cross-entropy's products run on CubeCL's matmul \
                 kernels instead, which are several times slower on Hopper GPUs. This \
                 build's cubecl-cuda may differ from the version this crate reads its \
                 stream from; please report it."
            );
            *entry = Err(why.clone());
            Err(why)
        }
    }
}

/// Why a product did not run through cuBLASLt.
pub(crate) enum Refusal {
    /// Only this product (its shape, alignment or a failed call).
    ThisCall(String),
    /// Nothing more on this device: its streams could not be found.
    Device(String),
}

impl LtDevice {
    /// The algorithm for products of kind `key`: the one chosen before in this process,
    /// else what `choose` chooses (given where the store keeps the kind's), kept for the
    /// process.
    pub fn algorithm(
        &mut self,
        key: AlgorithmKey,
        choose: impl FnOnce(Option<StoreKey>) -> Result<Algorithm, String>,
    ) -> Result<Algorithm, String> {
        if let Some(chosen) = self.algorithms.get(&key) {
            return chosen.clone();
        }
        let store_key =
            self.identity
                .as_ref()
                .zip(cublaslt_version().ok())
                .map(|(device, version)| {
                    StoreKey::new(
                        &device.name,
                        device.compute_capability,
                        device.multiprocessors,
                        version as u64,
                        key.store_words(),
                    )
                });
        let chosen = choose(store_key);
        self.algorithms.insert(key, chosen.clone());
        chosen
    }

    /// The stream cubecl launches stream `stream_id`'s kernels on, read from the server's
    /// `Debug` text (`server_text` formats it; called once per slot) and checked: a
    /// non-blocking stream of the current context, as cubecl-cuda makes them.
    pub fn stream(
        &mut self,
        stream_id: u64,
        server_text: impl FnOnce() -> String,
    ) -> Result<sys::cudaStream_t, Refusal> {
        if let Some(&stream) = self.streams.get(&stream_id) {
            return Ok(stream);
        }
        let text = server_text();
        let not_found = || Refusal::Device("cubecl-cuda's stream could not be found".into());
        let slots = regular_slots(&text).ok_or_else(not_found)?;
        let raw =
            stream_of_slot(&text, (stream_id % slots as u64) as usize).ok_or_else(not_found)?;
        let stream = raw as usize as driver::CUstream;
        let mut current: driver::CUcontext = core::ptr::null_mut();
        let mut owner: driver::CUcontext = core::ptr::null_mut();
        let mut flags: core::ffi::c_uint = 0;
        // SAFETY: `stream` is a handle cubecl-cuda created on this device and keeps
        // alive as long as its server; the queries only read it.
        let checked = unsafe {
            driver::cuCtxGetCurrent(&mut current) == driver::CUresult::CUDA_SUCCESS
                && driver::cuStreamGetCtx(stream, &mut owner) == driver::CUresult::CUDA_SUCCESS
                && driver::cuStreamGetFlags(stream, &mut flags) == driver::CUresult::CUDA_SUCCESS
        };
        let non_blocking = driver::CUstream_flags::CU_STREAM_NON_BLOCKING as core::ffi::c_uint;
        if !(checked && !current.is_null() && owner == current && flags & non_blocking != 0) {
            return Err(Refusal::Device(
                "the stream read from cubecl-cuda is not its device's".into(),
            ));
        }
        let stream = stream.cast::<sys::CUstream_st>();
        self.streams.insert(stream_id, stream);
        Ok(stream)
    }
}
