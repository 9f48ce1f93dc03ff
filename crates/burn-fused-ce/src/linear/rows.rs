//! What the fused linear cross-entropy's forward (`extension.rs`) and the passes that form
//! its gradients (`gradients.rs`) share, on any backend: the call's tensors as typed
//! views, the chunks of rows (so that the N x V logits are never whole in memory), their
//! per-row statistics joined, and the mean's denominators over all rows.

use burn::backend::Backend;
use burn::tensor::DType;

use crate::linear::{chunking::LinearChunking, types::LinearInputs};
use crate::mean_denominators::{LEAST_ROWS, LEAST_WEIGHT_TOTAL};
use crate::primitive::{FloatOf, IntOf};
use crate::values::{ClassWeights, OptionalFloat, OptionalInt, RowStats, RowWeights, row_stat};

/// The tensors of a call as typed views.
pub(crate) struct Typed<B: Backend> {
    pub hidden: FloatOf<B, 2>,
    pub weight: FloatOf<B, 2>,
    pub bias: Option<FloatOf<B, 1>>,
    pub targets: IntOf<B, 1>,
    pub class_weights: ClassWeights<B>,
    pub row_weights: RowWeights<B>,
}

impl<B: Backend> Typed<B> {
    /// The call's tensors, the weight as given (callers pass it through
    /// [`LinearCrossEntropyBackend::with_matmul_aligned_rows`](crate::backend::LinearCrossEntropyBackend::with_matmul_aligned_rows) first).
    pub fn of(inputs: LinearInputs<B>) -> Self {
        Self {
            hidden: FloatOf::new(inputs.hidden),
            weight: FloatOf::new(inputs.head.weight),
            bias: inputs.head.bias.into_option().map(FloatOf::new),
            targets: IntOf::new(inputs.targets),
            class_weights: inputs.class_weights,
            row_weights: inputs.row_weights,
        }
    }

    pub fn rows(&self) -> usize {
        self.hidden.dims()[0]
    }

    pub fn width(&self) -> usize {
        self.weight.dims()[0]
    }

    pub fn vocab(&self) -> usize {
        self.weight.dims()[1]
    }

    /// The rows `start..end` of the hidden states (a view).
    pub fn hidden_rows(&self, start: usize, end: usize) -> FloatOf<B, 2> {
        self.hidden.clone().narrow(0, start, end - start)
    }

    /// The rows' weights of the chunk `start..end` (views).
    // A slice of a rank-1 tensor is an array of one range.
    #[allow(clippy::single_range_in_vec_init)]
    pub fn chunk_row_weights(&self, start: usize, end: usize) -> RowWeights<B> {
        let slice = |weights: &OptionalFloat<B>| {
            OptionalFloat::from_option(weights.clone().into_option().map(|weights| {
                FloatOf::<B, 1>::new(weights)
                    .slice([start..end])
                    .into_primitive()
            }))
        };
        RowWeights {
            loss: slice(&self.row_weights.loss),
            entropy: slice(&self.row_weights.entropy),
        }
    }

    /// Rows per chunk of `chunking` (already bounded by the device's largest buffer).
    pub fn rows_per_chunk(&self, chunking: &LinearChunking) -> usize {
        chunking.rows_per_chunk(self.rows(), self.vocab(), self.hidden.dtype())
    }
}

/// The chunks of `rows` rows: `(start, end)` pairs.
pub(crate) fn chunks(rows: usize, per_chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..rows)
        .step_by(per_chunk.max(1))
        .map(move |start| (start, (start + per_chunk).min(rows)))
}

/// The per-row statistics of the chunks, as one `RowStats` over all rows (none: zero
/// rows, on the call's device, with an empty argmax when `argmax`).
pub(crate) fn joined<B: Backend>(
    parts: Vec<RowStats<B>>,
    typed: &Typed<B>,
    argmax: bool,
) -> RowStats<B> {
    let weighted = typed.class_weights.is_weighted();
    if parts.is_empty() {
        let device = typed.hidden.device();
        return RowStats {
            // `empty`, not `zeros`: a fill over zero elements is an invalid launch on CUDA.
            stats: FloatOf::<B, 2>::empty([row_stat::COUNT, 0], &device, DType::F32)
                .into_primitive(),
            predicted: OptionalInt::from_option(argmax.then(|| {
                IntOf::<B, 1>::empty([0], &device, typed.targets.dtype()).into_primitive()
            })),
            weighted,
        };
    }
    let mut stats = Vec::with_capacity(parts.len());
    let mut predicted = Vec::with_capacity(parts.len());
    for part in parts {
        stats.push(FloatOf::<B, 2>::new(part.stats));
        if let Some(p) = part.predicted.into_option() {
            predicted.push(IntOf::<B, 1>::new(p));
        }
    }
    RowStats {
        stats: FloatOf::cat(stats, 1).into_primitive(),
        predicted: OptionalInt::from_option(
            (!predicted.is_empty()).then(|| IntOf::cat(predicted, 0).into_primitive()),
        ),
        weighted,
    }
}

/// The mean's denominators over all rows, f32 `[2]`: `D` (the targets' class weights over
/// non-ignored rows; 1 for a target that is not a class) and `n` (non-ignored rows),
/// clamped as the loss clamps them. The one pass of each chunk divides by these rather
/// than by its own rows'.
pub(crate) fn mean_denominators_of<B: Backend>(
    typed: &Typed<B>,
    ignore_index: i64,
) -> FloatOf<B, 1> {
    let targets = &typed.targets;
    let vocab = typed.vocab();
    let counted = targets.clone().not_equal_elem(ignore_index);
    let n = counted
        .clone()
        .float(DType::F32)
        .sum()
        .clamp_min(LEAST_ROWS);
    let d = match &typed.class_weights {
        ClassWeights::Unweighted => n.clone(),
        ClassWeights::Weighted { weights, .. } => {
            let is_class = targets
                .clone()
                .greater_equal_elem(0)
                .and(targets.clone().lower_elem(vocab as i64));
            let class = targets.clone().clamp(0, vocab as i64 - 1);
            FloatOf::<B, 1>::new(weights.clone())
                .gather(0, class)
                .mask_fill(is_class.not(), 1.0)
                .mask_fill(counted.not(), 0.0)
                .sum()
                .clamp_min(LEAST_WEIGHT_TOTAL)
        }
    };
    FloatOf::cat(vec![d, n], 0)
}
