//! Host-side planning: what each launch computes from the shapes, the options and the
//! tuning (cube sizes, grids, the one pass's chunks), before any buffer is touched.

use cubecl::prelude::*;

use crate::one_pass::{OnePassOptions, PARTIAL_SLOTS};
use crate::row::RowOptions;
use crate::tuning::{KernelTuning, MAX_CHUNKS};

/// Largest grid dimension every runtime accepts (wgpu's limit).
const MAX_GRID_DIM: usize = 65_535;

/// A grid of `cubes` cubes (at least one), 2-D because wgpu caps each dimension at 65535;
/// kernels number them with `row_of_cube`.
pub(crate) fn grid_of(cubes: usize) -> CubeCount {
    let (x, y) = grid_dims(cubes);
    CubeCount::Static(x, y, 1)
}

fn grid_dims(cubes: usize) -> (u32, u32) {
    let x = cubes.clamp(1, MAX_GRID_DIM);
    let y = cubes.div_ceil(x).max(1);
    (x as u32, y as u32)
}

/// Units of a one-cube reduction over the rows (the one pass's prologue, the reduced
/// statistics, the first bad target): the most a cube holds, up to 1024, as a power of
/// two. Their loops are latency-bound chains of loads (one row per unit per step), so
/// more units mean fewer steps.
pub(crate) fn reduction_units(client: &Client) -> usize {
    units_for(client.properties().hardware.max_units_per_cube as usize)
}

fn units_for(max_units_per_cube: usize) -> usize {
    1 << max_units_per_cube.clamp(32, 1024).ilog2()
}

/// What the kernels may use of the runtime they are launched on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    /// The CUDA runtime: CUDA's fast-math options.
    pub(crate) cuda: bool,
    /// Inline PTX (`gpu_asm!`, the `ptx` module): the CUDA runtime compiling through CUDA
    /// C++. Neither SPIR-V nor cubecl-cuda's LLVM backend takes it.
    pub(crate) inline_ptx: bool,
}

impl Target {
    /// Not CUDA (wgpu, the CPU runtime).
    pub(crate) const OTHER: Self = Target {
        cuda: false,
        inline_ptx: false,
    };
    /// CUDA through CUDA C++ and NVRTC (cubecl-cuda's `cpp` feature).
    #[cfg(any(test, feature = "cuda-source"))]
    pub(crate) const CUDA_CPP: Self = Target {
        cuda: true,
        inline_ptx: true,
    };

    /// The runtime behind `client`. cubecl-cuda 0.11 compiles through LLVM unless its
    /// `cpp` feature is on (process-wide), and the LLVM backend refuses a kernel with
    /// inline assembly. The client does not say which backend it runs, but the LLVM one
    /// narrows the device's features to what it lowers, and complex numbers, which the
    /// C++ backend always advertises, are among those it takes away.
    pub(crate) fn of(client: &Client) -> Self {
        let cuda = client.name() == "cuda";
        let cpp = !client.properties().features.types.complex.is_empty();
        Target {
            cuda,
            inline_ptx: cuda && cpp,
        }
    }
}

/// The loss options as the kernels take them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LossSettings {
    /// Targets equal to this are ignored.
    pub ignore_index: i32,
    /// 0 turns label smoothing off (no smoothing code is compiled in).
    pub label_smoothing: f32,
    /// 0 turns the z-loss off.
    pub z_loss_scale: f32,
    pub softcap: Option<f32>,
    /// Logits are divided by this first (`None`: by 1, no code compiled in).
    pub temperature: Option<f32>,
    /// Class weights (and their total) are bound.
    pub weighted: bool,
    /// Track the argmax (accuracy or predictions asked for).
    pub argmax: bool,
    /// Track the softmax's entropy (asked for).
    pub entropy: bool,
    /// The fast exponential may flush results below 2^-126 to zero (CUDA through its C++
    /// backend only: inline PTX).
    pub exp_flush_to_zero: bool,
    /// Softcap's `tanh` may be the hardware's approximation for bf16 logits (CUDA only).
    pub approximate_tanh: bool,
}

/// What every row-per-cube launch needs besides its buffers.
#[derive(Debug, Clone, Copy)]
pub struct RowLaunch {
    /// Number of rows (one cube each).
    pub rows: usize,
    /// Classes per row.
    pub vocab: usize,
    /// Elements per vectorised load; divides `vocab` and the row strides.
    pub vector_size: usize,
    /// 32-bit or 64-bit index arithmetic, from the largest buffer involved.
    pub address_type: AddressType,
    /// Element type of the logits (and of their gradient).
    pub float_dtype: ElemType,
    /// Element type of the targets (and of the predictions).
    pub int_dtype: ElemType,
    pub settings: LossSettings,
    pub tuning: KernelTuning,
}

impl RowLaunch {
    /// Units per cube: a power of two (the shared-memory tree halves it), enough to cover
    /// a short row with one pass, at most `tuning.row_units`.
    pub(crate) fn cube_size(&self) -> usize {
        let vectors = (self.vocab / self.vector_size).max(1);
        vectors
            .next_power_of_two()
            .clamp(32, self.tuning.row_units.max(32))
    }

    pub(crate) fn cube_count(&self) -> CubeCount {
        grid_of(self.rows)
    }

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

    /// The row kernels' comptime options on `target`: the options asked for, and the
    /// fast-math ones it allows (the approximate `tanh` only for bf16 logits, whose own
    /// rounding is coarser than its error).
    pub(crate) fn options_on(
        &self,
        target: Target,
        cube_size: usize,
        loads_per_step: usize,
    ) -> RowOptions {
        let settings = self.settings;
        let bf16 = self.float_dtype == ElemType::Float(cubecl::ir::FloatKind::BF16);
        RowOptions {
            loads_per_step,
            temperature: settings.temperature.is_some(),
            softcap: settings.softcap.is_some(),
            smoothing: settings.label_smoothing > 0.0,
            weighted: settings.weighted,
            z_loss: settings.z_loss_scale > 0.0,
            argmax: settings.argmax,
            entropy: settings.entropy,
            entropy_gradient: false,
            cube_size,
            exp_flush_to_zero: target.inline_ptx && settings.exp_flush_to_zero,
            approximate_tanh: target.inline_ptx
                && settings.softcap.is_some()
                && bf16
                && settings.approximate_tanh,
        }
    }

    /// [`RowLaunch::options_on`] the runtime of `client`.
    pub(crate) fn launch_options(
        &self,
        client: &Client,
        cube_size: usize,
        loads_per_step: usize,
    ) -> RowOptions {
        self.options_on(Target::of(client), cube_size, loads_per_step)
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
        RowLaunch {
            rows,
            vocab,
            vector_size,
            address_type: AddressType::U32,
            float_dtype: ElemType::Float(float),
            int_dtype: ElemType::Int(cubecl::ir::IntKind::I32),
            settings: LossSettings::default(),
            tuning: KernelTuning::defaults(true, true),
        }
    }

    #[test]
    fn grids_cover_every_cube_within_wgpu_limits() {
        assert_eq!(grid_dims(0), (1, 1));
        assert_eq!(grid_dims(1), (1, 1));
        assert_eq!(grid_dims(65_535), (65_535, 1));
        assert_eq!(grid_dims(65_536), (65_535, 2));
        let (x, y) = grid_dims(8192 * 6);
        assert!(x as usize * y as usize >= 8192 * 6);
        let (x, y) = grid_dims(1 << 22);
        assert!(x as usize * y as usize >= 1 << 22 && x <= 65_535 && y <= 65_535);
    }

    #[test]
    fn reduction_units_are_a_power_of_two_up_to_1024() {
        assert_eq!(units_for(1024), 1024);
        assert_eq!(units_for(1536), 1024);
        assert_eq!(units_for(768), 512);
        assert_eq!(units_for(16), 32);
    }

    #[test]
    fn row_cubes_fit_short_rows() {
        assert_eq!(shape(4, 100, FloatKind::F32, 4).cube_size(), 32);
        assert_eq!(shape(4, 1000, FloatKind::F32, 4).cube_size(), 256);
        assert_eq!(shape(4, 128_256, FloatKind::BF16, 8).cube_size(), 256);
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
        // The entropy is summed as the staged vectors turn into exponentials.
        launch.settings.entropy = true;
        assert!(staged(&launch));
    }

    #[test]
    fn fast_math_only_on_cuda_and_tanh_only_for_bf16() {
        let mut launch = shape(8, 128_256, FloatKind::BF16, 8);
        launch.settings.softcap = Some(30.0);
        launch.settings.exp_flush_to_zero = true;
        launch.settings.approximate_tanh = true;
        let cuda = launch.options_on(Target::CUDA_CPP, 256, 8);
        assert!(cuda.exp_flush_to_zero && cuda.approximate_tanh);
        let other = launch.options_on(Target::OTHER, 256, 8);
        assert!(!other.exp_flush_to_zero && !other.approximate_tanh);
        launch.float_dtype = ElemType::Float(FloatKind::F32);
        assert!(!launch.options_on(Target::CUDA_CPP, 256, 8).approximate_tanh);
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
