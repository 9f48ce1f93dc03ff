//! Test hooks (feature `test-hooks`): process-wide switches and counters read on the host
//! only (never a device read). Not part of the loss's API; the project's tests use them to
//! prove what the op did. Without the feature they are private and never switched on.

use core::cell::Cell;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

static POISON_OUTPUTS: AtomicBool = AtomicBool::new(false);
static IN_PLACE_BACKWARDS: AtomicUsize = AtomicUsize::new(0);
static IN_PLACE_ACCUMULATES: AtomicUsize = AtomicUsize::new(0);
static SPLIT_K_PRODUCTS: AtomicUsize = AtomicUsize::new(0);
static UNSPLIT_KERNEL_PRODUCTS: AtomicUsize = AtomicUsize::new(0);
static CUBLASLT_PRODUCTS: AtomicUsize = AtomicUsize::new(0);
static PROBE_MEMORY: AtomicBool = AtomicBool::new(false);
static PROBED_PEAK: AtomicU64 = AtomicU64::new(0);

/// Why the in-place matmul last refused a product (see [`in_place_accumulate_refusal`]).
pub(crate) static IN_PLACE_ACCUMULATE_REFUSAL: LastRefusal = LastRefusal::new();
/// Why cuBLASLt last refused a product (see [`cublaslt_refusal`]).
pub(crate) static CUBLASLT_REFUSAL: LastRefusal = LastRefusal::new();

/// The last reason one kind of launch was refused, kept for the tests.
pub(crate) struct LastRefusal(Mutex<Option<String>>);

impl LastRefusal {
    const fn new() -> Self {
        Self(Mutex::new(None))
    }

    fn last(&self) -> Option<String> {
        self.0.lock().map_or(None, |refusal| refusal.clone())
    }

    /// Keeps `why()`; formed only where the hooks are on.
    pub(crate) fn note(&self, why: impl FnOnce() -> String) {
        if cfg!(feature = "test-hooks")
            && let Ok(mut refusal) = self.0.lock()
        {
            *refusal = Some(why());
        }
    }
}

/// Fill every output buffer with NaN before its kernel runs (one extra launch each).
pub fn set_poison_outputs(enabled: bool) {
    POISON_OUTPUTS.store(enabled, Ordering::Relaxed);
}

pub(crate) fn poison_outputs() -> bool {
    POISON_OUTPUTS.load(Ordering::Relaxed)
}

/// How many backward launches wrote the gradient over the logits buffer so far.
pub fn in_place_backward_count() -> usize {
    IN_PLACE_BACKWARDS.load(Ordering::Relaxed)
}

pub(crate) fn count_in_place_backward() {
    IN_PLACE_BACKWARDS.fetch_add(1, Ordering::Relaxed);
}

/// How many weight-gradient products were summed in place by one matmul so far
/// ([`crate::backend::LinearCrossEntropyBackend::accumulate_product`] through cuBLASLt, or
/// CubeCL's kernel on a device with TMA).
pub fn in_place_accumulate_count() -> usize {
    IN_PLACE_ACCUMULATES.load(Ordering::Relaxed)
}

pub(crate) fn count_in_place_accumulate() {
    IN_PLACE_ACCUMULATES.fetch_add(1, Ordering::Relaxed);
}

/// Why the in-place matmul last refused a product it was given (its error: a weight
/// gradient summed in place, or a split hidden-state gradient), if it did.
pub fn in_place_accumulate_refusal() -> Option<String> {
    IN_PLACE_ACCUMULATE_REFUSAL.last()
}

/// How many products ran split along their inner dimension so far
/// ([`crate::backend::FusedCrossEntropyBackend::matmul_split_k`] on a device with TMA).
pub fn split_k_product_count() -> usize {
    SPLIT_K_PRODUCTS.load(Ordering::Relaxed)
}

pub(crate) fn count_split_k_product() {
    SPLIT_K_PRODUCTS.fetch_add(1, Ordering::Relaxed);
}

/// How many products [`crate::backend::FusedCrossEntropyBackend::matmul_split_k`] formed unsplit
/// by the in-place matmul into zeros so far (where splitting would not fill more of the
/// device, on a device with TMA).
pub fn unsplit_kernel_product_count() -> usize {
    UNSPLIT_KERNEL_PRODUCTS.load(Ordering::Relaxed)
}

pub(crate) fn count_unsplit_kernel_product() {
    UNSPLIT_KERNEL_PRODUCTS.fetch_add(1, Ordering::Relaxed);
}

/// How many of the fused linear cross-entropy's products ran through cuBLASLt so far
/// (`ChunkProducts::cublaslt`, on CUDA devices where the library loads).
pub fn cublaslt_product_count() -> usize {
    CUBLASLT_PRODUCTS.load(Ordering::Relaxed)
}

pub(crate) fn count_cublaslt_product() {
    CUBLASLT_PRODUCTS.fetch_add(1, Ordering::Relaxed);
}

/// Why cuBLASLt last refused a product it was asked for, if it did.
pub fn cublaslt_refusal() -> Option<String> {
    CUBLASLT_REFUSAL.last()
}

/// Read the device's bytes in use at each of the fused linear cross-entropy's products,
/// as the product runs (inputs, output and cuBLASLt's workspace allocated), and keep the
/// most seen; switching it on or off starts again from 0. Each reading is a round trip
/// to the device's thread (no wait for the device): for the benches' peak memory, which
/// readings from another thread can miss.
pub fn set_probe_memory(enabled: bool) {
    PROBED_PEAK.store(0, Ordering::Relaxed);
    PROBE_MEMORY.store(enabled, Ordering::Relaxed);
}

/// The most bytes in use seen at a product since [`set_probe_memory`] (0 when off).
pub fn probed_peak_bytes_in_use() -> u64 {
    PROBED_PEAK.load(Ordering::Relaxed)
}

pub(crate) fn probe_memory() -> bool {
    cfg!(feature = "test-hooks") && PROBE_MEMORY.load(Ordering::Relaxed)
}

pub(crate) fn note_bytes_in_use(bytes: u64) {
    PROBED_PEAK.fetch_max(bytes, Ordering::Relaxed);
}

thread_local! {
    // Per thread: the products are asked for on the calling thread (the timing runs on
    // the device's), and the tests that read it run side by side.
    static CUBLASLT_MEASUREMENTS: Cell<usize> = const { Cell::new(0) };
}

/// How many cuBLASLt products asked for on this thread had their kind's algorithm chosen
/// by timing cuBLASLt's candidates on the device (the first product of each kind in the
/// process; none where the kind's algorithm was read from the store on disk).
pub fn cublaslt_measurement_count() -> usize {
    CUBLASLT_MEASUREMENTS.with(Cell::get)
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn count_cublaslt_measurement() {
    CUBLASLT_MEASUREMENTS.with(|count| count.set(count.get() + 1));
}

/// The fused linear cross-entropy's products, by what they form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearProduct {
    /// A chunk's logits `h_c W`.
    Logits,
    /// A chunk's hidden-state gradient `dlogits_c W^T`.
    HiddenGradient,
    /// A chunk's weight-gradient product `h_c^T dlogits_c` (summed, or one per block of
    /// columns).
    WeightGradient,
    /// A chunk's bias gradient, the column sums of `dlogits_c`.
    BiasGradient,
}

/// How many products of each kind the fused linear cross-entropy asked its backend for
/// on this thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinearProductCounts {
    pub logits: usize,
    pub hidden_gradient: usize,
    pub weight_gradient: usize,
    pub bias_gradient: usize,
}

thread_local! {
    // Per thread, unlike the counters above: the op asks for its products on the calling
    // thread, and the tests that read these run side by side.
    static LINEAR_PRODUCTS: Cell<LinearProductCounts> = const {
        Cell::new(LinearProductCounts {
            logits: 0,
            hidden_gradient: 0,
            weight_gradient: 0,
            bias_gradient: 0,
        })
    };
}

/// The products counted on this thread so far (see [`LinearProductCounts`]).
pub fn linear_product_counts() -> LinearProductCounts {
    LINEAR_PRODUCTS.with(Cell::get)
}

pub(crate) fn count_linear_product(product: LinearProduct) {
    if cfg!(feature = "test-hooks") {
        LINEAR_PRODUCTS.with(|counts| {
            let mut now = counts.get();
            match product {
                LinearProduct::Logits => now.logits += 1,
                LinearProduct::HiddenGradient => now.hidden_gradient += 1,
                LinearProduct::WeightGradient => now.weight_gradient += 1,
                LinearProduct::BiasGradient => now.bias_gradient += 1,
            }
            counts.set(now);
        });
    }
}
