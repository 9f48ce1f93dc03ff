//! `out += lhs rhs` in place: a cubek-matmul kernel with a writer that adds each output
//! vector's value to the product before writing it ([`crate::sum_writer`]). The fused
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

use std::marker::PhantomData;

use cubecl::{
    client::Client,
    features::TypeUsage,
    ir::{AddressType, ElemType},
    prelude::*,
    zspace::{Shape, Strides},
};
use cubek::matmul::{
    definition::{
        AvailableVectorSizes, MatmulAvailabilityError, MatmulElems, MatmulGlobalElems,
        MatmulProblem, MatmulSetupError, MatmulVectorSizes,
    },
    multi_level::{
        BatchMatmulRoutine, ExpandInfo, LaunchInfo,
        args::{
            ConcreteInputsFactory, ConcreteOutputFactory, ConfigRuntimeArg, InputArg,
            InputRuntimeArg, MatmulArgs, OutputArg, OutputRuntimeArg, TensorArgs, TensorMapArgs,
        },
        batch_validate_blueprint,
        components::{
            batch::{
                BatchMatmulFamily, PartitionedBatchMatmulFamily, RowMajorGlobalPartitionMatmul,
            },
            global::{
                multi_stage::{
                    double_buffering::DoubleBufferingMatmulFamily,
                    specialized::SpecializedMatmulFamily,
                },
                read::{
                    async_partial_tma::AsyncPartialTmaLoading,
                    sync_full_cyclic::SyncFullCyclicLoading,
                    sync_full_strided::SyncFullStridedLoading,
                    sync_partial_cyclic::SyncPartialCyclicLoading,
                },
            },
            stage::{NumStages, PlanePartitioner},
            tile::TileMatmulKind,
        },
        definition::{BatchMatmulBlueprint, CubeMappingLaunch, MultiRowStrategy},
        launch_kernel,
        routines::{
            PlaneTilingBlueprintOptions, batch::specialized::SpecializedStrategy,
            infer_blueprint_plane,
        },
        tile::RowMajorTilingOrder,
    },
    routine::{BlueprintStrategy, DeviceSettings, Routine},
};
use cubek::std::{
    InputBinding,
    cube_count::{CubeCountPlan, CubeCountPlanKind},
};

use crate::sum_writer::SumPlaneWriterFamily;
use crate::tma_rows::{has_tma, tma_readable};

/// One of the kernels, as cubek builds it, with the summing writer in place of cubek's
/// plane writer, and no accumulator read before the main loop.
trait SumKernel: 'static + Send + Sync {
    /// The batch-level kernel.
    type Family: BatchMatmulFamily<(), Blueprint = BatchMatmulBlueprint>;
    /// Whether its planes are split into loading and computing ones.
    const SPECIALIZED: bool;
    /// The tile instructions it is tried on, in order.
    const TILES: &'static [TileMatmulKind];

    /// The vector sizes its loads may take, for the given dtypes.
    fn vector_sizes(client: &Client, dtypes: &MatmulElems) -> AvailableVectorSizes;
}

/// cubek's `SpecializedAlgorithm` (TMA loads of both operands), writer aside.
struct Specialized;

impl SumKernel for Specialized {
    type Family = PartitionedBatchMatmulFamily<
        (),
        SpecializedMatmulFamily<
            PlanePartitioner,
            (),
            AsyncPartialTmaLoading,
            SyncFullStridedLoading,
            SumPlaneWriterFamily,
        >,
        RowMajorGlobalPartitionMatmul,
    >;
    const SPECIALIZED: bool = true;
    const TILES: &'static [TileMatmulKind] = &[TileMatmulKind::Mma];

    fn vector_sizes(client: &Client, dtypes: &MatmulElems) -> AvailableVectorSizes {
        AvailableVectorSizes::from_type_size_tma(client, dtypes.acc_global.size())
    }
}

/// cubek's `CyclicDoubleBufferingAlgorithm` (synchronous cyclic loads), writer aside.
struct DoubleBuffered;

impl SumKernel for DoubleBuffered {
    type Family = PartitionedBatchMatmulFamily<
        (),
        DoubleBufferingMatmulFamily<
            PlanePartitioner,
            (),
            SyncPartialCyclicLoading<RowMajorTilingOrder>,
            SyncPartialCyclicLoading<RowMajorTilingOrder>,
            SyncFullCyclicLoading<RowMajorTilingOrder>,
            SumPlaneWriterFamily,
        >,
        RowMajorGlobalPartitionMatmul,
    >;
    const SPECIALIZED: bool = false;
    const TILES: &'static [TileMatmulKind] = &[TileMatmulKind::Mma, TileMatmulKind::Cmma];

    fn vector_sizes(client: &Client, dtypes: &MatmulElems) -> AvailableVectorSizes {
        AvailableVectorSizes::from_type_sizes(
            client,
            dtypes.lhs_global.size(),
            dtypes.rhs_global.size(),
            dtypes.acc_global.size(),
        )
    }
}

/// The routine of kernel `K`, as cubek's launch functions take one.
struct SumRoutine<K>(PhantomData<K>);

impl<K: SumKernel> Routine<()> for SumRoutine<K> {
    type Strategy = SpecializedStrategy;
    type Blueprint = BatchMatmulBlueprint;
}

impl<K: SumKernel> BatchMatmulRoutine<()> for SumRoutine<K> {
    fn launch<MA: MatmulArgs<Config = ()>>(
        client: &Client,
        cube_dim: CubeDim,
        cube_count: CubeCount,
        address_type: AddressType,
        input: InputRuntimeArg<MA>,
        output: OutputRuntimeArg<MA>,
        config: ConfigRuntimeArg<MA>,
        cube_mapping: CubeMappingLaunch,
        blueprint: BatchMatmulBlueprint,
        dtypes: &MatmulElems,
        vector_sizes: &MatmulVectorSizes,
    ) -> Result<(), MatmulSetupError> {
        // SAFETY: as cubek's own routines launch it, after `prepare` validated the
        // blueprint against the problem; the views check their bounds.
        unsafe {
            K::Family::launch_unchecked::<MA>(
                client,
                cube_dim,
                cube_count,
                address_type,
                input,
                output,
                config,
                cube_mapping,
                blueprint,
                dtypes,
                vector_sizes,
            )?;
        }
        Ok(())
    }

    fn validate_blueprint(
        client: &Client,
        blueprint: &BatchMatmulBlueprint,
        problem: &MatmulProblem,
        dtypes: &MatmulElems,
        vector_sizes: &MatmulVectorSizes,
    ) -> Result<(), MatmulSetupError> {
        batch_validate_blueprint::<K::Family, ()>(client, blueprint, problem, dtypes, vector_sizes)
    }

    fn num_stages() -> NumStages {
        K::Family::num_stages()
    }

    fn expand_blueprint(
        problem: &MatmulProblem,
        settings: &DeviceSettings,
        strategy: &BlueprintStrategy<(), Self>,
    ) -> Result<ExpandInfo<BatchMatmulBlueprint>, MatmulSetupError> {
        match strategy {
            BlueprintStrategy::Forced(blueprint) => Ok(ExpandInfo {
                blueprint: blueprint.clone(),
                dtypes: stage_dtypes(problem, blueprint.tile_matmul),
            }),
            BlueprintStrategy::Inferred(_) => {
                self::blueprint::<K>(problem, settings, K::TILES[0], PlaneRows::One)
            }
        }
    }

    fn prepare(
        problem: &MatmulProblem,
        settings: &DeviceSettings,
        expand_info: ExpandInfo<BatchMatmulBlueprint>,
    ) -> Result<LaunchInfo<BatchMatmulBlueprint>, MatmulSetupError> {
        let ExpandInfo { blueprint, dtypes } = expand_info;
        Self::validate_blueprint(
            &settings.client,
            &blueprint,
            problem,
            &dtypes,
            &settings.vector_sizes,
        )?;
        let resource = K::Family::cubedim_resource(&blueprint, &dtypes, &settings.vector_sizes)?;
        LaunchInfo::new(blueprint, dtypes, problem, resource, settings)
    }
}

/// How many rows of `mma` tiles each computing plane of the kernel takes. The cube's
/// output tile is the same either way: computing planes of one row of tiles each, or half
/// as many of two, which load each tile of the right operand once for both rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlaneRows {
    /// One row of tiles per plane.
    One,
    /// Two rows of tiles per plane.
    Two,
}

/// Inner length from which [`PlaneRows::for_product`] gives each plane two rows.
const LONG_INNER: usize = 16_384;

/// Output rows above which [`PlaneRows::for_product`] gives each plane two rows whatever
/// the inner length (where cubek-matmul's own selection starts giving two).
const TALL_OUTPUT: usize = 2048;

impl PlaneRows {
    /// The rows per plane for an output of `rows` rows over `inner` columns: two over a
    /// long inner dimension (a chunk's hidden-state gradient, over the vocabulary), where
    /// the main loop is all the time, or on a tall output (the weight gradient of a head
    /// more than 2048 wide); one otherwise (a narrower head's weight-gradient chunk
    /// products, over the chunk's rows), where writing the sum weighs more.
    pub fn for_product(rows: usize, inner: usize) -> Self {
        if inner >= LONG_INNER || rows > TALL_OUTPUT {
            Self::Two
        } else {
            Self::One
        }
    }

    fn strategy(self) -> MultiRowStrategy {
        match self {
            Self::One => MultiRowStrategy::Never,
            Self::Two => MultiRowStrategy::Always(2),
        }
    }
}

/// `out += lhs rhs` for `lhs [M, K]`, `rhs [K, N]` and `out [M, N]` of the given dtypes,
/// `out` updated in place; or for a batch of them (`[B, M, K]`, `[B, K, N]`, `[B, M, N]`,
/// each operand's batch at any stride: slices of one matrix, [`split_k_slices`]). `lhs`
/// and `rhs` may be transposed views; `out`'s rows must be contiguous (its row stride may
/// be padded, as CUDA allocations are). `rows`: the tiling ([`PlaneRows::for_product`]
/// picks it from the shape). On a device with TMA, the specialized kernel, which also
/// needs each operand TMA-readable ([`tma_readable`]); elsewhere the double-buffered one
/// (module docs). An error where the kernel does not suit the device, the dtypes, the
/// shapes, layouts or alignment: callers then form the product and add it.
pub fn launch_matmul_accumulate(
    client: &Client,
    lhs: (TensorBinding, ElemType),
    rhs: (TensorBinding, ElemType),
    out: (TensorBinding, ElemType),
    rows: PlaneRows,
) -> Result<(), MatmulSetupError> {
    if !has_tma(client) {
        return launch_with::<DoubleBuffered, TensorArgs>(client, lhs, rhs, out, rows);
    }
    if ![(&lhs.0, lhs.1), (&rhs.0, rhs.1), (&out.0, out.1)]
        .into_iter()
        .all(|(binding, dtype)| tma_readable(binding, dtype))
    {
        return Err(MatmulSetupError::Unavailable(
            MatmulAvailabilityError::TmaUnavailable,
        ));
    }
    launch_with::<Specialized, TensorMapArgs>(client, lhs, rhs, out, rows)
}

/// [`launch_matmul_accumulate`] by kernel `K`, its operands passed as `MA` takes them.
fn launch_with<K: SumKernel, MA: MatmulArgs<Config = ()>>(
    client: &Client,
    (lhs, lhs_dtype): (TensorBinding, ElemType),
    (rhs, rhs_dtype): (TensorBinding, ElemType),
    (out, out_dtype): (TensorBinding, ElemType),
    rows: PlaneRows,
) -> Result<(), MatmulSetupError>
where
    InputArg<MA>: ConcreteInputsFactory<SumRoutine<K>>,
    OutputArg<MA>: ConcreteOutputFactory<SumRoutine<K>>,
{
    let dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: lhs_dtype,
        rhs: rhs_dtype,
        out: out_dtype,
    });
    let lhs = InputBinding::new(lhs, lhs_dtype);
    let rhs = InputBinding::new(rhs, rhs_dtype);
    let out_address = out.required_address_type(dtypes.acc_global.size());
    let (problem, launch_info) = plan::<K>(
        client,
        (&lhs, &rhs),
        (out.shape.clone(), out.strides.clone(), out_address),
        dtypes,
        rows,
    )?;

    let input = <InputArg<MA> as ConcreteInputsFactory<SumRoutine<K>>>::create(
        lhs,
        rhs,
        &launch_info.blueprint,
        &problem,
        &launch_info.vector_sizes,
        &launch_info.dtypes,
    );
    let output = <OutputArg<MA> as ConcreteOutputFactory<SumRoutine<K>>>::create(
        out,
        &launch_info.blueprint,
        &problem,
        &launch_info.vector_sizes,
        &launch_info.dtypes,
    );
    launch_kernel::<MA, SumRoutine<K>>(client, input, output, (), launch_info)
}

/// The problem and kernel `K`'s launch for `lhs rhs` into an output of the given shape,
/// strides and address type, of the given dtypes, tiled as `rows` says: on the first of
/// `K`'s tile instructions that takes it.
fn plan<K: SumKernel>(
    client: &Client,
    (lhs, rhs): (&InputBinding, &InputBinding),
    (out_shape, out_strides, out_address): (Shape, Strides, AddressType),
    dtypes: MatmulElems,
    rows: PlaneRows,
) -> Result<(MatmulProblem, LaunchInfo<BatchMatmulBlueprint>), MatmulSetupError> {
    let features = &client.properties().features;
    for dtype in [dtypes.lhs_global, dtypes.rhs_global, dtypes.acc_global] {
        if !features.type_usage(dtype).contains(TypeUsage::Conversion) {
            return Err(MatmulSetupError::Unavailable(
                MatmulAvailabilityError::TypesUnavailable {
                    lhs: dtypes.lhs_global,
                    rhs: dtypes.rhs_global,
                    output: dtypes.acc_global,
                },
            ));
        }
    }
    let address_type = lhs
        .required_address_type()
        .max(rhs.required_address_type())
        .max(out_address);
    let problem = MatmulProblem::from_shapes_and_strides(
        lhs.shape().into(),
        rhs.shape().into(),
        out_shape,
        lhs.data().strides.clone(),
        rhs.data().strides.clone(),
        out_strides,
        dtypes.as_global_elems(),
        address_type,
        None,
        None,
    )?;
    let vector_sizes = K::vector_sizes(client, &dtypes)
        .filter_lhs_with_tensor(&problem.lhs_strides, &problem.lhs_shape, problem.lhs_layout)
        .filter_rhs_with_tensor(&problem.rhs_strides, &problem.rhs_shape, problem.rhs_layout)
        .filter_out_with_tensor(&problem.out_strides, &problem.out_shape)
        .pick_max()?;
    let settings = SumRoutine::<K>::device_settings(client, vector_sizes);
    let mut refusal = None;
    for &tile in K::TILES {
        let launch_info = blueprint::<K>(&problem, &settings, tile, rows)
            .and_then(|expand_info| SumRoutine::<K>::prepare(&problem, &settings, expand_info));
        match launch_info {
            Ok(launch_info) => return Ok((problem, launch_info)),
            Err(error) => refusal = Some(error),
        }
    }
    Err(refusal.expect("every kernel has a tile instruction to try"))
}

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

/// Kernel `K`'s routine's own blueprint inference on `tile` instructions, with two
/// changes: the accumulator's stage is f32 ([`stage_dtypes`]), and each plane takes the
/// rows of tiles `rows` says (cubek's default gives planes two rows on tall problems,
/// whatever their inner length).
fn blueprint<K: SumKernel>(
    problem: &MatmulProblem,
    settings: &DeviceSettings,
    tile: TileMatmulKind,
    rows: PlaneRows,
) -> Result<ExpandInfo<BatchMatmulBlueprint>, MatmulSetupError> {
    let (blueprint, mut dtypes) = infer_blueprint_plane(
        tile,
        &settings.client,
        problem,
        settings.plane_dim,
        stage_dtypes(problem, tile),
        &settings.vector_sizes,
        PlaneTilingBlueprintOptions {
            specialized: K::SPECIALIZED,
            multi_row_strategy: rows.strategy(),
            swizzled: tile.should_swizzle(&settings.client),
            stage_buffering: K::Family::num_stages().stage_buffering(),
            ..Default::default()
        },
    )?;
    dtypes.acc_stage = dtypes.acc_register;
    Ok(ExpandInfo { blueprint, dtypes })
}

/// The problem's element types as cubek's routines stage them on `tile` instructions,
/// except the accumulator's stage (the writer's), which is the accumulator's own type
/// (f32): the writer adds the output to the product before the one rounding to the
/// output's type.
fn stage_dtypes(problem: &MatmulProblem, tile: TileMatmulKind) -> MatmulElems {
    let mut dtypes = MatmulElems::from_globals(&problem.global_dtypes);
    if tile.can_cast_stage_element() {
        dtypes.adjust_stage_dtypes();
    }
    dtypes.acc_stage = dtypes.acc_register;
    dtypes
}

#[cfg(test)]
mod tests {
    use super::{PlaneRows, slices_for};

    #[test]
    fn two_rows_over_a_long_inner_dimension_or_a_tall_output() {
        // A chunk's hidden-state gradient (over the vocabulary), split or not.
        assert_eq!(PlaneRows::for_product(1536, 37_952), PlaneRows::Two);
        assert_eq!(PlaneRows::for_product(2048, 128_256), PlaneRows::Two);
        // A weight-gradient chunk product: two rows on a 4096-wide head only.
        assert_eq!(PlaneRows::for_product(4096, 2048), PlaneRows::Two);
        assert_eq!(PlaneRows::for_product(2048, 1536), PlaneRows::One);
        assert_eq!(PlaneRows::for_product(768, 5120), PlaneRows::One);
    }

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
