//! Thin launch functions: pick the cube shape for a row-per-cube kernel and launch it.
//! Callers hand in launch arguments already bound to buffers; nothing here allocates.

use cubecl::prelude::*;

use crate::kernels::{cross_entropy_backward_kernel, cross_entropy_forward_kernel};

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

/// What every row-per-cube launch needs besides its buffers.
#[derive(Debug, Clone, Copy)]
pub struct RowLaunch {
    /// Number of rows (one cube each).
    pub rows: usize,
    /// Classes per row.
    pub vocab: usize,
    /// Elements per vectorised load; divides `vocab` and the row stride.
    pub vector_size: usize,
    /// 32-bit or 64-bit index arithmetic, from the largest buffer involved.
    pub address_type: AddressType,
    /// Element type of the logits (and of their gradient).
    pub float_dtype: StorageType,
    /// Element type of the targets.
    pub int_dtype: StorageType,
    /// Targets equal to this are ignored.
    pub ignore_index: i32,
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
}

/// The per-row f32 `[rows]` buffers forward writes and backward reads.
pub struct RowBuffers<R: Runtime> {
    pub loss: TensorArg<R>,
    pub lse: TensorArg<R>,
    pub valid: TensorArg<R>,
    /// `p_y - 1`, formed without cancellation.
    pub target_grad: TensorArg<R>,
}

/// Per-row forward: writes every buffer of `rows`.
pub fn launch_forward<R: Runtime>(
    client: &ComputeClient<R>,
    shape: RowLaunch,
    logits: TensorArg<R>,
    targets: TensorArg<R>,
    rows: RowBuffers<R>,
) {
    if shape.rows == 0 {
        return;
    }
    let cube_size = shape.cube_size();
    cross_entropy_forward_kernel::launch::<R>(
        client,
        shape.cube_count(),
        CubeDim::new_1d(cube_size as u32),
        shape.address_type,
        shape.vector_size,
        logits,
        targets,
        rows.loss,
        rows.lse,
        rows.valid,
        rows.target_grad,
        shape.ignore_index,
        cube_size,
        [shape.float_dtype, shape.int_dtype],
    );
}

/// Where backward writes the gradient.
pub enum GradientTarget<R: Runtime> {
    /// Over the logits themselves (they are not read again by anyone).
    InPlace(TensorArg<R>),
    /// Read `logits`, write `grad`.
    Separate {
        logits: TensorArg<R>,
        grad: TensorArg<R>,
    },
}

/// Per-row backward: `grad = scale_row * (softmax(x) - onehot(y))`, zero rows for ignored
/// targets. `grad_scale` is f32, `[1]` (shared by all rows) or `[rows]` (`per_row_scale`).
pub fn launch_backward<R: Runtime>(
    client: &ComputeClient<R>,
    shape: RowLaunch,
    target: GradientTarget<R>,
    targets: TensorArg<R>,
    lse_rows: TensorArg<R>,
    target_grad_rows: TensorArg<R>,
    grad_scale: TensorArg<R>,
    per_row_scale: bool,
) {
    if shape.rows == 0 {
        return;
    }
    let cube_size = shape.cube_size();
    let cube_dim = CubeDim::new_1d(cube_size as u32);
    let dtypes = [shape.float_dtype, shape.int_dtype];
    let (logits, grad) = match target {
        // The kernel's first input is the logits: the gradient aliases it.
        GradientTarget::InPlace(logits) => {
            let grad = TensorArg::Alias {
                input_pos: 0,
                strides: logits.strides().into(),
                shape: logits.shape().into(),
            };
            (logits, grad)
        }
        GradientTarget::Separate { logits, grad } => (logits, grad),
    };
    cross_entropy_backward_kernel::launch::<R>(
        client,
        shape.cube_count(),
        cube_dim,
        shape.address_type,
        shape.vector_size,
        logits,
        targets,
        lse_rows,
        target_grad_rows,
        grad_scale,
        grad,
        shape.ignore_index,
        per_row_scale,
        cube_size,
        dtypes,
    );
}
