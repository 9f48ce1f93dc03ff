//! The CUDA C++ of the one-pass kernel, generated on a machine with no GPU: the kernel's
//! IR is built as a launch on any runtime would build it (here lavapipe's), then compiled
//! by cubecl's CUDA compiler with the options the CUDA runtime uses on an H200. NVRTC and
//! `ptxas -v` then count its registers offline (`scripts/kernel_registers_offline.sh`):
//! the registers decide how many cubes an SM holds. Tooling only, behind the
//! `cuda-source` feature.

use cubecl::Compiler;
use cubecl::prelude::*;
use cubecl_cpp::{
    cuda::{CudaDialect, mma::CudaWmmaCompiler},
    shared::{CompilationOptions, CppCompiler, CppSupportedFeatures},
};

use crate::one_pass::cross_entropy_one_pass_kernel::{
    _F, _I, _N, CrossEntropyOnePassKernel, F as KernelF, I as KernelI, N as KernelN,
};
use crate::{OnePassPlan, RowLaunch};

/// What `launch_one_pass` would launch on an H200 for `shape` (its tuning included), as
/// CUDA C++ (the IR built through `client`, any runtime), the gradient written over the
/// logits (`gradient_in_place`, when the loss owns them) or into a buffer of its own.
pub fn one_pass_kernel_source(
    client: &Client,
    shape: RowLaunch,
    mean: bool,
    gradient_in_place: bool,
) -> String {
    // As the CUDA runtime plans it.
    let plan = OnePassPlan::for_device(&shape, true, true);
    let settings = KernelSettings::default()
        .cube_dim(CubeDim::new_1d(plan.cube_size as u32))
        .address_type(shape.address_type);
    let mut launcher = KernelLauncher::::new(settings.clone());
    let dtypes = [shape.float_dtype, shape.int_dtype];
    launcher.with_scope(|scope| {
        scope.device_properties(client.properties());
        scope.register_type::<DynamicScalar<_F>>(dtypes[0]);
        scope.register_type::<DynamicScalar<_I>>(dtypes[1]);
        scope.register_size::<DynamicSize<_N>>(shape.vector_size);
    });
    // Buffers only give the arguments their kinds: one element each.
    let buffer = |dims: usize| {
        let handle = client.empty(16);
        let shape = vec![1usize; dims];
        let strides = vec![1usize; dims];
        unsafe { TensorArg::::from_raw_parts(handle, strides.into(), shape.into()) }
    };
    let target = if gradient_in_place {
        crate::GradientTarget::InPlace(buffer(3))
    } else {
        crate::GradientTarget::Separate {
            logits: buffer(3),
            grad: buffer(3),
        }
    };
    let (logits, grad) = target.into_args();
    let logits = <Tensor<Vector<KernelF, KernelN>> as LaunchArg>::register(logits, &mut launcher);
    let targets = <Tensor<KernelI> as LaunchArg>::register(buffer(2), &mut launcher);
    let class_weights = <Tensor<f32> as LaunchArg>::register(buffer(1), &mut launcher);
    let weight_total = <Tensor<f32> as LaunchArg>::register(buffer(1), &mut launcher);
    let scales = <Tensor<f32> as LaunchArg>::register(buffer(1), &mut launcher);
    let stats = <Tensor<f32> as LaunchArg>::register(buffer(2), &mut launcher);
    let predicted = <Tensor<KernelI> as LaunchArg>::register(buffer(1), &mut launcher);
    let grad = <Tensor<Vector<KernelF, KernelN>> as LaunchArg>::register(grad, &mut launcher);
    let tickets = <Tensor<Atomic<i32>> as LaunchArg>::register(buffer(1), &mut launcher);
    let partials = <Tensor<Atomic<i32>> as LaunchArg>::register(buffer(1), &mut launcher);
    // A scalar's compilation argument is `()`.
    <u32 as LaunchArg>::register(plan.chunk_vectors as u32, &mut launcher);
    let scalars = <crate::RowScalars as LaunchArg>::register(
        crate::launch::row_scalars(&shape),
        &mut launcher,
    );
    let one_pass = plan.options(mean, gradient_in_place);
    // As the CUDA runtime launches it (its exponential and tanh).
    let options = shape.options_on(true, plan.cube_size, plan.loads_per_step);
    let kernel = CrossEntropyOnePassKernel::::new(
        settings,
        client.clone(),
        logits,
        targets,
        class_weights,
        weight_total,
        scales,
        stats,
        predicted,
        grad,
        tickets,
        partials,
        (),
        scalars,
        shape.vector_size,
        options,
        one_pass,
        dtypes,
    );
    let mut compiler = CppCompiler::<CudaDialect<CudaWmmaCompiler>>::default();
    // As the CUDA runtime sets them for an sm_90 device (cubecl-cuda 0.10, runtime.rs).
    let compilation = CompilationOptions {
        warp_size: 32,
        supports_features: CppSupportedFeatures {
            grid_constants: true,
            clusters: true,
            fast_math: true,
            fast_tanh: true,
            elect_sync: true,
        },
    };
    let address = shape.address_type.unsigned_type();
    compiler
        .compile(
            kernel.define(),
            &compilation,
            ExecutionMode::Unchecked,
            address,
        )
        .map(|kernel| kernel.to_string())
        .unwrap_or_else(|error| format!("// compilation failed: {error:?}"))
}
