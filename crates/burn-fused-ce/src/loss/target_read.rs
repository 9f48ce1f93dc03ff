//! Starting a deferred target check's read. Every way Burn reads a device tensor blocks
//! the calling thread somewhere: the fusion stream's drain and cubecl's read are
//! requests the caller waits for, and a cube device's `into_data_async` returns bytes
//! that copy on first access, waiting then for everything queued since. Once a step,
//! any of these stalls a training loop's queue. So the read runs on a thread of its own,
//! which waits for the device in the loop's place; the loop's thread only looks at the
//! result, calls later.

use std::sync::OnceLock;
use std::sync::mpsc::{self, Receiver, SyncSender};

use burn::backend::ExecutionError;
use burn::tensor::{Int, Tensor, TensorData};

use crate::loss::target_check::PendingRead;

/// A read for the reader thread: the tensor, and where its values go.
type ReadJob = (
    Tensor<1, Int>,
    SyncSender<Result<TensorData, ExecutionError>>,
);

/// Starts reading `tensor` (a few integers) without waiting for it.
pub(crate) fn start_read(tensor: Tensor<1, Int>) -> PendingRead {
    let (result_sender, result) = mpsc::sync_channel(1);
    match reader().send((tensor, result_sender)) {
        Ok(()) => PendingRead::received(result),
        // No reader thread (it could not be started): read here, later.
        Err(mpsc::SendError((tensor, _))) => PendingRead::start(tensor.into_data_async()),
    }
}

/// The process's reader thread, started on first use. Where it cannot start, its end of
/// the channel is dropped with the failed spawn: sending fails, and the caller reads on
/// its own thread.
fn reader() -> SyncSender<ReadJob> {
    static READER: OnceLock<SyncSender<ReadJob>> = OnceLock::new();
    READER
        .get_or_init(|| {
            // Room for many calls' checks: a loop never waits to hand one over.
            let (jobs, queue) = mpsc::sync_channel::<ReadJob>(1024);
            let _ = std::thread::Builder::new()
                .name("fused-ce-target-check".into())
                .spawn(move || read_all(queue));
            jobs
        })
        .clone()
}

/// The reader thread's loop: each read to the end, its values materialized here (a
/// cube device's bytes copy on first access).
fn read_all(queue: Receiver<ReadJob>) {
    for (tensor, result) in queue {
        let read = cubecl::future::block_on(tensor.into_data_async()).and_then(|data| {
            let shape = data.shape().clone();
            data.try_into_vec_as::<i64>()
                .map(|values| TensorData::new(values, shape))
                .map_err(|error| ExecutionError::WithContext {
                    reason: format!("the target check's result: {error:?}"),
                })
        });
        // The loss may have stopped waiting (its thread ended): nothing to tell.
        let _ = result.send(read);
    }
}
