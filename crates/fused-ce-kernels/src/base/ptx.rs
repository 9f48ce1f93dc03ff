//! Inline PTX (`gpu_asm!`) for what cubecl has no operation for: the flush-to-zero fast
//! exponential and logarithm, and the evict-first (`.cs`) loads and stores.
//!
//! Only the CUDA runtime's C++ backend (NVRTC) takes inline PTX: SPIR-V has no such thing,
//! and cubecl-cuda 0.11's LLVM backend (its default) has no lowering for it and refuses
//! the kernel. So every helper here is behind a comptime flag that the launches set only
//! there ([`Target`](crate::base::target::Target)); without it each one is the plain operation.

use core::f32::consts::LOG2_E;

use cubecl::prelude::*;

/// `exp(x)` as `ex2.approx.ftz.f32` of `x log2(e)`: two instructions. The
/// approximation is a few ulp; flushing to zero changes only results below 2^-126
/// (probabilities under 1.2e-38), where `ex2.approx.f32` would spend a range test and two
/// predicated multiplies per call to keep them, in loops that are near issue-bound.
#[cube]
pub(crate) fn exp_flush_to_zero(x: f32) -> f32 {
    let scaled = x * f32::new(LOG2_E);
    let y: f32;
    gpu_asm!(
        "ex2.approx.ftz.f32 {}, {};",
        out(_) y,
        in(_) scaled,
        options(pure, nomem)
    );
    y
}

/// [`exp_flush_to_zero()`] of each lane (PTX has no vector form of `ex2`).
#[cube]
pub(crate) fn exp_flush_to_zero_lanes<N: Size>(values: Vector<f32, N>) -> Vector<f32, N> {
    let mut exps = values;
    #[unroll]
    for lane in 0..values.vector_size() {
        exps.insert(lane, exp_flush_to_zero(values.extract(lane)));
    }
    exps
}

/// `log2(x)` as `lg2.approx.ftz.f32`: one instruction, absolute error about 2^-22;
/// inputs below 2^-126 give `-inf`, as [`exp_flush_to_zero()`] makes them 0.
#[cube]
pub(crate) fn log2_flush_to_zero(x: f32) -> f32 {
    let y: f32;
    gpu_asm!(
        "lg2.approx.ftz.f32 {}, {};",
        out(_) y,
        in(_) x,
        options(pure, nomem)
    );
    y
}

/// [`log2_flush_to_zero()`] of each lane.
#[cube]
pub(crate) fn log2_flush_to_zero_lanes<N: Size>(values: Vector<f32, N>) -> Vector<f32, N> {
    let mut logs = values;
    #[unroll]
    for lane in 0..values.vector_size() {
        logs.insert(lane, log2_flush_to_zero(values.extract(lane)));
    }
    logs
}

/// `tanh(x)` as `tanh.approx.f32` (one instruction, relative error about 2^-11), where
/// the C++ backend's `tanhf` is a long polynomial in loops that are near issue-bound.
#[cube]
pub(crate) fn tanh_approx(x: f32) -> f32 {
    let y: f32;
    gpu_asm!(
        "tanh.approx.f32 {}, {};",
        out(_) y,
        in(_) x,
        options(pure, nomem)
    );
    y
}

/// [`tanh_approx()`] of each lane.
#[cube]
pub(crate) fn tanh_approx_lanes<N: Size>(values: Vector<f32, N>) -> Vector<f32, N> {
    let mut tanhs = values;
    #[unroll]
    for lane in 0..values.vector_size() {
        tanhs.insert(lane, tanh_approx(values.extract(lane)));
    }
    tanhs
}

/// 16 bytes as PTX moves them in one `.v4.u32` access.
type Bits128 = Vector<u32, Const<4>>;

/// `tensor[index]`; with `streaming`, for a 16-byte vector, as `ld.global.cs` (evict first:
/// read once, it should not push out of L2 what is read again). Other widths load plainly.
#[cube]
pub(crate) fn load_vector<F: Float, N: Size>(
    tensor: &Tensor<Vector<F, N>>,
    index: usize,
    #[comptime] streaming: bool,
) -> Vector<F, N> {
    let bytes = Vector::<F, N>::size().comptime();
    if comptime!(streaming && bytes == 16) {
        let bits: Bits128;
        gpu_asm!(
            "ld.global.cs.v4.u32 {}, [{}];",
            out(_) bits,
            in(_) tensor.slice(index, index + 1).as_ptr(),
            options(pure, readonly)
        );
        Vector::<F, N>::reinterpret(bits)
    } else {
        tensor[index]
    }
}

/// `tensor[index] = value`; with `streaming`, for a 16-byte vector, as `st.global.cs`
/// (written once, it should not push out of L2 what is read again). Other widths store
/// plainly.
#[cube]
pub(crate) fn store_vector<F: Float, N: Size>(
    tensor: &mut Tensor<Vector<F, N>>,
    index: usize,
    value: Vector<F, N>,
    #[comptime] streaming: bool,
) {
    let bytes = Vector::<F, N>::size().comptime();
    if comptime!(streaming && bytes == 16) {
        // A register value, not a variable's address, for the asm's operand.
        let bits = Bits128::reinterpret(value);
        gpu_asm!(
            "st.global.cs.v4.u32 [{}], {};",
            mem_out(_) tensor.slice_mut(index, index + 1).as_mut_ptr(),
            in(_) bits,
            options(explicit_mem)
        );
    } else {
        tensor[index] = value;
    }
}
