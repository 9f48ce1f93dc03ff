//! How launches lay out their cubes: grids every runtime accepts, and the units of a
//! one-cube reduction.

use cubecl::prelude::*;

/// Largest grid dimension every runtime accepts (wgpu's limit).
const MAX_GRID_DIM: usize = 65_535;

/// A grid of `cubes` cubes (at least one), 2-D because wgpu caps each dimension at 65535;
/// kernels number them with `row_of_cube`.
pub(crate) fn grid_of(cubes: usize) -> CubeCount {
    let (x, y) = grid_dims(cubes);
    CubeCount::Static(x, y, 1)
}

fn grid_dims(cubes: usize) -> (u32, u32) {
    let x = cubes.clamp(1, MAX_GRID_DIM);
    let y = cubes.div_ceil(x).max(1);
    (x as u32, y as u32)
}

/// Units of a one-cube reduction over the rows (the one pass's prologue, the reduced
/// statistics, the first bad target): the most a cube holds, up to 1024, as a power of
/// two. Their loops are latency-bound chains of loads (one row per unit per step), so
/// more units mean fewer steps.
pub(crate) fn reduction_units(client: &Client) -> usize {
    units_for(client.properties().hardware.max_units_per_cube as usize)
}

fn units_for(max_units_per_cube: usize) -> usize {
    1 << max_units_per_cube.clamp(32, 1024).ilog2()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_cover_every_cube_within_wgpu_limits() {
        assert_eq!(grid_dims(0), (1, 1));
        assert_eq!(grid_dims(1), (1, 1));
        assert_eq!(grid_dims(65_535), (65_535, 1));
        assert_eq!(grid_dims(65_536), (65_535, 2));
        let (x, y) = grid_dims(8192 * 6);
        assert!(x as usize * y as usize >= 8192 * 6);
        let (x, y) = grid_dims(1 << 22);
        assert!(x as usize * y as usize >= 1 << 22 && x <= 65_535 && y <= 65_535);
    }

    #[test]
    fn reduction_units_are_a_power_of_two_up_to_1024() {
        assert_eq!(units_for(1024), 1024);
        assert_eq!(units_for(1536), 1024);
        assert_eq!(units_for(768), 512);
        assert_eq!(units_for(16), 32);
    }
}
