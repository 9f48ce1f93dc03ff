//! The call's inputs as the portable math reads them: the logits in f32 after the
//! temperature and softcap, the targets classified, the class weights per row.

use burn::backend::{
    Backend,
    tensor::{FloatTensor, IntTensor},
};
use burn::tensor::{DType, Shape};

use crate::options::CrossEntropyOptions;
use crate::primitive::{BoolOf, FloatOf, IntOf};
use crate::values::ClassWeights;

/// `(N, V)` of `[N, V]` or `[B, T, V]` logits (any rank >= 1: every dimension but the
/// last counts rows).
pub(super) fn rows_and_vocab(shape: &Shape) -> (usize, usize) {
    let dims = shape.num_dims();
    let vocab = shape[dims - 1];
    let rows = (0..dims - 1).map(|dim| shape[dim]).product();
    (rows, vocab)
}

/// The logits as f32 `[N, V]` (a copy when they were strided), divided by the
/// temperature and soft-capped when asked.
pub(super) fn logits_f32<B: Backend>(
    logits: FloatTensor<B>,
    rows: usize,
    vocab: usize,
    options: &CrossEntropyOptions,
) -> FloatOf<B, 2> {
    let logits =
        FloatOf::<B, 2>::new(B::float_reshape(logits, Shape::new([rows, vocab]))).cast(DType::F32);
    let logits = match options.temperature {
        Some(temperature) => logits.mul_scalar(1.0 / temperature as f64),
        None => logits,
    };
    match options.softcap {
        Some(cap) => logits.div_scalar(cap as f64).tanh().mul_scalar(cap as f64),
        None => logits,
    }
}

/// The value range of an integer dtype, as i64 (u64's top half is out of reach, and no
/// class index or ignore index lives there).
fn int_range(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::U64 => (0, i64::MAX),
        DType::U32 => (0, u32::MAX.into()),
        DType::U16 => (0, u16::MAX.into()),
        DType::U8 => (0, u8::MAX.into()),
        _ => (i64::MIN, i64::MAX),
    }
}

/// What every row's target says, `[N, 1]` unless noted.
pub(super) struct Targets<B: Backend> {
    /// Not the ignore index and a class in `[0, V)`: the rows with a loss and a gradient.
    pub(super) counted: BoolOf<B, 2>,
    /// The ignore index: every statistic 0, prediction -1.
    pub(super) ignored: BoolOf<B, 2>,
    /// The target where it is a class, 0 elsewhere (every gather stays in bounds).
    pub(super) safe: IntOf<B, 2>,
    /// `[N, V]`: the target's column (no column on rows that are not counted).
    pub(super) one_hot: BoolOf<B, 2>,
}

/// `targets` (`[N]` or `[B, T]`, any int dtype) against a vocabulary of `vocab` classes.
/// Scalars are compared only where the targets' dtype can hold them (Burn panics when a
/// scalar does not fit): an ignore index outside that range ignores no row.
pub(super) fn classify_targets<B: Backend>(
    targets: IntTensor<B>,
    rows: usize,
    vocab: usize,
    ignore_index: i64,
) -> Targets<B> {
    let targets = IntOf::<B, 2>::new(B::int_reshape(targets, Shape::new([rows, 1])));
    let device = targets.device();
    let dtype = targets.dtype();
    let (low, high) = int_range(dtype);
    let ignored = if (low..=high).contains(&ignore_index) {
        targets.clone().equal_elem(ignore_index)
    } else {
        IntOf::<B, 2>::zeros([rows, 1], &device, dtype).equal_elem(1)
    };
    let non_negative = targets.clone().greater_equal_elem(0);
    let in_range = if (vocab as u64) <= high as u64 {
        non_negative.and(targets.clone().lower_elem(vocab as i64))
    } else {
        non_negative
    };
    let counted = in_range.and(ignored.clone().not());
    let safe = targets.mask_fill(counted.clone().not(), 0);
    let classes = IntOf::<B, 1>::arange(0..vocab as i64, &device, dtype)
        .reshape([1, vocab])
        .expand([rows, vocab]);
    let one_hot = classes
        .equal(safe.clone().expand([rows, vocab]))
        .and(counted.clone().expand([rows, vocab]));
    Targets {
        counted,
        ignored,
        safe,
        one_hot,
    }
}

/// Class weights as f32 `[1, V]`, each row's target weight `[N, 1]` (1 on rows that are
/// not counted, as in the kernels) and the total `W` (`[1, 1]`; `V` without weights).
pub(super) struct Weights<B: Backend> {
    pub(super) row: Option<FloatOf<B, 2>>,
    pub(super) target: FloatOf<B, 2>,
    pub(super) total: FloatOf<B, 2>,
}

pub(super) fn class_weights_f32<B: Backend>(
    class_weights: ClassWeights<B>,
    t: &Targets<B>,
    rows: usize,
    vocab: usize,
    device: &B::Device,
) -> Weights<B> {
    match class_weights.tensors() {
        Some((weights, total)) => {
            let row = FloatOf::<B, 1>::new(weights).cast(DType::F32);
            let total = FloatOf::<B, 1>::new(total).cast(DType::F32).reshape([1, 1]);
            let target = row
                .clone()
                .select(0, t.safe.clone().reshape([rows]))
                .reshape([rows, 1])
                .mask_fill(t.counted.clone().not(), 1.0);
            Weights {
                row: Some(row.reshape([1, vocab])),
                target,
                total,
            }
        }
        None => Weights {
            row: None,
            target: FloatOf::ones([rows, 1], device, DType::F32),
            total: FloatOf::full([1, 1], vocab as f64, device, DType::F32),
        },
    }
}
