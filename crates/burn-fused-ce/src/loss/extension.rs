//! The loss's backend extension: the ops every backend that runs the loss implements, on
//! primitives. Inputs here are already validated (see `api.rs`). Burn's dispatch routes a
//! call to the backend of its tensors: [`burn_cubecl::CubeBackend`] runs our kernels
//! (`cube.rs`), `Fusion<CubeBackend>` defers them as custom ops (`fusion_meta.rs`), Flex
//! runs the portable path (`flex.rs`) and `Autodiff<B, C>` records the backward step
//! (`autodiff.rs`).

use burn::backend::{
    Backend, backend_extension,
    tensor::{FloatTensor, IntTensor},
};
use burn::tensor::DType;

use crate::loss::check_read::TargetCheckRead;
use crate::loss::incoming_guess::{IncomingGuess, next_guess};
use crate::loss::reduce::{mean_denominators, reduce_stats};
use crate::loss::types::{OnePassOutput, OnePassScale, Reduced, TwoPassBackward};
use crate::options::{CrossEntropyOptions, Reduction};
use crate::primitive::{FloatOf, IntOf};
use crate::values::{CrossEntropyInputs, LossParts, OptionalFloat, RowStats, RowWeights};

#[cfg(all(feature = "fusion", feature = "cube"))]
use crate::loss::fusion_meta::*;

/// A Burn backend that can run the fused cross-entropy.
///
/// Callers validate shapes and options first (the typed functions in this crate do).
#[backend_extension(
    Cube: cfg(feature = "cube"),
    Flex: cfg(feature = "flex"),
    Autodiff,
    Fusion: cfg(all(feature = "fusion", feature = "cube")),
)]
pub trait FusedCrossEntropyBackend: Backend {
    /// Per-row forward: reads the logits once and writes nothing of size N x V.
    #[fusion(meta = rows_meta)]
    fn cross_entropy_rows(
        #[extension_type] inputs: CrossEntropyInputs<Self>,
        options: CrossEntropyOptions,
    ) -> RowStats<Self>;

    /// The two-pass backward: the gradient with respect to the logits (same shape),
    /// scaled per row by the incoming gradient and, for `Mean`, divided by the
    /// denominators; of the weighted objective when `inputs.row_weights` has weights, and
    /// with the entropy output's own incoming gradient when it is given. Writes over the
    /// logits when nothing else holds that buffer.
    #[fusion(meta = backward_meta)]
    fn cross_entropy_backward(
        #[extension_type] inputs: CrossEntropyInputs<Self>,
        #[extension_type] backward: TwoPassBackward<Self>,
        options: CrossEntropyOptions,
    ) -> FloatTensor<Self>;

    /// The one pass: forward that also forms the gradient for the incoming gradient
    /// `scale.guess` (`Mean` or `Sum`; divided by the mean's denominators for `Mean`, the
    /// given ones or those of the call's rows), of the weighted objective when
    /// `inputs.row_weights` has weights, in the same pass when the backend can, over the
    /// logits when nothing else holds them. The default runs forward and the two-pass
    /// backward.
    #[fusion(meta = one_pass_meta)]
    fn cross_entropy_one_pass(
        #[extension_type] inputs: CrossEntropyInputs<Self>,
        #[extension_type] scale: OnePassScale<Self>,
        options: CrossEntropyOptions,
    ) -> OnePassOutput<Self> {
        let rows = Self::cross_entropy_rows(inputs.clone(), options.clone());
        let mean = options.reduction == Reduction::Mean;
        let denominators = match scale.denominators {
            OptionalFloat::Present { tensor } => Some(tensor),
            OptionalFloat::Absent => mean.then(|| mean_denominators::<Self>(&rows)),
        };
        let backward = TwoPassBackward {
            stats: rows.stats.clone(),
            grad_output: scale.guess,
            denominators: OptionalFloat::from_option(denominators.filter(|_| mean)),
            entropy_grad_output: OptionalFloat::Absent,
        };
        let grad = Self::cross_entropy_backward(inputs, backward, options);
        OnePassOutput { rows, grad }
    }

    /// Backward of the one pass: `grad * g / guess` for the scalar incoming gradient `g`
    /// (`[1]`, any float dtype) and the `guess` (f32 `[1]`) the one pass formed `grad`
    /// for (`[N, V]` or `[B, T, V]`), and the guess for the next call (see
    /// [`next_guess`]). Cube backends leave `grad` as is on the device when `g` equals
    /// the guess, and form the next guess in the same launch.
    #[fusion(meta = scale_meta)]
    fn scale_one_pass_gradient(
        grad: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        guess: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let dtype = burn::backend::TensorMetadata::dtype(&grad);
        let rank = burn::backend::TensorMetadata::shape(&grad).num_dims();
        let incoming = FloatOf::<Self, 1>::new(grad_output.clone())
            .cast(DType::F32)
            .reshape([1]);
        let scale = incoming.div(FloatOf::new(guess.clone())).cast(dtype);
        let scaled = match rank {
            2 => FloatOf::<Self, 2>::new(grad)
                .mul(scale.reshape([1, 1]))
                .into_primitive(),
            _ => FloatOf::<Self, 3>::new(grad)
                .mul(scale.reshape([1, 1, 1]))
                .into_primitive(),
        };
        (scaled, next_guess::<Self>(grad_output, guess))
    }

    /// The input check: `[first bad row, its target]` (`[2]`, the targets' int type) for
    /// `targets` (`[N]`, `N > 0`), where a bad target is neither in `[0, vocab)` nor
    /// `ignore_index`; the row is `N` when there is none. The default uses tensor ops;
    /// cube backends run one small kernel.
    #[fusion(meta = first_bad_target_meta)]
    fn first_bad_target(
        targets: IntTensor<Self>,
        vocab: usize,
        ignore_index: i64,
    ) -> IntTensor<Self> {
        let targets = IntOf::<Self, 1>::new(targets);
        let [rows] = targets.dims();
        let bad = targets
            .clone()
            .lower_elem(0)
            .or(targets.clone().greater_equal_elem(vocab as i64))
            .and(targets.clone().not_equal_elem(ignore_index));
        let first = crate::loss::reduce::first_true::<Self>(bad, rows, targets.dtype());
        let at = first.clone().clamp_max(rows as i64 - 1);
        let value = targets.gather(0, at);
        IntOf::cat(vec![first, value], 0).into_primitive()
    }

    /// A deferred target check: [`Self::first_bad_target`], whose result's read starts as
    /// the check runs and is handed to `read`. The default reads through Burn's
    /// `int_into_data`; cube backends queue the copy on the check's stream, so that nothing
    /// waits for the device until the host looks at the read.
    #[fusion(meta = start_target_check_meta)]
    fn start_target_check(
        targets: IntTensor<Self>,
        vocab: usize,
        ignore_index: i64,
        read: TargetCheckRead,
    ) -> IntTensor<Self> {
        let found = Self::first_bad_target(targets, vocab, ignore_index);
        read.start(crate::loss::pending_read::PendingRead::start(
            Self::int_into_data(found.clone()),
        ));
        found
    }

    /// The loss and extra outputs from forward's statistics (see [`Reduced`]), on the
    /// device, the loss in `dtype`: with row weights, the weighted objective's (see
    /// [`RowWeights`]). The default uses tensor ops (about eight small launches for
    /// `Mean`); cube backends run one kernel.
    #[fusion(meta = reduce_meta)]
    fn reduce_row_stats(
        #[extension_type] rows: RowStats<Self>,
        #[extension_type] row_weights: RowWeights<Self>,
        options: CrossEntropyOptions,
        dtype: DType,
        keep_denominators: bool,
    ) -> Reduced<Self> {
        reduce_stats::<Self>(rows, row_weights, &options, dtype, keep_denominators)
    }

    /// The loss (`[N]` for `Reduction::None`, `[1]` otherwise, in the logits' dtype) and
    /// the extra outputs asked for. `Autodiff` overrides it to record the backward step;
    /// the one pass forms the gradient for `guess`'s incoming gradient.
    #[fusion(default)]
    fn fused_cross_entropy(
        #[extension_type] inputs: CrossEntropyInputs<Self>,
        options: CrossEntropyOptions,
        guess: IncomingGuess,
    ) -> LossParts<Self> {
        let _ = guess;
        let dtype = burn::backend::TensorMetadata::dtype(&inputs.logits);
        let row_weights = inputs.row_weights.clone();
        let rows = Self::cross_entropy_rows(inputs, options.clone());
        Self::reduce_row_stats(rows, row_weights, options, dtype, false).parts
    }
}
