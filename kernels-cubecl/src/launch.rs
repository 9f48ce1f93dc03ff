//! Thin launch functions: pick the cube shape for a row-per-cube kernel and launch it.
//! Callers hand in launch arguments already bound to buffers; nothing here allocates.

use cubecl::prelude::*;

use crate::kernels::{
    GradOptions, RowOptions, RowScalarsLaunch, cross_entropy_backward_kernel,
    cross_entropy_forward_grad_kernel, cross_entropy_forward_kernel, first_bad_target_kernel,
    scale_gradient_kernel,
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
        let x = self.rows.clamp(1, MAX_GRID_DIM);
        let y = self.rows.div_ceil(x).max(1);
        CubeCount::Static(x as u32, y as u32, 1)
    }

    fn options(&self) -> RowOptions {
        self.options_with(self.cube_size())
    }

    fn options_with(&self, cube_size: usize) -> RowOptions {
        let settings = self.settings;
        RowOptions {
            softcap: settings.softcap.is_some(),
            smoothing: settings.label_smoothing > 0.0,
            weighted: settings.weighted,
            z_loss: settings.z_loss_scale > 0.0,
            argmax: settings.argmax,
            cube_size,
        }
    }

    fn scalars<R: Runtime>(&self) -> RowScalarsLaunch<R> {
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
    let options = shape.options();
    cross_entropy_forward_kernel::launch::<R>(
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
    fn into_args(self) -> (TensorArg<R>, TensorArg<R>) {
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
    let options = shape.options();
    let grad_options = GradOptions {
        per_row: incoming.per_row,
        mean: incoming.denominators.is_some(),
    };
    let (logits, grad) = target.into_args();
    cross_entropy_backward_kernel::launch::<R>(
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

/// A tuning knob read once from the environment (`None` when unset or unparsable).
fn env_usize(name: &str, cell: &'static std::sync::OnceLock<Option<usize>>) -> Option<usize> {
    *cell.get_or_init(|| std::env::var(name).ok().and_then(|v| v.parse().ok()))
}

/// Bytes of rows the forward-gradient kernel keeps in flight: their second read should
/// come from L2 (the H200 has 60 MB; half of it leaves room for the gradient's writes).
/// `FUSED_CE_L2_BYTES` overrides it for tuning runs.
fn rows_in_flight_bytes() -> usize {
    static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    env_usize("FUSED_CE_L2_BYTES", &CELL).unwrap_or(32 << 20)
}

/// Units per cube of the forward-gradient kernel: 1024 where the device allows it (one
/// cube per SM streams enough bytes), or `FUSED_CE_FUSED_UNITS`.
fn fused_units<R: Runtime>(client: &ComputeClient<R>, vectors: usize) -> usize {
    static CELL: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let max = client.properties().hardware.max_units_per_cube as usize;
    // Without an SM count (wgpu, lavapipe's CPU threads) 256, as the other kernels.
    let default = match client.properties().hardware.num_streaming_multiprocessors {
        Some(_) => 1024,
        None => 256,
    };
    let wanted = env_usize("FUSED_CE_FUSED_UNITS", &CELL)
        .filter(|v| v.is_power_of_two())
        .unwrap_or(default);
    // A power of two no larger than the device's limit.
    let limit = 1usize << (usize::BITS - 1 - max.max(32).leading_zeros());
    vectors
        .max(1)
        .next_power_of_two()
        .clamp(32, wanted.min(limit).max(32))
}

/// Per-row forward that also writes the gradient for an incoming gradient of 1, divided
/// by the mean's denominators when `mean` (see `cross_entropy_forward_grad_kernel`).
/// `target` says where the gradient goes (over the logits, or a new buffer).
#[allow(clippy::too_many_arguments)]
pub fn launch_forward_grad<R: Runtime>(
    client: &ComputeClient<R>,
    shape: RowLaunch,
    target: GradientTarget<R>,
    targets: TensorArg<R>,
    weights: WeightArgs<R>,
    stats: TensorArg<R>,
    predicted: TensorArg<R>,
    mean: bool,
) {
    if shape.rows == 0 {
        return;
    }
    let vectors = shape.vocab / shape.vector_size;
    let cube_size = fused_units(client, vectors);
    let options = shape.options_with(cube_size);
    let hardware = &client.properties().hardware;
    let row_bytes = shape.vocab * shape.float_dtype.size();
    let cubes = match hardware.num_streaming_multiprocessors {
        Some(sms) => {
            let sms = sms as usize;
            let resident = sms * (2048 / cube_size).max(1);
            (rows_in_flight_bytes() / row_bytes.max(1)).clamp(sms, resident)
        }
        // No SM count (wgpu): a few cubes per core is plenty for a CPU.
        None => 64,
    }
    .min(shape.rows)
    .min(MAX_GRID_DIM);
    let (logits, grad) = target.into_args();
    cross_entropy_forward_grad_kernel::launch::<R>(
        client,
        CubeCount::Static(cubes as u32, 1, 1),
        CubeDim::new_1d(cube_size as u32),
        shape.address_type,
        shape.vector_size,
        logits,
        targets,
        weights.weights,
        weights.total,
        stats,
        predicted,
        grad,
        shape.scalars(),
        options,
        mean,
        [shape.float_dtype, shape.int_dtype],
    );
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
    scale_gradient_kernel::launch::<R>(
        client,
        shape.cube_count(),
        CubeDim::new_1d(cube_size as u32),
        shape.address_type,
        shape.vector_size,
        grad,
        grad_output,
        cube_size,
        [shape.float_dtype, grad_dtype],
    );
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
    let cube_size = 256;
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
