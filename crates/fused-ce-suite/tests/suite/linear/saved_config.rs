//! Configs saved by earlier versions (serde): fields added since load with their
//! defaults, a renamed one keeps its value, a removed one is ignored.

use burn_fused_ce::{FusedLinearCrossEntropyLossConfig, LinearChunking};

/// A config saved before `weight_gradient_in_place`, `hidden_gradient_split_k` and
/// `cublaslt` existed still loads, with each at its default (on), as a new config has
/// them; one
/// saved with the split's earlier name (`hidden_gradient_in_place`) keeps its value.
#[test]
fn configs_saved_without_the_in_place_matmuls_load() {
    use burn::config::Config;
    assert!(LinearChunking::default().weight_gradient_in_place);
    assert!(LinearChunking::default().hidden_gradient_split_k);
    assert!(LinearChunking::default().cublaslt);
    let config = FusedLinearCrossEntropyLossConfig::new().with_chunking(LinearChunking {
        logits_bytes: Some(1 << 20),
        weight_gradient_in_place: false,
        hidden_gradient_split_k: false,
        cublaslt: false,
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
    ];
    for field in fields {
        assert!(
            json.contains(field),
            "{field} is in the saved config: {json}"
        );
    }
    // Drop both fields' lines, then the comma left before a closing brace.
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
        cublaslt: false,
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
