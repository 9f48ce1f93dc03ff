//! Row primitives shared by every kernel: the options and scalars, where a row and its
//! statistics lie, the fast exponential, the temperature and softcap, and the class
//! weights. The online state a cube reduces a row into is the row family's
//! (`rows::row_state`).
//!
//! Logits are seen as `[B, T, V]` (2-D inputs as `[1, N, V]`) with any stride on the two
//! row dimensions, so a slice of a bigger tensor is read where it lies. Every option is a
//! comptime flag: the plain loss compiles to the plain loop.

use cubecl::prelude::*;

use crate::base::ptx::{
    exp_flush_to_zero, exp_flush_to_zero_lanes, log2_flush_to_zero_lanes, tanh_approx_lanes,
};

/// Start value of a running maximum. Finite on purpose: `exp(m_old - m_new)` with both at
/// `-inf` would be NaN for a row whose logits are all `-inf` so far (masked vocabulary).
pub const RUNNING_MAX_START: f32 = -3.0e38;

/// A NaN made at run time from any finite `seed`: CUDA C has no NaN or infinity literal
/// for CubeCL's compiler to print, so kernels never write `f32::NAN` as a constant.
#[cube]
pub fn runtime_nan(seed: f32) -> f32 {
    f32::sqrt(f32::new(-1.0) - f32::abs(seed))
}

/// Which options a launch uses (each one compiles its own kernel).
#[derive_cube_comptime]
pub struct RowOptions {
    /// Logits are divided by a temperature first (`RowScalars::inv_temperature`).
    pub temperature: bool,
    /// Logits become `c * tanh(x / c)`.
    pub softcap: bool,
    /// Label smoothing > 0.
    pub smoothing: bool,
    /// Class weights given.
    pub weighted: bool,
    /// z-loss scale > 0.
    pub z_loss: bool,
    /// Track the argmax (accuracy, predictions).
    pub argmax: bool,
    /// Track `sum_c exp(x'_c - max) (x'_c - max)` (the softmax's entropy).
    pub entropy: bool,
    /// The gradient carries the entropy's part too (`RowGradient::entropy_coef`): in
    /// backward for the entropy output's incoming gradient, in the one pass for the
    /// entropy weights; never in forward.
    pub entropy_gradient: bool,
    /// Each row's incoming gradient is scaled by its weight (`row_weights [rows]`, f32):
    /// a weighted objective's loss weights.
    pub row_weighted: bool,
    /// Units per cube, a power of two.
    pub cube_size: usize,
    /// Vectors each unit loads before using any (bytes in flight per unit).
    pub loads_per_step: usize,
    /// The fast exponential as `ex2.approx.ftz.f32` (`fast_exp`), and the logarithm as
    /// `lg2.approx.ftz.f32` (`fast_log2`): inline PTX, so set only where the CUDA runtime
    /// compiles through CUDA C++ (`Target`).
    pub exp_flush_to_zero: bool,
    /// Softcap's `tanh` as the hardware's approximation (`soft_cap`).
    pub approximate_tanh: bool,
}

/// The options' values (runtime scalars: changing them does not recompile).
#[derive(CubeLaunch, CubeType, Clone, Copy)]
#[expand(derive(Clone))]
pub struct RowScalars {
    pub ignore_index: i32,
    pub label_smoothing: f32,
    pub z_loss_scale: f32,
    pub softcap: f32,
    /// One over the temperature.
    pub inv_temperature: f32,
}

/// Row index of this cube. The grid is 2-D because wgpu caps each grid dimension at 65535.
#[cube]
pub(crate) fn row_of_cube() -> usize {
    (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize
}

/// Element offset of row `row` in a tensor whose first two dimensions are the rows
/// (`[B, T, ..]`, row `b * T + t`), whatever their strides.
#[cube]
pub(crate) fn row_offset<T: CubePrimitive>(tensor: &Tensor<T>, row: usize) -> usize {
    let inner_rows = tensor.shape(1);
    (row / inner_rows) * tensor.stride(0) + (row % inner_rows) * tensor.stride(1)
}

/// Where statistic `stat` of row `row` lives in `stats [COUNT, rows]`, whatever its
/// strides (a CUDA allocation may pad rows). The runtime stride is the left operand on
/// purpose: cubecl 0.10 types `CONST * x` as the constant's 32-bit type even when the
/// kernel indexes with 64 bits.
#[cube]
pub(crate) fn stat_index(stats: &Tensor<f32>, #[comptime] stat: usize, row: usize) -> usize {
    stats.stride(0) * stat + row * stats.stride(1)
}

/// What a target outside i32 reads as: never a class (a vocabulary has fewer classes),
/// and never the ignore index, which the options keep below it. Not `i32::MIN`, which
/// WGSL has no literal for.
pub const TARGET_OUTSIDE_I32: i32 = i32::MAX;

/// The class index of a row as i32. A wider target that i32 cannot hold (an i64 target of
/// `2^32 + 5`) reads as [`TARGET_OUTSIDE_I32`], not as its low 32 bits.
#[cube]
pub(crate) fn read_target<I: Int>(targets: &Tensor<I>, row: usize) -> i32 {
    let target = targets[row_offset::<I>(targets, row)];
    let narrow = i32::cast_from(target);
    select(
        I::cast_from(narrow) == target,
        narrow,
        i32::new(TARGET_OUTSIDE_I32 as i64),
    )
}

#[cube]
pub(crate) fn is_class(target: i32, vocab: usize) -> bool {
    target >= 0 && usize::cast_from(target) < vocab
}

/// Largest lane of a vector.
#[cube]
pub(crate) fn lane_max<N: Size>(values: Vector<f32, N>) -> f32 {
    let mut max = values.extract(0usize);
    #[unroll]
    for lane in 1..values.vector_size() {
        max = f32::max(max, values.extract(lane));
    }
    max
}

/// Sum of the lanes.
#[cube]
pub(crate) fn lane_sum<N: Size>(values: Vector<f32, N>) -> f32 {
    let mut sum = values.extract(0usize);
    #[unroll]
    for lane in 1..values.vector_size() {
        sum += values.extract(lane);
    }
    sum
}

/// `exp(values - shift)` per lane, for an argument <= 0 (a logit minus its row's maximum,
/// or a maximum minus a larger one). With `flush_to_zero` (CUDA C++ only: see
/// `RowOptions::exp_flush_to_zero`) as `ex2.approx.ftz.f32` (`ptx::exp_flush_to_zero`):
/// the accurate `expf` made the forward pass instruction-bound on the H200. Else cubecl's `exp`, allowed its fast forms.
#[cube(fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
pub(crate) fn fast_exp<N: Size>(
    values: Vector<f32, N>,
    shift: f32,
    #[comptime] flush_to_zero: bool,
) -> Vector<f32, N> {
    let shifted = values - Vector::new(shift);
    if comptime!(flush_to_zero) {
        exp_flush_to_zero_lanes::<N>(shifted)
    } else {
        Vector::exp(shifted)
    }
}

/// `log2(values)` per lane, for a kept exponential (in `[0, 1]`): with `flush_to_zero`
/// as `lg2.approx.ftz.f32` (`ptx::log2_flush_to_zero`), where the accurate `log` is a
/// long polynomial; else cubecl's `log`. A 0 gives `-inf`.
#[cube]
pub(crate) fn fast_log2<N: Size>(
    values: Vector<f32, N>,
    #[comptime] flush_to_zero: bool,
) -> Vector<f32, N> {
    if comptime!(flush_to_zero) {
        log2_flush_to_zero_lanes::<N>(values)
    } else {
        Vector::ln(values) * Vector::new(core::f32::consts::LOG2_E)
    }
}

/// `exp(x)` as [`fast_exp()`] forms it, for a rescaling factor (`x <= 0`).
#[cube(fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
pub(crate) fn fast_exp_scalar(x: f32, #[comptime] flush_to_zero: bool) -> f32 {
    if comptime!(flush_to_zero) {
        exp_flush_to_zero(x)
    } else {
        f32::exp(x)
    }
}

/// `ln(1 + x)`, accurate for small `x`: a Taylor polynomial below 0.05 (error under
/// 1e-10 relative), `ln(1 + x)` above (rounding `1 + x` costs at most 1.2e-6 relative
/// there). Written out because `log1p` is not accurate on every runtime, and compilers
/// may fold Goldberg's `(1 + x) - 1` correction away.
#[cube]
pub(crate) fn ln_one_plus(x: f32) -> f32 {
    let series = x
        * (f32::new(1.0)
            + x * (f32::new(-0.5)
                + x * (f32::new(1.0 / 3.0)
                    + x * (f32::new(-0.25)
                        + x * (f32::new(0.2)
                            + x * (f32::new(-1.0 / 6.0) + x * f32::new(1.0 / 7.0)))))));
    select(
        f32::abs(x) < f32::new(0.05),
        series,
        f32::ln(f32::new(1.0) + x),
    )
}

/// The logits as the loss sees them: divided by the temperature, then soft-capped, as
/// the options ask.
#[cube]
pub(crate) fn transformed<N: Size>(
    values: Vector<f32, N>,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
) -> Vector<f32, N> {
    let mut values = values;
    if comptime!(options.temperature) {
        values *= Vector::new(scalars.inv_temperature);
    }
    if comptime!(options.softcap) {
        values = soft_cap::<N>(values, scalars.softcap, options.approximate_tanh);
    }
    values
}

/// `c * tanh(x / c)`, the division as a multiply by `1 / c` (loop-invariant, so one
/// division per launch instead of one per element; at most an ulp from `x / c`). With
/// `fast` the hardware's `tanh.approx.f32` (`__tanhf` on CUDA: one instruction, relative
/// error about 2^-11) instead of `tanhf`; the launch asks for it only for bf16 logits,
/// whose own rounding (2^-8) is coarser.
#[cube]
pub(crate) fn soft_cap<N: Size>(
    values: Vector<f32, N>,
    cap: f32,
    #[comptime] fast: bool,
) -> Vector<f32, N> {
    let scaled = values * Vector::new(f32::new(1.0) / cap);
    let capped = if comptime!(fast) {
        fast_tanh::<N>(scaled)
    } else {
        Vector::tanh(scaled)
    };
    Vector::new(cap) * capped
}

/// `tanh` as the hardware's approximation (`tanh.approx.f32`, see `soft_cap`).
#[cube]
fn fast_tanh<N: Size>(values: Vector<f32, N>) -> Vector<f32, N> {
    tanh_approx_lanes::<N>(values)
}

/// The class weights of one vector's columns.
#[cube]
pub(crate) fn weights_vector<N: Size>(
    class_weights: &Tensor<f32>,
    first_col: usize,
) -> Vector<f32, N> {
    let mut weights = Vector::<f32, N>::new(0.0);
    #[unroll]
    for lane in 0..weights.vector_size() {
        weights.insert(lane, class_weights[first_col + lane]);
    }
    weights
}
