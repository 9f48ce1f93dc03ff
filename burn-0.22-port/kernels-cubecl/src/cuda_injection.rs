//! CUDA C++ injected into the generated kernels, for what cubecl 0.10 has no intrinsic
//! for: the flush-to-zero fast exponential and the evict-first cache hints.
//!
//! Each piece travels as a kernel comment that closes itself (`*/ ... /*`) and leaves
//! preprocessor text in the CUDA C++ source: cubecl's CUDA compiler emits comments as
//! they are, its SPIR-V compiler drops them. This depends on cubecl 0.10's code
//! generation: comments emitted verbatim, and the kernel's buffers named
//! `buffer_<binding>`. A cubecl upgrade must re-check both. The launches ask for these
//! only on the CUDA runtime.
//!
//! Tested by the CUDA suite (every kernel runs with them on, as by default) and offline:
//! `cargo run -p fused-ce-kernels --example cuda_source --features cuda-source` prints
//! the one-pass kernel's CUDA C++, which `scripts/kernel_registers_offline.sh` compiles
//! with NVRTC to check the PTX (`ex2.approx.ftz.f32`, `ld.global.cs`, `st.global.cs`).

use cubecl::prelude::*;

/// With `enabled`, makes the rest of the kernel's `__expf` (`row::fast_exp`) two
/// instructions instead of six: a multiply by log2(e) and `ex2.approx.ftz.f32`. Without
/// `-ftz` (cubecl 0.10 passes NVRTC fixed options) `__expf` also scales denormal results
/// (a range test and two predicated multiplies); flushing them to zero changes only
/// results below 2^-126 (probabilities under 1.2e-38), and the hot loops are near
/// issue-bound. Call it first in a kernel.
#[cube]
pub(crate) fn redefine_cuda_fast_exp(#[comptime] enabled: bool) {
    if comptime!(enabled) {
        comment!(
            "fast exponential:\n*/\n#define __expf(x) ([](float fce_x) { float fce_y; asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(fce_y) : \"f\"(fce_x * 1.44269504088896341f)); return fce_y; }(x))\n/*"
        );
    }
}

/// Declares, in the CUDA C++ of the kernel, `fce_buffer_0`: the kernel's first buffer
/// (the logits; with an in-place gradient also the gradient, an alias of it) whose
/// element reads become `ld.global.cs` (bit 0 of `mode`) and writes `st.global.cs` (bit
/// 1), for 16-byte vectors (others stay plain); with a gradient of its own, the same for
/// it (`fce_buffer_7`, written only), switched on for the whole kernel. [`cache_hints`]
/// then switches the kernel's `buffer_0[i]` between the proxy and the plain pointer by a
/// preprocessor definition. The gradient is the eighth binding of the one-pass kernel
/// when it is not an alias of the first.
#[cube]
pub(crate) fn declare_cache_hints(#[comptime] mode: u32, #[comptime] gradient_in_place: bool) {
    if comptime!(mode & 1 == 1) {
        comment!("streaming loads:\n*/\n#define FCE_LOAD_CS 1\n/*");
    }
    if comptime!(mode & 2 == 2) {
        comment!("streaming stores:\n*/\n#define FCE_STORE_CS 1\n/*");
    }
    if comptime!(mode != 0) {
        comment!(
            r#"streaming access:
*/
#ifndef FCE_LOAD_CS
#define FCE_LOAD_CS 0
#endif
#ifndef FCE_STORE_CS
#define FCE_STORE_CS 0
#endif
#define FCE_DECLARE_STREAMING(buf) \
auto fce_deref_##buf = [](decltype(buf) q) { return *q; }; \
typedef decltype(fce_deref_##buf(buf)) fce_value_##buf; \
struct fce_ref_##buf { \
  decltype(buf) p; \
  __device__ operator fce_value_##buf() const { \
    if (FCE_LOAD_CS && sizeof(fce_value_##buf) == 16) { \
      uint4 bits = __ldcs((const uint4*)p); \
      fce_value_##buf value; \
      memcpy(&value, &bits, 16); \
      return value; \
    } \
    return *p; \
  } \
  __device__ void operator=(const fce_value_##buf& value) const { \
    if (FCE_STORE_CS && sizeof(fce_value_##buf) == 16) { \
      uint4 bits; \
      memcpy(&bits, &value, 16); \
      __stcs((uint4*)p, bits); \
    } else { \
      *(fce_value_##buf*)p = value; \
    } \
  } \
}; \
struct fce_ptr_##buf { \
  decltype(buf) p; \
  __device__ fce_ref_##buf operator[](unsigned long long i) const { return fce_ref_##buf{p + i}; } \
}; \
const fce_ptr_##buf fce_##buf{buf};
FCE_DECLARE_STREAMING(buffer_0)
/*"#
        );
        if comptime!(!gradient_in_place) {
            comment!(
                "streaming gradient stores:\n*/\nFCE_DECLARE_STREAMING(buffer_7)\n#define buffer_7 fce_buffer_7\n/*"
            );
        }
    }
}

/// From here on in the kernel's text, `buffer_0[i]` goes through `fce_buffer_0` (`on`) or
/// is the plain pointer again (see [`declare_cache_hints`]).
#[cube]
pub(crate) fn cache_hints(#[comptime] mode: u32, #[comptime] on: bool) {
    if comptime!(mode != 0) {
        if comptime!(on) {
            comment!("streaming access on:\n*/\n#define buffer_0 fce_buffer_0\n/*");
        } else {
            comment!("streaming access off:\n*/\n#undef buffer_0\n/*");
        }
    }
}
