//! The targets as a shard's row kernel takes them.

use cubecl::prelude::*;

use crate::base::row::read_target;

/// The target of a row whose class another shard holds, as a shard's row kernel takes it
/// (not a class: the kernel reads the whole row and reports its log-sum-exp).
pub const ELSEWHERE: i32 = -1;

/// The ignore index of a shard's own kernel passes: the caller's may be one of the
/// shard's columns.
pub const SHARD_IGNORE: i32 = -2;

/// One unit per row: the targets as the row kernel of the shard holding classes
/// `start..end` takes them, `local [N]`: a class of the shard as its column, an ignored
/// row as [`SHARD_IGNORE`], any other target as [`ELSEWHERE`]; with `smoothing`, also
/// `first_class [N]`: 0, or [`SHARD_IGNORE`] for an ignored row (the smoothing pass's
/// targets). `targets` are bound as `[1, N]`.
#[cube(launch_unchecked)]
pub fn shard_targets_kernel<I: Int>(
    targets: &Tensor<I>,
    local: &mut Tensor<I>,
    first_class: &mut Tensor<I>,
    start: u32,
    end: u32,
    ignore_index: i32,
    #[comptime] smoothing: bool,
    #[define(I)] _dtype: ElemType,
) {
    let row = ABSOLUTE_POS;
    if row >= local.shape(0) {
        terminate!();
    }
    let target = read_target::<I>(targets, row);
    let counted = target != ignore_index;
    let here = counted && target >= i32::cast_from(start) && target < i32::cast_from(end);
    let elsewhere = select(counted, ELSEWHERE, SHARD_IGNORE);
    local[row] = I::cast_from(select(here, target - i32::cast_from(start), elsewhere));
    if comptime!(smoothing) {
        first_class[row] = I::cast_from(select(counted, 0i32, SHARD_IGNORE));
    }
}
