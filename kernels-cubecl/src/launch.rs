//! Thin launch functions: pick the cube shape for a row-per-cube kernel and launch it.
//! Callers hand in launch arguments already bound to buffers; nothing here allocates.

use cubecl::prelude::*;

use crate::kernels::{
    GradOptions, RowOptions, RowScalarsLaunch, cross_entropy_backward_kernel,
    cross_entropy_forward_kernel, first_bad_target_kernel, scale_gradient_kernel,
};
use crate::reduce::{ReduceOptions, reduce_stats_kernel};
use crate::split::{
    PARTIAL_SLOTS, SplitOptions, cross_entropy_split_grad_kernel, split_prologue_kernel,
};

/// Largest grid dimension every runtime accepts (wgpu's limit).
const MAX_GRID_DIM: usize = 65_535;

/// The most units one row's cube gets: 256 (on the H200, 128 and 512 measured within the
/// run-to-run spread of it, 1024 slower), or `FUSED_CE_UNITS_PER_ROW` (a power of two,
/// 32 to 1024), read once, for tuning runs.
fn max_units_per_row() -> usize {
    static UNITS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *UNITS.get_or_init(|| {
        std::env::var("FUSED_CE_UNITS_PER_ROW")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|v| v.is_power_of_two() && (32..=1024).contains(v))
            .unwrap_or(256)
    })
}

/// A grid of `cubes` cubes (at least one), 2-D because wgpu caps each dimension at 65535;
/// kernels number them with `row_of_cube`.
fn grid_of(cubes: usize) -> CubeCount {
    let x = cubes.clamp(1, MAX_GRID_DIM);
    let y = cubes.div_ceil(x).max(1);
    CubeCount::Static(x as u32, y as u32, 1)
}

/// Units of a one-cube reduction over the rows (the prologue's target count, the reduced
/// statistics, the first bad target): the most a cube holds, up to 1024, as a power of
/// two. Their loops are latency-bound chains of loads (one row per unit per step), so
/// more units mean fewer steps: 256 units took 12 us over 8192 rows on the H200.
fn reduction_units<R: Runtime>(client: &ComputeClient<R>) -> usize {
    let most = (client.properties().hardware.max_units_per_cube as usize).clamp(32, 1024);
    1 << most.ilog2()
}

/// Vectors each unit of the row kernels loads before using any: 8 (on the H200 forward 0.77
/// ms against 0.83 with 2, bf16 8192 x 128256), or `FUSED_CE_LOADS`
/// (1 to 8) for tuning runs.
fn loads_per_step() -> usize {
    static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    env_usize("FUSED_CE_LOADS", &CELL)
        .filter(|v| (1..=8).contains(v))
        .unwrap_or(8)
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
    /// Class weights (and their total) are bound.
    pub weighted: bool,
    /// Track the argmax (accuracy or predictions asked for).
    pub argmax: bool,
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
    pub float_dtype: StorageType,
    /// Element type of the targets (and of the predictions).
    pub int_dtype: StorageType,
    pub settings: LossSettings,
}

impl RowLaunch {
    /// Units per cube: a power of two (the shared-memory tree halves it), enough to cover
    /// a short row with one pass, at most 256 (see `max_units_per_row`).
    fn cube_size(&self) -> usize {
        let vectors = (self.vocab / self.vector_size).max(1);
        vectors.next_power_of_two().clamp(32, max_units_per_row())
    }

    fn cube_count(&self) -> CubeCount {
        grid_of(self.rows)
    }

    /// The shape the split kernel runs on: the same, or narrower vectors when
    /// `FUSED_CE_SPLIT_VECTOR` (a power of two dividing the chosen width) is set, for
    /// tuning runs (bf16 over the logits with 4 lanes: 40 registers against 63 with 8,
    /// counted offline; timed in the fifth session: 1.76-1.79 ms against 1.64-1.73, slower).
    pub fn for_split(self) -> Self {
        static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
        match env_usize("FUSED_CE_SPLIT_VECTOR", &CELL) {
            Some(width) if width.is_power_of_two() && self.vector_size % width == 0 => Self {
                vector_size: width,
                ..self
            },
            _ => self,
        }
    }

    fn options_with(&self, cube_size: usize) -> RowOptions {
        self.options_with_loads(cube_size, loads_per_step())
    }

    pub(crate) fn options_with_loads(&self, cube_size: usize, loads_per_step: usize) -> RowOptions {
        let settings = self.settings;
        RowOptions {
            loads_per_step,
            softcap: settings.softcap.is_some(),
            smoothing: settings.label_smoothing > 0.0,
            weighted: settings.weighted,
            z_loss: settings.z_loss_scale > 0.0,
            argmax: settings.argmax,
            cube_size,
            cuda_ftz_exp: false,
            fast_tanh: false,
        }
    }

    /// The row kernels' options for a launch through `client`: `options_on` that runtime.
    fn launch_options<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        cube_size: usize,
        loads_per_step: usize,
    ) -> RowOptions {
        self.options_on(R::name(client) == "cuda", cube_size, loads_per_step)
    }

    /// As `options_with_loads`, with what the CUDA runtime allows (`on_cuda`): its
    /// exponential and, for bf16 logits, its tanh.
    pub(crate) fn options_on(
        &self,
        on_cuda: bool,
        cube_size: usize,
        loads_per_step: usize,
    ) -> RowOptions {
        RowOptions {
            cuda_ftz_exp: on_cuda && ftz_exp_knob(),
            fast_tanh: on_cuda
                && self.settings.softcap.is_some()
                && self.float_dtype
                    == StorageType::Scalar(cubecl::ir::ElemType::Float(
                        cubecl::ir::FloatKind::BF16,
                    ))
                && fast_tanh_knob(),
            ..self.options_with_loads(cube_size, loads_per_step)
        }
    }

    pub(crate) fn scalars<R: Runtime>(&self) -> RowScalarsLaunch<R> {
        let settings = self.settings;
        RowScalarsLaunch::new(
            settings.ignore_index,
            settings.label_smoothing,
            settings.z_loss_scale,
            settings.softcap.unwrap_or(1.0),
        )
    }
}

/// Class weights `[V]` and their total `[1]` (f32), or any small f32 buffers when the
/// launch is not weighted (they are then never read).
pub struct WeightArgs<R: Runtime> {
    pub weights: TensorArg<R>,
    pub total: TensorArg<R>,
}

/// Per-row forward: writes `stats [row_stat::COUNT, rows]` (f32) and, when the argmax is
/// tracked, `predicted [rows]` (the targets' int type; any buffer otherwise). `logits` are
/// `[B, T, V]`, `targets` `[B, T]` (2-D inputs bound as `[1, N, ..]`).
pub fn launch_forward<R: Runtime>(
    client: &ComputeClient<R>,
    shape: RowLaunch,
    logits: TensorArg<R>,
    targets: TensorArg<R>,
    weights: WeightArgs<R>,
    stats: TensorArg<R>,
    predicted: TensorArg<R>,
) {
    if shape.rows == 0 {
        return;
    }
    let options = shape.launch_options(client, shape.cube_size(), loads_per_step());
    // Unchecked: every index is in bounds by construction (clamped or masked in the
    // kernel), and the checked launch's per-lane selects cost about one instruction per
    // element.
    unsafe {
        cross_entropy_forward_kernel::launch_unchecked::<R>(
            client,
            shape.cube_count(),
            CubeDim::new_1d(options.cube_size as u32),
            shape.address_type,
            shape.vector_size,
            logits,
            targets,
            weights.weights,
            weights.total,
            stats,
            predicted,
            shape.scalars(),
            options,
            [shape.float_dtype, shape.int_dtype],
        );
    }
}

/// Where backward writes the gradient.
pub enum GradientTarget<R: Runtime> {
    /// Over the logits themselves (they are not read again by anyone).
    InPlace(TensorArg<R>),
    /// Read `logits`, write `grad` (same shape).
    Separate {
        logits: TensorArg<R>,
        grad: TensorArg<R>,
    },
}

impl<R: Runtime> GradientTarget<R> {
    /// The `(logits, grad)` launch arguments. Every gradient-writing kernel takes the
    /// logits as its first input, so an in-place gradient is an alias of input 0.
    pub(crate) fn into_args(self) -> (TensorArg<R>, TensorArg<R>) {
        match self {
            GradientTarget::InPlace(logits) => {
                let grad = TensorArg::Alias {
                    input_pos: 0,
                    strides: logits.strides().into(),
                    shape: logits.shape().into(),
                };
                (logits, grad)
            }
            GradientTarget::Separate { logits, grad } => (logits, grad),
        }
    }
}

/// The loss's incoming gradient as backward reads it.
pub struct IncomingGradient<R: Runtime> {
    /// `[rows]` when `per_row`, else `[1]`; any float type (`dtype`).
    pub grad: TensorArg<R>,
    pub dtype: StorageType,
    pub per_row: bool,
    /// f32 `[2]` (`D`, `n`) for `Mean`; `None` binds `grad` in their place, unread.
    pub denominators: Option<TensorArg<R>>,
}

/// Per-row backward: the spec's gradient for every row, zero rows for ignored targets.
pub fn launch_backward<R: Runtime>(
    client: &ComputeClient<R>,
    shape: RowLaunch,
    target: GradientTarget<R>,
    targets: TensorArg<R>,
    weights: WeightArgs<R>,
    stats: TensorArg<R>,
    incoming: IncomingGradient<R>,
    dummy: TensorArg<R>,
) {
    if shape.rows == 0 {
        return;
    }
    let options = shape.launch_options(client, shape.cube_size(), loads_per_step());
    let grad_options = GradOptions {
        per_row: incoming.per_row,
        mean: incoming.denominators.is_some(),
    };
    let (logits, grad) = target.into_args();
    // Unchecked: every index is in bounds by construction (clamped or masked in the
    // kernel), and the checked launch's per-lane selects cost about one instruction per
    // element.
    unsafe {
        cross_entropy_backward_kernel::launch_unchecked::<R>(
            client,
            shape.cube_count(),
            CubeDim::new_1d(options.cube_size as u32),
            shape.address_type,
            shape.vector_size,
            logits,
            targets,
            weights.weights,
            weights.total,
            stats,
            incoming.grad,
            incoming.denominators.unwrap_or(dummy),
            grad,
            shape.scalars(),
            options,
            grad_options,
            [shape.float_dtype, shape.int_dtype, incoming.dtype],
        );
    }
}

/// Whether the row kernels compute their fast exponential as `ex2.approx.ftz.f32`
/// (`redefine_cuda_fast_exp`) on the CUDA runtime: unless `FUSED_CE_FTZ_EXP=0` (for A/B
/// timing runs). Two instructions per exponential instead of six; only results below
/// 2^-126 differ (they become zero).
fn ftz_exp_knob() -> bool {
    static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    env_usize("FUSED_CE_FTZ_EXP", &CELL) != Some(0)
}

/// Whether softcap's `tanh` may be the hardware's approximation for bf16 logits on the
/// CUDA runtime (`RowOptions::fast_tanh`): unless `FUSED_CE_FAST_TANH=0` (for A/B runs).
/// The one pass with ls + z + softcap, bf16 8192 x 128256: 2.70 -> 1.88 ms (ncu, session
/// 7); the PyTorch oracle's bf16 softcap rows within their bounds.
fn fast_tanh_knob() -> bool {
    static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    env_usize("FUSED_CE_FAST_TANH", &CELL) != Some(0)
}

/// The one pass's cache hints on the logits and gradient on the CUDA runtime
/// (`SplitOptions::streaming_access`): 3 (evict-first loads and stores) by default;
/// `FUSED_CE_STREAMING_ACCESS` picks 0 (plain), 1 (loads only) or 2 (stores only) for A/B
/// runs. Data read or written once no longer evicts the unstaged half of a chunk before
/// its re-read: bf16 8192 x 128256 one-pass kernel 1.16 -> 1.08 ms (ncu, session 7).
pub(crate) fn streaming_access_knob() -> u32 {
    static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    match env_usize("FUSED_CE_STREAMING_ACCESS", &CELL) {
        Some(mode @ 0..=3) => mode as u32,
        _ => 3,
    }
}

/// A tuning knob read once from the environment (`None` when unset or unparsable).
fn env_usize(name: &str, cell: &'static std::sync::OnceLock<Option<usize>>) -> Option<usize> {
    *cell.get_or_init(|| std::env::var(name).ok().and_then(|v| v.parse().ok()))
}

/// Most bytes of a row each cube of the split kernel takes on CUDA, or
/// `FUSED_CE_CHUNK_BYTES` (1 KB to 1 MB) for tuning runs: 64 KB, half staged, half re-read
/// from L2. With every option too: since v22/v25 made the per-element work cheaper, the
/// one pass with ls + z + softcap takes 1.54 ms with 64 KB against 1.88 with 32 KB (bf16
/// 8192 x 128256, ncu, session 7; v17 had measured the opposite).
fn chunk_bytes() -> usize {
    static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    env_usize("FUSED_CE_CHUNK_BYTES", &CELL)
        .filter(|&bytes| (1024..=1024 * 1024).contains(&bytes))
        .unwrap_or(64 * 1024)
}

/// Most bytes of its chunk a cube of the split kernel stages in shared memory on CUDA (the
/// rest is re-read from L2): 32 KB (a few cubes per SM with room for their merge
/// buffers), or `FUSED_CE_STAGE_BYTES` (0 to 192 KB) for tuning runs. cubecl 0.10 gathers
/// a CUDA kernel's shared memory into one dynamic buffer and opts in to the device's
/// per-block maximum (227 KB on the H200), so a stage past 48 KB launches: a whole bf16
/// row of 128256 in 4 chunks of 62.6 KB, none re-read, at 3 cubes per SM (untimed).
fn stage_bytes() -> usize {
    static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    env_usize("FUSED_CE_STAGE_BYTES", &CELL)
        .filter(|&bytes| bytes <= 192 * 1024)
        .unwrap_or(32 * 1024)
}

/// Most units per cube of the split kernel: 256, or `FUSED_CE_SPLIT_UNITS` (a power of
/// two, 32 to 1024) for tuning runs.
fn split_units() -> usize {
    static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    env_usize("FUSED_CE_SPLIT_UNITS", &CELL)
        .filter(|v| v.is_power_of_two() && (32..=1024).contains(v))
        .unwrap_or(256)
}

/// Vectors each unit of the split kernel loads before using any on CUDA: 4, or
/// `FUSED_CE_SPLIT_LOADS` (1 to 8) for tuning runs.
fn split_loads() -> usize {
    static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    env_usize("FUSED_CE_SPLIT_LOADS", &CELL)
        .filter(|v| (1..=8).contains(v))
        .unwrap_or(4)
}

/// Vectors each unit of the split kernel's re-reading loop loads before storing any: 4,
/// or `FUSED_CE_SPLIT_GRAD_LOADS` (1, 2 or 4) for tuning runs. Fewer loads, fewer
/// registers, more cubes per SM; kernel times (ncu, bf16 8192 x 128256, session 5):
/// without `staged_exps` 1.29 ms with 2 loads against 1.38 with 4, with `staged_exps`
/// 1.26 with 4 against 1.37 with 2 (its re-reads then miss L2 more); with v22's
/// exponential (session 6) 1.15 with 4 against 1.33 with 2.
fn split_reread_loads() -> usize {
    static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    env_usize("FUSED_CE_SPLIT_GRAD_LOADS", &CELL)
        .filter(|v| [1, 2, 4].contains(v))
        .unwrap_or(4)
}

/// Whether the split kernel keeps its staged vectors as exponentials (`SplitOptions::
/// staged_exps`): always but with softcap, or `FUSED_CE_STAGED_EXPS=0` for A/B runs.
/// 13% fewer instructions; kernel 1.26 ms against 1.29 without (ncu, bf16 8192 x 128256).
fn staged_exps(settings: &LossSettings) -> bool {
    static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    settings.softcap.is_none() && env_usize("FUSED_CE_STAGED_EXPS", &CELL) != Some(0)
}

/// A row's chunk count rounded up to an even one (one chunk stays one). Measured, not
/// modelled: in the session-7 sweep (ncu, one pass, chunk lengths 40-96 KB on bf16 rows of
/// 128256, 151936, 256000 and f32 128256) an odd count was slower than an even neighbour
/// in every case (bf16 151936: 5 chunks 2.96 ms, 6 chunks 2.78; 256000: 9 chunks 1.22,
/// 8 or 10 chunks 1.16; f32 128256: 9 chunks 2.38, 8 chunks 2.31).
fn even_chunks(chunks: usize) -> usize {
    if chunks > 1 {
        chunks.next_multiple_of(2)
    } else {
        chunks
    }
}

/// Most chunks per row: the exchange gathers `MAX_CHUNKS * PARTIAL_SLOTS` values in
/// shared memory.
pub(crate) const MAX_CHUNKS: usize = 64;

/// How the split kernel cuts the rows of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPlan {
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
    pub(crate) streaming_access: u32,
}

impl SplitPlan {
    /// On a device with a known SM count (CUDA), chunks of at most `chunk_bytes()` (an even
    /// count: `even_chunks`), rows cut evenly, at most `stage_bytes()` of each staged in
    /// shared memory; elsewhere one chunk per row (cubes cannot be known to run at once),
    /// its first 16 KB staged.
    pub fn new<R: Runtime>(client: &ComputeClient<R>, shape: &RowLaunch) -> Self {
        let properties = client.properties();
        let known_device = properties.hardware.num_streaming_multiprocessors.is_some();
        SplitPlan {
            streaming_access: if R::name(client) == "cuda" {
                streaming_access_knob()
            } else {
                0
            },
            ..Self::for_device(shape, known_device)
        }
    }

    /// [`SplitPlan::new`] for a device that reports its SM count (`known_device`: CUDA) or
    /// not.
    pub(crate) fn for_device(shape: &RowLaunch, known_device: bool) -> Self {
        let vectors = (shape.vocab / shape.vector_size).max(1);
        let vector_bytes = shape.vector_size * shape.float_dtype.size();
        let (capacity, chunks, loads_per_step) = if known_device {
            let chunk_vectors = (chunk_bytes() / vector_bytes).max(1);
            (
                stage_bytes() / vector_bytes,
                even_chunks(vectors.div_ceil(chunk_vectors)),
                split_loads(),
            )
        } else {
            ((16 * 1024 / vector_bytes).max(1), 1, 2)
        };
        let plan = SplitPlan {
            chunk_vectors: 0,
            chunks: 0,
            staged_vectors: capacity,
            cube_size: 0,
            loads_per_step,
            reread_loads: split_reread_loads(),
            staged_exps: staged_exps(&shape.settings),
            streaming_access: 0,
        };
        plan.cut(vectors, chunks)
    }

    /// This plan with `vectors` cut into `chunks` even chunks (at most `MAX_CHUNKS`).
    fn cut(self, vectors: usize, chunks: usize) -> Self {
        let max_units = split_units();
        let chunks = chunks.clamp(1, MAX_CHUNKS);
        let chunk_vectors = vectors.div_ceil(chunks);
        SplitPlan {
            chunk_vectors,
            chunks: vectors.div_ceil(chunk_vectors),
            cube_size: chunk_vectors.next_power_of_two().clamp(32, max_units),
            ..self
        }
    }

    /// The same plan with rows cut into `chunks` chunks, whatever the device: for tests of
    /// the exchange, on a device known to run that many cubes at once.
    pub fn with_chunks(self, shape: &RowLaunch, chunks: usize) -> Self {
        let vectors = (shape.vocab / shape.vector_size).max(1);
        self.cut(vectors, chunks)
    }

    /// The split kernel's comptime options for this plan, the gradient written over the
    /// logits or not.
    pub(crate) fn options(&self, mean: bool, gradient_in_place: bool) -> SplitOptions {
        SplitOptions {
            mean,
            staged_vectors: self.staged_vectors,
            max_chunks: MAX_CHUNKS,
            reread: self.chunk_vectors > self.staged_vectors,
            reread_loads: self.reread_loads,
            staged_exps: self.staged_exps && self.staged_vectors > 0,
            streaming_access: self.streaming_access,
            gradient_in_place,
        }
    }

    /// Length of the partials buffer (i32) for `rows` rows.
    pub fn partials_len(&self, rows: usize) -> usize {
        (rows * self.chunks * PARTIAL_SLOTS).max(1)
    }
}

/// The split kernel's scratch buffers, written by its prologue: f32 `[2]` for the mean's
/// denominators, i32 `[1]` for the ticket counter, i32 `[plan.partials_len(rows)]`.
pub struct SplitScratch<R: Runtime> {
    pub denominators: TensorArg<R>,
    pub tickets: TensorArg<R>,
    pub partials: TensorArg<R>,
}

/// A second launch argument for the same buffer (`TensorArg` is not `Clone`).
fn same_arg<R: Runtime>(arg: &TensorArg<R>) -> TensorArg<R> {
    match arg {
        TensorArg::Handle { handle } => TensorArg::Handle {
            handle: handle.clone(),
        },
        TensorArg::Alias {
            input_pos,
            strides,
            shape,
        } => TensorArg::Alias {
            input_pos: *input_pos,
            strides: strides.clone(),
            shape: shape.clone(),
        },
    }
}

/// Forward that also writes the gradient for an incoming gradient of 1, divided by the
/// mean's denominators when `mean` (see `cross_entropy_split_grad_kernel`): one pass over
/// the logits, after a small prologue. `target` says where the gradient goes (over the
/// logits, or a new buffer).
#[allow(clippy::too_many_arguments)]
pub fn launch_forward_grad<R: Runtime>(
    client: &ComputeClient<R>,
    shape: RowLaunch,
    plan: SplitPlan,
    target: GradientTarget<R>,
    targets: TensorArg<R>,
    weights: WeightArgs<R>,
    stats: TensorArg<R>,
    predicted: TensorArg<R>,
    scratch: SplitScratch<R>,
    mean: bool,
) {
    if shape.rows == 0 {
        return;
    }
    let prologue_units = reduction_units(client);
    let prologue_cubes = plan
        .partials_len(shape.rows)
        .div_ceil(prologue_units * 4)
        .clamp(1, 1024);
    split_prologue_kernel::launch::<R>(
        client,
        CubeCount::Static(prologue_cubes as u32, 1, 1),
        CubeDim::new_1d(prologue_units as u32),
        same_arg(&targets),
        same_arg(&weights.weights),
        same_arg(&scratch.denominators),
        same_arg(&scratch.tickets),
        same_arg(&scratch.partials),
        u32::try_from(shape.vocab).unwrap_or(u32::MAX),
        shape.scalars(),
        shape.options_with(prologue_units),
        mean,
        shape.int_dtype,
    );
    let split = plan.options(mean, matches!(target, GradientTarget::InPlace(_)));
    let options = shape.launch_options(client, plan.cube_size, plan.loads_per_step);
    let (logits, grad) = target.into_args();
    // Unchecked: every index is in bounds by construction (clamped or masked in the
    // kernel), and the checked launch's per-lane selects cost about one instruction per
    // element.
    unsafe {
        cross_entropy_split_grad_kernel::launch_unchecked::<R>(
            client,
            grid_of(shape.rows * plan.chunks),
            CubeDim::new_1d(plan.cube_size as u32),
            shape.address_type,
            shape.vector_size,
            logits,
            targets,
            weights.weights,
            weights.total,
            scratch.denominators,
            stats,
            predicted,
            grad,
            scratch.tickets,
            scratch.partials,
            plan.chunk_vectors as u32,
            shape.scalars(),
            options,
            split,
            [shape.float_dtype, shape.int_dtype],
        );
    }
}

/// `grad *= g` in place for a scalar incoming gradient `g` (`[1]`, any float type
/// `grad_dtype`), skipped on the device when `g` is 1. `grad` is `[B, T, V]`.
pub fn launch_scale_gradient<R: Runtime>(
    client: &ComputeClient<R>,
    shape: RowLaunch,
    grad: TensorArg<R>,
    grad_output: TensorArg<R>,
    grad_dtype: StorageType,
) {
    if shape.rows == 0 {
        return;
    }
    let cube_size = shape.cube_size();
    // As many cubes as the device holds at once, each looping over rows: when the
    // incoming gradient is 1 every cube exits at once, and 8192 cubes cost 7 us to do
    // that; a device of unknown size gets one cube per row.
    let cubes = client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .map_or(shape.rows, |sms| {
            shape.rows.min(sms as usize * (2048 / cube_size).max(1))
        });
    // Unchecked: every index is in bounds by construction (clamped or masked in the
    // kernel), and the checked launch's per-lane selects cost about one instruction per
    // element.
    unsafe {
        scale_gradient_kernel::launch_unchecked::<R>(
            client,
            grid_of(cubes),
            CubeDim::new_1d(cube_size as u32),
            shape.address_type,
            shape.vector_size,
            grad,
            grad_output,
            cube_size,
            [shape.float_dtype, grad_dtype],
        );
    }
}

/// Writes `[first bad row, its target]` of `targets` (`[B, T]`) into `result` (`[2]`, the
/// targets' int type; the row is the number of rows when every target is a class in
/// `[0, vocab)` or `ignore_index`). One cube.
pub fn launch_first_bad_target<R: Runtime>(
    client: &ComputeClient<R>,
    targets: TensorArg<R>,
    result: TensorArg<R>,
    int_dtype: StorageType,
    vocab: usize,
    ignore_index: i32,
) {
    let cube_size = reduction_units(client);
    first_bad_target_kernel::launch::<R>(
        client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(cube_size as u32),
        targets,
        result,
        i32::try_from(vocab).unwrap_or(i32::MAX),
        ignore_index,
        cube_size,
        int_dtype,
    );
}

/// The reduced outputs of `N > 0` rows' statistics in one launch (`reduce_stats_kernel`):
/// `loss [1]` in `float_dtype`, f32 `z_loss [1]`, `accuracy [1]`, `denominators [2]`.
#[allow(clippy::too_many_arguments)]
pub fn launch_reduce_stats<R: Runtime>(
    client: &ComputeClient<R>,
    stats: TensorArg<R>,
    loss: TensorArg<R>,
    z_loss: TensorArg<R>,
    accuracy: TensorArg<R>,
    denominators: TensorArg<R>,
    float_dtype: StorageType,
    mean: bool,
    z_loss_on: bool,
    weighted: bool,
) {
    let cube_size = reduction_units(client);
    // SAFETY: every index is a row below `stats.shape(1)` or 0/1 of the outputs, which
    // the caller allocates with one and two elements.
    unsafe {
        reduce_stats_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(cube_size as u32),
            stats,
            loss,
            z_loss,
            accuracy,
            denominators,
            ReduceOptions {
                mean,
                z_loss: z_loss_on,
                weighted,
                cube_size,
            },
            float_dtype,
        );
    }
}
