//! `out += lhs rhs` in place: a cubek-matmul kernel with a writer that adds each output
//! vector's value to the product before writing it (`sum_writer`). The fused
//! linear cross-entropy sums its weight gradient over the chunks with it, so that no
//! chunk's `[H, V]` product is ever whole beside the sum.
//!
//! The kernel is chosen by the device, as cubek's own strategies are:
//! - with TMA, the specialized routine of cubek's `SpecializedTmaMma` strategy
//!   (warp-specialized, TMA loads, `mma` tiles), the kind of kernel Burn's autotune picks
//!   for the fused linear cross-entropy's weight-gradient shapes on Hopper;
//! - elsewhere, the double-buffered routine of its `DoubleCyclicMma` / `DoubleCyclicCmma`
//!   strategies, on `mma` tiles or else cooperative-matrix ones: plain cyclic loads, no
//!   TMA, barrier or async copy, none of which cubecl-cuda 0.11's default LLVM backend
//!   advertises, even on Hopper.
//!
//! Where neither runs (no tile instruction for the dtypes, a shape or alignment the
//! kernel refuses) [`launch_matmul_accumulate`] returns the error, and callers form the
//! product and add it.
//!
//! The product is accumulated and written through an f32 stage whatever `out`'s dtype, so
//! that the sum rounds once, to `out`'s dtype.

mod accumulate;
mod plane_rows;
mod routine;
mod split_k;
mod sum_writer;
mod tma_rows;

pub use accumulate::launch_matmul_accumulate;
pub use plane_rows::PlaneRows;
pub use split_k::split_k_slices;
pub use tma_rows::{has_tma, tma_readable, tma_readable_copy};
