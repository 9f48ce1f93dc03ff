//! burn-train's `Learner` with our losses. `FusedSequenceOutput` feeds burn-train's own
//! loss, accuracy and perplexity metrics exactly what the f64 reference gives for the
//! same logits (ignored rows left out, the z-loss taken out of the perplexity); and the
//! language model trained through the `Learner` logs, step by step, the loss of the
//! hand-written loop for the same seed and batches.

use burn::data::dataloader::Progress;
use burn::tensor::{Tensor, TensorData};
use burn::train::ItemLazy;
use burn::train::metric::{
    AccuracyInput, AccuracyMetric, Adaptor, LossInput, LossMetric, Metric, MetricMetadata, Numeric,
    NumericEntry, PerplexityInput, PerplexityMetric, store::Split,
};
use burn_fused_ce::{
    CrossEntropyError, CrossEntropyOptions, ExtraOutputs, FusedSequenceOutput, Reduction,
    try_fused_cross_entropy,
};
use fused_ce_suite::lm::{
    LearnerRun, LossKind, initial_model, logged_metric, train, train_with_learner,
};

use super::lm::tiny_run;
use crate::common::*;

fn metadata() -> MetricMetadata {
    MetricMetadata {
        progress: Progress {
            items_processed: 1,
            items_total: 1,
            unit: None,
        },
        iteration: Some(1),
        lr: None,
    }
}

/// The value a metric shows for its last update.
fn shown<M: Metric + Numeric>(metric: &M) -> f64 {
    match metric.value() {
        Some(NumericEntry::Value(value)) => value,
        Some(NumericEntry::Aggregated {
            aggregated_value, ..
        }) => aggregated_value,
        other => panic!("{}: no value: {other:?}", metric.name()),
    }
}

fn check_metrics(backend: TestBackend) {
    let _backward = shared_device();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let device = backend.device().autodiff();
    let (rows, vocab) = (53, 211);
    for z_loss_scale in [0.0f32, 0.01] {
        let context = format!("{} z-loss {z_loss_scale} seed={seed}", backend.name());
        let values = random_logits(&mut rng, rows, vocab);
        let targets = random_targets(&mut rng, rows, vocab, Ignore::SomeRows, -100);
        let options = CrossEntropyOptions::new(Reduction::Mean)
            .with_z_loss_scale(z_loss_scale)
            .with_outputs(ExtraOutputs {
                accuracy: true,
                z_loss: true,
                ..ExtraOutputs::default()
            });
        let logits =
            Tensor::<2>::from_data(TensorData::new(values.clone(), [rows, vocab]), &device)
                .require_grad();
        let target_tensor = targets_tensor(&targets, &device);
        let output = try_fused_cross_entropy(logits, target_tensor.clone(), None, &options)
            .unwrap_or_else(|error| panic!("{context}: refused: {error}"));
        let item = FusedSequenceOutput::new(output, target_tensor, &options)
            .unwrap_or_else(|error| panic!("{context}: {error}"))
            .sync()
            .unwrap_or_else(|error| panic!("{context}: sync: {error:?}"));

        let seen: Vec<f64> = values.iter().map(|&v| v as f64).collect();
        let reference = reference_rows(&seen, vocab, &targets, &RefOptions::new(&options, None));
        let counted: Vec<_> = reference.iter().filter(|row| row.counted).collect();
        let mean = |part: fn(&RefRow) -> f64| {
            counted.iter().map(|row| part(row)).sum::<f64>() / counted.len() as f64
        };
        let expected_loss = mean(|row| row.ce) + mean(|row| row.z);
        let expected_accuracy = 100.0 * reference_accuracy(&reference, &targets);
        let expected_perplexity = mean(|row| row.ce).exp();

        let mut loss = LossMetric::new();
        let mut accuracy = AccuracyMetric::new();
        let mut perplexity = PerplexityMetric::new();
        let (loss_input, accuracy_input, perplexity_input): (
            LossInput,
            AccuracyInput,
            PerplexityInput,
        ) = (item.adapt(), item.adapt(), item.adapt());
        let meta = metadata();
        for update in [
            loss.update(&loss_input, &meta).map(drop),
            accuracy.update(&accuracy_input, &meta).map(drop),
            perplexity.update(&perplexity_input, &meta).map(drop),
        ] {
            update.unwrap_or_else(|error| panic!("{context}: a metric's read: {error:?}"));
        }
        let close = |name: &str, got: f64, want: f64, tolerance: f64| {
            assert!(
                (got - want).abs() <= tolerance * want.abs().max(1.0),
                "{context}: {name} shows {got}, the reference {want}"
            );
        };
        close("Loss", shown(&loss), expected_loss, 1e-5);
        // Exact: a share of whole tokens.
        close("Accuracy", shown(&accuracy), expected_accuracy, 1e-9);
        close("Perplexity", shown(&perplexity), expected_perplexity, 1e-5);
    }
}

#[test]
fn burn_trains_metrics_show_the_reference_from_the_fused_output_on_the_default_fusion_backend() {
    check_metrics(TestBackend::Fusion);
}

#[test]
fn burn_trains_metrics_show_the_reference_from_the_fused_output_on_flex() {
    check_metrics(TestBackend::Flex);
}

/// What the metrics need from the loss is asked for, with an error naming the option.
#[test]
fn the_sequence_output_names_the_option_it_needs() {
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let device = device();
    let (rows, vocab) = (6, 40);
    let values = random_logits(&mut rng, rows, vocab);
    let targets = random_targets(&mut rng, rows, vocab, Ignore::NoRows, -100);
    let with_accuracy = ExtraOutputs {
        accuracy: true,
        ..ExtraOutputs::default()
    };
    let cases = [
        ("outputs.accuracy", CrossEntropyOptions::default()),
        (
            "reduction",
            CrossEntropyOptions::new(Reduction::Sum).with_outputs(with_accuracy),
        ),
        (
            "outputs.z_loss",
            CrossEntropyOptions::default()
                .with_outputs(with_accuracy)
                .with_z_loss_scale(1e-4),
        ),
    ];
    for (option, options) in cases {
        let logits =
            Tensor::<2>::from_data(TensorData::new(values.clone(), [rows, vocab]), &device);
        let target_tensor = targets_tensor(&targets, &device);
        let output = try_fused_cross_entropy(logits, target_tensor.clone(), None, &options)
            .unwrap_or_else(|error| panic!("seed={seed} {option}: refused: {error}"));
        match FusedSequenceOutput::new(output, target_tensor, &options) {
            Err(CrossEntropyError::InvalidOption { name, .. }) => {
                assert_eq!(name, option, "seed={seed}")
            }
            other => panic!("seed={seed} {option}: expected its error, got {other:?}"),
        }
    }
}

/// The language model through burn-train's `Learner` (its metrics logged to files and
/// checkpoints written) logs each step the hand-written loop's loss for the same seed and
/// batches, with accuracy in [0, 100] and perplexity `exp(loss)`.
#[test]
fn the_learner_trains_the_hand_written_loops_curve() {
    let _backward = shared_device();
    let seed = fresh_seed();
    let (corpus, config, run) = tiny_run(seed, 3);
    let device = device().autodiff();
    let start = initial_model(&config, seed, &device);
    let (logs, _) = train(
        &config,
        &run,
        LossKind::FusedLinear,
        start.clone(),
        &corpus,
        &device,
        |_, _| {},
    );

    let directory = std::env::temp_dir().join(format!("fused-ce-learner-{seed}"));
    let _ = std::fs::remove_dir_all(&directory);
    let learner_run = LearnerRun {
        valid_steps: 2,
        checkpoints: true,
        summary: false,
    };
    let _result = train_with_learner(&config, &run, &learner_run, start, &corpus, &directory);
    let read = |name: &str, split: Split| {
        logged_metric(&directory, name, 1, split)
            .unwrap_or_else(|error| panic!("seed={seed}: reading {name}: {error}"))
    };
    let losses = read("Loss", Split::Train);
    let accuracies = read("Accuracy", Split::Train);
    let perplexities = read("Perplexity", Split::Train);
    assert_eq!(
        losses.len(),
        run.steps,
        "seed={seed}: one loss per step: {losses:?}"
    );
    assert_eq!(accuracies.len(), run.steps, "seed={seed}: {accuracies:?}");
    assert_eq!(
        perplexities.len(),
        run.steps,
        "seed={seed}: {perplexities:?}"
    );
    for step in 0..run.steps {
        let (hand, learner) = (logs[step].loss, losses[step]);
        assert!(
            (hand - learner).abs() <= 1e-5 * hand.abs(),
            "seed={seed} step {step}: the loop's loss {hand}, the Learner's {learner}"
        );
        let ppl = perplexities[step];
        assert!(
            (ppl - learner.exp()).abs() <= 1e-4 * ppl,
            "seed={seed} step {step}: perplexity {ppl}, exp(loss) {}",
            learner.exp()
        );
        assert!(
            (0.0..=100.0).contains(&accuracies[step]),
            "seed={seed} step {step}: accuracy {}",
            accuracies[step]
        );
    }
    let valid = read("Loss", Split::Valid);
    assert_eq!(
        valid.len(),
        learner_run.valid_steps,
        "seed={seed}: validation losses"
    );
    assert!(
        valid.iter().all(|loss| loss.is_finite() && *loss > 0.0),
        "seed={seed}: {valid:?}"
    );
    let checkpoints = directory.join("checkpoint");
    assert!(
        std::fs::read_dir(&checkpoints).is_ok_and(|mut entries| entries.next().is_some()),
        "seed={seed}: checkpoints in {}",
        checkpoints.display()
    );
    let _ = std::fs::remove_dir_all(&directory);
}

/// A batch whose every token is ignored counts no token: burn-train's running accuracy
/// and perplexity stay what the batch before made them.
#[test]
fn a_batch_of_ignored_tokens_leaves_the_running_metrics() {
    let seed = fresh_seed();
    let mut rng = rng(seed);
    let device = device();
    let (rows, vocab) = (9, 50);
    let options = CrossEntropyOptions::new(Reduction::Mean).with_outputs(ExtraOutputs {
        accuracy: true,
        ..ExtraOutputs::default()
    });
    let mut accuracy = AccuracyMetric::new();
    let mut perplexity = PerplexityMetric::new();
    let running = |metric: &dyn Fn() -> Option<NumericEntry>| match metric() {
        Some(NumericEntry::Aggregated {
            aggregated_value,
            count,
        }) => (aggregated_value, count),
        other => panic!("seed={seed}: a running value: {other:?}"),
    };
    let mut seen = Vec::new();
    for ignore in [Ignore::NoRows, Ignore::AllRows] {
        let values = random_logits(&mut rng, rows, vocab);
        let targets = random_targets(&mut rng, rows, vocab, ignore, -100);
        let logits = Tensor::<2>::from_data(TensorData::new(values, [rows, vocab]), &device);
        let target_tensor = targets_tensor(&targets, &device);
        let output = try_fused_cross_entropy(logits, target_tensor.clone(), None, &options)
            .unwrap_or_else(|error| panic!("seed={seed}: refused: {error}"));
        let item = FusedSequenceOutput::new(output, target_tensor, &options)
            .unwrap_or_else(|error| panic!("seed={seed}: {error}"));
        let meta = metadata();
        let accuracy_input: AccuracyInput = item.adapt();
        let perplexity_input: PerplexityInput = item.adapt();
        accuracy
            .update(&accuracy_input, &meta)
            .unwrap_or_else(|error| panic!("seed={seed} {ignore:?}: accuracy: {error:?}"));
        perplexity
            .update(&perplexity_input, &meta)
            .unwrap_or_else(|error| panic!("seed={seed} {ignore:?}: perplexity: {error:?}"));
        seen.push((
            running(&|| accuracy.running_value()),
            running(&|| perplexity.running_value()),
        ));
    }
    assert_eq!(seen[0].0.1, rows, "seed={seed}: the first batch's tokens");
    assert_eq!(seen[1], seen[0], "seed={seed}: after the ignored batch");
}
