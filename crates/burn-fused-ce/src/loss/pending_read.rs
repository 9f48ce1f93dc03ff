//! A read of a small device tensor started without waiting: what a target check hands to
//! the host.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use burn::backend::ExecutionError;
use burn::tensor::TensorData;

/// A read of a small device tensor, started but not waited for.
pub struct PendingRead {
    state: ReadState,
}

type ReadFuture = Pin<Box<dyn Future<Output = Result<TensorData, ExecutionError>> + Send>>;

enum ReadState {
    Waiting(ReadFuture),
    /// A copy already queued on the device into host memory the future owns: waited for
    /// even when dropped, so the memory is never handed back while the copy may run.
    /// Only the cube ops' reads start this way.
    #[cfg_attr(not(feature = "cube"), allow(dead_code))]
    Queued(ReadFuture),
    Done(Option<Result<TensorData, ExecutionError>>),
}

impl PendingRead {
    /// Starts the read `future` stands for: polled once now, which queues the copy behind
    /// the work already queued (a fusion stream is flushed up to it), without waiting.
    pub fn start(
        future: impl Future<Output = Result<TensorData, ExecutionError>> + Send + 'static,
    ) -> Self {
        let mut future: ReadFuture = Box::pin(future);
        let mut context = Context::from_waker(Waker::noop());
        let state = match future.as_mut().poll(&mut context) {
            Poll::Ready(result) => ReadState::Done(Some(result)),
            Poll::Pending => ReadState::Waiting(future),
        };
        Self { state }
    }

    /// A read already queued on the device: `future` only waits for it, and is not
    /// polled before the host looks at the read.
    #[cfg_attr(not(feature = "cube"), allow(dead_code))]
    pub(crate) fn queued(
        future: impl Future<Output = Result<TensorData, ExecutionError>> + Send + 'static,
    ) -> Self {
        Self {
            state: ReadState::Queued(Box::pin(future)),
        }
    }

    /// Waits for the result.
    pub(crate) fn wait(mut self) -> Result<TensorData, ExecutionError> {
        match core::mem::replace(&mut self.state, ReadState::Done(None)) {
            ReadState::Waiting(future) | ReadState::Queued(future) => {
                cubecl::future::block_on(future)
            }
            ReadState::Done(result) => result.unwrap_or_else(|| {
                Err(ExecutionError::WithContext {
                    reason: "the read was taken already".into(),
                })
            }),
        }
    }
}

impl Future for PendingRead {
    type Output = Result<TensorData, ExecutionError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            ReadState::Waiting(future) | ReadState::Queued(future) => future.as_mut().poll(cx),
            ReadState::Done(result) => match result.take() {
                Some(result) => Poll::Ready(result),
                None => Poll::Pending,
            },
        }
    }
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        if let ReadState::Queued(future) =
            core::mem::replace(&mut self.state, ReadState::Done(None))
        {
            let _ = cubecl::future::block_on(future);
        }
    }
}
