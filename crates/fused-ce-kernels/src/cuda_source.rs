//! The CUDA C++ of the one-pass and forward kernels as the CUDA runtime's C++ backend
//! compiles them for an H200, generated on a machine with no GPU and no runtime: each
//! kernel is defined from its compilation arguments and an H200's properties, then
//! compiled by cubecl-cpp's CUDA compiler. NVRTC and `ptxas -v` then check the result
//! offline (`lab/kernel_registers_offline.sh`): the inline PTX that only this backend
//! takes (`base/ptx.rs`), and the registers, which decide how many cubes an SM holds. Tooling
//! only, behind the `cuda-source` feature.

use std::sync::Arc;

use cubecl::Compiler;
use cubecl::ir::{DeviceIdentity, HardwareProperties, MemoryDeviceProperties, features::Features};
use cubecl::prelude::*;
use cubecl_cpp::shared::{CompilationOptions, CppCompiler, CppSupportedFeatures};
use cubecl_cpp::target::Cuda;

use crate::base::row::RowScalarsCompilationArg;
use crate::base::row_launch::RowLaunch;
use crate::base::target::Target;
use crate::one_pass::OnePassPlan;
use crate::one_pass::cross_entropy_one_pass_kernel::CrossEntropyOnePassKernel;
use crate::rows::cross_entropy_forward_kernel::CrossEntropyForwardKernel;

/// What `launch_one_pass` would launch on an H200 for `shape` (its tuning included), as
/// CUDA C++: the gradient written over the logits (`gradient_in_place`, when the loss owns
/// them) or into a buffer of its own.
pub fn one_pass_kernel_source(shape: RowLaunch, mean: bool, gradient_in_place: bool) -> String {
    let plan = OnePassPlan::for_device(&shape, true, true);
    let kernel = CrossEntropyOnePassKernel::new(
        settings(&shape, plan.cube_size),
        h200(),
        Arc::new(TargetProperties::default()),
        tensor(None),
        tensor(None),
        tensor(None),
        tensor(None),
        tensor(None),
        // The row and entropy weights.
        tensor(None),
        tensor(None),
        tensor(None),
        tensor(None),
        // The gradient: input 0 again when written over the logits.
        tensor(gradient_in_place.then_some(0)),
        tensor(None),
        tensor(None),
        (),
        scalars(),
        shape.vector_size,
        shape.options_on(Target::CUDA_CPP, plan.cube_size, plan.loads_per_step),
        plan.options(mean),
        [shape.float_dtype, shape.int_dtype],
    );
    cuda_source(kernel)
}

/// What `launch_forward` would launch on an H200 for `shape`, as CUDA C++.
pub fn forward_kernel_source(shape: RowLaunch) -> String {
    let cube_size = shape.cube_size();
    let kernel = CrossEntropyForwardKernel::new(
        settings(&shape, cube_size),
        h200(),
        Arc::new(TargetProperties::default()),
        tensor(None),
        tensor(None),
        tensor(None),
        tensor(None),
        tensor(None),
        tensor(None),
        scalars(),
        shape.vector_size,
        shape.options_on(Target::CUDA_CPP, cube_size, shape.tuning.row_loads),
        [shape.float_dtype, shape.int_dtype],
    );
    cuda_source(kernel)
}

/// As the launches set them: unchecked, the shape's address type.
fn settings(shape: &RowLaunch, cube_size: usize) -> KernelSettings {
    KernelSettings::new(
        *CubeDim::new_1d(cube_size as u32),
        ExecutionMode::Unchecked,
        shape.address_type,
    )
}

/// A tensor argument, `inplace` naming the input it aliases.
fn tensor(inplace: Option<usize>) -> TensorCompilationArg {
    TensorCompilationArg {
        meta: TensorMetaCompilationArg { len: (), rank: () },
        buffer: BufferCompilationArg { inplace },
    }
}

/// Runtime scalars have no compilation argument of their own.
fn scalars() -> RowScalarsCompilationArg {
    RowScalarsCompilationArg {
        ignore_index: (),
        label_smoothing: (),
        z_loss_scale: (),
        softcap: (),
        inv_temperature: (),
    }
}

/// What the kernels' code reads of an H200 (132 SMs, 227 KiB of shared memory per cube).
fn h200() -> Arc<DeviceProperties> {
    let hardware = HardwareProperties {
        load_width: 128,
        vector_register_count: None,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: 1024,
        max_shared_memory_size: 227 * 1024,
        max_cube_count: (u32::MAX, u16::MAX as u32, u16::MAX as u32),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: Some(132),
        num_tensor_cores: None,
        min_tensor_cores_dim: None,
        num_cpu_cores: None,
        last_level_cache_size: None,
        max_vector_size: VectorSize::MAX,
        cube_mma_reserved_shared_memory: 0,
    };
    Arc::new(DeviceProperties::new(
        Features::default(),
        MemoryDeviceProperties::new(u64::MAX, 256),
        hardware,
        cubecl::profile::TimingMethod::Device,
        DeviceIdentity {
            name: "H200 (offline)".to_string(),
            fingerprint: "offline-sm90".to_string(),
            physical: None,
        },
    ))
}

/// The kernel through cubecl-cpp's CUDA compiler, with the features the CUDA runtime
/// sets for an sm_90 device (cubecl-cuda 0.11, `runtime.rs`).
fn cuda_source(kernel: impl CubeKernel) -> String {
    let options = CompilationOptions {
        warp_size: 32,
        supports_features: CppSupportedFeatures {
            grid_constants: true,
            clusters: true,
            fast_math: true,
            fast_tanh: true,
            elect_sync: true,
            dp4a: true,
        },
        amd_wmma: None,
    };
    CppCompiler::<Cuda>::default()
        .compile(kernel.define(), &options)
        .map(|kernel| kernel.to_string())
        .unwrap_or_else(|error| format!("// compilation failed: {error:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CacheHints, KernelTuning, LossSettings};
    use cubecl::ir::{FloatKind, IntKind};

    fn shape(exp_flush_to_zero: bool, cache_hints: CacheHints) -> RowLaunch {
        let mut tuning = KernelTuning::defaults(true, true);
        tuning.cache_hints = cache_hints;
        RowLaunch {
            rows: 8192,
            vocab: 128_256,
            vector_size: 8,
            address_type: AddressType::U32,
            float_dtype: ElemType::Float(FloatKind::BF16),
            int_dtype: ElemType::Int(IntKind::I32),
            settings: LossSettings {
                ignore_index: -100,
                exp_flush_to_zero,
                ..Default::default()
            },
            tuning,
        }
    }

    #[test]
    fn the_inline_ptx_reaches_the_cuda_source() {
        let on = shape(true, CacheHints::LoadsAndStores);
        for in_place in [true, false] {
            let source = one_pass_kernel_source(on, true, in_place);
            for instruction in [
                "ex2.approx.ftz.f32",
                "ld.global.cs.v4.u32",
                "st.global.cs.v4.u32",
            ] {
                assert!(source.contains(instruction), "{instruction}:\n{source}");
            }
        }
        assert!(forward_kernel_source(on).contains("ex2.approx.ftz.f32"));
        let loads = one_pass_kernel_source(shape(false, CacheHints::Loads), true, true);
        assert!(loads.contains("ld.global.cs") && !loads.contains("st.global.cs"));
    }

    #[test]
    fn softcap_takes_the_hardware_tanh_for_bf16() {
        let mut capped = shape(true, CacheHints::LoadsAndStores);
        capped.settings.softcap = Some(30.0);
        capped.settings.approximate_tanh = true;
        assert!(one_pass_kernel_source(capped, true, true).contains("tanh.approx.f32"));
        assert!(forward_kernel_source(capped).contains("tanh.approx.f32"));
        capped.settings.approximate_tanh = false;
        assert!(!forward_kernel_source(capped).contains("tanh.approx.f32"));
    }

    #[test]
    fn without_the_options_the_source_has_no_inline_ptx() {
        // (cubecl's own atomics are inline PTX too: look for ours.)
        let ours = |source: String| source.contains("ex2.approx") || source.contains(".cs.");
        let off = shape(false, CacheHints::Off);
        assert!(!ours(one_pass_kernel_source(off, true, true)));
        assert!(!ours(forward_kernel_source(off)));
        // 8-byte vectors keep plain loads and stores.
        let mut narrow = shape(false, CacheHints::LoadsAndStores);
        narrow.vector_size = 4;
        assert!(!one_pass_kernel_source(narrow, true, true).contains(".cs."));
    }
}
