//! The exchange between the cubes of a row: each chunk publishes its partial state in
//! `partials`, as f32 bits in i32 slots, gathers the row's other chunks' and merges them
//! into the row's.

use cubecl::prelude::*;

use crate::base::row::{RUNNING_MAX_START, RowOptions};
use crate::one_pass::options::OnePassOptions;
use crate::rows::row_state::{RowState, rescaled_entropy_sum};

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

/// Phase 2: publishes the chunk's `merged` state (its target's logit from `target_logit`
/// when it `has_target`, else 0), then gathers every chunk's into shared memory; each slot
/// is checked on its own, so no ordering between the stores is assumed. Only the slots
/// the options use are published and polled (each poll is an atomic at L2).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn publish_and_gather(
    partials: &mut Tensor<Atomic<i32>>,
    merged: RowState,
    target_logit: &Shared<[f32]>,
    has_target: bool,
    row: usize,
    chunk: usize,
    chunks: usize,
    #[comptime] options: RowOptions,
    #[comptime] one_pass: OnePassOptions,
) -> Shared<[i32]> {
    let cube_size = options.cube_size;
    let row_base = row * chunks * PARTIAL_SLOTS;
    if UNIT_POS == 0 {
        let base = row_base + chunk * PARTIAL_SLOTS;
        let chunk_target_logit = select(has_target, target_logit[0], f32::new(0.0));
        partials[base + slot::OTHERS].store(published_bits(merged.others));
        partials[base + slot::TARGET_LOGIT].store(published_bits(chunk_target_logit));
        if comptime!(options.argmax) {
            partials[base + slot::BEST].store(published_bits(merged.best));
            partials[base + slot::BEST_COL].store(i32::cast_from(merged.best_col));
        }
        if comptime!(options.smoothing) {
            partials[base + slot::SMOOTH].store(published_bits(merged.smooth));
        }
        if comptime!(options.entropy) {
            partials[base + slot::ENTROPY].store(published_bits(merged.entropy_sum));
        }
        partials[base + slot::MAX].store(published_bits(merged.max));
    }
    let mut gathered = Shared::<[i32]>::new_slice(comptime!(one_pass.max_chunks * PARTIAL_SLOTS));
    // Unit `u` waits for slot `u % PARTIAL_SLOTS` of chunk `u / PARTIAL_SLOTS` when the
    // options use that slot. (A unit never loops over several slots: cubecl 0.10 made a
    // `break` inside nested loops leave the outer one too.)
    let count = chunks * PARTIAL_SLOTS;
    let mut at = UNIT_POS as usize;
    while at < count {
        let index = at % PARTIAL_SLOTS;
        let wanted = index <= slot::TARGET_LOGIT
            || (comptime!(options.argmax) && (index == slot::BEST || index == slot::BEST_COL))
            || (comptime!(options.smoothing) && index == slot::SMOOTH)
            || (comptime!(options.entropy) && index == slot::ENTROPY);
        if wanted {
            // `loop` + `break` with the copy inside: a `while` re-assigning the loaded
            // value never saw the published value.
            loop {
                let value = partials[row_base + at].load();
                if value != i32::new(UNPUBLISHED as i64) {
                    gathered[at] = value;
                    break;
                }
            }
        }
        at += cube_size;
    }
    sync_cube();
    gathered
}

/// Phase 3: every unit merges the `chunks` states `gathered` in chunk order (ties of the
/// argmax go to the first column, as within a chunk) into the row's.
#[cube]
pub(crate) fn merge_chunks(
    gathered: &Shared<[i32]>,
    chunks: usize,
    vocab: usize,
    smooth_reference: f32,
    #[comptime] options: RowOptions,
) -> RowState {
    let mut row_max = f32::new(RUNNING_MAX_START);
    let mut row_others = f32::new(0.0);
    let mut row_target_logit = f32::new(0.0);
    let mut row_best = f32::new(RUNNING_MAX_START);
    let mut row_best_col = u32::cast_from(vocab);
    let mut row_smooth = f32::new(0.0);
    let mut row_entropy = f32::new(0.0);
    let mut index = 0usize;
    while index < chunks {
        let base = index * PARTIAL_SLOTS;
        let chunk_max = f32::reinterpret(gathered[base + slot::MAX]);
        let chunk_others = f32::reinterpret(gathered[base + slot::OTHERS]);
        let new_max = f32::max(row_max, chunk_max);
        let (row_rescale, chunk_rescale) =
            (f32::exp(row_max - new_max), f32::exp(chunk_max - new_max));
        if comptime!(options.entropy) {
            let chunk_entropy = f32::reinterpret(gathered[base + slot::ENTROPY]);
            row_entropy =
                rescaled_entropy_sum(row_entropy, row_others, row_max - new_max, row_rescale)
                    + rescaled_entropy_sum(
                        chunk_entropy,
                        chunk_others,
                        chunk_max - new_max,
                        chunk_rescale,
                    );
        }
        row_others = row_others * row_rescale + chunk_others * chunk_rescale;
        row_max = new_max;
        // One chunk holds the target; the others published 0.
        row_target_logit += f32::reinterpret(gathered[base + slot::TARGET_LOGIT]);
        if comptime!(options.argmax) {
            let chunk_best = f32::reinterpret(gathered[base + slot::BEST]);
            let better = chunk_best > row_best;
            row_best = select(better, chunk_best, row_best);
            row_best_col = select(
                better,
                u32::cast_from(gathered[base + slot::BEST_COL]),
                row_best_col,
            );
        }
        if comptime!(options.smoothing) {
            row_smooth += f32::reinterpret(gathered[base + slot::SMOOTH]);
        }
        index += 1;
    }
    RowState {
        max: row_max,
        others: row_others,
        target_logit: row_target_logit,
        best: row_best,
        best_col: row_best_col,
        smooth: row_smooth,
        smooth_reference,
        entropy_sum: row_entropy,
    }
}
