//! Input checks that run on the device.

mod first_bad_target;
mod launch;

pub use first_bad_target::first_bad_target_kernel;
pub use launch::launch_first_bad_target;
