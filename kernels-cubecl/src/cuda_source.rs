//! The CUDA C++ of the one-pass kernel, generated on a machine with no GPU: the kernel's
//! IR is built as a launch on any runtime would build it (here lavapipe's), then compiled
//! by cubecl's CUDA compiler with the options the CUDA runtime uses on an H200. NVRTC and
//! `ptxas -v` then count its registers offline (`scripts/kernel_registers_offline.sh`):
//! the registers decide how many cubes an SM holds (docs/performance.md, v16). Tooling
//! only, behind the `cuda-source` feature.

use cubecl::Compiler;
use cubecl::prelude::*;
use cubecl_cpp::{
    cuda::{CudaDialect, mma::CudaWmmaCompiler},
    shared::{CompilationOptions, CppCompiler, CppSupportedFeatures},
};

use crate::split::cross_entropy_split_grad_kernel::{
    _F, _I, _N, CrossEntropySplitGradKernel, F as KernelF, I as KernelI, N as KernelN,
};
use crate::{RowLaunch, SplitPlan};

/// What `launch_forward_grad` would launch on an H200 for `shape`, as CUDA C++ (the IR
/// built through `client`, any runtime).
pub fn split_grad_kernel_source<R: Runtime>(
    client: &ComputeClient<R>,
    shape: RowLaunch,
    mean: bool,
) -> String {
    // As the CUDA runtime plans it (`FUSED_CE_STREAMING_ACCESS` as there).
    let plan = SplitPlan {
        streaming_access: crate::launch::streaming_access_knob(),
        ..SplitPlan::for_device(&shape, true)
    };
    let settings = KernelSettings::default()
        .cube_dim(CubeDim::new_1d(plan.cube_size as u32))
        .address_type(shape.address_type);
    let mut launcher = KernelLauncher::<R>::new(settings.clone());
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
        unsafe { TensorArg::<R>::from_raw_parts(handle, strides.into(), shape.into()) }
    };
    // The gradient over the logits, as when the loss owns them (the bench's case), or
    // with `FUSED_CE_SOURCE_SEPARATE=1` into a buffer of its own.
    let gradient_in_place = std::env::var("FUSED_CE_SOURCE_SEPARATE").as_deref() != Ok("1");
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
    let denominators = <Tensor<f32> as LaunchArg>::register(buffer(1), &mut launcher);
    let stats = <Tensor<f32> as LaunchArg>::register(buffer(2), &mut launcher);
    let predicted = <Tensor<KernelI> as LaunchArg>::register(buffer(1), &mut launcher);
    let grad = <Tensor<Vector<KernelF, KernelN>> as LaunchArg>::register(grad, &mut launcher);
    let tickets = <Tensor<Atomic<i32>> as LaunchArg>::register(buffer(1), &mut launcher);
    let partials = <Tensor<Atomic<i32>> as LaunchArg>::register(buffer(1), &mut launcher);
    // A scalar's compilation argument is `()`.
    <u32 as LaunchArg>::register(plan.chunk_vectors as u32, &mut launcher);
    let scalars = <crate::RowScalars as LaunchArg>::register(shape.scalars(), &mut launcher);
    let split = plan.options(mean, gradient_in_place);
    // As the CUDA runtime launches it (its exponential and tanh, knobs as there).
    let options = shape.options_on(true, plan.cube_size, plan.loads_per_step);
    let kernel = CrossEntropySplitGradKernel::<R>::new(
        settings,
        client.clone(),
        logits,
        targets,
        class_weights,
        weight_total,
        denominators,
        stats,
        predicted,
        grad,
        tickets,
        partials,
        (),
        scalars,
        shape.vector_size,
        options,
        split,
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
