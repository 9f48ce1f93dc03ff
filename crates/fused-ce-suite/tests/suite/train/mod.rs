//! Training: the language-model example's training loop (`lm.rs`) and burn-train's
//! `Learner` with our losses (`learner.rs`).

mod learner;
mod lm;
