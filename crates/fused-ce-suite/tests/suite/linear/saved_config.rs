//! Configs saved by earlier versions (serde): fields added since load with their
//! defaults, a renamed one keeps its value, a removed one is ignored; `ChunkProducts`
//! is saved flat within `LinearChunking`, as before it was split out.

use burn_fused_ce::{ChunkProducts, FusedLinearCrossEntropyLossConfig, LinearChunking};

/// A config saved without `weight_gradient_in_place`, `hidden_gradient_split_k`,
/// `cublaslt` (added later) or `f32_weight_gradient` still loads, with each at its
/// default, as a new config has them; one saved with the split's earlier name
/// (`hidden_gradient_in_place`) keeps its value.
#[test]
fn configs_saved_without_the_in_place_matmuls_load() {
    use burn::config::Config;
    assert!(ChunkProducts::default().weight_gradient_in_place);
    assert!(ChunkProducts::default().hidden_gradient_split_k);
    assert!(ChunkProducts::default().cublaslt);
    let config = FusedLinearCrossEntropyLossConfig::new().with_chunking(LinearChunking {
        logits_bytes: Some(1 << 20),
        products: ChunkProducts {
            weight_gradient_in_place: false,
            hidden_gradient_split_k: false,
            cublaslt: false,
            ..ChunkProducts::default()
        },
        ..LinearChunking::default()
    });
    let json = config.to_string();
    let renamed = json.replace("hidden_gradient_split_k", "hidden_gradient_in_place");
    let loaded = FusedLinearCrossEntropyLossConfig::load_binary(renamed.as_bytes())
        .unwrap_or_else(|error| panic!("a config with the earlier name loads: {error:?}"));
    assert_eq!(loaded, config, "the earlier name keeps its value");
    let fields = [
        "\"weight_gradient_in_place\": false",
        "\"hidden_gradient_split_k\": false",
        "\"cublaslt\": false",
        "\"f32_weight_gradient\": false",
    ];
    for field in fields {
        assert!(
            json.contains(field),
            "{field} is in the saved config: {json}"
        );
    }
    // Drop those fields' lines, then the comma left before a closing brace.
    let mut lines: Vec<String> = json
        .lines()
        .filter(|line| !fields.iter().any(|field| line.contains(field)))
        .map(str::to_string)
        .collect();
    for at in 1..lines.len() {
        if lines[at].trim_start().starts_with('}') {
            let before = lines[at - 1].trim_end().trim_end_matches(',').to_string();
            lines[at - 1] = before;
        }
    }
    let older = lines.join("\n");
    let loaded = FusedLinearCrossEntropyLossConfig::load_binary(older.as_bytes())
        .unwrap_or_else(|error| panic!("an older config loads: {error:?}\n{older}"));
    assert_eq!(
        loaded,
        config.with_chunking(LinearChunking {
            logits_bytes: Some(1 << 20),
            ..LinearChunking::default()
        })
    );
}

/// A config saved while `LinearChunking` had `weight_gradient_stream` (the weight
/// gradient's sums on a second CUDA stream, since removed) still loads, whatever it held:
/// the field is ignored, the rest keeps its values.
#[test]
fn configs_saved_with_the_removed_weight_gradient_stream_load() {
    use burn::config::Config;
    let config = FusedLinearCrossEntropyLossConfig::new().with_chunking(LinearChunking {
        logits_bytes: Some(1 << 20),
        products: ChunkProducts {
            cublaslt: false,
            ..ChunkProducts::default()
        },
        ..LinearChunking::default()
    });
    let json = config.to_string();
    let budget = "\"logits_bytes\": 1048576";
    assert!(
        json.contains(budget),
        "{budget} is in the saved config: {json}"
    );
    for stream in ["Backend", "BesideHiddenGradient", "BesideNextChunk"] {
        let older = json.replace(
            budget,
            &format!("\"weight_gradient_stream\": \"{stream}\",\n{budget}"),
        );
        assert_ne!(older, json);
        let loaded = FusedLinearCrossEntropyLossConfig::load_binary(older.as_bytes())
            .unwrap_or_else(|error| panic!("a config with {stream} loads: {error:?}\n{older}"));
        assert_eq!(
            loaded, config,
            "{stream}: the other fields keep their values"
        );
    }
}

/// Every field of `LinearChunking` away from its default saves flat (the products'
/// fields beside the budgets, no `products` key) and loads back unchanged.
#[test]
fn configs_with_every_field_set_round_trip_flat() {
    use burn::config::Config;
    let defaults = LinearChunking::default();
    let chunking = LinearChunking {
        logits_bytes: Some(3 << 20),
        weight_gradient_block_bytes: Some(5 << 20),
        products: ChunkProducts {
            f32_weight_gradient: !defaults.products.f32_weight_gradient,
            weight_gradient_in_place: !defaults.products.weight_gradient_in_place,
            hidden_gradient_split_k: !defaults.products.hidden_gradient_split_k,
            cublaslt: !defaults.products.cublaslt,
        },
    };
    let config = FusedLinearCrossEntropyLossConfig::new().with_chunking(chunking);
    let json = config.to_string();
    assert!(!json.contains("products"), "saved flat: {json}");
    let products = chunking.products;
    for field in [
        format!("\"logits_bytes\": {}", 3 << 20),
        format!("\"weight_gradient_block_bytes\": {}", 5 << 20),
        format!("\"f32_weight_gradient\": {}", products.f32_weight_gradient),
        format!(
            "\"weight_gradient_in_place\": {}",
            products.weight_gradient_in_place
        ),
        format!(
            "\"hidden_gradient_split_k\": {}",
            products.hidden_gradient_split_k
        ),
        format!("\"cublaslt\": {}", products.cublaslt),
    ] {
        assert!(
            json.contains(&field),
            "{field} is in the saved config: {json}"
        );
    }
    let loaded = FusedLinearCrossEntropyLossConfig::load_binary(json.as_bytes())
        .unwrap_or_else(|error| panic!("the saved config loads: {error:?}\n{json}"));
    assert_eq!(loaded, config);
    assert_eq!(loaded.chunking, chunking);
}
