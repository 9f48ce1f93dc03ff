//! Writes the CUDA C++ of the one-pass kernel for the bench's LLM shapes, and of the
//! forward kernel for the first and with the accuracy, into a folder, as the CUDA runtime's C++ backend compiles
//! them for an H200: no GPU or runtime needed. `lab/kernel_registers_offline.sh` builds
//! and runs this, then compiles each kernel with NVRTC and ptxas from NVIDIA's pip wheels.
//!
//!   cargo run -p fused-ce-kernels --features cuda-source --example cuda_source -- OUT_DIR
//!
//! `FUSED_CE_TUNING` (space-separated `field=value`, see `KernelTuning::with_settings`)
//! changes the tuning; `FUSED_CE_SOURCE_SEPARATE=1` writes the variant whose gradient
//! has a buffer of its own.

use cubecl::ir::{ElemType, FloatKind, IntKind};
use cubecl::prelude::*;
use fused_ce_kernels::cuda_source::{forward_kernel_source, one_pass_kernel_source};
use fused_ce_kernels::{KernelTuning, LossSettings, RowLaunch};

fn main() {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "cuda-source".into());
    std::fs::create_dir_all(&out).expect("output folder");
    let tuning = KernelTuning::defaults(true, true)
        .with_settings(&std::env::var("FUSED_CE_TUNING").unwrap_or_default())
        .unwrap_or_else(|error| panic!("FUSED_CE_TUNING: {error}"));
    let gradient_in_place = std::env::var("FUSED_CE_SOURCE_SEPARATE").as_deref() != Ok("1");
    let bf16 = ElemType::Float(FloatKind::BF16);
    let f32_ = ElemType::Float(FloatKind::F32);
    let i32_ = ElemType::Int(IntKind::I32);
    let plain = LossSettings {
        ignore_index: -100,
        exp_flush_to_zero: true,
        approximate_tanh: true,
        ..Default::default()
    };
    let options = LossSettings {
        label_smoothing: 0.1,
        z_loss_scale: 1e-4,
        softcap: Some(30.0),
        ..plain
    };
    let outputs = LossSettings {
        argmax: true,
        entropy: true,
        ..plain
    };
    let accuracy = LossSettings {
        argmax: true,
        ..plain
    };
    let entropy = LossSettings {
        entropy: true,
        ..plain
    };
    let cases = [
        ("bf16_128256", bf16, 8, 128256, plain),
        ("bf16_128256_acc_entropy", bf16, 8, 128256, outputs),
        ("bf16_128256_accuracy", bf16, 8, 128256, accuracy),
        ("bf16_128256_entropy", bf16, 8, 128256, entropy),
        ("f32_128256", f32_, 4, 128256, plain),
        ("bf16_32000", bf16, 8, 32000, plain),
        ("bf16_128256_4_lanes", bf16, 4, 128256, plain),
        ("bf16_128256_ls_z_cap", bf16, 8, 128256, options),
    ];
    let write = |name: String, source: String| {
        let path = format!("{out}/{name}.cu");
        std::fs::write(&path, source).expect("write source");
        println!("{path}");
    };
    for (index, (name, dtype, vector_size, vocab, settings)) in cases.into_iter().enumerate() {
        let shape = RowLaunch {
            rows: 8192,
            vocab,
            vector_size,
            address_type: AddressType::U32,
            float_dtype: dtype,
            int_dtype: i32_,
            settings,
            tuning,
        };
        // The forward kernel alone (evaluation): plain, and with the accuracy.
        if index == 0 || index == 2 {
            write(format!("forward_{name}"), forward_kernel_source(shape));
        }
        let source = one_pass_kernel_source(shape.for_one_pass(), true, gradient_in_place);
        write(format!("one_pass_{name}"), source);
    }
}
