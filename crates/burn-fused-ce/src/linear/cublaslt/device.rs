//! Per CUDA device: cuBLASLt's handle, cubecl's streams by slot, and the algorithm
//! chosen for each product shape. Used only inside tasks on the device's thread, which
//! cubecl runs one at a time.

use std::collections::{HashMap, hash_map::Entry};
use std::sync::{LazyLock, Mutex};

use cubecl::device::DeviceId;
use cudarc::cublaslt::{result, sys};
use cudarc::driver::sys as driver;

use super::descriptors::failed;
use super::second_stream::SecondStream;
use super::stream_scan::{regular_slots, stream_of_slot};

/// What picks an algorithm: the product, the operands' types and alignments, and which
/// of the heuristic's list is taken (0, its first, but where the benches ask).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct AlgorithmKey {
    pub product: super::layout::LtProduct,
    pub types: [u32; 3],
    pub alignments: [u32; 4],
    pub accumulate: bool,
    pub rank: usize,
    /// The SMs the product is described to run on (0: all).
    pub sm_target: i32,
}

/// One device's cuBLASLt state.
pub(crate) struct LtDevice {
    pub handle: sys::cublasLtHandle_t,
    streams: HashMap<u64, sys::cudaStream_t>,
    /// The second stream beside each of cubecl's streams that has used one.
    second_streams: HashMap<u64, SecondStream>,
    /// The algorithm the heuristic listed at the key's rank (its first by default) and
    /// its workspace, or why it found none.
    pub algorithms: HashMap<AlgorithmKey, Result<(sys::cublasLtMatmulAlgo_t, usize), String>>,
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
                second_streams: HashMap::new(),
                algorithms: HashMap::new(),
            })
            .map_err(|error| failed("handle", error))
    });
    let state = entry.as_mut().map_err(|why| why.clone())?;
    match task(state) {
        Ok(value) => Ok(value),
        Err(Refusal::ThisCall(why)) => Err(why),
        Err(Refusal::Device(why)) => {
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
    /// The second stream beside cubecl's stream `stream_id`, made on first use.
    pub fn second_stream(&mut self, stream_id: u64) -> Result<&mut SecondStream, Refusal> {
        Ok(match self.second_streams.entry(stream_id) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => entry.insert(SecondStream::new().map_err(Refusal::ThisCall)?),
        })
    }

    /// Whether sums enqueued on the second stream beside cubecl's stream `stream_id` may
    /// still run (cubecl's stream has not waited for them).
    pub fn sums_pending(&self, stream_id: u64) -> bool {
        self.second_streams
            .get(&stream_id)
            .is_some_and(SecondStream::has_pending)
    }

    /// cubecl's stream `stream_id` (`main`) waits for what its second stream has
    /// enqueued, if it has one.
    pub fn join_second_stream(
        &mut self,
        stream_id: u64,
        main: sys::cudaStream_t,
    ) -> Result<(), Refusal> {
        match self.second_streams.get_mut(&stream_id) {
            Some(second) => second.join(main).map_err(Refusal::ThisCall),
            None => Ok(()),
        }
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
