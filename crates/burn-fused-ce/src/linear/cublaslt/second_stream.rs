//! A second CUDA stream beside one of cubecl's, for the weight gradient's sum
//! ([`WeightGradientStream`](crate::WeightGradientStream)): chunk `c`'s
//! `grad_W += h_c^T dlogits_c` runs there while cubecl's stream forms chunk `c`'s
//! hidden-state gradient, or goes on to chunk `c + 1`, so that the sum's read and write
//! of the whole weight gradient overlap other products' arithmetic.
//!
//! Ordering, all on the device (the host waits for nothing):
//! - the second stream starts each product after everything enqueued on cubecl's stream
//!   so far (an event recorded there);
//! - cubecl's stream waits for a product when the next one is enqueued, and for all of
//!   them at [`SecondStream::join`] (before the sum is read by anything else, or before
//!   the next chunk);
//! - each product's operands and workspace stay allocated until cubecl's stream waits
//!   for it: cubecl hands freed memory to the next kernels on its stream, which must not
//!   write it while the second stream still reads it. The sum itself is held by the
//!   caller until the join; holding it here would stop the next product from summing
//!   into it in place.

use cubecl_runtime::server::Handle;
use cudarc::cublaslt::sys;
use cudarc::driver::sys as driver;

/// A product enqueued on the second stream that cubecl's stream has not waited for.
struct Pending {
    /// Recorded on the second stream after the product.
    done: driver::CUevent,
    /// What the product reads (its operands and workspace), kept from reuse.
    _held: Vec<Handle>,
}

/// The second stream beside one of cubecl's streams.
pub(crate) struct SecondStream {
    stream: driver::CUstream,
    pending: Vec<Pending>,
}

/// Checks a driver call.
fn checked(what: &str, result: driver::CUresult) -> Result<(), String> {
    if result == driver::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("CUDA {what}: {result:?}"))
    }
}

/// A new event without timing.
fn new_event() -> Result<driver::CUevent, String> {
    let mut event: driver::CUevent = core::ptr::null_mut();
    let flags = driver::CUevent_flags::CU_EVENT_DISABLE_TIMING as core::ffi::c_uint;
    // SAFETY: writes one handle; the device's context is current in its tasks.
    checked("event", unsafe { driver::cuEventCreate(&mut event, flags) })?;
    Ok(event)
}

/// `waiter` waits, on the device, for what `event` recorded; the event is released
/// once that is done.
fn wait_and_release(waiter: driver::CUstream, event: driver::CUevent) -> Result<(), String> {
    // SAFETY: both handles live (the event is destroyed after the wait is enqueued,
    // which the driver allows: its resources go once the work completes).
    let waited = checked("stream wait", unsafe {
        driver::cuStreamWaitEvent(waiter, event, 0)
    });
    // SAFETY: created by `new_event`, destroyed once.
    let _ = unsafe { driver::cuEventDestroy_v2(event) };
    waited
}

fn as_driver(stream: sys::cudaStream_t) -> driver::CUstream {
    stream.cast::<driver::CUstream_st>()
}

impl SecondStream {
    /// A new non-blocking stream on the current context.
    pub fn new() -> Result<Self, String> {
        let mut stream: driver::CUstream = core::ptr::null_mut();
        let flags = driver::CUstream_flags::CU_STREAM_NON_BLOCKING as core::ffi::c_uint;
        // SAFETY: writes one handle; the device's context is current in its tasks.
        checked("stream", unsafe {
            driver::cuStreamCreate(&mut stream, flags)
        })?;
        Ok(Self {
            stream,
            pending: Vec::new(),
        })
    }

    /// The stream, as cuBLASLt takes it, ready for a product that follows everything
    /// enqueued on `main` so far.
    pub fn follow(&mut self, main: sys::cudaStream_t) -> Result<sys::cudaStream_t, String> {
        let ready = new_event()?;
        // SAFETY: both handles live.
        checked("event record", unsafe {
            driver::cuEventRecord(ready, as_driver(main))
        })?;
        wait_and_release(self.stream, ready)?;
        Ok(self.stream.cast::<sys::CUstream_st>())
    }

    /// After a product was enqueued on the stream: `main` waits for the products before
    /// it, whose operands are then released, and this one is kept with `held`.
    pub fn enqueued(&mut self, main: sys::cudaStream_t, held: Vec<Handle>) -> Result<(), String> {
        let done = new_event().and_then(|done| {
            // SAFETY: both handles live.
            let recorded = checked("event record", unsafe {
                driver::cuEventRecord(done, self.stream)
            });
            if recorded.is_err() {
                // SAFETY: created above, destroyed once.
                let _ = unsafe { driver::cuEventDestroy_v2(done) };
            }
            recorded.map(|()| done)
        });
        let joined = self.join(main);
        match done {
            Ok(done) => {
                self.pending.push(Pending { done, _held: held });
                joined
            }
            Err(why) => {
                // The product's order is lost: the host waits for it before its
                // operands are released.
                // SAFETY: a live stream of the current context.
                let _ = unsafe { driver::cuStreamSynchronize(self.stream) };
                Err(why)
            }
        }
    }

    /// `main` waits for every product on the stream; their operands are released.
    pub fn join(&mut self, main: sys::cudaStream_t) -> Result<(), String> {
        let mut result = Ok(());
        for pending in self.pending.drain(..) {
            let waited = wait_and_release(as_driver(main), pending.done);
            if waited.is_err() {
                // The order could not be enqueued: the host waits instead.
                // SAFETY: a live stream of the current context.
                let _ = unsafe { driver::cuStreamSynchronize(self.stream) };
                result = result.and(waited);
            }
        }
        result
    }
}
