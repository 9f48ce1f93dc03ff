//! The op on `Fusion<B>` (what `burn::backend::Cuda` and `Wgpu` are with Burn's default
//! features): each kernel launch is registered in the fusion stream as a custom operation,
//! so the fused kernels around it keep working and it runs in stream order.
//!
//! Buffer ownership carries over: the stream hands the inner backend the logits' handle by
//! value when this op is their last use, which lets backward write the gradient over them.

use core::marker::PhantomData;

use burn::tensor::{DType, Shape, ops::FloatTensor, ops::IntTensor};
use burn_fusion::{
    Fusion, FusionBackend, FusionRuntime,
    stream::{Operation, OperationStreams},
};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use crate::{
    backend::{FusedCrossEntropyBackend, RowStats, SavedRows},
    options::CrossEntropyOptions,
};

type Handles<B> =
    HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

#[derive(Debug, Clone)]
struct RowsOp<B> {
    desc: CustomOpIr,
    options: CrossEntropyOptions,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime> for RowsOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([logits, targets], [loss, valid, lse, target_grad]) = self.desc.as_fixed();
        let rows = B::cross_entropy_rows(
            handles.get_float_tensor::<B>(logits),
            handles.get_int_tensor::<B>(targets),
            &self.options,
        );
        handles.register_float_tensor::<B>(&loss.id, rows.loss);
        handles.register_float_tensor::<B>(&valid.id, rows.valid);
        handles.register_float_tensor::<B>(&lse.id, rows.saved.lse);
        handles.register_float_tensor::<B>(&target_grad.id, rows.saved.target_grad);
    }
}

#[derive(Debug, Clone)]
struct BackwardOp<B> {
    desc: CustomOpIr,
    options: CrossEntropyOptions,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime> for BackwardOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([logits, targets, lse, target_grad, grad_scale], [grad]) = self.desc.as_fixed();
        let saved = SavedRows {
            lse: handles.get_float_tensor::<B>(lse),
            target_grad: handles.get_float_tensor::<B>(target_grad),
        };
        let output = B::cross_entropy_rows_backward(
            handles.get_float_tensor::<B>(logits),
            handles.get_int_tensor::<B>(targets),
            saved,
            handles.get_float_tensor::<B>(grad_scale),
            &self.options,
        );
        handles.register_float_tensor::<B>(&grad.id, output);
    }
}

impl<B: FusionBackend + FusedCrossEntropyBackend> FusedCrossEntropyBackend for Fusion<B> {
    fn cross_entropy_rows(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        options: &CrossEntropyOptions,
    ) -> RowStats<Self> {
        let client = logits.client.clone();
        let rows = Shape::new([logits.shape[0]]);
        let streams = OperationStreams::with_inputs([&logits, &targets]);
        let row_output =
            || TensorIr::uninit(client.create_empty_handle(), rows.clone(), DType::F32);
        let outputs = [row_output(), row_output(), row_output(), row_output()];
        let desc = CustomOpIr::new(
            "fused_cross_entropy_rows",
            &[logits.into_ir(), targets.into_ir()],
            &outputs,
        );
        let op = RowsOp::<B> {
            desc: desc.clone(),
            options: options.clone(),
            _backend: PhantomData,
        };
        let [loss, valid, lse, target_grad] = client
            .register(streams, OperationIr::Custom(desc), op)
            .try_into()
            .unwrap_or_else(|_| unreachable!("the op declares four outputs"));
        RowStats {
            loss,
            valid,
            saved: SavedRows { lse, target_grad },
        }
    }

    fn cross_entropy_rows_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        saved: SavedRows<Self>,
        grad_scale: FloatTensor<Self>,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        let client = logits.client.clone();
        let streams = OperationStreams::with_inputs([
            &logits,
            &targets,
            &saved.lse,
            &saved.target_grad,
            &grad_scale,
        ]);
        let grad = TensorIr::uninit(
            client.create_empty_handle(),
            logits.shape.clone(),
            logits.dtype,
        );
        let desc = CustomOpIr::new(
            "fused_cross_entropy_backward",
            &[
                logits.into_ir(),
                targets.into_ir(),
                saved.lse.into_ir(),
                saved.target_grad.into_ir(),
                grad_scale.into_ir(),
            ],
            &[grad],
        );
        let op = BackwardOp::<B> {
            desc: desc.clone(),
            options: options.clone(),
            _backend: PhantomData,
        };
        let [grad] = client
            .register(streams, OperationIr::Custom(desc), op)
            .try_into()
            .unwrap_or_else(|_| unreachable!("the op declares one output"));
        grad
    }
}
