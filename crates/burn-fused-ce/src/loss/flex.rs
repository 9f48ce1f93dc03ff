//! The loss on Flex, Burn's CPU backend: the portable math (`portable.rs`) for the two row
//! ops; every other op takes its default body.

use burn::backend::{Flex, tensor::FloatTensor};

use crate::loss::extension::FusedCrossEntropyBackend;
use crate::loss::portable::{cross_entropy_backward, cross_entropy_rows};
use crate::loss::types::TwoPassBackward;
use crate::options::CrossEntropyOptions;
use crate::values::{CrossEntropyInputs, RowStats};

impl FusedCrossEntropyBackend for Flex {
    fn cross_entropy_rows(
        inputs: CrossEntropyInputs<Self>,
        options: CrossEntropyOptions,
    ) -> RowStats<Self> {
        cross_entropy_rows::<Self>(inputs, &options)
    }

    fn cross_entropy_backward(
        inputs: CrossEntropyInputs<Self>,
        backward: TwoPassBackward<Self>,
        options: CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        cross_entropy_backward::<Self>(inputs, backward, &options)
    }
}
