//! A GPT-style causal language model: token and position embeddings, pre-norm
//! transformer blocks with causal attention, a final layer norm and the LM head.

use burn::{
    module::Module,
    nn::{
        Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig,
        attention::generate_autoregressive_mask,
        transformer::{TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput},
    },
    tensor::{Device, Int, Tensor},
};

/// The model's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptConfig {
    pub vocab: usize,
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    /// Longest sequence (positions).
    pub seq_len: usize,
}

impl GptConfig {
    /// Parameters of the model.
    pub fn parameters(&self) -> usize {
        let d = self.d_model;
        let block = 12 * d * d + 13 * d;
        self.vocab * d * 2 + self.seq_len * d + self.layers * block + 2 * d
    }
}

#[derive(Module, Debug)]
pub struct Gpt {
    tokens: Embedding,
    positions: Embedding,
    blocks: TransformerEncoder,
    norm: LayerNorm,
    /// `[d_model, vocab]`, no bias (GPT-2's head).
    pub head: Linear,
}

impl Gpt {
    /// The model with freshly drawn (lazily initialised) parameters on `device`: an
    /// autodiff device to train it.
    pub fn new(config: &GptConfig, device: &Device) -> Self {
        Self {
            tokens: EmbeddingConfig::new(config.vocab, config.d_model).init(device),
            positions: EmbeddingConfig::new(config.seq_len, config.d_model).init(device),
            blocks: TransformerEncoderConfig::new(
                config.d_model,
                4 * config.d_model,
                config.heads,
                config.layers,
            )
            .with_norm_first(true)
            .with_dropout(0.0)
            .init(device),
            norm: LayerNormConfig::new(config.d_model).init(device),
            head: LinearConfig::new(config.d_model, config.vocab)
                .with_bias(false)
                .init(device),
        }
    }

    /// The last hidden states `[batch * seq, d_model]` for input tokens `[batch, seq]`:
    /// what the LM head takes.
    pub fn hidden(&self, input: Tensor<2, Int>) -> Tensor<2> {
        let [batch, seq] = input.dims();
        let device = input.device();
        let positions = Tensor::<1, Int>::arange(0..seq as i64, &device)
            .unsqueeze_dim::<2>(0)
            .expand([batch, seq]);
        let x = self.tokens.forward(input) + self.positions.forward(positions);
        let mask = generate_autoregressive_mask(batch, seq, &device);
        let x = self
            .blocks
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        let [_, _, d_model] = x.dims();
        self.norm.forward(x).reshape([batch * seq, d_model])
    }

    /// Logits `[batch * seq, vocab]` for input tokens `[batch, seq]`.
    pub fn forward(&self, input: Tensor<2, Int>) -> Tensor<2> {
        self.head.forward(self.hidden(input))
    }
}
