//! How the one-pass kernel cuts the rows of a launch into chunks, from the shape and the
//! tuning, before any buffer is touched.

use cubecl::prelude::*;

use crate::base::grid::grid_of;
use crate::base::row_launch::RowLaunch;
use crate::base::target::Target;
use crate::base::tuning::MAX_CHUNKS;
use crate::one_pass::exchange::PARTIAL_SLOTS;
use crate::one_pass::options::OnePassOptions;

impl RowLaunch {
    /// The shape the one-pass kernel runs on: the same, or narrower vectors when
    /// `tuning.one_pass_vector` divides the chosen width.
    pub fn for_one_pass(self) -> Self {
        match self.tuning.one_pass_vector {
            Some(width) if width.is_power_of_two() && self.vector_size.is_multiple_of(width) => {
                Self {
                    vector_size: width,
                    ..self
                }
            }
            _ => self,
        }
    }
}

/// A row's chunk count rounded up to an even one (one chunk stays one): in the chunk
/// sweeps an odd count was slower than an even neighbour in every case measured
/// (docs/history.md).
fn even_chunks(chunks: usize) -> usize {
    if chunks > 1 {
        chunks.next_multiple_of(2)
    } else {
        chunks
    }
}

/// How the one-pass kernel cuts the rows of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnePassPlan {
    /// Vectors per chunk (the last chunk of a row may be shorter).
    pub chunk_vectors: usize,
    /// Chunks per row.
    pub chunks: usize,
    /// Vectors of shared memory a cube stages its chunk's first vectors in (0: none); the
    /// whole capacity even for a shorter chunk: one kernel per dtype and options, not one
    /// per vocabulary and chunk count.
    pub(crate) staged_vectors: usize,
    pub(crate) cube_size: usize,
    pub(crate) loads_per_step: usize,
    pub(crate) reread_loads: usize,
    pub(crate) staged_exps: bool,
    /// The cache hints' bits (0 without inline PTX).
    pub(crate) cache_hints: u32,
}

impl OnePassPlan {
    /// The plan for the device behind `client`.
    pub fn new(client: &Client, shape: &RowLaunch) -> Self {
        let properties = client.properties();
        let known_device = properties.hardware.num_streaming_multiprocessors.is_some();
        Self::for_device(shape, known_device, Target::of(client).inline_ptx)
    }

    /// On a device that reports its SM count (`known_device`), chunks of at most
    /// `tuning.chunk_bytes` (an even count), rows cut evenly; elsewhere one chunk per row
    /// (the cubes of a row wait for each other, so they must all run at once, which only
    /// such a device lets the launch know). At most `tuning.stage_bytes` of each chunk
    /// staged in shared memory. `tuning.chunks` overrides the count. The cache hints only
    /// with `inline_ptx` (see [`Target`]).
    pub(crate) fn for_device(shape: &RowLaunch, known_device: bool, inline_ptx: bool) -> Self {
        let tuning = shape.tuning;
        let vectors = (shape.vocab / shape.vector_size).max(1);
        let vector_bytes = shape.vector_size * shape.float_dtype.size();
        let chunks = match tuning.chunks {
            Some(chunks) => chunks,
            None if known_device => {
                let chunk_vectors = (tuning.chunk_bytes / vector_bytes).max(1);
                even_chunks(vectors.div_ceil(chunk_vectors))
            }
            None => 1,
        };
        let chunks = chunks.clamp(1, MAX_CHUNKS);
        let chunk_vectors = vectors.div_ceil(chunks);
        OnePassPlan {
            chunk_vectors,
            chunks: vectors.div_ceil(chunk_vectors),
            staged_vectors: tuning.stage_bytes / vector_bytes,
            cube_size: chunk_vectors
                .next_power_of_two()
                .clamp(32, tuning.one_pass_units.max(32)),
            loads_per_step: tuning.one_pass_loads,
            reread_loads: tuning.reread_loads.unwrap_or(
                if known_device && shape.float_dtype.size() == 2 {
                    2
                } else {
                    4
                },
            ),
            // The kept exponentials lose the logits that the softcap's and the
            // temperature's derivatives need (the entropy's gradient takes their logs).
            staged_exps: tuning.staged_exps
                && shape.settings.softcap.is_none()
                && shape.settings.temperature.is_none(),
            cache_hints: if inline_ptx {
                tuning.cache_hints.bits()
            } else {
                0
            },
        }
    }

    /// The one-pass kernel's comptime options for this plan.
    pub(crate) fn options(&self, mean: bool) -> OnePassOptions {
        OnePassOptions {
            mean,
            staged_vectors: self.staged_vectors,
            max_chunks: MAX_CHUNKS,
            reread: self.chunk_vectors > self.staged_vectors,
            reread_loads: self.reread_loads,
            staged_exps: self.staged_exps && self.staged_vectors > 0,
            cache_hints: self.cache_hints,
        }
    }

    /// Length of the partials buffer (i32) for `rows` rows.
    pub fn partials_len(&self, rows: usize) -> usize {
        (rows * self.chunks * PARTIAL_SLOTS).max(1)
    }

    /// Cubes of the one-pass launch: one per chunk.
    pub(crate) fn cube_count(&self, rows: usize) -> CubeCount {
        grid_of(rows * self.chunks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cubecl::ir::FloatKind;

    fn shape(rows: usize, vocab: usize, float: FloatKind, vector_size: usize) -> RowLaunch {
        RowLaunch::example(rows, vocab, float, vector_size)
    }

    #[test]
    fn one_pass_chunks_on_a_known_device() {
        // bf16 rows of 128256 in 16-byte vectors: 16032 vectors, 250.5 KiB, so four chunks
        // of at most 64 KiB.
        let plan = OnePassPlan::for_device(&shape(8, 128_256, FloatKind::BF16, 8), true, true);
        assert_eq!(plan.chunks, 4);
        assert_eq!(plan.chunk_vectors, 4008);
        assert_eq!(plan.staged_vectors, 2048);
        assert_eq!(plan.cube_size, 256);
        assert_eq!(plan.cache_hints, 3);
        assert_eq!(plan.partials_len(8), 8 * 4 * PARTIAL_SLOTS);
        // 151936: 296.75 KiB, five chunks rounded up to an even six.
        let plan = OnePassPlan::for_device(&shape(8, 151_936, FloatKind::BF16, 8), true, true);
        assert_eq!(plan.chunks, 6);
        // f32 rows of 128256: 501 KiB, eight chunks.
        let plan = OnePassPlan::for_device(&shape(8, 128_256, FloatKind::F32, 4), true, true);
        assert_eq!(plan.chunks, 8);
        // A short row stays one chunk.
        let plan = OnePassPlan::for_device(&shape(8, 1000, FloatKind::F32, 4), true, true);
        assert_eq!((plan.chunks, plan.chunk_vectors), (1, 250));
    }

    #[test]
    fn one_pass_on_an_unknown_device_is_one_chunk_without_hints() {
        let plan = OnePassPlan::for_device(&shape(8, 128_256, FloatKind::BF16, 8), false, false);
        assert_eq!(plan.chunks, 1);
        assert_eq!(plan.chunk_vectors, 16032);
        assert_eq!(plan.cache_hints, 0);
    }

    #[test]
    fn forced_chunks_cut_rows_evenly() {
        let mut launch = shape(8, 32_000, FloatKind::F32, 4);
        launch.tuning.chunks = Some(3);
        let plan = OnePassPlan::for_device(&launch, false, false);
        assert_eq!((plan.chunks, plan.chunk_vectors), (3, 2667));
        assert!(plan.chunks * plan.chunk_vectors >= 8000);
        // More chunks than vectors: every chunk still holds one.
        launch.vocab = 8;
        launch.tuning.chunks = Some(5);
        let plan = OnePassPlan::for_device(&launch, false, false);
        assert_eq!((plan.chunks, plan.chunk_vectors), (2, 1));
    }

    #[test]
    fn staged_exps_never_with_softcap_or_temperature() {
        let mut launch = shape(8, 128_256, FloatKind::BF16, 8);
        let staged = |launch: &RowLaunch| {
            OnePassPlan::for_device(launch, true, true)
                .options(true)
                .staged_exps
        };
        assert!(staged(&launch));
        launch.settings.softcap = Some(30.0);
        assert!(!staged(&launch));
        launch.settings.softcap = None;
        launch.settings.temperature = Some(0.7);
        assert!(!staged(&launch));
        launch.settings.temperature = None;
        // The entropy is summed as the staged vectors turn into exponentials, and its
        // gradient is formed from their logarithms.
        launch.settings.entropy = true;
        assert!(staged(&launch));
        launch.settings.entropy_weighted = true;
        assert!(staged(&launch));
    }

    #[test]
    fn inline_ptx_only_where_it_compiles() {
        // CUDA through LLVM: no inline PTX, so neither the fast exponential nor the hints.
        let llvm = Target {
            cuda: true,
            inline_ptx: false,
        };
        let mut launch = shape(8, 128_256, FloatKind::BF16, 8);
        launch.settings.exp_flush_to_zero = true;
        assert!(!launch.options_on(llvm, 256, 8).exp_flush_to_zero);
        let plan = OnePassPlan::for_device(&launch, true, llvm.inline_ptx);
        assert_eq!(plan.cache_hints, 0);
    }

    #[test]
    fn one_pass_vector_narrows_only_when_it_divides() {
        let mut launch = shape(8, 128_256, FloatKind::BF16, 8);
        launch.tuning.one_pass_vector = Some(4);
        assert_eq!(launch.for_one_pass().vector_size, 4);
        launch.tuning.one_pass_vector = Some(16);
        assert_eq!(launch.for_one_pass().vector_size, 8);
    }
}
