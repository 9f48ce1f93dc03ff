//! Second oracle on a GPU host with PyTorch: writes random inputs and our CUDA results to a
//! folder so `scripts/torch_check.py` can compare them with
//! `torch.nn.functional.cross_entropy` (with `weight` and `label_smoothing`; softcap and
//! z-loss added around it). Each case is `reduction = None` with a non-uniform per-row
//! incoming gradient, plus the Mean loss; the cases cover the options alone and together.
//!
//!   torch_oracle <dir>     (then: python3 scripts/torch_check.py <dir>)

use burn::tensor::{DType, Device, Distribution, Int, Tensor, TensorData};
use burn_fused_ce::{CrossEntropyOptions, Reduction, try_fused_cross_entropy};

fn write(dir: &std::path::Path, name: &str, data: TensorData) {
    std::fs::write(dir.join(name), data.as_bytes()).expect("write oracle file");
}

fn main() {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "oracle".into()));
    std::fs::create_dir_all(&dir).expect("create oracle dir");
    // The build's GPU (CUDA in the oracle's build) as users have it, with Burn's fusion; the
    // losses and gradients on its autodiff device.
    let device = fused_ce_suite::device();
    let autodiff = device.clone().autodiff();
    let mut manifest = String::new();
    // (rows, vocab, dtype, label smoothing, z-loss scale, softcap, class weights)
    for (i, (rows, vocab, dtype, ls, z, cap, weighted)) in [
        (
            4096usize,
            32000usize,
            DType::BF16,
            0.0f32,
            0.0f32,
            None,
            false,
        ),
        (2048, 128256, DType::BF16, 0.1, 1e-4, Some(30.0f32), true),
        (1024, 151936, DType::F16, 0.1, 0.0, None, false),
        (2048, 50257, DType::F32, 0.0, 1e-4, None, true),
        (1024, 32000, DType::BF16, 0.0, 0.0, Some(15.0), false),
        (1024, 32000, DType::F32, 0.05, 1e-3, Some(30.0), true),
    ]
    .into_iter()
    .enumerate()
    {
        let logits = Tensor::<2>::random([rows, vocab], Distribution::Uniform(-8.0, 8.0), &device)
            .cast(dtype);
        let targets: Vec<i64> = (0..rows)
            .map(|r| {
                if r % 7 == 3 {
                    -100
                } else {
                    ((r as i64) * 7919 + 13) % vocab as i64
                }
            })
            .collect();
        let weights =
            Tensor::<1>::random([rows], Distribution::Uniform(0.25, 4.0), &device).cast(dtype);
        let class_weights = weighted
            .then(|| Tensor::<1>::random([vocab], Distribution::Uniform(0.2, 3.0), &device));
        if let Some(w) = &class_weights {
            write(&dir, &format!("{i}.class_weights"), w.clone().into_data());
        }
        let class_weights_ad = || class_weights.clone().map(Tensor::autodiff);
        let options = |reduction| {
            CrossEntropyOptions::default()
                .with_reduction(reduction)
                .with_label_smoothing(ls)
                .with_z_loss_scale(z)
                .with_softcap(cap)
        };
        let targets_t =
            |d: &Device| Tensor::<1, Int>::from_data(TensorData::new(targets.clone(), [rows]), d);

        write(&dir, &format!("{i}.logits"), logits.clone().into_data());
        write(&dir, &format!("{i}.weights"), weights.clone().into_data());
        write(
            &dir,
            &format!("{i}.targets"),
            TensorData::new(targets.clone(), [rows]),
        );

        let leaf = logits.autodiff().require_grad();
        let loss = try_fused_cross_entropy(
            leaf.clone() * 1.0,
            targets_t(&autodiff),
            class_weights_ad(),
            &options(Reduction::None),
        )
        .expect("valid input")
        .loss;
        let grads = (loss.clone() * weights.autodiff()).sum().backward();
        write(&dir, &format!("{i}.loss_none"), loss.inner().into_data());
        write(
            &dir,
            &format!("{i}.grad_none"),
            leaf.grad(&grads).expect("gradient").into_data(),
        );
        let mean = try_fused_cross_entropy(
            leaf.detach(),
            targets_t(&autodiff),
            class_weights_ad(),
            &options(Reduction::Mean),
        )
        .expect("valid input")
        .loss;
        write(&dir, &format!("{i}.loss_mean"), mean.inner().into_data());
        manifest.push_str(&format!(
            "{i} {rows} {vocab} {dtype:?} {ls} {z} {} {}\n",
            cap.unwrap_or(0.0),
            u8::from(weighted)
        ));
    }
    std::fs::write(dir.join("manifest.txt"), manifest).expect("write manifest");
    println!("wrote oracle cases to {}", dir.display());
}
