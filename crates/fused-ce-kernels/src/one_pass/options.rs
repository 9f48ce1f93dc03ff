//! How the one-pass kernel runs.

use cubecl::prelude::*;

/// How the one-pass kernel runs (each combination compiles its own kernel).
#[derive_cube_comptime]
pub struct OnePassOptions {
    /// Divide by the mean's denominators (else the gradient of a `Sum`).
    pub mean: bool,
    /// Vectors of shared memory holding a chunk's first vectors; the gradient pass
    /// re-reads the rest from global memory (L2: they were read last) before it writes the
    /// staged part. 0: nothing staged.
    pub staged_vectors: usize,
    /// Most chunks a row may have (sizes the exchange's shared memory).
    pub max_chunks: usize,
    /// Some chunk is longer than `staged_vectors`: the re-reading loop is compiled in
    /// (when every chunk is staged it would never run, but would still hold registers).
    pub reread: bool,
    /// Vectors each unit of the re-reading loop loads before storing any. Its registers
    /// set the kernel's: fewer loads, more cubes per SM.
    pub reread_loads: usize,
    /// The staged vectors are kept as `exp(x - m)` (in the logits' type) with `m` a
    /// reference maximum per unit and step, so their gradient is one multiply per element
    /// instead of an exponential (not with softcap, whose derivative needs the logits).
    pub staged_exps: bool,
    /// Inline PTX, so only where the CUDA runtime compiles through CUDA C++ (see
    /// `KernelTuning::cache_hints`): bit 0, the loads of the logits that are not read
    /// again from L2 (the staged part, the re-read part's second read) as `ld.global.cs`;
    /// bit 1, the gradient's stores as `st.global.cs` (`ptx::load_vector`,
    /// `ptx::store_vector`). Both evict first from L2, leaving it to the unstaged part the
    /// gradient pass re-reads. 0: plain loads and stores.
    pub cache_hints: u32,
}

impl OnePassOptions {
    /// The logits' loads that are not read again use `ld.global.cs`.
    pub(crate) fn stream_loads(&self) -> bool {
        self.cache_hints & 1 != 0
    }

    /// The gradient's stores use `st.global.cs`.
    pub(crate) fn stream_stores(&self) -> bool {
        self.cache_hints & 2 != 0
    }
}
