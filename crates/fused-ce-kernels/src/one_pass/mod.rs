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

mod chunk;
mod exchange;
mod kernel;
mod launch;
mod options;
mod plan;
mod prologue;
mod scale_gradient;
mod staged_exps;

pub use exchange::{PARTIAL_SLOTS, UNPUBLISHED};
pub use kernel::cross_entropy_one_pass_kernel;
pub use launch::{OnePassBuffers, OnePassScratch, launch_one_pass, launch_scale_gradient};
pub use options::OnePassOptions;
pub use plan::OnePassPlan;
pub use prologue::{one_pass_prologue_kernel, scale_slot};
pub use scale_gradient::scale_gradient_kernel;
