//! What every shard knows of a row's target, for the tensor-op versions of the shard ops,
//! and the slice of the class weights a shard's own passes take.

use core::ops::Range;

use burn::backend::{
    Backend, TensorMetadata,
    tensor::{FloatTensor, IntTensor},
};
use burn::tensor::{DType, Shape};

use crate::primitive::{BoolOf, FloatOf, IntOf};
use crate::values::ClassWeights;
use crate::vocab_parallel::shard::{ELSEWHERE, SHARD_IGNORE, VocabShard};

/// `[N]` tensors of the targets and what they say on one shard.
pub(crate) struct TargetRows<B: Backend> {
    /// The targets, flattened.
    pub targets: IntOf<B, 1>,
    /// Not the ignore index.
    pub counted: BoolOf<B, 1>,
    /// Counted and a class of the vocabulary (a gradient flows).
    pub class: BoolOf<B, 1>,
    /// Counted and one of this shard's classes.
    pub here: BoolOf<B, 1>,
}

/// Whether `value` fits the integer dtype `dtype` (Burn panics when a compared scalar
/// does not).
fn fits(dtype: DType, value: i64) -> bool {
    let (low, high): (i64, i64) = match dtype {
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::U64 => (0, i64::MAX),
        DType::U32 => (0, u32::MAX.into()),
        DType::U16 => (0, u16::MAX.into()),
        DType::U8 => (0, u8::MAX.into()),
        _ => (i64::MIN, i64::MAX),
    };
    (low..=high).contains(&value)
}

impl<B: Backend> TargetRows<B> {
    /// The targets (`[N]` or `[B, T]`) against `shard`.
    pub fn new(targets: IntTensor<B>, shard: &VocabShard, ignore_index: i64) -> Self {
        let rows = targets.shape().num_elements();
        let targets = IntOf::<B, 1>::new(B::int_reshape(targets, Shape::new([rows])));
        let dtype = targets.dtype();
        // An ignore index the targets' dtype cannot hold ignores no row.
        let counted = if fits(dtype, ignore_index) {
            targets.clone().not_equal_elem(ignore_index)
        } else {
            IntOf::<B, 1>::zeros([rows], &targets.device(), dtype).equal_elem(0)
        };
        let within = |range: Range<usize>| {
            targets
                .clone()
                .greater_equal_elem(range.start as i64)
                .and(targets.clone().lower_elem(range.end as i64))
                .and(counted.clone())
        };
        Self {
            class: within(0..shard.vocab()),
            here: within(shard.classes()),
            counted,
            targets,
        }
    }

    /// The rows' count.
    pub fn rows(&self) -> usize {
        self.targets.dims()[0]
    }

    /// The targets as this shard's row kernel takes them (see
    /// [`crate::vocab_parallel::shard::local_options`]): a class of the shard as its
    /// column, an ignored row as [`SHARD_IGNORE`], any other target as [`ELSEWHERE`]
    /// (neither: the kernel reads the whole row and reports its log-sum-exp).
    pub fn local(&self, shard: &VocabShard) -> IntOf<B, 1> {
        let start = shard.classes().start as i64;
        let device = self.targets.device();
        IntOf::<B, 1>::full([self.rows()], ELSEWHERE, &device, self.targets.dtype())
            .mask_where(self.here.clone(), self.targets.clone().sub_scalar(start))
            .mask_fill(self.counted.clone().not(), SHARD_IGNORE)
    }

    /// Zeros of the targets' int type, `[N]`.
    pub fn int_zeros(&self) -> IntOf<B, 1> {
        IntOf::zeros([self.rows()], &self.targets.device(), self.targets.dtype())
    }

    /// f32 zeros, `[N]`.
    pub fn zeros(&self) -> FloatOf<B, 1> {
        FloatOf::zeros([self.rows()], &self.targets.device(), DType::F32)
    }

    /// f32 ones, `[N]`.
    pub fn ones(&self) -> FloatOf<B, 1> {
        FloatOf::ones([self.rows()], &self.targets.device(), DType::F32)
    }

    /// `value` where `mask`, else 0.
    pub fn masked(mask: &BoolOf<B, 1>, value: FloatOf<B, 1>) -> FloatOf<B, 1> {
        let zeros = FloatOf::zeros(value.shape(), &value.device(), value.dtype());
        zeros.mask_where(mask.clone(), value)
    }
}

/// The class weights of the classes `range` (f32, with their sum), or none.
pub(crate) fn shard_weights<B: Backend>(
    weights: &ClassWeights<B>,
    range: Range<usize>,
) -> ClassWeights<B> {
    match weights {
        ClassWeights::Unweighted => ClassWeights::Unweighted,
        ClassWeights::Weighted { weights, .. } => {
            let slice = FloatOf::<B, 1>::new(weights.clone()).slice([range]);
            ClassWeights::Weighted {
                total: slice.clone().sum().into_primitive(),
                weights: slice.into_primitive(),
            }
        }
    }
}

/// The class weights of `shard`'s columns as f32 `[V_s]` (ones without weights).
pub(crate) fn shard_column_weights<B: Backend>(
    weights: &ClassWeights<B>,
    shard: &VocabShard,
    device: &B::Device,
) -> FloatOf<B, 1> {
    match weights {
        ClassWeights::Weighted { weights, .. } => {
            FloatOf::<B, 1>::new(weights.clone()).slice([shard.classes()])
        }
        ClassWeights::Unweighted => FloatOf::ones([shard.classes().len()], device, DType::F32),
    }
}

/// The whole vocabulary's class-weight total, f32 `[1]`, when weights are given.
pub(crate) fn weight_total<B: Backend>(weights: &ClassWeights<B>) -> Option<FloatTensor<B>> {
    match weights {
        ClassWeights::Weighted { total, .. } => Some(total.clone()),
        ClassWeights::Unweighted => None,
    }
}
