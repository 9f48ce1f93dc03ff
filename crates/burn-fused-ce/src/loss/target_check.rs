//! Deferred target checks ([`TargetCheck::Deferred`]): each call's check runs on the
//! device and its small result is read back without waiting; the host looks at it two
//! calls of the loss later on the same thread, or when asked to wait.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::mem::ManuallyDrop;

use burn::backend::ExecutionError;
use burn::tensor::{Int, Tensor, TensorData};

use crate::error::CrossEntropyError;
use crate::loss::check_read::TargetCheckRead;
#[cfg(doc)]
use crate::options::TargetCheck;

/// A call's target check whose result the host has not looked at yet: the slot its op
/// hands the read of `[first bad row, its target]` to, that result's tensor, and the
/// call's row count and vocabulary.
pub struct PendingTargetCheck {
    pub slot: TargetCheckRead,
    pub found: Tensor<1, Int>,
    pub rows: usize,
    pub vocab: usize,
}

impl PendingTargetCheck {
    /// Waits for the result: the op's read, or, where the op has not run yet, a read of
    /// `found` through Burn (under Fusion that runs the thread's queued operations first).
    fn wait(self) -> Result<TensorData, ExecutionError> {
        match self.slot.take() {
            Some(read) => read.wait(),
            None => {
                let result = cubecl::future::block_on(self.found.into_data_async());
                // The op ran on the way: its read finishes as it is dropped.
                drop(self.slot.take());
                result
            }
        }
    }
}

/// Checks a call leaves pending: those of the calls just before it. Waiting for the
/// previous call's check would let the device run dry: that call's loss kernels sit
/// behind its check and may not have reached the device yet (cubecl batches launches),
/// so the host would sleep while the device idles. The check two calls back is behind
/// a whole step of queued work and has normally run by then.
const LEFT_PENDING: usize = 1;

thread_local! {
    // Left undropped when the thread ends: waiting for a device read then would use other
    // thread-locals (the stream's) already gone, and the process ends or the thread is
    // done with the device.
    static PENDING: RefCell<ManuallyDrop<VecDeque<PendingTargetCheck>>> =
        const { RefCell::new(ManuallyDrop::new(VecDeque::new())) };
}

/// The error a finished check reports, if any.
fn verdict(
    result: Result<TensorData, ExecutionError>,
    rows: usize,
    vocab: usize,
) -> Result<(), CrossEntropyError> {
    // A failed read is the device's own error; it surfaces through Burn's next read.
    let Ok(data) = result else { return Ok(()) };
    let found = data.try_into_vec_as::<i64>().unwrap_or_default();
    match found[..] {
        [row, value, ..] if (row as usize) < rows => Err(CrossEntropyError::TargetOutOfRange {
            row: row as usize,
            value,
            vocab,
            earlier_call: true,
        }),
        _ => Ok(()),
    }
}

/// Waits for the pending checks of this thread but the newest [`LEFT_PENDING`], oldest
/// first, and returns the first bad target found.
pub(crate) fn surface_finished() -> Result<(), CrossEntropyError> {
    let due: Vec<PendingTargetCheck> = PENDING.with(|pending| {
        let mut pending = pending.borrow_mut();
        let due = pending.len().saturating_sub(LEFT_PENDING);
        pending.drain(..due).collect()
    });
    first_error(due)
}

/// Waits for `checks` and returns the first bad target among them.
fn first_error(checks: Vec<PendingTargetCheck>) -> Result<(), CrossEntropyError> {
    let mut found = Ok(());
    for check in checks {
        let (rows, vocab) = (check.rows, check.vocab);
        let verdict = verdict(check.wait(), rows, vocab);
        if found.is_ok() {
            found = verdict;
        }
    }
    found
}

/// Keeps a call's check until a later call, or [`wait_for_target_checks`], looks at it.
pub(crate) fn defer(check: PendingTargetCheck) {
    PENDING.with(|pending| pending.borrow_mut().push_back(check));
}

/// Waits for every target check this thread's calls left pending
/// ([`TargetCheck::Deferred`]) and returns the first bad target among them, oldest call
/// first. Call it where a training loop syncs anyway (after the last step, before
/// reading the loss) to learn of a bad target at once.
///
/// # Example
///
/// A bad target under `Deferred` (the default) and under `Immediate`:
///
/// ```rust
/// # use burn::tensor::{Device, DeviceKind, Distribution, Int, Tensor};
/// # let device = Device::wgpu(DeviceKind::DefaultDevice).autodiff();
/// # let logits = Tensor::<2>::random([4, 10], Distribution::Default, &device).require_grad();
/// use burn_fused_ce::{CrossEntropyError, FusedCrossEntropyLossConfig, TargetCheck};
/// use burn_fused_ce::target_check::wait_for_target_checks;
///
/// let bad = Tensor::<1, Int>::from_ints([1, 2, 10, 3], &device); // 10 is not in [0, 10)
/// let loss_fn = FusedCrossEntropyLossConfig::new().init(&device); // Deferred
/// let _loss = loss_fn.forward(logits.clone(), bad.clone()); // runs: NaN loss, zero gradient on row 2
/// let found = wait_for_target_checks(); // or the second call after this one
/// assert_eq!(found, Err(CrossEntropyError::TargetOutOfRange {
///     row: 2, value: 10, vocab: 10, earlier_call: true,
/// }));
///
/// // Immediate: the call itself refuses the batch, at one blocking read per call.
/// let strict = FusedCrossEntropyLossConfig::new()
///     .with_target_check(TargetCheck::Immediate)
///     .init(&device);
/// let refused = strict.try_forward(logits, bad);
/// assert!(matches!(
///     refused,
///     Err(CrossEntropyError::TargetOutOfRange { row: 2, earlier_call: false, .. })
/// ));
/// # device.sync().unwrap(); // exiting with work in flight can crash lavapipe
/// ```
pub fn wait_for_target_checks() -> Result<(), CrossEntropyError> {
    first_error(PENDING.with(|pending| pending.borrow_mut().drain(..).collect()))
}
