//! What every row-per-cube launch needs besides its buffers: the shape, the loss's
//! settings and the tuning, and the kernels' options and scalars formed from them.

use cubecl::prelude::*;

use crate::base::grid::grid_of;
use crate::base::row::{RowOptions, RowScalarsLaunch};
use crate::base::target::Target;
use crate::base::tuning::KernelTuning;

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
    /// Track the softmax's entropy (asked for, or weighted in the objective).
    pub entropy: bool,
    /// Per-row weights of the entropy are bound (`entropy_weights [rows]`, f32): the one
    /// pass forms the entropy's gradient for them (and `entropy` is on).
    pub entropy_weighted: bool,
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
            entropy: settings.entropy || settings.entropy_weighted,
            entropy_gradient: false,
            row_weighted: false,
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

/// The options' values as the row kernels take them (runtime scalars).
pub(crate) fn row_scalars(shape: &RowLaunch) -> RowScalarsLaunch {
    let settings = shape.settings;
    RowScalarsLaunch::new(
        settings.ignore_index,
        settings.label_smoothing,
        settings.z_loss_scale,
        settings.softcap.unwrap_or(1.0),
        settings
            .temperature
            .map_or(1.0, |temperature| 1.0 / temperature),
    )
}

#[cfg(test)]
impl RowLaunch {
    /// `rows` rows of `vocab` classes in `float` logits, with the default settings and a
    /// CUDA device's tuning.
    pub(crate) fn example(
        rows: usize,
        vocab: usize,
        float: cubecl::ir::FloatKind,
        vector_size: usize,
    ) -> Self {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use cubecl::ir::FloatKind;

    fn shape(rows: usize, vocab: usize, float: FloatKind, vector_size: usize) -> RowLaunch {
        RowLaunch::example(rows, vocab, float, vector_size)
    }

    #[test]
    fn row_cubes_fit_short_rows() {
        assert_eq!(shape(4, 100, FloatKind::F32, 4).cube_size(), 32);
        assert_eq!(shape(4, 1000, FloatKind::F32, 4).cube_size(), 256);
        assert_eq!(shape(4, 128_256, FloatKind::BF16, 8).cube_size(), 256);
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
}
