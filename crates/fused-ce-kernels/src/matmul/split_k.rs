//! A product's inner dimension cut into slices whose products, side by side, fill the
//! device's SMs better than one product does.

use cubecl::{
    client::Client,
    ir::{AddressType, ElemType},
    prelude::*,
    zspace::{Shape, Strides},
};
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::std::{
    InputBinding,
    cube_count::{CubeCountPlan, CubeCountPlanKind},
};

use crate::matmul::plane_rows::PlaneRows;
use crate::matmul::routine::{Specialized, plan};
use crate::matmul::tma_rows::has_tma;

/// Fewest columns of the inner dimension in one slice of a split product.
const MIN_SLICE: usize = 256;

/// Most slices of a split product.
const MAX_SLICES: usize = 8;

/// Columns of one slice are a multiple of this (the kernel's stage along the inner
/// dimension), so that only the last, leftover columns load a partial stage.
const SLICE_STEP: usize = 64;

/// How to cut the inner dimension `K` of `lhs [M, K] rhs [K, N]`, summed into an
/// `out_dtype` output, so that the slices' products side by side
/// ([`launch_matmul_accumulate`] on `[slices, M, slice]` by `[slices, slice, N]` views)
/// fill the device's SMs better than one product does: `(slices, slice)`, the columns
/// past `slices * slice` left over. One slice where the product alone fills them as well
/// (a product with many output tiles), where the kernel cannot run, or where the device
/// has no TMA: the model below is the specialized kernel's.
///
/// The kernel runs one cube per SM at a time, all cubes of a launch over the same inner
/// length, so a launch takes `ceil(cubes / SMs)` equal waves: a chunk's hidden-state
/// gradient of `chunk x H` (96 tiles of 256 x 128 for 1536 x 2048) leaves 36 of the 132
/// SMs of an H200 idle for its whole inner dimension (the vocabulary); in 4 slices, 384
/// tiles a fourth as long fill 3 waves.
///
/// [`launch_matmul_accumulate`]: super::accumulate::launch_matmul_accumulate
pub fn split_k_slices(
    client: &Client,
    lhs: (&TensorBinding, ElemType),
    rhs: (&TensorBinding, ElemType),
    out_dtype: ElemType,
) -> (usize, usize) {
    let inner = lhs.0.shape[lhs.0.shape.len() - 1];
    let whole = (1, inner);
    let sms = client.properties().hardware.num_streaming_multiprocessors;
    let (Some(sms), true) = (sms, has_tma(client)) else {
        return whole;
    };
    let (m, n) = (lhs.0.shape[0], rhs.0.shape[rhs.0.shape.len() - 1]);
    let out = (
        Shape::from(vec![m, n]),
        Strides::from(vec![n, 1]),
        AddressType::from_len(m * n),
    );
    let dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: lhs.1,
        rhs: rhs.1,
        out: out_dtype,
    });
    let (lhs, rhs) = (
        InputBinding::new(lhs.0.clone(), lhs.1),
        InputBinding::new(rhs.0.clone(), rhs.1),
    );
    // The tiling does not change the output tiles, hence the cube count.
    let Ok((_, launch_info)) =
        plan::<Specialized>(client, (&lhs, &rhs), out, dtypes, PlaneRows::One)
    else {
        return whole;
    };
    slices_for(
        problem_cubes(&launch_info.cube_count_plan),
        sms as u64,
        inner,
    )
}

/// [`split_k_slices`] for a product of `cubes` cubes over `inner` columns on `sms` SMs.
fn slices_for(cubes: u64, sms: u64, inner: usize) -> (usize, usize) {
    // The time of `slices` slices against one product: waves of cubes each over
    // `1 / slices` of the inner dimension.
    let time = |slices: usize| (cubes * slices as u64).div_ceil(sms) as f64 / slices as f64;
    let most = MAX_SLICES.min(inner / MIN_SLICE).max(1);
    // More slices only where they save a twentieth of the time.
    let slices = (2..=most).fold(1, |best, slices| {
        if time(slices) < 0.95 * time(best) {
            slices
        } else {
            best
        }
    });
    let slice = (inner / slices) / SLICE_STEP * SLICE_STEP;
    if slices == 1 || slice == 0 {
        (1, inner)
    } else {
        (slices, slice)
    }
}

/// The cubes of a launch plan's problem: its output tiles times its batches.
fn problem_cubes(plan: &CubeCountPlan) -> u64 {
    let count = match plan.kind {
        CubeCountPlanKind::FromProblem { problem_count }
        | CubeCountPlanKind::Sm { problem_count, .. }
        | CubeCountPlanKind::Flattened { problem_count }
        | CubeCountPlanKind::Spread { problem_count, .. } => problem_count,
    };
    count.x as u64 * count.y as u64 * count.z as u64
}

#[cfg(test)]
mod tests {
    use super::slices_for;

    #[test]
    fn slices_fill_whole_waves() {
        // 1536 x 2048 (96 tiles) on an H200's 132 SMs: 3 waves of 4 slices; 1664 x 2048
        // (112 tiles): 6 waves of 7.
        assert_eq!(slices_for(96, 132, 151_936), (4, 37_952));
        assert_eq!(slices_for(112, 132, 151_936), (7, 21_696));
        // An output that already fills its waves, or nearly: no split.
        assert_eq!(slices_for(256, 132, 128_256), (1, 128_256));
        assert_eq!(slices_for(1024, 132, 151_936), (1, 151_936));
        // One tile: as many slices as the inner dimension allows, a multiple of 64
        // columns each, the rest left over.
        assert_eq!(slices_for(1, 132, 1000), (3, 320));
        assert_eq!(slices_for(1, 132, 100_000), (8, 12_480));
        // Too short to cut, or no slots to fill.
        assert_eq!(slices_for(1, 132, 300), (1, 300));
        assert_eq!(slices_for(13, 1, 1 << 20), (1, 1 << 20));
    }
}
