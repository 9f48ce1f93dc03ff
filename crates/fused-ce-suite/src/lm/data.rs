//! Real English text as BPE tokens (OpenAI's vocabularies, shipped inside `tiktoken-rs`),
//! and the batches a language model trains on.

use rand::{Rng, rngs::SmallRng};
use tiktoken_rs::CoreBPE;

/// *Around the World in Eighty Days* (Jules Verne; Project Gutenberg eBook #103, public
/// domain), as the crate `esaxx-rs` 0.1.10 ships it in `data/eighty.txt`, without the
/// Gutenberg header and footer: the text the example and its test train on by default.
/// Read from this package's `examples/data/` (`crates/fused-ce-suite/examples/data/`).
pub const SAMPLE_TEXT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/data/around-the-world-in-80-days.txt"
));

/// A BPE vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vocabulary {
    /// GPT-2's `r50k_base`: 50257 tokens.
    Gpt2,
    /// `cl100k_base`: 100277 tokens.
    Cl100k,
}

impl Vocabulary {
    /// Tokens in the vocabulary (the LM head's width).
    pub fn size(self) -> usize {
        match self {
            Vocabulary::Gpt2 => 50_257,
            Vocabulary::Cl100k => 100_277,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Vocabulary::Gpt2 => "GPT-2 r50k_base",
            Vocabulary::Cl100k => "cl100k_base",
        }
    }

    /// The tokens of `text`.
    pub fn encode(self, text: &str) -> Vec<u32> {
        self.bpe().encode_ordinary(text)
    }

    fn bpe(self) -> &'static CoreBPE {
        match self {
            Vocabulary::Gpt2 => tiktoken_rs::r50k_base_singleton(),
            Vocabulary::Cl100k => tiktoken_rs::cl100k_base_singleton(),
        }
    }
}

/// A text as tokens.
pub struct Corpus {
    pub vocabulary: Vocabulary,
    pub tokens: Vec<u32>,
}

impl Corpus {
    pub fn new(text: &str, vocabulary: Vocabulary) -> Self {
        Self {
            vocabulary,
            tokens: vocabulary.encode(text),
        }
    }

    /// One batch of `batch` windows of `seq` tokens at random places: inputs `[batch,
    /// seq]` and next-token targets, both flattened row-major.
    pub fn batch(&self, batch: usize, seq: usize, rng: &mut SmallRng) -> (Vec<i64>, Vec<i64>) {
        let mut inputs = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        let last_start = self.tokens.len().saturating_sub(seq + 1).max(1);
        for _ in 0..batch {
            let start = rng.random_range(0..last_start);
            for i in 0..seq {
                let at = |k: usize| i64::from(self.tokens[(start + k) % self.tokens.len()]);
                inputs.push(at(i));
                targets.push(at(i + 1));
            }
        }
        (inputs, targets)
    }

    /// Text of `tokens` (lossy where a token cuts a character).
    pub fn decode(&self, tokens: &[u32]) -> String {
        self.vocabulary
            .bpe()
            .decode(tokens)
            .unwrap_or_else(|_| String::from("<undecodable>"))
    }
}

/// A prompt for sampling: the first `words` words of the first paragraph of prose in
/// `text`, the first one with a line of 40 lowercase letters or more (past a title page
/// and a table of contents), else of `text`.
pub fn prose_prompt(text: &str, words: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|line| line.chars().filter(char::is_ascii_lowercase).count() >= 40)
        .map_or(0, |prose| {
            lines[..prose]
                .iter()
                .rposition(|line| line.trim().is_empty())
                .map_or(0, |blank| blank + 1)
        });
    lines[start..]
        .iter()
        .flat_map(|line| line.split_whitespace())
        .take(words)
        .collect::<Vec<_>>()
        .join(" ")
}
