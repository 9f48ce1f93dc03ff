//! The reduced outputs from forward's per-row statistics, in one launch: the loss (`Mean`
//! or `Sum`), the z-loss, the accuracy and the mean's denominators. Done with Burn's
//! tensor ops this was eight small kernels (two sums, each a zero fill and an atomic
//! reduction, a clamp as a compare and a masked fill, a division, a cast), and each small
//! launch has a fixed cost on the device.

mod launch;
mod reduce_stats;

pub use launch::launch_reduce_stats;
pub use reduce_stats::{ReduceOptions, reduce_stats_kernel};
