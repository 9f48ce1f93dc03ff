//! The runtime a launch targets, as the kernels' options see it.

use cubecl::prelude::*;

/// What the kernels may use of the runtime they are launched on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    /// The CUDA runtime: CUDA's fast-math options.
    pub(crate) cuda: bool,
    /// Inline PTX (`gpu_asm!`, the `ptx` module): the CUDA runtime compiling through CUDA
    /// C++. Neither SPIR-V nor cubecl-cuda's LLVM backend takes it.
    pub(crate) inline_ptx: bool,
}

impl Target {
    /// Not CUDA (wgpu, the CPU runtime).
    pub(crate) const OTHER: Self = Target {
        cuda: false,
        inline_ptx: false,
    };
    /// CUDA through CUDA C++ and NVRTC (cubecl-cuda's `cpp` feature).
    #[cfg(any(test, feature = "cuda-source"))]
    pub(crate) const CUDA_CPP: Self = Target {
        cuda: true,
        inline_ptx: true,
    };

    /// The runtime behind `client`. cubecl-cuda 0.11 compiles through LLVM unless its
    /// `cpp` feature is on (process-wide), and the LLVM backend refuses a kernel with
    /// inline assembly. The client does not say which backend it runs, but the LLVM one
    /// narrows the device's features to what it lowers, and complex numbers, which the
    /// C++ backend always advertises, are among those it takes away.
    pub(crate) fn of(client: &Client) -> Self {
        let cuda = client.name() == "cuda";
        let cpp = !client.properties().features.types.complex.is_empty();
        Target {
            cuda,
            inline_ptx: cuda && cpp,
        }
    }
}
