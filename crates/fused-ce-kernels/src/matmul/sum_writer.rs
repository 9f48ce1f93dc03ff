//! The output writer of `launch_matmul_accumulate`: cubek-matmul's plane writer
//! (`PlaneWriter`: each computing plane writes its tiles from shared memory to the output,
//! one vector per unit at a time) with the output's own value added to each vector before
//! it is written back, so that the kernel forms `out + lhs rhs`.
//!
//! The add happens in the writer rather than by loading the output as the tiles' initial
//! accumulator: that load needs a shared-memory stage of the whole output tile (in f32),
//! filled before the main loop, which holds fewer cubes on each SM and leaves the loop
//! waiting for it. Here the read is one vector per unit after the loop, where other
//! cubes on the SM can compute meanwhile. Each vector is read and written by the same
//! unit, once.

use cubecl::{
    prelude::*,
    std::tensor::{ViewMut, layout::Coords2d},
};
use cubek::matmul::multi_level::{
    components::{
        global::{
            GlobalWriter, GlobalWriterConfig, GlobalWriterFamily, PartitionedStage,
            PartitionedStageFamily, PlaneWriterFamily, WriteEvent, WriteEventExpand,
            WriteEventListener,
            read::tiled::{TiledCoords, TiledLayout},
        },
        stage::{PlanePartitioner, partition_coordinates},
    },
    definition::MatrixTypes,
    stage::StageMemoryConfig,
    tile::StridedTile,
};
use cubek::std::{InvalidConfigError, StageIdent};

/// The family of [`SumPlaneWriter`], for the routine's type.
pub struct SumPlaneWriterFamily;

impl GlobalWriterFamily for SumPlaneWriterFamily {
    type Stage = PartitionedStageFamily;
    type Writer<'a, IP: MatrixTypes> = SumPlaneWriter<'a, IP>;

    fn validate_with_config(config: &GlobalWriterConfig) -> Result<(), InvalidConfigError> {
        // The same layout of writes as cubek's plane writer: the same limits.
        PlaneWriterFamily::validate_with_config(config)
    }
}

/// Writes each plane's tiles from shared memory to the output, adding the output's value.
#[derive(CubeType)]
pub struct SumPlaneWriter<'a, IP: MatrixTypes> {
    global: ViewMut<'a, Vector<IP::Global, IP::GlobalSize>, TiledCoords>,
    stage: PartitionedStage<IP::Stage, IP::StageSize>,
    #[cube(comptime)]
    plane_dim: u32,
    #[cube(comptime)]
    smem_config: StageMemoryConfig,
}

#[cube]
impl<'a, IP: MatrixTypes> SumPlaneWriter<'a, IP> {
    fn write(&mut self, tile_pos: Coords2d) {
        let elements_in_tile = self.smem_config.comptime().elements_per_tile();
        let vector_size = self.global.vector_size().comptime() as u32;
        let unit_step = self.plane_dim.comptime() * vector_size;
        let num_unit_writes = elements_in_tile.div_ceil(unit_step);
        let balanced_workload = elements_in_tile.is_multiple_of(unit_step);

        // Units read vectors of the stage that other units of the plane stored.
        sync_plane();

        #[unroll(num_unit_writes == 1)]
        for i in 0..num_unit_writes {
            let unit_write = UNIT_POS_X * vector_size + i * unit_step;
            // The first branch is decided at compile time: no bounds check where every
            // unit's writes fall in the tile.
            #[allow(clippy::collapsible_else_if)]
            if balanced_workload {
                add_vector::<IP::Stage, IP::StageSize, IP::Global, IP::GlobalSize>(
                    &mut self.global,
                    &self.stage.unit_tile,
                    unit_write,
                    tile_pos,
                );
            } else {
                if unit_write < elements_in_tile {
                    add_vector::<IP::Stage, IP::StageSize, IP::Global, IP::GlobalSize>(
                        &mut self.global,
                        &self.stage.unit_tile,
                        unit_write,
                        tile_pos,
                    );
                }
            }
        }

        // The plane's next tile is stored into the same shared memory.
        sync_plane();
    }
}

#[cube]
impl<IP: MatrixTypes> WriteEventListener for SumPlaneWriter<'_, IP> {
    fn on_event(this: &mut Self, event: WriteEvent) {
        #[allow(clippy::single_match)]
        match event {
            WriteEvent::TileStored { tile } => {
                this.write(tile);
            }
            _ => {}
        }
    }
}

#[cube]
impl<'a, IP: MatrixTypes> GlobalWriter<'a, IP> for SumPlaneWriter<'a, IP> {
    type Stage = PartitionedStage<IP::Stage, IP::StageSize>;

    fn init(
        tensor: ViewMut<'a, Vector<IP::Global, IP::GlobalSize>, Coords2d>,
        #[comptime] config: GlobalWriterConfig,
    ) -> Self {
        let stage = PartitionedStage::new(
            partition_coordinates::<PlanePartitioner>(
                config.plane_flow_partition_rule,
                config.plane_dim,
                config.smem_config.partitions_per_stage_along_col,
            ),
            config.smem_config,
        );
        SumPlaneWriter::<'a, IP> {
            global: tensor.view_mut(TiledLayout::new(StageIdent::Out, config.smem_config)),
            stage,
            plane_dim: config.plane_dim,
            smem_config: config.smem_config,
        }
    }

    fn stage(this: &Self) -> Self::Stage {
        this.stage.clone()
    }
}

/// `out[v] += stage[v]` for the vector `v` at `unit_write` of the tile at `tile`, summed in
/// the stage's element type (the accumulator's, f32).
#[cube]
fn add_vector<ES: Numeric, NS: Size, EG: Numeric, NG: Size>(
    view: &mut ViewMut<Vector<EG, NG>, TiledCoords>,
    stage_tile: &StridedTile<ES, NS>,
    unit_write: u32,
    tile: Coords2d,
) {
    let out_vector_size = view.vector_size().comptime();
    let stage_vector_size = stage_tile.container.vector_size().comptime();

    let product = if out_vector_size == stage_vector_size {
        let offset = stage_tile.stage_offset(unit_write / out_vector_size as u32);
        Vector::<ES, NG>::cast_from(stage_tile.container[offset as usize])
    } else if stage_vector_size < out_vector_size
        && out_vector_size.is_multiple_of(stage_vector_size)
    {
        let mut value = Vector::<ES, NG>::empty();
        #[unroll]
        for i in 0..out_vector_size / stage_vector_size {
            let offset = stage_tile.stage_offset(unit_write + i as u32);
            #[unroll]
            for j in 0..stage_vector_size {
                value.insert(
                    i * stage_vector_size + j,
                    stage_tile.container[offset as usize].extract(j),
                );
            }
        }
        value
    } else {
        unimplemented!()
    };
    let sum = Vector::<ES, NG>::cast_from(view.read_checked((tile, unit_write))) + product;
    view.write_checked((tile, unit_write), Vector::cast_from(sum));
}
