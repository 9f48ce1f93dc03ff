//! The errors bad input gets, shared by every layer: each names what was wrong, what was
//! expected and what was found, so that callers can match on them.

use burn::tensor::DType;

/// Which input of a call an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Input {
    /// The loss's logits, or a vocabulary shard's.
    Logits,
    /// The class indices.
    Targets,
    /// The class weights.
    ClassWeights,
    /// The fused linear cross-entropy's hidden states.
    Hidden,
    /// The LM head's weight.
    Weight,
    /// The LM head's bias.
    Bias,
    /// Per-row values handed back to a batch's rows (`CountedRows::spread`).
    PerRow,
    /// The rows' loss weights (`Targets::weights`).
    RowWeights,
    /// The rows' entropy weights (`Targets::entropy_weights`).
    EntropyWeights,
}

impl core::fmt::Display for Input {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::Logits => "logits",
            Self::Targets => "targets",
            Self::ClassWeights => "class weights",
            Self::Hidden => "hidden states",
            Self::Weight => "head's weight",
            Self::Bias => "head's bias",
            Self::PerRow => "per-row values",
            Self::RowWeights => "row weights",
            Self::EntropyWeights => "entropy weights",
        })
    }
}

/// Why a call refused its input. Every variant but a deferred target check's is detected
/// before any kernel of the call runs.
#[derive(Debug, Clone, PartialEq)]
pub enum CrossEntropyError {
    /// An option outside its domain, or two options that do not go together.
    InvalidOption {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    /// A tensor whose shape does not fit the call: `expected` says what would, `found` is
    /// the tensor's shape.
    ShapeMismatch {
        input: Input,
        expected: String,
        found: Vec<usize>,
    },
    /// A tensor of a dtype the call does not take: `expected` lists those it takes.
    DTypeMismatch {
        input: Input,
        expected: Vec<DType>,
        found: DType,
    },
    /// A class weight that is negative or not finite.
    InvalidClassWeight { class: usize, value: f32 },
    /// A target that is neither a class in `[0, vocab)` nor the ignore index.
    TargetOutOfRange {
        row: usize,
        value: i64,
        vocab: usize,
        /// Found by a deferred check: the row is one of an earlier call's targets.
        earlier_call: bool,
    },
    /// The vocabulary-parallel loss's exchange between shards failed.
    Exchange(String),
}

impl CrossEntropyError {
    /// [`Self::InvalidOption`]: option `name` is `value`, `expected` says what it may be.
    pub(crate) fn invalid_option(
        name: &'static str,
        value: impl ToString,
        expected: &'static str,
    ) -> Self {
        Self::InvalidOption {
            name,
            value: value.to_string(),
            expected,
        }
    }

    /// [`Self::ShapeMismatch`] of `input`, whose shape `found` is not `expected`.
    pub(crate) fn shape(input: Input, expected: impl ToString, found: &[usize]) -> Self {
        Self::ShapeMismatch {
            input,
            expected: expected.to_string(),
            found: found.to_vec(),
        }
    }

    /// [`Self::DTypeMismatch`] unless `found` is one of `expected`.
    pub(crate) fn check_dtype(input: Input, expected: &[DType], found: DType) -> Result<(), Self> {
        if expected.contains(&found) {
            return Ok(());
        }
        Err(Self::DTypeMismatch {
            input,
            expected: expected.to_vec(),
            found,
        })
    }

    /// [`Self::DTypeMismatch`] unless `found` is a float dtype: weights of any float dtype
    /// are cast to f32.
    pub(crate) fn check_float(input: Input, found: DType) -> Result<(), Self> {
        if found.is_float() {
            return Ok(());
        }
        Err(Self::DTypeMismatch {
            input,
            expected: vec![DType::F64, DType::F32, DType::F16, DType::BF16],
            found,
        })
    }
}

impl core::fmt::Display for CrossEntropyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::InvalidOption {
                name,
                value,
                expected,
            } => write!(
                f,
                "fused cross-entropy: option `{name}` is {value}, expected {expected}"
            ),
            Self::ShapeMismatch {
                input,
                expected,
                found,
            } => write!(
                f,
                "fused cross-entropy: {input} of shape {found:?}, expected {expected}"
            ),
            Self::DTypeMismatch {
                input,
                expected,
                found,
            } => write!(
                f,
                "fused cross-entropy: {input} of dtype {found:?}, expected {}",
                dtype_list(expected)
            ),
            Self::InvalidClassWeight { class, value } => write!(
                f,
                "fused cross-entropy: class weight {class} is {value}, expected a finite number >= 0"
            ),
            Self::TargetOutOfRange {
                row,
                value,
                vocab,
                earlier_call,
            } => write!(
                f,
                "fused cross-entropy: target {value} at row {row}{} is not a class in [0, {vocab}) nor the ignore index",
                if *earlier_call {
                    " of an earlier call (checked after it ran)"
                } else {
                    ""
                }
            ),
            Self::Exchange(why) => write!(
                f,
                "fused cross-entropy: the shards' exchange of row statistics failed: {why}"
            ),
        }
    }
}

impl std::error::Error for CrossEntropyError {}

/// `F32`, `F32 or F16`, `F32, F16 or BF16`.
fn dtype_list(dtypes: &[DType]) -> String {
    let names: Vec<String> = dtypes.iter().map(|dtype| format!("{dtype:?}")).collect();
    match names.split_last() {
        None => "nothing".into(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_is_wrong() {
        let error = CrossEntropyError::TargetOutOfRange {
            row: 7,
            value: 50_000,
            vocab: 32_000,
            earlier_call: false,
        };
        let text = error.to_string();
        assert!(text.contains("row 7") && text.contains("50000") && text.contains("32000"));
        let error = CrossEntropyError::TargetOutOfRange {
            row: 7,
            value: 50_000,
            vocab: 32_000,
            earlier_call: true,
        };
        assert!(error.to_string().contains("earlier call"));
        let error = CrossEntropyError::shape(Input::Bias, "[32000]", &[32001]);
        assert_eq!(
            error.to_string(),
            "fused cross-entropy: head's bias of shape [32001], expected [32000]"
        );
    }

    #[test]
    fn dtype_errors_name_the_input_and_both_dtypes() {
        let accepted = [DType::F32, DType::F16, DType::BF16];
        assert_eq!(
            CrossEntropyError::check_dtype(Input::Logits, &accepted, DType::F16),
            Ok(())
        );
        let error = CrossEntropyError::check_dtype(Input::Logits, &accepted, DType::F64)
            .expect_err("f64 logits are refused");
        assert_eq!(
            error,
            CrossEntropyError::DTypeMismatch {
                input: Input::Logits,
                expected: accepted.to_vec(),
                found: DType::F64,
            }
        );
        assert!(error.to_string().contains("F64") && error.to_string().contains("F16 or BF16"));
        let error = CrossEntropyError::check_dtype(Input::Bias, &[DType::BF16], DType::F32)
            .expect_err("an f32 bias on a bf16 head is refused");
        assert!(error.to_string().contains("expected BF16"), "{error}");
    }
}
