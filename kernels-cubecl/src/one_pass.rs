//! The training step in one pass over the logits, for an incoming gradient guessed at
//! forward time (`Mean`/`Sum`: the last one this loss saw, 1 at first; backward rescales
//! the gradient when the guess misses).
//!
//! Each row is cut into chunks, one cube per chunk. A cube streams its chunk into shared
//! memory while reducing it, publishes its partial state in global memory, waits for the
//! other chunks of its row, merges their states into the row's log-sum-exp, and writes
//! the chunk's gradient from shared memory. The logits are read from DRAM once and the
//! gradient written once: the training floor. (Re-reading a row from global memory
//! instead relied on L2 and missed it: docs/history.md.)
//!
//! The cubes of a row wait for each other, so a row's cubes must all be resident at once.
//! A cube takes its chunk from a ticket counter when it starts, so chunks are handed out
//! in start order: every resident cube belongs to a row whose chunks have all started,
//! except the cubes of the one row being handed out, and that row completes as soon as
//! the device holds as many cubes as a row has chunks. The launch cuts rows into more
//! than one chunk only where it knows the device runs that many cubes at once (CUDA);
//! elsewhere (lavapipe runs as many workgroups at once as it has threads) a row is one
//! chunk, and the exchange is the cube's own.

use cubecl::prelude::*;

use crate::backward::{
    gradient_coefficients, incoming_scales, store_gradient_vector, write_gradient_span,
    zero_vectors,
};
use crate::forward::{finish_row, write_ignored_row};
use crate::ptx::{load_vector, store_vector};
use crate::row::{
    RUNNING_MAX_START, RowOptions, RowScalars, fast_exp_scalar, is_class, mean_denominators,
    read_target, row_offset,
};
use crate::row_state::{RowState, cube_merge, reduce_span, rescaled_entropy_sum, target_share};
use crate::staged_exps::{
    gradient_from_staged_exps, reduce_chunk_staging_exps, write_staged_exps_gradient,
};

/// Where each value of a chunk's partial state lives among its `PARTIAL_SLOTS` slots of
/// `partials` (f32 bits as i32, the column as i32).
mod slot {
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

/// How the one-pass kernel runs (each combination compiles its own kernel).
#[derive_cube_comptime]
pub struct OnePassOptions {
    /// Divide by the mean's denominators (else the gradient of a `Sum`).
    pub mean: bool,
    /// Vectors of shared memory holding a chunk's first vectors; the gradient pass
    /// re-reads the rest from global memory (L2: they were read last) before it writes the
    /// staged part. 0: nothing staged.
    pub staged_vectors: usize,
    /// Most chunks a row may have (sizes the exchange's shared memory).
    pub max_chunks: usize,
    /// Some chunk is longer than `staged_vectors`: the re-reading loop is compiled in
    /// (when every chunk is staged it would never run, but would still hold registers).
    pub reread: bool,
    /// Vectors each unit of the re-reading loop loads before storing any. Its registers
    /// set the kernel's: fewer loads, more cubes per SM.
    pub reread_loads: usize,
    /// The staged vectors are kept as `exp(x - m)` (in the logits' type) with `m` a
    /// reference maximum per unit and step, so their gradient is one multiply per element
    /// instead of an exponential (not with softcap, whose derivative needs the logits).
    pub staged_exps: bool,
    /// Inline PTX, so only where the CUDA runtime compiles through CUDA C++ (see
    /// `KernelTuning::cache_hints`): bit 0, the loads of the logits that are not read
    /// again from L2 (the staged part, the re-read part's second read) as `ld.global.cs`;
    /// bit 1, the gradient's stores as `st.global.cs` (`ptx::load_vector`,
    /// `ptx::store_vector`). Both evict first from L2, leaving it to the unstaged part the
    /// gradient pass re-reads. 0: plain loads and stores.
    pub cache_hints: u32,
}

impl OnePassOptions {
    /// The logits' loads that are not read again use `ld.global.cs`.
    pub(crate) fn stream_loads(&self) -> bool {
        self.cache_hints & 1 != 0
    }

    /// The gradient's stores use `st.global.cs`.
    pub(crate) fn stream_stores(&self) -> bool {
        self.cache_hints & 2 != 0
    }
}

/// f32 bits for a slot, never `UNPUBLISHED` (that bit pattern is a NaN; any NaN says the
/// same).
#[cube]
fn published_bits(value: f32) -> i32 {
    let bits = i32::reinterpret(value);
    select(bits == UNPUBLISHED, i32::new(0x7fff_ffff), bits)
}

/// Where each value lives in the one pass's `scales` (f32 `[3]`): the mean's
/// denominators `D` and `n` (written for `Mean` only) and the guessed incoming gradient.
pub mod scale_slot {
    pub const WEIGHT_TOTAL: usize = 0;
    pub const COUNT: usize = 1;
    pub const GUESS: usize = 2;
    /// Length of the buffer.
    pub const LEN: usize = 3;
}

/// Before the one-pass kernel: every slot of `partials` to `UNPUBLISHED`, the ticket counter
/// to 0, the guessed incoming gradient `guess [1]` into `scales` and, for `Mean`, the
/// denominators `D` and `n`: `given [2]` when `given_denominators`, else from the targets
/// (cube 0).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn one_pass_prologue_kernel<I: Int>(
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    guess: &Tensor<f32>,
    given: &Tensor<f32>,
    scales: &mut Tensor<f32>,
    tickets: &mut Tensor<Atomic<i32>>,
    partials: &mut Tensor<Atomic<i32>>,
    vocab: u32,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] mean: bool,
    #[comptime] given_denominators: bool,
    #[define(I)] _dtype: ElemType,
) {
    let len = partials.len();
    let stride = CUBE_COUNT * CUBE_DIM as usize;
    let mut at = ABSOLUTE_POS;
    while at < len {
        partials[at].store(i32::new(UNPUBLISHED as i64));
        at += stride;
    }
    if CUBE_POS == 0 {
        if UNIT_POS == 0 {
            tickets[0].store(i32::new(0));
            scales[scale_slot::GUESS] = guess[0];
        }
        if comptime!(mean && given_denominators) {
            if UNIT_POS == 0 {
                scales[scale_slot::WEIGHT_TOTAL] = given[0];
                scales[scale_slot::COUNT] = given[1];
            }
        } else if comptime!(mean) {
            let rows = targets.shape(0) * targets.shape(1);
            let (weight_sum, count) = mean_denominators::<I>(
                targets,
                class_weights,
                rows,
                vocab as usize,
                scalars.clone(),
                options,
            );
            if UNIT_POS == 0 {
                scales[scale_slot::WEIGHT_TOTAL] = weight_sum;
                scales[scale_slot::COUNT] = count;
            }
        }
    }
}

/// Forward that also writes the gradient for the guessed incoming gradient in `scales`
/// (divided by the mean's denominators when `one_pass.mean`), over the logits when `grad`
/// aliases them: one cube per chunk of `chunk_vectors` vectors of a row (see the module's
/// text).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_one_pass_kernel<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    scales: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    grad: &mut Tensor<Vector<F, N>>,
    tickets: &mut Tensor<Atomic<i32>>,
    partials: &mut Tensor<Atomic<i32>>,
    chunk_vectors: u32,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] one_pass: OnePassOptions,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let rows = stats.shape(1);
    let vector_size = logits.vector_size();
    let vectors_per_row = logits.shape(2) / vector_size;
    let chunk_vectors = chunk_vectors as usize;
    let chunks = vectors_per_row.div_ceil(chunk_vectors);

    // The chunk: the next ticket, in the order cubes start.
    let mut shared_ticket = Shared::<[u32]>::new_slice(1usize);
    if UNIT_POS == 0 {
        shared_ticket[0] = u32::cast_from(tickets[0].fetch_add(i32::new(1)));
    }
    sync_cube();
    let ticket = shared_ticket[0] as usize;
    let row = ticket / chunks;
    if row >= rows {
        terminate!();
    }
    let chunk = ticket % chunks;
    let first = chunk * chunk_vectors;
    let len = usize::min(chunk_vectors, vectors_per_row - first);

    let target = read_target::<I>(targets, row);
    if target == scalars.ignore_index {
        // Nobody waits for an ignored row's chunks: they publish nothing.
        let out_start = row_offset::<Vector<F, N>>(&*grad, row) / grad.vector_size() + first;
        zero_vectors::<F, N>(
            grad,
            out_start,
            len,
            options.cube_size,
            comptime!(one_pass.stream_stores()),
        );
        if chunk == 0 && UNIT_POS == 0 {
            write_ignored_row::<I>(stats, predicted, row, options);
        }
    } else {
        one_pass_chunk::<F, I, N>(
            logits,
            class_weights,
            weight_total,
            scales,
            stats,
            predicted,
            grad,
            partials,
            row.clone(),
            chunk,
            chunks,
            first,
            len,
            target,
            scalars.clone(),
            options,
            one_pass,
        );
    }
}

/// One chunk of a row that is not ignored: reduce (staging the chunk), exchange, write
/// the gradient.
#[cube]
// A comptime `if` around a runtime one: merged, the option's code would stay compiled in.
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
fn one_pass_chunk<F: Float, I: Int, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    class_weights: &Tensor<f32>,
    weight_total: &Tensor<f32>,
    scales: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    predicted: &mut Tensor<I>,
    grad: &mut Tensor<Vector<F, N>>,
    partials: &mut Tensor<Atomic<i32>>,
    row: usize,
    chunk: usize,
    chunks: usize,
    first: usize,
    len: usize,
    target: i32,
    scalars: RowScalars,
    #[comptime] options: RowOptions,
    #[comptime] one_pass: OnePassOptions,
) {
    let cube_size = options.cube_size;
    let stream_loads = comptime!(one_pass.stream_loads());
    let stream_stores = comptime!(one_pass.stream_stores());
    let vector_size = logits.vector_size();
    let vocab = logits.shape(2);
    let target_is_class = is_class(target, vocab);
    // When the target is not a class, `target_col` is one no unit reaches.
    let target_col = select(target_is_class, usize::cast_from(target), vocab);
    let mut staged =
        Shared::<[Vector<F, N>]>::new_slice(comptime!(if one_pass.staged_vectors > 0 {
            one_pass.staged_vectors
        } else {
            1
        }));

    // 1. Reduce the chunk, keeping it in shared memory when it fits.
    let row_start = row_offset::<Vector<F, N>>(logits, row) / vector_size;
    // With `staged_exps`, the unit's staged vectors are kept as `exp(x - reference)`.
    let (state, reference) = if comptime!(one_pass.staged_exps) {
        reduce_chunk_staging_exps::<F, N>(
            logits,
            row_start,
            first,
            len,
            target_col,
            class_weights,
            &mut staged,
            scalars.clone(),
            options,
            one_pass.staged_vectors,
            stream_loads,
        )
    } else {
        // Staged and unstaged vectors come through the same loads here: plain ones.
        let state = reduce_span::<F, N>(
            logits,
            row_start,
            first,
            len,
            target_col,
            class_weights,
            &mut staged,
            scalars.clone(),
            options,
            one_pass.staged_vectors,
        );
        (state, f32::new(0.0))
    };
    let target_vector = target_col / vector_size;
    let chunk_has_target = target_vector >= first && target_vector < first + len;
    let (holds_target, target_at) = target_share(target_vector, first, len, cube_size);
    let mut shared_target_logit = Shared::<[f32]>::new_slice(1usize);
    if holds_target {
        shared_target_logit[0] = state.target_logit;
    }
    // The merge's barriers also publish `shared_target_logit`.
    let merged = cube_merge(state, options);

    // 2. Publish the chunk's state, then gather every chunk's; each slot is checked on its
    // own, so no ordering between the stores is assumed. Only the slots the options use
    // are published and polled (each poll is an atomic at L2).
    let row_base = row * chunks * PARTIAL_SLOTS;
    if UNIT_POS == 0 {
        let base = row_base + chunk * PARTIAL_SLOTS;
        let chunk_target_logit = select(chunk_has_target, shared_target_logit[0], f32::new(0.0));
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

    // 3. Every unit merges the chunks' states in chunk order (ties of the argmax go to
    // the first column, as within a chunk).
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
    let row_state = RowState {
        max: row_max,
        others: row_others,
        target_logit: row_target_logit,
        best: row_best,
        best_col: row_best_col,
        smooth: row_smooth,
        smooth_reference: merged.smooth_reference,
        entropy_sum: row_entropy,
    };
    let forward = finish_row::<I>(
        row_state,
        select(target_is_class, row_target_logit, f32::new(0.0)),
        target,
        vocab,
        class_weights,
        weight_total,
        stats,
        predicted,
        row.clone(),
        chunk == 0 && UNIT_POS == 0,
        scalars.clone(),
        options,
    );

    // 4. The chunk's gradient for the guessed incoming gradient.
    let incoming = select(target_is_class, scales[scale_slot::GUESS], f32::new(0.0));
    let (ce_scale, z_scale) = incoming_scales(incoming, scales, one_pass.mean);
    let row_grad = gradient_coefficients(
        target_col,
        ce_scale,
        z_scale,
        forward.max,
        forward.log_sum,
        forward.target_grad,
        class_weights,
        weight_total,
        vocab,
        scalars.clone(),
        options,
    );
    let out_start = row_offset::<Vector<F, N>>(&*grad, row) / vector_size;
    if !target_is_class {
        zero_vectors::<F, N>(grad, out_start + first, len, cube_size, stream_stores);
    } else {
        let in_start = row_offset::<Vector<F, N>>(logits, row) / vector_size;
        // A select, not `min`: cubecl 0.10 types the constant as 32 bits, and NVRTC finds
        // `min(uint64, uint32)` ambiguous in a 64-bit-indexed kernel.
        let staged_len = select(len < one_pass.staged_vectors, len, one_pass.staged_vectors);
        // As in `write_gradient_row`: the target's vector is written as if it held no
        // target, then fixed from its logits read before the loop.
        let target_staged = target_at < staged_len;
        let target_in_stage = staged[select(target_staged, target_at, 0usize)];
        let target_logits = load_vector::<F, N>(logits, in_start + first + target_at, stream_loads);
        let target_values = select(
            target_staged && comptime!(!one_pass.staged_exps),
            target_in_stage,
            target_logits,
        );
        // The part not staged first: it was read last, so it is the likeliest in L2.
        if comptime!(one_pass.reread) {
            write_gradient_span::<F, N>(
                logits,
                grad,
                in_start,
                out_start,
                first + staged_len,
                len - staged_len,
                row_grad.clone(),
                class_weights,
                scalars.clone(),
                options,
                one_pass.reread_loads,
                stream_loads,
                stream_stores,
            );
        }
        if comptime!(one_pass.staged_exps) {
            write_staged_exps_gradient::<F, N>(
                grad,
                out_start,
                first,
                staged_len,
                &staged,
                reference,
                class_weights,
                row_grad.clone(),
                options,
                stream_stores,
            );
        } else {
            let mut local = UNIT_POS as usize;
            while local < staged_len {
                // Each unit reads back only the vectors it staged itself.
                store_gradient_vector::<F, N>(
                    grad,
                    out_start,
                    first + local,
                    staged[local],
                    class_weights,
                    row_grad.clone(),
                    scalars.clone(),
                    options,
                    false,
                    stream_stores,
                );
                local += cube_size;
            }
        }
        // The target's vector: from its kept exponentials when staged as such, else from
        // its logits.
        let from_exps = holds_target && target_staged && comptime!(one_pass.staged_exps);
        if comptime!(one_pass.staged_exps) {
            if from_exps {
                let coefficient =
                    fast_exp_scalar(reference - row_grad.max, options.exp_flush_to_zero)
                        * row_grad.prob_coef;
                let value = gradient_from_staged_exps::<F, N>(
                    target_in_stage,
                    coefficient,
                    class_weights,
                    (first + target_at) * vector_size,
                    row_grad.clone(),
                    options,
                    true,
                );
                store_vector::<F, N>(grad, out_start + first + target_at, value, stream_stores);
            }
        }
        if holds_target && !from_exps {
            store_gradient_vector::<F, N>(
                grad,
                out_start,
                first + target_at,
                target_values,
                class_weights,
                row_grad.clone(),
                scalars.clone(),
                options,
                true,
                stream_stores,
            );
        }
    }
}
