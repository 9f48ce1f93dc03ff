//! Which CUDA stream each chunk's weight-gradient sum runs on, and what it runs beside.

use serde::{Deserialize, Serialize};

/// Where each chunk's weight-gradient sum `grad_W += h_c^T dlogits_c` runs
/// ([`LinearChunking::weight_gradient_stream`](crate::LinearChunking::weight_gradient_stream)).
/// The sum reads and writes the whole weight gradient once per chunk; on a second CUDA
/// stream that traffic overlaps other products' arithmetic. Only with
/// [`LinearChunking::cublaslt`](crate::LinearChunking::cublaslt) and
/// [`LinearChunking::weight_gradient_in_place`](crate::LinearChunking::weight_gradient_in_place)
/// on CUDA devices; elsewhere every variant is [`Self::Backend`]. The host waits for
/// nothing, and the math is the same.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WeightGradientStream {
    /// On the stream the backend's kernels run on, after the chunk's hidden-state
    /// gradient.
    #[default]
    Backend,
    /// On a second stream, beside the same chunk's hidden-state gradient (both read the
    /// chunk's logits gradient); the backend's stream waits for it before the next
    /// chunk's logits. One chunk of logits in memory, as with [`Self::Backend`].
    BesideHiddenGradient,
    /// On a second stream, beside the next chunk's logits, loss and hidden-state
    /// gradient; the backend's stream waits for it when the next sum is enqueued. The
    /// chunk's logits gradient stays allocated until then: two chunks of logits in
    /// memory at once (halve [`LinearChunking::logits_bytes`](crate::LinearChunking::logits_bytes)
    /// for the same peak).
    BesideNextChunk,
}

impl WeightGradientStream {
    /// Whether the sums run on a second stream.
    pub fn is_second(self) -> bool {
        self != Self::Backend
    }
}
