//! The values the fused linear cross-entropy's op takes: the head and the call's tensors,
//! grouped as Burn's dispatch maps them (`ExtensionType`).

use burn::backend::{
    Backend, ExtensionType,
    tensor::{FloatTensor, IntTensor},
};

use crate::values::{ClassWeights, OptionalFloat, RowWeights};

/// The LM head: `weight [H, V]` (Burn's `Linear` layout) and, when it has one, `bias [V]`
/// (added in the logits' dtype; the functions refuse one of another dtype, the ops cast it).
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct LinearHead<B: Backend> {
    pub weight: FloatTensor<B>,
    #[extension_type]
    pub bias: OptionalFloat<B>,
}

/// The tensors of one call: `hidden [N, H]`, the head, `targets [N]`, the class weights
/// and the rows' weights (f32 `[N]` each).
#[derive(ExtensionType, Debug, Clone)]
#[extension_type(fusion: cfg(feature = "fusion"))]
pub struct LinearInputs<B: Backend> {
    pub hidden: FloatTensor<B>,
    #[extension_type]
    pub head: LinearHead<B>,
    pub targets: IntTensor<B>,
    #[extension_type]
    pub class_weights: ClassWeights<B>,
    #[extension_type]
    pub row_weights: RowWeights<B>,
}
