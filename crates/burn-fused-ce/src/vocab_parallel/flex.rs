//! The vocabulary-parallel ops on Flex, Burn's CPU backend: every op takes its default
//! body, the tensor-op versions around the loss's portable row op.

use burn::backend::Flex;

use crate::vocab_parallel::extension::VocabParallelBackend;

impl VocabParallelBackend for Flex {}
