//! A GPT-style language model trained on real English text with a real BPE vocabulary,
//! shared by the `train_lm` example and its test: the LM head's loss as Burn's stock
//! loss, as our fused loss, and as the fused linear cross-entropy.

pub mod cpu;
pub mod data;
pub mod learner;
pub mod model;
pub mod parallel;
pub mod plot;
pub mod train;

pub use data::{Corpus, SAMPLE_TEXT, Vocabulary, prose_prompt};
pub use learner::{LearnerGpt, LearnerRun, logged_metric, train_with_learner};
pub use model::{Gpt, GptConfig};
pub use parallel::{GradientSync, ParallelError, train_data_parallel, train_data_parallel_with};
pub use train::{
    LossKind, RunConfig, Sampling, StepLog, initial_model, sample, sample_with, train,
};
