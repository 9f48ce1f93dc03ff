//! The `#[cube]` kernels. One cube reduces one row: every unit streams a strided share of
//! the row's vectors, keeps an online (max, sum of exp) pair in f32, and the cube then
//! merges the pairs in shared memory. Shared memory rather than plane (warp) operations,
//! so the very same kernel runs on lavapipe, which has no plane ops.

use cubecl::prelude::*;

/// Start value of a running maximum. Finite on purpose: `exp(m_old - m_new)` with both at
/// `-inf` would be NaN for a row whose logits are all `-inf` so far (masked vocabulary).
const RUNNING_MAX_START: f32 = -3.0e38;

/// Row index of this cube. The grid is 2-D because wgpu caps each grid dimension at 65535.
#[cube]
fn row_of_cube() -> usize {
    (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize
}

/// The class index of a row as i32, plus whether it is a real class (`0 <= y < vocab`) and
/// whether the row counts at all (`y != ignore_index`).
#[cube]
fn read_target<I: Int>(targets: &Tensor<I>, row: usize) -> i32 {
    i32::cast_from(targets[row * targets.stride(0)])
}

#[cube]
fn is_class(target: i32, vocab: usize) -> bool {
    target >= 0 && usize::cast_from(target) < vocab
}

/// Largest lane of a vector.
#[cube]
fn lane_max<N: Size>(values: Vector<f32, N>) -> f32 {
    let mut max = values[0];
    #[unroll]
    for lane in 1..values.size() {
        max = f32::max(max, values[lane]);
    }
    max
}

/// `exp(values - shift)` per lane, as the hardware's fast exponential where there is one
/// (`__expf` on CUDA: a few ulp, and still inf/NaN-correct, at a fraction of `expf`'s
/// instructions; the accurate `expf` made the forward pass instruction-bound on the H200).
/// Used only where the argument is <= 0 or a logit minus its row's log-sum-exp.
#[cube(fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
fn fast_exp<N: Size>(values: Vector<f32, N>, shift: f32) -> Vector<f32, N> {
    Vector::exp(values - Vector::new(shift))
}

/// `sum exp(values - max)` over the lanes, leaving out the target's lane when this vector
/// holds the target.
#[cube]
fn exp_sum_without_target<N: Size>(
    values: Vector<f32, N>,
    max: f32,
    holds_target: bool,
    target_lane: usize,
) -> f32 {
    let exps = fast_exp::<N>(values, max);
    let mut sum = f32::new(0.0);
    #[unroll]
    for lane in 0..values.size() {
        sum += select(
            holds_target && lane == target_lane,
            f32::new(0.0),
            exps[lane],
        );
    }
    sum
}

/// The target's logit when this vector holds it, `current` otherwise.
#[cube]
fn pick_target<N: Size>(
    values: Vector<f32, N>,
    holds_target: bool,
    target_lane: usize,
    current: f32,
) -> f32 {
    let mut picked = current;
    #[unroll]
    for lane in 0..values.size() {
        picked = select(holds_target && lane == target_lane, values[lane], picked);
    }
    picked
}

/// Merges the units' online (max, sum of exp over non-target classes) pairs in shared
/// memory. Returns the row's max and that sum, to every unit.
#[cube]
fn cube_max_and_sum(
    running_max: f32,
    running_sum: f32,
    #[comptime] cube_size: usize,
) -> (f32, f32) {
    let mut shared_max = SharedMemory::<f32>::new(cube_size);
    let mut shared_sum = SharedMemory::<f32>::new(cube_size);
    let unit = UNIT_POS as usize;
    shared_max[unit] = running_max;
    shared_sum[unit] = running_sum;
    sync_cube();

    let levels = comptime!(cube_size.trailing_zeros() as usize);
    #[unroll]
    for level in 0..levels {
        let half = comptime!(cube_size >> (level + 1));
        if unit < half {
            let max_a = shared_max[unit];
            let max_b = shared_max[unit + half];
            let merged_max = f32::max(max_a, max_b);
            shared_sum[unit] = shared_sum[unit] * f32::exp(max_a - merged_max)
                + shared_sum[unit + half] * f32::exp(max_b - merged_max);
            shared_max[unit] = merged_max;
        }
        sync_cube();
    }
    (shared_max[0], shared_sum[0])
}

// cubecl-opt 0.10's value numbering sometimes panics ("no entry found for key", varying
// with hash order) on a `let mut` reassigned inside an `if`; these kernels use `select`
// for such values instead.

/// Forward. Per row it writes the loss `lse - x_y`, the log-sum-exp (backward's only
/// need besides the logits), a validity weight (1 counted, 0 ignored; the mean divides by
/// its sum) and `p_y - 1`.
///
/// The target's own exp is kept out of the running sum: with `others = sum_{c != y}
/// exp(x_c - max)`, `p_y - 1 = -others / (others + exp(x_y - max))` keeps its relative
/// precision when the model is confident (`p_y` near 1), where `exp(x_y - lse) - 1` would
/// cancel. Likewise the loss is `(max - x_y) + ln(sum)`, exact in its first term.
///
/// Ignored rows are not read at all. A target outside `[0, vocab)` gives a NaN loss and is
/// never used as an address.
#[cube(launch, address_type = "dynamic")]
pub fn cross_entropy_forward_kernel<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    loss_rows: &mut Tensor<f32>,
    lse_rows: &mut Tensor<f32>,
    valid_rows: &mut Tensor<f32>,
    target_grad_rows: &mut Tensor<f32>,
    ignore_index: i32,
    #[comptime] cube_size: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let row = row_of_cube();
    if row >= loss_rows.shape(0) {
        terminate!();
    }
    let vector_size = logits.vector_size();
    let vocab = logits.shape(1);
    let target = read_target::<I>(targets, row);

    if target == ignore_index {
        if UNIT_POS == 0 {
            loss_rows[row] = f32::new(0.0);
            lse_rows[row] = f32::new(0.0);
            valid_rows[row] = f32::new(0.0);
            target_grad_rows[row] = f32::new(0.0);
        }
        terminate!();
    }

    let target_is_class = is_class(target, vocab);
    // When the target is not a class, `target_vector` is one no unit reaches.
    let vectors_per_row = vocab / vector_size;
    let target_col = select(target_is_class, usize::cast_from(target), vocab);
    let target_vector = target_col / vector_size;
    let target_lane = target_col % vector_size;
    let row_start = row * logits.stride(0) / vector_size;

    let mut shared_target_logit = SharedMemory::<f32>::new(1usize);
    let mut running_max = f32::new(RUNNING_MAX_START);
    let mut running_sum = f32::new(0.0);
    let mut target_logit = f32::new(0.0);
    // Two vectors per step: both loads are issued before either is waited on, which
    // doubles the bytes each unit has in flight (the loop is latency-bound otherwise).
    let mut index = UNIT_POS as usize;
    while index + cube_size < vectors_per_row {
        let second_index = index + cube_size;
        let first = Vector::<f32, N>::cast_from(logits[row_start + index]);
        let second = Vector::<f32, N>::cast_from(logits[row_start + second_index]);
        let new_max = f32::max(
            running_max,
            f32::max(lane_max::<N>(first), lane_max::<N>(second)),
        );
        let first_is_target = index == target_vector;
        let second_is_target = second_index == target_vector;
        let exp_sum = exp_sum_without_target::<N>(first, new_max, first_is_target, target_lane)
            + exp_sum_without_target::<N>(second, new_max, second_is_target, target_lane);
        target_logit = pick_target::<N>(first, first_is_target, target_lane, target_logit);
        target_logit = pick_target::<N>(second, second_is_target, target_lane, target_logit);
        running_sum = running_sum * f32::exp(running_max - new_max) + exp_sum;
        running_max = new_max;
        index += 2 * cube_size;
    }
    if index < vectors_per_row {
        let values = Vector::<f32, N>::cast_from(logits[row_start + index]);
        let new_max = f32::max(running_max, lane_max::<N>(values));
        let is_target = index == target_vector;
        let exp_sum = exp_sum_without_target::<N>(values, new_max, is_target, target_lane);
        target_logit = pick_target::<N>(values, is_target, target_lane, target_logit);
        running_sum = running_sum * f32::exp(running_max - new_max) + exp_sum;
        running_max = new_max;
    }
    let holds_any_target =
        target_vector % cube_size == UNIT_POS as usize && target_vector < vectors_per_row;

    if holds_any_target {
        shared_target_logit[0] = target_logit;
    }
    // The reduction's barriers also publish `shared_target_logit`.
    let (row_max, others) = cube_max_and_sum(running_max, running_sum, cube_size);

    if UNIT_POS == 0 {
        // A target that is not a class reads a zero logit and gets a NaN loss below.
        let target_logit = select(target_is_class, shared_target_logit[0], f32::new(0.0));
        let target_exp = select(
            target_is_class,
            f32::exp(target_logit - row_max),
            f32::new(0.0),
        );
        let sum = others + target_exp;
        let log_sum = f32::ln(sum);
        let loss = (row_max - target_logit) + log_sum;
        // NaN made at run time: CUDA C has no NaN literal for the compiler to print.
        let not_a_number = f32::sqrt(f32::new(-1.0) - f32::abs(f32::cast_from(target)));
        loss_rows[row] = select(target_is_class, loss, not_a_number);
        lse_rows[row] = row_max + log_sum;
        valid_rows[row] = f32::new(1.0);
        target_grad_rows[row] = -others / sum;
    }
}

/// `scale * (softmax(x) - onehot(target))` for one vector of a row, in f32, rounded to `F`
/// once. The target lane takes forward's `p_y - 1` (see the forward kernel for why).
#[cube]
fn gradient_vector<F: Float, N: Size>(
    values: Vector<F, N>,
    first_col: usize,
    row: RowGradient,
) -> Vector<F, N> {
    let probs = fast_exp::<N>(Vector::<f32, N>::cast_from(values), row.lse);
    let mut grad = probs * Vector::new(row.scale);
    let vector_size = values.size();
    #[unroll]
    for lane in 0..vector_size {
        let is_target = first_col + lane == row.target_col;
        grad[lane] = select(is_target, row.target_grad * row.scale, grad[lane]);
    }
    Vector::cast_from(grad)
}

/// What backward knows of a row before streaming it.
#[derive(CubeType, Clone, Copy)]
struct RowGradient {
    /// Incoming gradient over the reduction's denominator.
    scale: f32,
    /// `vocab` when the row's gradient is zero (ignored, or not a class).
    target_col: usize,
    lse: f32,
    /// `p_y - 1` from forward.
    target_grad: f32,
}

/// Reads what backward needs of a row. The target column is `vocab` when the row gets a
/// zero gradient: an ignored row, or a target that is not a class.
#[cube]
fn row_gradient<I: Int>(
    targets: &Tensor<I>,
    lse_rows: &Tensor<f32>,
    target_grad_rows: &Tensor<f32>,
    grad_scale: &Tensor<f32>,
    row: usize,
    vocab: usize,
    ignore_index: i32,
    #[comptime] per_row_scale: bool,
) -> RowGradient {
    let target = read_target::<I>(targets, row);
    let counted = target != ignore_index && is_class(target, vocab);
    let target_col = select(counted, usize::cast_from(target), vocab);
    let incoming = if comptime!(per_row_scale) {
        grad_scale[row * grad_scale.stride(0)]
    } else {
        grad_scale[0]
    };
    let scale = select(counted, incoming, f32::new(0.0));
    RowGradient {
        scale,
        target_col,
        lse: lse_rows[row],
        target_grad: target_grad_rows[row],
    }
}

/// Backward: reads `logits`, writes `grad`. When nothing else holds the logits, the launch
/// binds `grad` as an alias of `logits`, so the gradient is written over them (no N x V
/// allocation at all); each unit reads its vectors before writing them.
#[cube(launch, address_type = "dynamic")]
pub fn cross_entropy_backward_kernel<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    lse_rows: &Tensor<f32>,
    target_grad_rows: &Tensor<f32>,
    grad_scale: &Tensor<f32>,
    grad: &mut Tensor<Vector<F, N>>,
    ignore_index: i32,
    #[comptime] per_row_scale: bool,
    #[comptime] cube_size: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let row = row_of_cube();
    if row >= lse_rows.shape(0) {
        terminate!();
    }
    let vector_size = logits.vector_size();
    let vocab = logits.shape(1);
    let row_grad = row_gradient::<I>(
        targets,
        lse_rows,
        target_grad_rows,
        grad_scale,
        row,
        vocab,
        ignore_index,
        per_row_scale,
    );
    let in_start = row * logits.stride(0) / vector_size;
    let out_start = row * grad.stride(0) / vector_size;
    let vectors_per_row = vocab / vector_size;
    let mut index = UNIT_POS as usize;
    if row_grad.target_col == vocab {
        // Zero row: the logits are not read (they may be anything, NaN included).
        while index < vectors_per_row {
            grad[out_start + index] = Vector::new(F::new(0.0));
            index += cube_size;
        }
    } else {
        // Two vectors per step, both loads issued first (more bytes in flight).
        while index + cube_size < vectors_per_row {
            let second = index + cube_size;
            let first_values = logits[in_start + index];
            let second_values = logits[in_start + second];
            grad[out_start + index] =
                gradient_vector::<F, N>(first_values, index * vector_size, row_grad);
            grad[out_start + second] =
                gradient_vector::<F, N>(second_values, second * vector_size, row_grad);
            index += 2 * cube_size;
        }
        if index < vectors_per_row {
            grad[out_start + index] =
                gradient_vector::<F, N>(logits[in_start + index], index * vector_size, row_grad);
        }
    }
}
