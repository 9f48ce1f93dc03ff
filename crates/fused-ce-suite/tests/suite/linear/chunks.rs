//! Chunk budgets: the rows per chunk and the columns per weight-gradient block a budget
//! gives, and the default budget within the device's largest buffer.

use burn::tensor::{DType, Tensor, TensorData};
use burn_fused_ce::linear::max_buffer_bytes;
use burn_fused_ce::{
    ChunkProducts, CrossEntropyOptions, LinearChunking, LinearCrossEntropyInputs, LmHead,
    Reduction, try_fused_linear_cross_entropy,
};

use super::{check_close, uniform};
use crate::common::*;

#[test]
fn chunk_rows_follow_the_budget() {
    let chunking = LinearChunking::default();
    // The default: chunks of 2048 rows whatever the vocabulary and dtype, spread evenly.
    assert_eq!(LinearChunking::DEFAULT_CHUNK_ROWS, 2048);
    assert_eq!(chunking.rows_per_chunk(8192, 128_256, DType::BF16), 2048);
    assert_eq!(chunking.rows_per_chunk(16384, 151_936, DType::BF16), 2048);
    assert_eq!(chunking.rows_per_chunk(8192, 32_000, DType::F32), 2048);
    assert_eq!(chunking.rows_per_chunk(600, 128_256, DType::BF16), 600);
    // 5000 rows: three chunks, of 1792 (1667 rounded up to a multiple of 128) and less.
    assert_eq!(chunking.rows_per_chunk(5000, 128_256, DType::BF16), 1792);
    // 200 rows a chunk fit: a multiple of 128 below 256 rows.
    let small_budget = LinearChunking {
        logits_bytes: Some(200 * 1000 * 4),
        ..LinearChunking::default()
    };
    assert_eq!(small_budget.rows_per_chunk(1000, 1000, DType::F32), 128);
    // 256 MiB: 1046 rows fit; 8192 rows take 8 chunks of 1024, not seven of 1040 and
    // one of 912.
    let quarter_gib = LinearChunking {
        logits_bytes: Some(256 << 20),
        ..LinearChunking::default()
    };
    assert_eq!(quarter_gib.rows_per_chunk(8192, 128_256, DType::BF16), 1024);
    // 157 MiB holds 641 rows: 13 chunks of 640 with cuBLASLt's tiles of 128 rows, 16 of
    // 512 in cubek-matmul's stages of 256 without it.
    let between_stages = LinearChunking {
        logits_bytes: Some(157 << 20),
        ..LinearChunking::default()
    };
    assert_eq!(
        between_stages.rows_per_chunk(8192, 128_256, DType::BF16),
        640
    );
    let cubecl_only = LinearChunking {
        products: ChunkProducts {
            cublaslt: false,
            ..between_stages.products
        },
        ..between_stages
    };
    assert_eq!(cubecl_only.rows_per_chunk(8192, 128_256, DType::BF16), 512);
    // Within a device's largest buffer: 128 MiB of f32 logits of 50257 classes hold 667
    // rows, 640 in whole tiles; 2000 rows take 4 chunks of 512 (500 rounded up).
    let lavapipe = chunking.within(Some(128 << 20), 50_257, DType::F32);
    assert_eq!(lavapipe.rows_per_chunk(2000, 50_257, DType::F32), 512);
    assert_eq!(lavapipe.logits_bytes, Some(128 << 20));
    // A larger buffer, or none known, leaves the budget as it is: the default's rows.
    let (vocab, dtype) = (128_256, DType::BF16);
    assert_eq!(
        chunking.within(Some(1 << 40), vocab, dtype),
        chunking.within(None, vocab, dtype)
    );
    assert_eq!(
        chunking.within(None, vocab, dtype).logits_bytes,
        Some(LinearChunking::DEFAULT_CHUNK_ROWS * vocab * dtype.size())
    );
    assert_eq!(quarter_gib.within(Some(1 << 40), vocab, dtype), quarter_gib);
    assert_eq!(chunking.rows_per_chunk(100, 128_256, DType::BF16), 100);
    let small = LinearChunking {
        logits_bytes: Some(1),
        weight_gradient_block_bytes: None,
        products: ChunkProducts {
            f32_weight_gradient: false,
            weight_gradient_in_place: false,
            hidden_gradient_split_k: true,
            cublaslt: true,
        },
    };
    assert_eq!(small.rows_per_chunk(100, 50, DType::F32), 16);
    assert_eq!(small.rows_per_chunk(5, 50, DType::F32), 5);
    // Weight-gradient blocks: 64 MiB of bf16 columns of 4096 rows hold 8192 columns.
    let blocks = LinearChunking {
        weight_gradient_block_bytes: Some(64 << 20),
        ..LinearChunking::default()
    };
    assert_eq!(
        blocks.weight_gradient_block_columns(4096, 128_256, DType::BF16),
        Some(8192)
    );
    assert_eq!(
        blocks.weight_gradient_block_columns(4096, 8192, DType::BF16),
        None
    );
    assert_eq!(
        blocks.weight_gradient_block_columns(1 << 30, 100, DType::F32),
        Some(1)
    );
    assert_eq!(
        chunking.weight_gradient_block_columns(4096, 128_256, DType::BF16),
        None
    );
    // Below a tile, multiples of 16: 64 rows fit, 130 rows go in three chunks of 48.
    let below_a_tile = LinearChunking {
        logits_bytes: Some(64 * 50 * 4),
        weight_gradient_block_bytes: None,
        products: ChunkProducts {
            f32_weight_gradient: false,
            weight_gradient_in_place: false,
            hidden_gradient_split_k: true,
            cublaslt: true,
        },
    };
    assert_eq!(below_a_tile.rows_per_chunk(130, 50, DType::F32), 48);
    // Never more than the budget holds, whatever the rows.
    for rows in 1..2000 {
        for fit in [16, 20, 100, 128, 200, 1046] {
            let budget = LinearChunking {
                logits_bytes: Some(fit * 50 * 4),
                weight_gradient_block_bytes: None,
                products: ChunkProducts {
                    f32_weight_gradient: false,
                    weight_gradient_in_place: false,
                    hidden_gradient_split_k: true,
                    cublaslt: true,
                },
            };
            let per = budget.rows_per_chunk(rows, 50, DType::F32);
            assert!(
                per >= 1 && per <= rows.max(1),
                "rows {rows} fit {fit}: {per}"
            );
            assert!(per <= fit.max(16), "rows {rows} fit {fit}: {per}");
            assert!(
                per == rows || per.is_multiple_of(16),
                "rows {rows} fit {fit}: {per}"
            );
        }
    }
}

/// The default chunk (`LinearChunking::DEFAULT_CHUNK_ROWS` rows) stays within the
/// device's largest buffer: where that buffer holds fewer rows of logits than the batch
/// (lavapipe's 128 MiB), the rows go in several chunks, and the loss and gradients equal
/// those of small explicit chunks, for `Mean` (scaled) and for `None` with non-uniform
/// per-row gradients. On `Fusion<CubeBackend>` (a cube device's `Tensor<D>`).
#[test]
fn default_chunks_fit_the_largest_buffer() {
    let _backward = shared_device();
    let device = device().autodiff();
    let largest = max_buffer_bytes(&device).expect("a cube device knows its largest buffer");
    let (width, vocab) = (8, 50_257);
    let row_bytes = vocab * DType::F32.size();
    if largest >= LinearChunking::DEFAULT_CHUNK_ROWS * row_bytes {
        eprintln!("the largest buffer ({largest} bytes) holds a default chunk: nothing to check");
        return;
    }
    let rows = largest / row_bytes + 16;
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let hidden_values = uniform(&mut rng, rows * width, 1.0);
    let weight_values = uniform(&mut rng, width * vocab, 0.5);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
    let row_weights = uniform(&mut rng, rows, 1.0);
    let small = LinearChunking {
        logits_bytes: Some((rows / 5) * row_bytes),
        ..LinearChunking::default()
    };
    for reduction in [Reduction::Mean, Reduction::None] {
        let run = |chunking: &LinearChunking| {
            let hidden = Tensor::<2>::from_data(
                TensorData::new(hidden_values.clone(), [rows, width]),
                &device,
            )
            .require_grad();
            let weight = Tensor::<2>::from_data(
                TensorData::new(weight_values.clone(), [width, vocab]),
                &device,
            )
            .require_grad();
            let loss = try_fused_linear_cross_entropy(
                LinearCrossEntropyInputs::new(
                    hidden.clone(),
                    LmHead::new(weight.clone()),
                    targets_tensor(&targets, &device),
                ),
                &CrossEntropyOptions::new(reduction),
                chunking,
            )
            .unwrap_or_else(|e| panic!("seed={seed}: refused: {e}"))
            .loss;
            let objective = match reduction {
                Reduction::None => (loss.clone()
                    * Tensor::<1>::from_data(
                        TensorData::new(row_weights.clone(), [rows]),
                        &device,
                    ))
                .sum(),
                _ => loss.clone() * 0.75,
            };
            let grads = objective.backward();
            [
                to_f64(loss.inner()),
                to_f64(hidden.grad(&grads).expect("a hidden-state gradient")),
                to_f64(weight.grad(&grads).expect("a weight gradient")),
            ]
        };
        let default = run(&LinearChunking::default());
        let explicit = run(&small);
        for (name, (got, expected)) in ["loss", "hidden gradient", "weight gradient"]
            .iter()
            .zip(default.iter().zip(&explicit))
        {
            check_close(
                got,
                expected,
                1e-5,
                &format!("{reduction:?} {name} seed={seed}"),
            );
        }
    }
}
