//! Each kind of product's cuBLASLt algorithm, chosen by measurement the first time the
//! kind runs in the process: the heuristic's first [`CANDIDATES`] (within
//! [`WORKSPACE_BYTES`] of workspace and the operands' real alignments), each launched
//! once to warm up and then [`TIMED_LAUNCHES`] times on the real operands, on the stream
//! the product runs on, between CUDA events; the fastest median is kept for the process
//! (`device.rs`) and on disk (`store.rs`). The host waits for the device once per kind
//! (the timings are read back), as Burn's autotune does; later products of the kind
//! enqueue with no wait. An algorithm read from the store is checked by
//! `cublasLtMatmulAlgoCheck` against the product's descriptors and measured again where
//! the check fails.

use core::ffi::c_void;

use cudarc::cublaslt::{result, sys};
use cudarc::driver::{result as driver_result, sys as driver};

use super::descriptors::{Layout, Preference, ProductDesc, failed};
use super::store::{StoreKey, StoredAlgorithm, keep_algorithm, stored_algorithm};

/// The most workspace a product may use: what cuBLAS asks for on Hopper.
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

/// How many of the heuristic's algorithms are timed for a kind of product: its first
/// few hold the fastest, each costs a handful of launches once per kind.
pub(crate) const CANDIDATES: usize = 8;

/// Timed launches per candidate, after one to warm up; their median is compared.
const TIMED_LAUNCHES: usize = 3;

/// An algorithm and the workspace it uses.
pub(crate) type Algorithm = (sys::cublasLtMatmulAlgo_t, usize);

/// One product's handle and descriptors (cuBLASLt's A, B and C/D), live for the call.
pub(crate) struct Described<'a> {
    pub handle: sys::cublasLtHandle_t,
    pub desc: &'a ProductDesc,
    pub a: &'a Layout,
    pub b: &'a Layout,
    pub d: &'a Layout,
}

/// Where a product reads and writes, on the device: cuBLASLt's A and B, its C/D (the
/// output, `out_bytes` from `out` as its layout reaches), the workspace given, and the
/// stream it runs on.
pub(crate) struct Operands {
    pub a: u64,
    pub b: u64,
    pub out: u64,
    pub out_bytes: usize,
    pub accumulate: bool,
    pub workspace: u64,
    pub workspace_bytes: usize,
    pub stream: sys::cudaStream_t,
}

fn pointer(address: u64) -> *mut c_void {
    address as usize as *mut c_void
}

impl Described<'_> {
    /// Enqueues `d = a b (+ c where accumulate)` with `algorithm` on `stream`; `c` and
    /// `d` share D's layout.
    ///
    /// # Safety
    /// The addresses must hold the layouts' extents, the workspace `workspace_bytes`,
    /// all of it live until the product has run.
    pub unsafe fn enqueue(
        &self,
        [a, b, c, d]: [u64; 4],
        accumulate: bool,
        algorithm: &sys::cublasLtMatmulAlgo_t,
        (workspace, workspace_bytes): (u64, usize),
        stream: sys::cudaStream_t,
    ) -> Result<(), String> {
        let alpha = 1.0f32;
        let beta = if accumulate { 1.0f32 } else { 0.0 };
        // SAFETY: the caller's promise; C and D are one matrix with one layout where they
        // are one address, which cuBLASLt allows in place.
        unsafe {
            result::matmul(
                self.handle,
                self.desc.0,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                pointer(a),
                self.a.0,
                pointer(b),
                self.b.0,
                pointer(c),
                self.d.0,
                pointer(d),
                self.d.0,
                algorithm,
                pointer(workspace),
                workspace_bytes,
                stream,
            )
        }
        .map_err(|error| failed("matmul", error))
    }

    /// The heuristic's first `count` algorithms (at least one) for the product, within
    /// [`WORKSPACE_BYTES`] of workspace and operands aligned to `alignments` bytes.
    pub fn listed(&self, alignments: [u32; 4], count: usize) -> Result<Vec<Algorithm>, String> {
        let preference = Preference::new(WORKSPACE_BYTES as u64, alignments)?;
        let requested = count.clamp(1, 32);
        // SAFETY: plain data, each entry written by the call before it is read.
        let mut listed: Vec<sys::cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { core::mem::zeroed() }; requested];
        let mut returned = 0;
        // SAFETY: the descriptors are live (`Described`); the array holds `requested`
        // entries.
        unsafe {
            sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                self.desc.0,
                self.a.0,
                self.b.0,
                self.d.0,
                self.d.0,
                preference.0,
                requested as i32,
                listed.as_mut_ptr(),
                &mut returned,
            )
        }
        .result()
        .map_err(|error| failed("algorithm heuristic", error))?;
        let returned = usize::try_from(returned).unwrap_or(0).min(requested);
        let found: Vec<Algorithm> = listed[..returned]
            .iter()
            .filter(|entry| entry.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|entry| (entry.algo, entry.workspaceSize))
            .collect();
        if found.is_empty() {
            return Err("cuBLASLt found no algorithm".into());
        }
        Ok(found)
    }

    /// The workspace `algorithm` uses for this product, where cuBLASLt says it can run
    /// it (`cublasLtMatmulAlgoCheck`).
    fn checked(&self, algorithm: &sys::cublasLtMatmulAlgo_t) -> Option<usize> {
        // SAFETY: plain data, written by the call.
        let mut checked: sys::cublasLtMatmulHeuristicResult_t = unsafe { core::mem::zeroed() };
        // SAFETY: the descriptors are live (`Described`); the algorithm is read, the
        // result written.
        unsafe {
            sys::cublasLtMatmulAlgoCheck(
                self.handle,
                self.desc.0,
                self.a.0,
                self.b.0,
                self.d.0,
                self.d.0,
                algorithm,
                &mut checked,
            )
        }
        .result()
        .ok()?;
        (checked.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .then_some(checked.workspaceSize)
    }
}

/// The algorithm for a kind of product not run before in this process: the one `store`
/// kept for it where cuBLASLt accepts it for these descriptors, else the fastest of the
/// heuristic's first [`CANDIDATES`] on `operands` (kept under `store`), else, where
/// they could not be timed (or it lists one), the heuristic's first; and whether
/// candidates were timed.
///
/// # Safety
/// `operands` must be the product's, pinned until it has run, in the device's current
/// context; `described` its descriptors.
pub(crate) unsafe fn choose(
    described: &Described,
    operands: &Operands,
    alignments: [u32; 4],
    store: Option<StoreKey>,
) -> Result<(Algorithm, bool), String> {
    if let Some(key) = &store
        && let Some(stored) = stored_algorithm(key)
    {
        let algorithm = sys::cublasLtMatmulAlgo_t {
            data: stored.algorithm,
        };
        if let Some(workspace) = described.checked(&algorithm)
            && workspace <= WORKSPACE_BYTES
        {
            return Ok(((algorithm, workspace), false));
        }
    }
    let candidates = described.listed(alignments, CANDIDATES)?;
    if candidates.len() < 2 {
        return Ok((candidates[0], false));
    }
    // SAFETY: the caller's promise.
    match unsafe { fastest(described, &candidates, operands) } {
        Ok(index) => {
            let (algorithm, workspace) = candidates[index];
            if let Some(key) = store {
                let stored = StoredAlgorithm {
                    algorithm: algorithm.data,
                    workspace_bytes: workspace as u64,
                };
                keep_algorithm(key, stored);
            }
            Ok(((algorithm, workspace), true))
        }
        // Not timed (no memory for the timing's buffers, a failed event): the
        // heuristic's first, for this process, stored nowhere.
        Err(_) => Ok((candidates[0], false)),
    }
}

/// Device memory of the driver's, outside cubecl's pool, for the timing only: freed
/// when dropped (after every launch using it has run: the caller synchronizes first).
struct DeviceBuffer(driver::CUdeviceptr);

impl DeviceBuffer {
    fn new(bytes: usize) -> Result<Self, String> {
        // SAFETY: an allocation in the current context, written only by our launches.
        unsafe { driver_result::malloc_sync(bytes.max(1)) }
            .map(Self)
            .map_err(|error| format!("CUDA allocation of {bytes} bytes: {error:?}"))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once, no launch left using it.
        let _ = unsafe { driver_result::free_sync(self.0) };
    }
}

/// Timing events, destroyed when dropped.
struct Events(Vec<driver::CUevent>);

impl Events {
    fn new(count: usize) -> Result<Self, String> {
        let mut events = Self(Vec::with_capacity(count));
        for _ in 0..count {
            let event = driver_result::event::create(driver::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(|error| format!("CUDA event: {error:?}"))?;
            events.0.push(event);
        }
        Ok(events)
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        for &event in &self.0 {
            // SAFETY: created by `new`, destroyed once.
            let _ = unsafe { driver_result::event::destroy(event) };
        }
    }
}

/// Which of `candidates` runs the product fastest on `operands`: the least median of
/// [`TIMED_LAUNCHES`] after one launch to warm up, each between two events on the
/// product's stream. A candidate cuBLASLt refuses to launch is passed over.
///
/// The device finishes everything enqueued before (a host wait), so that no other work
/// runs beside the timed launches. A product that overwrites its output is timed into
/// it (the real launch overwrites it again). A product that sums into its output reads
/// it as C and writes D to a scratch buffer of the output's extent instead, allocated
/// from the driver for the timing and freed right after: the sum is never written by a
/// timed launch, no copy of it is made or restored, and the step keeps none of that
/// memory (cubecl's pool would keep what it had allocated for it), at the cost of one
/// output's extent while a kind of sum is first timed. The workspace is the one given
/// where it holds every candidate's, else one of the driver's as well.
///
/// # Safety
/// As [`choose`].
unsafe fn fastest(
    described: &Described,
    candidates: &[Algorithm],
    operands: &Operands,
) -> Result<usize, String> {
    synchronize("before timing")?;
    let scratch = if operands.accumulate {
        Some(DeviceBuffer::new(operands.out_bytes)?)
    } else {
        None
    };
    let most_workspace = candidates
        .iter()
        .map(|&(_, bytes)| bytes)
        .max()
        .unwrap_or(0);
    let own_workspace = if most_workspace > operands.workspace_bytes {
        Some(DeviceBuffer::new(most_workspace)?)
    } else {
        None
    };
    let events = Events::new(2 * TIMED_LAUNCHES)?;
    let workspace = own_workspace.as_ref().map_or(operands.workspace, |b| b.0);
    let written = scratch.as_ref().map_or(operands.out, |b| b.0);
    let addresses = [operands.a, operands.b, operands.out, written];
    let mut fastest: Option<(f32, usize)> = None;
    let mut failure = None;
    for (index, (algorithm, workspace_bytes)) in candidates.iter().enumerate() {
        // SAFETY: the operands are pinned (the caller's promise); the scratch and the
        // workspace hold what the layouts and the candidate need.
        let launch = || unsafe {
            described.enqueue(
                addresses,
                operands.accumulate,
                algorithm,
                (workspace, *workspace_bytes),
                operands.stream,
            )
        };
        if launch().is_err() {
            continue;
        }
        match median_ms(&events, operands.stream, launch) {
            Ok(median) => {
                if fastest.is_none_or(|(best, _)| median < best) {
                    fastest = Some((median, index));
                }
            }
            Err(why) => {
                failure = Some(why);
                break;
            }
        }
    }
    // Every launch has run before the buffers are freed, whether the timing finished
    // or not.
    let drained = synchronize("after timing");
    drop((scratch, own_workspace));
    if let Some(why) = failure {
        return Err(why);
    }
    drained?;
    fastest
        .map(|(_, index)| index)
        .ok_or_else(|| "no candidate launched".to_string())
}

/// The device's context finishes all its work.
fn synchronize(when: &str) -> Result<(), String> {
    driver_result::ctx::synchronize().map_err(|error| format!("CUDA synchronize {when}: {error:?}"))
}

/// The median of [`TIMED_LAUNCHES`] runs of `launch` on `stream`, each between a pair of
/// `events`, in milliseconds (the host waits for the last).
fn median_ms(
    events: &Events,
    stream: sys::cudaStream_t,
    launch: impl Fn() -> Result<(), String>,
) -> Result<f32, String> {
    let stream = stream.cast::<driver::CUstream_st>();
    let event_error = |error| format!("CUDA event: {error:?}");
    for pair in events.0.chunks_exact(2) {
        // SAFETY: live events and stream of the current context.
        unsafe { driver_result::event::record(pair[0], stream) }.map_err(event_error)?;
        launch()?;
        // SAFETY: as above.
        unsafe { driver_result::event::record(pair[1], stream) }.map_err(event_error)?;
    }
    let mut times = [0f32; TIMED_LAUNCHES];
    for (time, pair) in times.iter_mut().zip(events.0.chunks_exact(2)) {
        // SAFETY: recorded events; the second waited for before both are read.
        *time = unsafe {
            driver_result::event::synchronize(pair[1])
                .and_then(|()| driver_result::event::elapsed(pair[0], pair[1]))
        }
        .map_err(event_error)?;
    }
    times.sort_by(f32::total_cmp);
    Ok(times[TIMED_LAUNCHES / 2])
}
