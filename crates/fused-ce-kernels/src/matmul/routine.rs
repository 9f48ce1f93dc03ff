//! The kernels as cubek builds them, with the summing writer in place of cubek's plane
//! writer, and the planning of a launch on them.

use std::marker::PhantomData;

use cubecl::{
    client::Client,
    features::TypeUsage,
    ir::AddressType,
    prelude::*,
    zspace::{Shape, Strides},
};
use cubek::matmul::{
    definition::{
        AvailableVectorSizes, MatmulAvailabilityError, MatmulElems, MatmulProblem,
        MatmulSetupError, MatmulVectorSizes,
    },
    multi_level::{
        BatchMatmulRoutine, ExpandInfo, LaunchInfo,
        args::{ConfigRuntimeArg, InputRuntimeArg, MatmulArgs, OutputRuntimeArg},
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
        definition::{BatchMatmulBlueprint, CubeMappingLaunch},
        routines::{
            PlaneTilingBlueprintOptions, batch::specialized::SpecializedStrategy,
            infer_blueprint_plane,
        },
        tile::RowMajorTilingOrder,
    },
    routine::{BlueprintStrategy, DeviceSettings, Routine},
};
use cubek::std::InputBinding;

use crate::matmul::plane_rows::PlaneRows;
use crate::matmul::sum_writer::SumPlaneWriterFamily;

/// One of the kernels, as cubek builds it, with the summing writer in place of cubek's
/// plane writer, and no accumulator read before the main loop.
pub(crate) trait SumKernel: 'static + Send + Sync {
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
pub(crate) struct Specialized;

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
pub(crate) struct DoubleBuffered;

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
pub(crate) struct SumRoutine<K>(PhantomData<K>);

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

/// The problem and kernel `K`'s launch for `lhs rhs` into an output of the given shape,
/// strides and address type, of the given dtypes, tiled as `rows` says: on the first of
/// `K`'s tile instructions that takes it.
pub(crate) fn plan<K: SumKernel>(
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
