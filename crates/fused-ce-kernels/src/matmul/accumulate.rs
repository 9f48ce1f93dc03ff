//! The launch: the kernel the device runs, its operands passed as that kernel takes them.

use cubecl::{client::Client, ir::ElemType, prelude::*};
use cubek::matmul::{
    definition::{MatmulAvailabilityError, MatmulElems, MatmulGlobalElems, MatmulSetupError},
    multi_level::{
        args::{
            ConcreteInputsFactory, ConcreteOutputFactory, InputArg, MatmulArgs, OutputArg,
            TensorArgs, TensorMapArgs,
        },
        launch_kernel,
    },
};
use cubek::std::InputBinding;

use crate::matmul::plane_rows::PlaneRows;
use crate::matmul::routine::{DoubleBuffered, Specialized, SumKernel, SumRoutine, plan};
use crate::matmul::tma_rows::{has_tma, tma_readable};

/// `out += lhs rhs` for `lhs [M, K]`, `rhs [K, N]` and `out [M, N]` of the given dtypes,
/// `out` updated in place; or for a batch of them (`[B, M, K]`, `[B, K, N]`, `[B, M, N]`,
/// each operand's batch at any stride: slices of one matrix, [`split_k_slices`]). `lhs`
/// and `rhs` may be transposed views; `out`'s rows must be contiguous (its row stride may
/// be padded, as CUDA allocations are). `rows`: the tiling ([`PlaneRows::for_product`]
/// picks it from the shape). On a device with TMA, the specialized kernel, which also
/// needs each operand TMA-readable ([`tma_readable`]); elsewhere the double-buffered one
/// (the `matmul` module's docs). An error where the kernel does not suit the device, the
/// dtypes, the shapes, layouts or alignment: callers then form the product and add it.
///
/// [`split_k_slices`]: super::split_k::split_k_slices
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
