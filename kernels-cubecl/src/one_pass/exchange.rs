//! The exchange between the cubes of a row: each chunk publishes its partial state in
//! `partials`, as f32 bits in i32 slots, for the row's other chunks to gather.

use cubecl::prelude::*;

/// Where each value of a chunk's partial state lives among its `PARTIAL_SLOTS` slots of
/// `partials` (f32 bits as i32, the column as i32).
pub(crate) mod slot {
    pub const MAX: usize = 0;
    pub const OTHERS: usize = 1;
    pub const TARGET_LOGIT: usize = 2;
    pub const BEST: usize = 3;
    pub const BEST_COL: usize = 4;
    pub const SMOOTH: usize = 5;
    pub const ENTROPY: usize = 6;
}

/// Slots per chunk in the partials buffer `[rows * chunks * PARTIAL_SLOTS]` (i32).
pub const PARTIAL_SLOTS: usize = 7;

/// A slot's value until its chunk publishes. Published f32 bits are kept off it.
pub const UNPUBLISHED: i32 = -1;

/// f32 bits for a slot, never `UNPUBLISHED` (that bit pattern is a NaN; any NaN says the
/// same).
#[cube]
pub(crate) fn published_bits(value: f32) -> i32 {
    let bits = i32::reinterpret(value);
    select(bits == UNPUBLISHED, i32::new(0x7fff_ffff), bits)
}
