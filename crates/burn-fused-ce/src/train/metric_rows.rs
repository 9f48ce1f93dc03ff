//! Stand-in rows for burn-train's accuracy and perplexity metrics. They take logits and
//! targets; these rows give them, per counted token, exactly the share and the mean
//! log-likelihood the loss's pass measured, over two classes instead of the vocabulary.

use burn::tensor::{Int, Tensor, TensorData};

/// `[C, 2]` outputs and `[C]` targets (class 0) for the `C` counted tokens: the first
/// `round(accuracy * C)` rows put their argmax on class 0, the others on class 1.
pub(crate) fn accuracy_rows(
    accuracy: &Tensor<1>,
    counted_tokens: &Tensor<1, Int>,
) -> (Tensor<2>, Tensor<1, Int>) {
    let counted = read_count(counted_tokens);
    let share = f64::from(read_float(accuracy));
    let correct = ((share * counted as f64).round() as usize).min(counted);
    let values: Vec<f32> = (0..counted)
        .flat_map(|row| {
            if row < correct {
                [1.0, 0.0]
            } else {
                [0.0, 1.0]
            }
        })
        .collect();
    rows(values, counted, accuracy)
}

/// `[C, 2]` outputs and `[C]` targets (class 0) whose log-softmax at the target is
/// `-cross_entropy` on every row: logits `[-ce, ln(1 - e^-ce)]`.
pub(crate) fn perplexity_rows(
    cross_entropy: &Tensor<1>,
    counted_tokens: &Tensor<1, Int>,
) -> (Tensor<2>, Tensor<1, Int>) {
    let counted = read_count(counted_tokens);
    let ce = f64::from(read_float(cross_entropy));
    // ln(1 - e^-ce) without cancellation; -inf at ce <= 0 (log-softmax 0 at the target).
    let other = if ce > 0.0 {
        (-(-ce).exp_m1()).ln()
    } else {
        f64::NEG_INFINITY
    };
    let row = [-ce as f32, other as f32];
    let values: Vec<f32> = (0..counted).flat_map(|_| row).collect();
    rows(values, counted, cross_entropy)
}

fn rows(values: Vec<f32>, counted: usize, like: &Tensor<1>) -> (Tensor<2>, Tensor<1, Int>) {
    let device = like.device();
    let outputs = Tensor::<2>::from_data(TensorData::new(values, [counted, 2]), &device);
    let targets =
        Tensor::<1, Int>::from_data(TensorData::new(vec![0i64; counted], [counted]), &device);
    (outputs, targets)
}

// burn-train's adaptors cannot fail; a read that fails here would fail in the metric too.
fn read_count(counted_tokens: &Tensor<1, Int>) -> usize {
    let count: i64 = counted_tokens
        .clone()
        .try_into_scalar()
        .unwrap_or_else(|error| panic!("reading the counted tokens for a metric: {error:?}"));
    usize::try_from(count).unwrap_or(0)
}

fn read_float(value: &Tensor<1>) -> f32 {
    value
        .clone()
        .try_into_scalar()
        .unwrap_or_else(|error| panic!("reading a loss statistic for a metric: {error:?}"))
}
