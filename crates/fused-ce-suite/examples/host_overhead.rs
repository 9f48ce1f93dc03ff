//! Host time of one loss call, apart from the device's: on a batch too small to keep the
//! device busy (256 x 32000 bf16), each phase of a training step is timed on the host
//! (the loss call, `backward()`, then the wait for the device), next to plain Burn ops for
//! scale. At such sizes a step is mostly host work the device waits for. On Burn 0.22 the
//! tensors run on the device as users have it, with Burn's fusion (the plain cube backend is
//! not reachable through `Tensor`): fusion queues ops and runs them at a sync or when its
//! queue fills, so part of a call's device work shows up in the wait.
//!
//!   host_overhead [rows vocab]     (CUDA build: scripts/gpu-bundle.sh host_overhead)

use std::time::Instant;

use burn::tensor::{DType, Device, Distribution, Int, Tensor};
use burn_fused_ce::{CrossEntropyOptions, GradientPlan, TargetCheck, fused_cross_entropy};

const REPS: usize = 20;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Median host microseconds of each phase over `REPS` calls of `step` on inputs from
/// `prepare` (made and synced before the clock starts); `step` returns the instants it
/// passed, and the device is synced after it.
fn phases<S>(
    device: &Device,
    mut prepare: impl FnMut() -> S,
    mut step: impl FnMut(S) -> Vec<Instant>,
) -> Vec<f64> {
    let sync = || device.sync().expect("sync");
    for _ in 0..5 {
        step(prepare());
        sync();
    }
    let mut columns: Vec<Vec<f64>> = Vec::new();
    for _ in 0..REPS {
        let input = prepare();
        sync();
        let start = Instant::now();
        let mut marks = step(input);
        sync();
        marks.push(Instant::now());
        let mut last = start;
        for (i, mark) in marks.iter().enumerate() {
            if columns.len() <= i {
                columns.push(Vec::new());
            }
            columns[i].push((*mark - last).as_secs_f64() * 1e6);
            last = *mark;
        }
    }
    columns.into_iter().map(median).collect()
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rows, vocab) = match args[..] {
        [rows, vocab] => (rows, vocab),
        _ => (256, 32000),
    };
    println!("{rows} x {vocab} bf16, host microseconds (medians of {REPS})");
    let device = fused_ce_suite::device();
    let autodiff = device.clone().autodiff();
    let logits = Tensor::<2>::random([rows, vocab], Distribution::Uniform(-6.0, 6.0), &device)
        .cast(DType::BF16);
    let targets =
        Tensor::<1, Int>::random([rows], Distribution::Uniform(0.0, vocab as f64), &device);
    let print = |name: &str, labels: &[&str], times: Vec<f64>| {
        let total: f64 = times.iter().sum();
        let parts: Vec<String> = labels
            .iter()
            .zip(&times)
            .map(|(label, t)| format!("{label} {t:.1}"))
            .collect();
        println!("{name:<34} total {total:7.1} us: {}", parts.join(", "));
    };

    print(
        "burn: x.sum()",
        &["call", "wait"],
        phases(
            &device,
            || (),
            |_| {
                let _ = logits.clone().sum();
                vec![Instant::now()]
            },
        ),
    );
    print(
        "burn: x * 2",
        &["call", "wait"],
        phases(
            &device,
            || (),
            |_| {
                let _ = logits.clone() * 2.0;
                vec![Instant::now()]
            },
        ),
    );
    for (name, target_check) in [
        ("fused fwd (default options)", TargetCheck::Deferred),
        ("fused fwd, unchecked", TargetCheck::Off),
    ] {
        let options = CrossEntropyOptions::default().with_target_check(target_check);
        print(
            name,
            &["call", "wait"],
            phases(
                &device,
                || (),
                |_| {
                    let _ = fused_cross_entropy(logits.clone(), targets.clone(), &options);
                    vec![Instant::now()]
                },
            ),
        );
    }
    for (name, gradient_plan) in [
        ("fused fwd+bwd two passes, unchecked", GradientPlan::TwoPass),
        ("fused fwd+bwd one pass, unchecked", GradientPlan::OnePass),
    ] {
        let options = CrossEntropyOptions::default()
            .with_gradient_plan(gradient_plan)
            .with_target_check(TargetCheck::Off);
        let owned = || logits.clone().mul_scalar(1.0).autodiff().require_grad();
        let targets_ad = || targets.clone().autodiff();
        print(
            name,
            &["loss", "backward", "wait"],
            phases(&device, owned, |x| {
                let loss = fused_cross_entropy(x, targets_ad(), &options);
                let forward = Instant::now();
                drop(loss.backward());
                vec![forward, Instant::now()]
            }),
        );
        // Five steps back to back, one sync at the end: what the device itself takes per
        // step when the host keeps ahead of it.
        let batch = 5;
        let per_step = phases(
            &device,
            || (0..batch).map(|_| owned()).collect::<Vec<_>>(),
            |inputs| {
                for x in inputs {
                    drop(fused_cross_entropy(x, targets_ad(), &options).backward());
                }
                vec![]
            },
        );
        println!(
            "{:<34} per step {:7.1} us ({batch} steps back to back, one sync)",
            name,
            per_step[0] / batch as f64
        );
        // The same, but the gradients dropped after the clock stops (in `prepare`): what
        // freeing the N x V gradient costs inside the step.
        let kept = std::cell::RefCell::new(Vec::new());
        print(
            &format!("{name}, gradients dropped later"),
            &["loss", "backward", "wait"],
            phases(
                &device,
                || {
                    kept.borrow_mut().clear();
                    owned()
                },
                |x| {
                    let loss = fused_cross_entropy(x, targets_ad(), &options);
                    let forward = Instant::now();
                    kept.borrow_mut().push(loss.backward());
                    vec![forward, Instant::now()]
                },
            ),
        );
        print(
            &format!("{name}, synced between"),
            &["loss", "wait", "backward", "wait"],
            phases(&device, owned, |x| {
                let loss = fused_cross_entropy(x, targets_ad(), &options);
                let forward = Instant::now();
                autodiff.sync().expect("sync");
                let forward_done = Instant::now();
                drop(loss.backward());
                vec![forward, forward_done, Instant::now()]
            }),
        );
    }
}
