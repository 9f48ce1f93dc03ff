//! Generated cases: shapes, options, reductions, dtypes and gradient plans nobody picked
//! by hand, each checked against the f64 reference as the hand-written cases are (outputs
//! poisoned first, non-uniform incoming gradients). One seed per run draws every case;
//! a failing case is shrunk (fewer rows, then fewer classes, the same options and input
//! seed) and reported with the run's seed, which `FUSED_CE_SEED` replays.

use std::panic::{AssertUnwindSafe, catch_unwind};

use burn::tensor::DType;
use burn_fused_ce::{CrossEntropyOptions, EntropyOutput, ExtraOutputs, Reduction};
use rand::{Rng, rngs::SmallRng};

use crate::common::*;
use crate::linear::{LinearCase, check_linear_case_seeded};
use crate::loss::contract::{Case, REDUCTIONS, check_case_seeded, poisoned};

/// Cases of the loss per run.
const LOSS_CASES: usize = 500;
/// Cases of the fused linear cross-entropy per run.
const LINEAR_CASES: usize = 100;
/// Class counts the generator favours besides small random ones: primes, powers of two
/// and their neighbours, and large vocabularies.
const VOCABS: [usize; 10] = [1, 2, 7, 127, 128, 129, 4093, 8192, 65521, 70000];

/// Rows: 0 now and then, mostly a few, sometimes more than a chunk of rows.
fn draw_rows(rng: &mut SmallRng) -> usize {
    match rng.random_range(0..10) {
        0 => 0,
        1..=6 => rng.random_range(1..=16),
        _ => rng.random_range(17..=64),
    }
}

fn draw_vocab(rng: &mut SmallRng, largest: usize) -> usize {
    let vocab = if rng.random_bool(0.3) {
        VOCABS[rng.random_range(0..VOCABS.len())]
    } else {
        rng.random_range(1..=600)
    };
    vocab.min(largest)
}

/// Every option, each on about half the time.
fn draw_options(rng: &mut SmallRng) -> CrossEntropyOptions {
    let reduction = REDUCTIONS[rng.random_range(0..REDUCTIONS.len())];
    let mut options = CrossEntropyOptions::new(reduction);
    if rng.random_bool(0.5) {
        options.label_smoothing = rng.random_range(0.01..0.5);
    }
    if rng.random_bool(0.5) {
        options.z_loss_scale = rng.random_range(1e-5..1e-2);
    }
    if rng.random_bool(0.4) {
        options.softcap = Some(rng.random_range(2.0..50.0));
    }
    if rng.random_bool(0.3) {
        options.temperature = Some(rng.random_range(0.25..4.0));
    }
    if rng.random_bool(0.3) {
        // An ignore index inside the vocabulary (rows whose target it is are ignored).
        options.ignore_index = rng.random_range(0..4);
    }
    options.gradient_plan = match rng.random_range(0..3) {
        0 => burn_fused_ce::GradientPlan::Auto,
        1 => burn_fused_ce::GradientPlan::OnePass,
        _ => burn_fused_ce::GradientPlan::TwoPass,
    };
    options
}

/// Each extra output asked for with probability 0.3 (all checked against the reference).
fn draw_outputs(rng: &mut SmallRng) -> ExtraOutputs {
    ExtraOutputs {
        z_loss: rng.random_bool(0.3),
        accuracy: rng.random_bool(0.3),
        predicted: rng.random_bool(0.3),
        lse: rng.random_bool(0.3),
        entropy: if rng.random_bool(0.3) {
            EntropyOutput::Metric
        } else {
            EntropyOutput::Off
        },
    }
}

fn draw_ignore(rng: &mut SmallRng) -> Ignore {
    match rng.random_range(0..10) {
        0 => Ignore::AllRows,
        1..=3 => Ignore::NoRows,
        _ => Ignore::SomeRows,
    }
}

fn draw_dtype(rng: &mut SmallRng) -> DType {
    let dtypes = float_dtypes();
    dtypes[rng.random_range(0..dtypes.len())]
}

/// A loss case and the seed of its inputs.
fn draw_loss_case(rng: &mut SmallRng) -> (Case, u64) {
    let rows = draw_rows(rng);
    // Large vocabularies with few rows only: lavapipe's time.
    let vocab = draw_vocab(rng, if rows > 16 { 8192 } else { 70000 });
    let dtype = draw_dtype(rng);
    let mut case = Case::new(rows, vocab, dtype, Reduction::Mean);
    case.options = draw_options(rng);
    case.options.outputs = draw_outputs(rng);
    case.ignore = draw_ignore(rng);
    case.class_weights = rng.random_bool(0.3);
    case.exclusive_logits = rng.random_bool(0.5);
    case.via_module = rng.random_bool(0.3);
    if rows.is_multiple_of(2) && rows > 0 && rng.random_bool(0.3) {
        case.batch = Some(2);
    }
    (case, rng.random())
}

/// A fused linear cross-entropy case (random width, bias or none, a chunk budget that
/// rarely divides the rows) and the seed of its inputs.
fn draw_linear_case(rng: &mut SmallRng) -> (LinearCase, u64) {
    let rows = rng.random_range(1..=48);
    let width = rng.random_range(1..=40);
    let vocab = rng.random_range(1..=300);
    let dtype = draw_dtype(rng);
    let mut case = LinearCase::new(rows, width, vocab, dtype, Reduction::Mean);
    case.options = draw_options(rng);
    case.ignore = draw_ignore(rng);
    case.bias = rng.random_bool(0.5);
    case.class_weights = rng.random_bool(0.3);
    case.chunk_rows = rng.random_range(16..=40);
    case.via_module = rng.random_bool(0.3);
    case.three_d = rows.is_multiple_of(2) && rng.random_bool(0.3);
    (case, rng.random())
}

/// Whether `check` panics, with its message.
fn failure(check: impl FnOnce()) -> Option<String> {
    catch_unwind(AssertUnwindSafe(check)).err().map(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// The smallest failing case `shrink` reaches from `case` (each step halves the rows or
/// the classes while the case still fails), with its failure.
fn shrunk<C: Clone + std::fmt::Debug>(
    case: C,
    message: String,
    mut smaller: impl FnMut(&C) -> Vec<C>,
    check: impl Fn(C) -> Option<String>,
) -> (C, String) {
    let (mut case, mut message) = (case, message);
    'search: loop {
        for candidate in smaller(&case) {
            if let Some(failed) = check(candidate.clone()) {
                (case, message) = (candidate, failed);
                continue 'search;
            }
        }
        return (case, message);
    }
}

#[test]
fn generated_loss_cases_match_the_reference() {
    poisoned();
    let seed = fresh_seed();
    let mut rng = rng(seed);
    for index in 0..LOSS_CASES {
        let (case, inputs) = draw_loss_case(&mut rng);
        let check = |case: Case| failure(|| check_case_seeded(TestBackend::Fusion, case, inputs));
        let Some(message) = check(case.clone()) else {
            continue;
        };
        let smaller = |case: &Case| {
            let mut out = Vec::new();
            if case.rows > 1 {
                let rows = case.rows / 2;
                let batch = case.batch.filter(|_| rows.is_multiple_of(2));
                out.push(Case {
                    rows,
                    batch,
                    ..case.clone()
                });
            }
            if case.vocab > 1 {
                out.push(Case {
                    vocab: case.vocab / 2,
                    ..case.clone()
                });
            }
            out
        };
        let (small, small_message) = shrunk(case.clone(), message.clone(), smaller, check);
        panic!(
            "generated loss case {index} failed (replay: FUSED_CE_SEED={seed}; its inputs' seed {inputs}):\n{case:?}\n{message}\nshrunk to {small:?}:\n{small_message}"
        );
    }
}

#[test]
fn generated_linear_cases_match_the_reference() {
    let seed = fresh_seed();
    let mut rng = rng(seed);
    for index in 0..LINEAR_CASES {
        let (case, inputs) = draw_linear_case(&mut rng);
        let check = |case: LinearCase| {
            failure(|| check_linear_case_seeded(TestBackend::Fusion, case, inputs))
        };
        let Some(message) = check(case.clone()) else {
            continue;
        };
        let smaller = |case: &LinearCase| {
            let mut out = Vec::new();
            if case.rows > 2 {
                let rows = case.rows / 2;
                out.push(LinearCase {
                    rows,
                    three_d: case.three_d && rows.is_multiple_of(2),
                    ..case.clone()
                });
            }
            if case.vocab > 1 {
                out.push(LinearCase {
                    vocab: case.vocab / 2,
                    ..case.clone()
                });
            }
            out
        };
        let (small, small_message) = shrunk(case.clone(), message.clone(), smaller, check);
        panic!(
            "generated linear case {index} failed (replay: FUSED_CE_SEED={seed}; its inputs' seed {inputs}):\n{case:?}\n{message}\nshrunk to {small:?}:\n{small_message}"
        );
    }
}

#[test]
fn shrinking_reaches_a_smallest_failing_case() {
    // Fails from 5 rows and 3 classes on: (40, 100) halves to (5, 3).
    let check = |(rows, vocab): (usize, usize)| {
        (rows >= 5 && vocab >= 3).then(|| format!("{rows}x{vocab}"))
    };
    let smaller = |&(rows, vocab): &(usize, usize)| vec![(rows / 2, vocab), (rows, vocab / 2)];
    let (small, message) = shrunk((40, 100), "40x100".into(), smaller, check);
    assert_eq!(small, (5, 3));
    assert_eq!(message, "5x3");
}
