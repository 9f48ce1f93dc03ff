//! Gate for the burn 0.22.1 port: a CUDA build of burn 0.22.1 (offline LLVM), Burn's
//! matmul timed, and our forward kernel on cubecl 0.11 checked against an f64 host
//! reference and timed.
use std::time::Instant;

use burn::tensor::{DType, Device, Distribution, Tensor};
use cubecl::future::block_on;
use cubecl::prelude::*;
use cubecl::ir::{ElemType, FloatKind, IntKind};
use fused_ce_kernels::{
    GradientTarget, KernelTuning, LossSettings, OnePassBuffers, OnePassPlan, OnePassScratch, RowLaunch,
    WeightArgs, launch_forward, launch_one_pass, row_stat, scale_slot,
};

fn burn_matmul(device: &Device, m: usize, k: usize, n: usize) {
    let a = Tensor::<2>::random([m, k], Distribution::Default, device).cast(DType::BF16);
    let b = Tensor::<2>::random([k, n], Distribution::Default, device).cast(DType::BF16);
    device.sync().unwrap();
    let t0 = Instant::now();
    let c = a.clone().matmul(b.clone());
    let _ = c.into_data();
    println!("burn matmul {m}x{k}x{n} first call (autotune) {:.1} s", t0.elapsed().as_secs_f64());
    let mut times = Vec::new();
    for _ in 0..7 {
        device.sync().unwrap();
        let t = Instant::now();
        for _ in 0..5 {
            let c = a.clone().matmul(b.clone());
            drop(c);
        }
        device.sync().unwrap();
        times.push(t.elapsed().as_secs_f64() / 5.0);
    }
    times.sort_by(|x, y| x.partial_cmp(y).unwrap());
    let med = times[times.len() / 2];
    let tflops = 2.0 * (m * k * n) as f64 / med / 1e12;
    println!("burn matmul {m}x{k}x{n} bf16: median {:.3} ms, {:.0} TFLOP/s", med * 1e3, tflops);
}

fn main() {
    let mut passed = true;
    // --- Burn 0.22.1 on CUDA ---
    let device = Device::cuda(0);
    burn_matmul(&device, 4096, 4096, 4096);
    burn_matmul(&device, 2048, 4096, 128256);
    burn_matmul(&device, 8192, 4096, 128256);

    // --- our forward kernel on cubecl 0.11's CUDA client ---
    let client = cubecl::Device::cuda(0).expect("cuda device").client();
    let rows = 8192usize;
    let vocab = 128256usize;
    let mut seed = 0x9E3779B97F4A7C15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let logits: Vec<half::bf16> = (0..rows * vocab)
        .map(|_| half::bf16::from_f64((next() - 0.5) * 8.0))
        .collect();
    let targets: Vec<i32> = (0..rows)
        .map(|r| if r % 17 == 3 { -100 } else { (next() * vocab as f64) as i32 % vocab as i32 })
        .collect();
    let logits_h = client.create_from_slice(as_bytes(&logits));
    let targets_h = client.create_from_slice(as_bytes(&targets));
    let poison = vec![f32::NAN; row_stat::COUNT * rows];
    let stats_h = client.create_from_slice(as_bytes(&poison));
    let predicted_h = client.create_from_slice(as_bytes(&vec![-7i32; rows]));
    let ones = client.create_from_slice(as_bytes(&[1.0f32; 4]));
    let tuning = KernelTuning::for_device(&client);
    let shape = RowLaunch {
        rows,
        vocab,
        vector_size: 8,
        address_type: AddressType::U32,
        float_dtype: ElemType::Float(FloatKind::BF16),
        int_dtype: ElemType::Int(IntKind::I32),
        settings: LossSettings { ignore_index: -100, exp_flush_to_zero: true, ..Default::default() },
        tuning,
    };
    let launch = |stats: &cubecl::server::Handle| unsafe {
        launch_forward(
            &client,
            shape,
            TensorArg::from_raw_parts(logits_h.clone(), [vocab * rows, vocab, 1].into(), [1, rows, vocab].into()),
            TensorArg::from_raw_parts(targets_h.clone(), [rows, 1].into(), [1, rows].into()),
            WeightArgs {
                weights: TensorArg::from_raw_parts(ones.clone(), [1].into(), [4].into()),
                total: TensorArg::from_raw_parts(ones.clone(), [1].into(), [1].into()),
            },
            TensorArg::from_raw_parts(stats.clone(), [rows, 1].into(), [row_stat::COUNT, rows].into()),
            TensorArg::from_raw_parts(predicted_h.clone(), [1].into(), [rows].into()),
        )
    };
    let t0 = Instant::now();
    launch(&stats_h);
    let bytes = client.read_one(stats_h.clone()).expect("read stats");
    println!("forward first launch (compile) {:.2} s", t0.elapsed().as_secs_f64());
    let stats: &[f32] = from_bytes(&bytes);
    let mut worst = 0f64;
    let mut bad = 0usize;
    for r in 0..rows {
        let loss = stats[row_stat::LOSS * rows + r] as f64;
        let expected = if targets[r] == -100 {
            0.0
        } else if r % 64 == 0 || r < 8 {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let max = row.iter().map(|v| v.to_f64()).fold(f64::MIN, f64::max);
            let sum: f64 = row.iter().map(|v| (v.to_f64() - max).exp()).sum();
            max + sum.ln() - row[targets[r] as usize].to_f64()
        } else {
            if !loss.is_finite() { bad += 1; }
            continue;
        };
        let err = (loss - expected).abs() / expected.abs().max(1.0);
        worst = worst.max(if err.is_nan() { f64::INFINITY } else { err });
    }
    println!("forward vs f64: worst relative error {worst:.2e} (checked rows), non-finite unchecked rows {bad}");
    if !(worst < 1e-5) || bad > 0 {
        passed = false;
    }
    let mut times = Vec::new();
    for _ in 0..9 {
        block_on(client.sync()).unwrap();
        let t = Instant::now();
        for _ in 0..10 {
            launch(&stats_h);
        }
        block_on(client.sync()).unwrap();
        times.push(t.elapsed().as_secs_f64() / 10.0);
    }
    times.sort_by(|x, y| x.partial_cmp(y).unwrap());
    let med = times[times.len() / 2];
    let gbs = (rows * vocab * 2) as f64 / med / 1e9;
    println!("forward bf16 {rows}x{vocab}: median {:.3} ms, {:.0} GB/s of logits read", med * 1e3, gbs);

    // --- the one pass (the default training step's kernel): Mean, guess 1, gradient into a
    // buffer of its own, NaN-poisoned ---
    let one_pass_shape = shape.for_one_pass();
    let plan = OnePassPlan::new(&client, &one_pass_shape);
    let grad_h = client.create_from_slice(as_bytes(&vec![half::bf16::NAN; rows * vocab]));
    let guess_h = client.create_from_slice(as_bytes(&[1.0f32]));
    let scales_h = client.empty(scale_slot::LEN * 4);
    let tickets_h = client.empty(4);
    let partials_h = client.empty(plan.partials_len(rows).max(1) * 4);
    let one_pass = |stats: &cubecl::server::Handle| unsafe {
        let arg = |h: &cubecl::server::Handle, strides: Vec<usize>, shape: Vec<usize>| {
            TensorArg::from_raw_parts(h.clone(), strides.into(), shape.into())
        };
        launch_one_pass(
            &client,
            one_pass_shape,
            plan,
            OnePassBuffers {
                target: GradientTarget::Separate {
                    logits: arg(&logits_h, vec![vocab * rows, vocab, 1], vec![1, rows, vocab]),
                    grad: arg(&grad_h, vec![vocab * rows, vocab, 1], vec![1, rows, vocab]),
                },
                targets: arg(&targets_h, vec![rows, 1], vec![1, rows]),
                weights: WeightArgs {
                    weights: arg(&ones, vec![1], vec![4]),
                    total: arg(&ones, vec![1], vec![1]),
                },
                stats: arg(stats, vec![rows, 1], vec![row_stat::COUNT, rows]),
                predicted: arg(&predicted_h, vec![1], vec![rows]),
                guess: arg(&guess_h, vec![1], vec![1]),
                denominators: None,
                scratch: OnePassScratch {
                    scales: arg(&scales_h, vec![1], vec![scale_slot::LEN]),
                    tickets: arg(&tickets_h, vec![1], vec![1]),
                    partials: arg(&partials_h, vec![1], vec![plan.partials_len(rows).max(1)]),
                },
            },
            true,
        )
    };
    let stats2_h = client.create_from_slice(as_bytes(&poison));
    let t0 = Instant::now();
    one_pass(&stats2_h);
    let grad_bytes = client.read_one(grad_h.clone()).expect("read grad");
    println!("one pass first launch (compile) {:.2} s", t0.elapsed().as_secs_f64());
    let grad: &[half::bf16] = from_bytes(&grad_bytes);
    let counted = targets.iter().filter(|&&t| t != -100).count() as f64;
    let mut worst_grad = 0f64;
    let mut non_finite = 0usize;
    for r in 0..rows {
        let row = &logits[r * vocab..(r + 1) * vocab];
        let g = &grad[r * vocab..(r + 1) * vocab];
        non_finite += g.iter().filter(|v| !v.to_f32().is_finite()).count();
        if !(r % 97 == 0 || r < 4 || targets[r] == -100 && r < 200) {
            continue;
        }
        let max = row.iter().map(|v| v.to_f64()).fold(f64::MIN, f64::max);
        let sum: f64 = row.iter().map(|v| (v.to_f64() - max).exp()).sum();
        for c in 0..vocab {
            let expected = if targets[r] == -100 {
                0.0
            } else {
                let p = (row[c].to_f64() - max).exp() / sum;
                (p - if c as i32 == targets[r] { 1.0 } else { 0.0 }) / counted
            };
            // bf16 output: half an ulp of the value, plus a floor for tiny probabilities.
            let err = (g[c].to_f64() - expected).abs() / (expected.abs() + 1e-12 / counted);
            if err.is_nan() || err > worst_grad {
                worst_grad = if err.is_nan() { f64::INFINITY } else { err };
            }
        }
    }
    println!("one pass gradient vs f64: worst relative error {worst_grad:.2e}, non-finite values {non_finite}");
    if !(worst_grad < 8e-3) || non_finite > 0 {
        passed = false;
    }
    let mut times = Vec::new();
    for _ in 0..9 {
        block_on(client.sync()).unwrap();
        let t = Instant::now();
        for _ in 0..10 {
            one_pass(&stats2_h);
        }
        block_on(client.sync()).unwrap();
        times.push(t.elapsed().as_secs_f64() / 10.0);
    }
    times.sort_by(|x, y| x.partial_cmp(y).unwrap());
    let med = times[times.len() / 2];
    let gbs = (rows * vocab * 4) as f64 / med / 1e9;
    println!("one pass bf16 {rows}x{vocab} (read + write): median {:.3} ms, {:.0} GB/s", med * 1e3, gbs);
    println!("{}", if passed { "GATE PASSED" } else { "GATE FAILED" });
}

fn as_bytes<T: Copy>(values: &[T]) -> &[u8] {
    unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values)) }
}
fn from_bytes<T: Copy>(bytes: &[u8]) -> &[T] {
    unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size_of::<T>()) }
}
