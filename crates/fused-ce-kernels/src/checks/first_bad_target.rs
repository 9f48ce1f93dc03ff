//! The first target that is neither a class nor ignored.

use cubecl::prelude::*;

use crate::base::row::{read_target, row_offset};
use crate::base::tree::{TreeFold, TreeFoldExpand, tree_fold};

/// The units' first bad rows, a slot per unit, folded to the smallest.
#[derive(CubeType)]
struct FirstRows {
    rows: Shared<[u32]>,
}

#[cube]
impl TreeFold for FirstRows {
    fn fold(&mut self, unit: usize, #[comptime] half: usize) {
        self.rows[unit] = u32::min(self.rows[unit], self.rows[unit + half]);
    }
}

/// The input check: the first row whose target is neither a class in `[0, vocab)` nor
/// `ignore_index` (compared as i32, as the loss kernels read targets: 64-bit integer
/// casts were not reliable on lavapipe), and that target. One cube walks
/// all the rows (`[B, T]`, any strides) and writes `result = [row, target]`, with `row`
/// the number of rows when every target is fine. One launch and a two-element read, in
/// place of a chain of tensor ops.
#[cube(launch)]
pub fn first_bad_target_kernel<I: Int>(
    targets: &Tensor<I>,
    result: &mut Tensor<I>,
    vocab: i32,
    ignore_index: i32,
    #[comptime] cube_size: usize,
    #[define(I)] _dtype: ElemType,
) {
    let rows = targets.shape(0) * targets.shape(1);
    let mut first = rows;
    let mut row = UNIT_POS as usize;
    // Rows are visited in increasing order: a unit's first bad row is its smallest.
    while row < rows {
        let target = read_target::<I>(targets, row);
        let bad = target != ignore_index && (target < 0 || target >= vocab);
        first = select(bad && first == rows, row, first);
        row += cube_size;
    }
    let mut first_rows = FirstRows {
        rows: Shared::<[u32]>::new_slice(cube_size),
    };
    let unit = UNIT_POS as usize;
    first_rows.rows[unit] = u32::cast_from(first);
    tree_fold::<FirstRows>(&mut first_rows, cube_size);
    if unit == 0 {
        let first = usize::cast_from(first_rows.rows[0]);
        let found = first < rows;
        let at = row_offset::<I>(targets, select(found, first, 0usize));
        result[0] = I::cast_from(first);
        result[1] = select(found, targets[at], I::new(0));
    }
}
