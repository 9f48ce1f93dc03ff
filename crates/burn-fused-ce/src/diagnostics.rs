//! Test hooks: process-wide switches and counters read on the host only (never a device
//! read). Not part of the loss's API; tests use them to prove what the op did.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static POISON_OUTPUTS: AtomicBool = AtomicBool::new(false);
static IN_PLACE_BACKWARDS: AtomicUsize = AtomicUsize::new(0);

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

/// 0: the device's own plan.
static SPLIT_CHUNKS: AtomicUsize = AtomicUsize::new(0);

/// Cut every row into `chunks` chunks in the one-pass (forward-formed gradient) kernel,
/// whatever the device's plan (`None`: back to the plan). Tests the exchange between the
/// cubes of a row where the plan would use one chunk; the device must run that many cubes
/// at once.
pub fn set_split_chunks(chunks: Option<usize>) {
    SPLIT_CHUNKS.store(chunks.unwrap_or(0), Ordering::Relaxed);
}

pub(crate) fn split_chunks() -> Option<usize> {
    match SPLIT_CHUNKS.load(Ordering::Relaxed) {
        0 => None,
        chunks => Some(chunks),
    }
}
