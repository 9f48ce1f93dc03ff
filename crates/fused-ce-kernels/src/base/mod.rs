//! What every family builds on, importing none of them. On the device: the row
//! primitives (`row`), the statistics' layout (`row_stat`), the shared-memory tree
//! (`tree`) and inline PTX (`ptx`). On the host: the shape of a row launch
//! (`row_launch`), the runtime it targets (`target`), grids (`grid`), the launch
//! arguments the families share (`launch_args`) and the tuning (`tuning`).

pub(crate) mod grid;
pub(crate) mod launch_args;
pub(crate) mod ptx;
pub(crate) mod row;
pub(crate) mod row_launch;
pub mod row_stat;
pub(crate) mod target;
pub(crate) mod tree;
pub(crate) mod tuning;
