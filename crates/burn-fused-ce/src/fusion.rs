//! The op on `Fusion<B>` (what `burn::backend::Cuda` and `Wgpu` are with Burn's default
//! features): each kernel launch is registered in the fusion stream as a custom operation,
//! so the fused kernels around it keep working and it runs in stream order.
//!
//! Buffer ownership carries over: the stream hands the inner backend the logits' handle by
//! value when this op is their last use, which lets backward write the gradient over them.
//! Optional tensors (class weights, predictions, denominators) make the operations'
//! input and output lists variable; the options say which are there.

use core::marker::PhantomData;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::{Arc, Mutex};

use burn::tensor::{
    DType, Shape, TensorData, backend::ExecutionError, ops::FloatTensor, ops::IntTensor,
};
use burn_fusion::{
    Fusion, FusionBackend, FusionRuntime, FusionTensor,
    stream::{Operation, OperationStreams},
};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use crate::{
    backend::{
        ClassWeights, CrossEntropyInputs, FusedCrossEntropyBackend, OnePassScale, RowStats,
        TwoPassBackward, row_stat,
    },
    options::CrossEntropyOptions,
    target_check::PendingRead,
    vocab_parallel::{
        ExchangedRows, KernelBackwardRows, ShardBackwardRows, VocabShard, exchanged_rows,
    },
};

type Handles<B> =
    HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// Registers the custom op `op` (described by `desc`) in the stream: its `N` outputs, as
/// `desc` declares them.
fn declared_outputs<R: FusionRuntime, O: Operation<R> + 'static, const N: usize>(
    client: &burn_fusion::Client<R>,
    streams: OperationStreams,
    desc: CustomOpIr,
    op: O,
) -> [FusionTensor<R>; N] {
    client
        .register(streams, OperationIr::Custom(desc), op)
        .try_into()
        .unwrap_or_else(|_| unreachable!("the op declares {N} outputs"))
}

/// Reads the class weights (two tensors) from `inputs` when `weighted`.
fn weights_from<B: FusionBackend + FusedCrossEntropyBackend>(
    handles: &mut Handles<B>,
    inputs: &[TensorIr],
    weighted: bool,
) -> Option<ClassWeights<B>> {
    weighted.then(|| ClassWeights {
        weights: handles.get_float_tensor::<B>(&inputs[0]),
        total: handles.get_float_tensor::<B>(&inputs[1]),
    })
}

/// The forward op, or the one pass. Inputs: logits, targets, [weights, total], [guess,
/// [given denominators] when `one_pass`]; outputs: stats, [grad when `one_pass`],
/// [predicted].
#[derive(Debug, Clone)]
struct ForwardOp<B> {
    desc: CustomOpIr,
    options: CrossEntropyOptions,
    weighted: bool,
    one_pass: bool,
    given_denominators: bool,
    _backend: PhantomData<B>,
}

/// The call's inputs from the op's first inputs: logits, targets, [weights, total].
fn inputs_from<B: FusionBackend + FusedCrossEntropyBackend>(
    handles: &mut Handles<B>,
    inputs: &[TensorIr],
    weighted: bool,
) -> CrossEntropyInputs<B> {
    CrossEntropyInputs {
        class_weights: weights_from::<B>(handles, &inputs[2..], weighted),
        logits: handles.get_float_tensor::<B>(&inputs[0]),
        targets: handles.get_int_tensor::<B>(&inputs[1]),
    }
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime> for ForwardOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let outputs = &self.desc.outputs;
        let first_scale = if self.weighted { 4 } else { 2 };
        let scale = self.one_pass.then(|| OnePassScale {
            guess: handles.get_float_tensor::<B>(&self.desc.inputs[first_scale]),
            denominators: self
                .given_denominators
                .then(|| handles.get_float_tensor::<B>(&self.desc.inputs[first_scale + 1])),
        });
        let inputs = inputs_from::<B>(handles, &self.desc.inputs, self.weighted);
        let rows = if let Some(scale) = scale {
            let (rows, grad) = B::cross_entropy_one_pass(inputs, scale, &self.options);
            handles.register_float_tensor::<B>(&outputs[1].id, grad);
            rows
        } else {
            B::cross_entropy_rows(inputs, &self.options)
        };
        handles.register_float_tensor::<B>(&outputs[0].id, rows.stats);
        let predicted_at = if self.one_pass { 2 } else { 1 };
        if let (Some(predicted), Some(output)) = (rows.predicted, outputs.get(predicted_at)) {
            handles.register_int_tensor::<B>(&output.id, predicted);
        }
    }
}

/// The op's tensor inputs: logits, targets, then the class weights and their total.
fn inputs_with_weights<B: FusionBackend>(
    first: [FusionTensor<B::FusionRuntime>; 2],
    class_weights: Option<ClassWeights<Fusion<B>>>,
) -> Vec<FusionTensor<B::FusionRuntime>> {
    let mut inputs = Vec::from(first);
    if let Some(weights) = class_weights {
        inputs.push(weights.weights);
        inputs.push(weights.total);
    }
    inputs
}

/// Registers [`ForwardOp`] in the stream: the statistics, the one pass's gradient when
/// given its `scale`, and the predictions when the options track the argmax.
fn register_forward<B: FusionBackend + FusedCrossEntropyBackend>(
    inputs: CrossEntropyInputs<Fusion<B>>,
    options: &CrossEntropyOptions,
    scale: Option<OnePassScale<Fusion<B>>>,
) -> (RowStats<Fusion<B>>, Option<FloatTensor<Fusion<B>>>) {
    let one_pass = scale.is_some();
    let given_denominators = scale.as_ref().is_some_and(|s| s.denominators.is_some());
    let CrossEntropyInputs {
        logits,
        targets,
        class_weights,
    } = inputs;
    let client = logits.client.clone();
    let rows: usize = targets.shape.iter().product();
    let weighted = class_weights.is_some();
    let (grad_shape, grad_dtype, int_dtype) = (logits.shape.clone(), logits.dtype, targets.dtype);
    let mut inputs = inputs_with_weights::<B>([logits, targets], class_weights);
    if let Some(scale) = scale {
        inputs.push(scale.guess);
        inputs.extend(scale.denominators);
    }
    let streams = OperationStreams::with_inputs(inputs.iter());
    let output =
        |shape: Shape, dtype: DType| TensorIr::uninit(client.create_empty_handle(), shape, dtype);
    let mut outputs = vec![output(Shape::new([row_stat::COUNT, rows]), DType::F32)];
    if one_pass {
        outputs.push(output(grad_shape, grad_dtype));
    }
    if options.outputs.needs_argmax() {
        outputs.push(output(Shape::new([rows]), int_dtype));
    }
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new("fused_cross_entropy_rows", &inputs, &outputs);
    let op = ForwardOp::<B> {
        desc: desc.clone(),
        options: options.clone(),
        weighted,
        one_pass,
        given_denominators,
        _backend: PhantomData,
    };
    let mut outputs = client
        .register(streams, OperationIr::Custom(desc), op)
        .into_iter();
    let stats = outputs
        .next()
        .unwrap_or_else(|| unreachable!("the op declares its stats output"));
    let grad = if one_pass { outputs.next() } else { None };
    let rows = RowStats {
        stats,
        predicted: outputs.next(),
        weighted,
    };
    (rows, grad)
}

#[derive(Debug, Clone)]
struct ScaleOp<B> {
    desc: CustomOpIr,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime> for ScaleOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([grad, grad_output, guess], [output, next]) = self.desc.as_fixed();
        let (scaled, next_guess) = B::scale_one_pass_gradient(
            handles.get_float_tensor::<B>(grad),
            handles.get_float_tensor::<B>(grad_output),
            handles.get_float_tensor::<B>(guess),
        );
        handles.register_float_tensor::<B>(&output.id, scaled);
        handles.register_float_tensor::<B>(&next.id, next_guess);
    }
}

/// [`FusedCrossEntropyBackend::add_into_columns`] on the inner backend, as one op: the
/// stream hands it the sum's handle by value when this is the sum's last use.
#[derive(Debug, Clone)]
struct AddColumnsOp<B> {
    desc: CustomOpIr,
    start: usize,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime> for AddColumnsOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([sum, block], [output]) = self.desc.as_fixed();
        let summed = B::add_into_columns(
            handles.get_float_tensor::<B>(sum),
            handles.get_float_tensor::<B>(block),
            self.start,
        );
        handles.register_float_tensor::<B>(&output.id, summed);
    }
}

/// [`FusedCrossEntropyBackend::with_matmul_aligned_rows`] on the inner backend, as one op.
#[derive(Debug, Clone)]
struct MatmulAlignedRowsOp<B> {
    desc: CustomOpIr,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime>
    for MatmulAlignedRowsOp<B>
{
    fn execute(&self, handles: &mut Handles<B>) {
        let ([matrix], [output]) = self.desc.as_fixed();
        let aligned = B::with_matmul_aligned_rows(handles.get_float_tensor::<B>(matrix));
        handles.register_float_tensor::<B>(&output.id, aligned);
    }
}

/// [`FusedCrossEntropyBackend::accumulate_product`] on the inner backend, as one op: the
/// stream hands it the sum's handle by value when this is the sum's last use.
#[derive(Debug, Clone)]
struct AccumulateProductOp<B> {
    desc: CustomOpIr,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime>
    for AccumulateProductOp<B>
{
    fn execute(&self, handles: &mut Handles<B>) {
        let ([sum, lhs, rhs], [output]) = self.desc.as_fixed();
        let summed = B::accumulate_product(
            handles.get_float_tensor::<B>(sum),
            handles.get_float_tensor::<B>(lhs),
            handles.get_float_tensor::<B>(rhs),
        );
        handles.register_float_tensor::<B>(&output.id, summed);
    }
}

/// [`FusedCrossEntropyBackend::matmul_split_k`] on the inner backend, as one op.
#[derive(Debug, Clone)]
struct MatmulSplitKOp<B> {
    desc: CustomOpIr,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime>
    for MatmulSplitKOp<B>
{
    fn execute(&self, handles: &mut Handles<B>) {
        let ([lhs, rhs], [output]) = self.desc.as_fixed();
        let product = B::matmul_split_k(
            handles.get_float_tensor::<B>(lhs),
            handles.get_float_tensor::<B>(rhs),
        );
        handles.register_float_tensor::<B>(&output.id, product);
    }
}

/// [`FusedCrossEntropyBackend::shard_contributions`] on the inner backend. Inputs: logits,
/// targets, [weights, total]; output: the packed contributions.
#[derive(Debug, Clone)]
struct ContributionsOp<B> {
    desc: CustomOpIr,
    shard: VocabShard,
    options: CrossEntropyOptions,
    weighted: bool,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime>
    for ContributionsOp<B>
{
    fn execute(&self, handles: &mut Handles<B>) {
        let inputs = inputs_from::<B>(handles, &self.desc.inputs, self.weighted);
        let packed = B::shard_contributions(inputs, &self.shard, &self.options);
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, packed);
    }
}

/// [`FusedCrossEntropyBackend::shard_gradient_rows`] on the inner backend. Inputs: stats,
/// targets, logits, grad_output, [denominators], [weight total]; outputs: targets, stats,
/// coefficients, [smooth].
#[derive(Debug, Clone)]
struct GradientRowsOp<B> {
    desc: CustomOpIr,
    shard: VocabShard,
    options: CrossEntropyOptions,
    mean: bool,
    weighted: bool,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime>
    for GradientRowsOp<B>
{
    fn execute(&self, handles: &mut Handles<B>) {
        let inputs = &self.desc.inputs;
        let weight_total_at = if self.mean { 5 } else { 4 };
        let rows = ShardBackwardRows {
            stats: handles.get_float_tensor::<B>(&inputs[0]),
            targets: handles.get_int_tensor::<B>(&inputs[1]),
            logits: handles.get_float_tensor::<B>(&inputs[2]),
            grad_output: handles.get_float_tensor::<B>(&inputs[3]),
            denominators: self.mean.then(|| handles.get_float_tensor::<B>(&inputs[4])),
            weight_total: self
                .weighted
                .then(|| handles.get_float_tensor::<B>(&inputs[weight_total_at])),
        };
        let kernel_rows = B::shard_gradient_rows(rows, &self.shard, &self.options);
        let outputs = &self.desc.outputs;
        handles.register_int_tensor::<B>(&outputs[0].id, kernel_rows.targets);
        handles.register_float_tensor::<B>(&outputs[1].id, kernel_rows.stats);
        handles.register_float_tensor::<B>(&outputs[2].id, kernel_rows.coefficients);
        if let (Some(smooth), Some(output)) = (kernel_rows.smooth, outputs.get(3)) {
            handles.register_float_tensor::<B>(&output.id, smooth);
        }
    }
}

/// [`FusedCrossEntropyBackend::whole_vocabulary_rows`] on the inner backend. Inputs:
/// summed, targets, [weights, total], [shard totals]; outputs: stats, [predicted].
#[derive(Debug, Clone)]
struct WholeVocabularyOp<B> {
    desc: CustomOpIr,
    shard: VocabShard,
    options: CrossEntropyOptions,
    weighted: bool,
    smoothing: bool,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime>
    for WholeVocabularyOp<B>
{
    fn execute(&self, handles: &mut Handles<B>) {
        let inputs = &self.desc.inputs;
        let totals_at = if self.weighted { 4 } else { 2 };
        let exchanged = ExchangedRows {
            summed: handles.get_float_tensor::<B>(&inputs[0]),
            targets: handles.get_int_tensor::<B>(&inputs[1]),
            class_weights: weights_from::<B>(handles, &inputs[2..], self.weighted),
            shard_totals: self
                .smoothing
                .then(|| handles.get_float_tensor::<B>(&inputs[totals_at])),
        };
        let rows = B::whole_vocabulary_rows(exchanged, &self.shard, &self.options);
        let outputs = &self.desc.outputs;
        handles.register_float_tensor::<B>(&outputs[0].id, rows.stats);
        if let (Some(predicted), Some(output)) = (rows.predicted, outputs.get(1)) {
            handles.register_int_tensor::<B>(&output.id, predicted);
        }
    }
}

/// Where a deferred check's read is put once the stream runs the check.
type ReadSlot = Arc<Mutex<Option<PendingRead>>>;

/// The target check; with `read_into`, it also starts the read of its result.
#[derive(Clone)]
struct CheckOp<B> {
    desc: CustomOpIr,
    vocab: usize,
    ignore_index: i64,
    read_into: Option<ReadSlot>,
    _backend: PhantomData<B>,
}

impl<B> core::fmt::Debug for CheckOp<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CheckOp")
            .field("desc", &self.desc)
            .field("vocab", &self.vocab)
            .field("ignore_index", &self.ignore_index)
            .finish()
    }
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime> for CheckOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([targets], [result]) = self.desc.as_fixed();
        let found = B::first_bad_target(
            handles.get_int_tensor::<B>(targets),
            self.vocab,
            self.ignore_index,
        );
        if let Some(slot) = &self.read_into {
            let read = B::start_read(found.clone());
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(read);
        }
        handles.register_int_tensor::<B>(&result.id, found);
    }
}

/// Registers [`CheckOp`]: the check's result tensor.
fn register_check<B: FusionBackend + FusedCrossEntropyBackend>(
    targets: IntTensor<Fusion<B>>,
    vocab: usize,
    ignore_index: i64,
    read_into: Option<ReadSlot>,
) -> IntTensor<Fusion<B>> {
    let client = targets.client.clone();
    let result = TensorIr::uninit(client.create_empty_handle(), Shape::new([2]), targets.dtype);
    let streams = OperationStreams::with_inputs([&targets]);
    let desc = CustomOpIr::new(
        "fused_cross_entropy_check_targets",
        &[targets.into_ir()],
        &[result],
    );
    let op = CheckOp::<B> {
        desc: desc.clone(),
        vocab,
        ignore_index,
        read_into,
        _backend: PhantomData,
    };
    let [found] = declared_outputs(&client, streams, desc, op);
    found
}

/// The read a [`CheckOp`] starts when the stream runs it: pending until then.
struct SlotRead {
    slot: ReadSlot,
}

impl Future for SlotRead {
    type Output = Result<TensorData, ExecutionError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_mut() {
            Some(read) => Pin::new(read).poll(cx),
            None => Poll::Pending,
        }
    }
}

#[derive(Debug, Clone)]
struct BackwardOp<B> {
    desc: CustomOpIr,
    options: CrossEntropyOptions,
    weighted: bool,
    mean: bool,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend + FusedCrossEntropyBackend> Operation<B::FusionRuntime> for BackwardOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        // logits, targets, [weights, total], stats, grad_output, [denominators]
        let inputs = &self.desc.inputs;
        let next = if self.weighted { 4 } else { 2 };
        let backward = TwoPassBackward {
            stats: handles.get_float_tensor::<B>(&inputs[next]),
            grad_output: handles.get_float_tensor::<B>(&inputs[next + 1]),
            denominators: self
                .mean
                .then(|| handles.get_float_tensor::<B>(&inputs[next + 2])),
        };
        let inputs = inputs_from::<B>(handles, inputs, self.weighted);
        let grad = B::cross_entropy_backward(inputs, backward, &self.options);
        handles.register_float_tensor::<B>(&self.desc.outputs[0].id, grad);
    }
}

impl<B: FusionBackend + FusedCrossEntropyBackend> FusedCrossEntropyBackend for Fusion<B> {
    fn cross_entropy_rows(
        inputs: CrossEntropyInputs<Self>,
        options: &CrossEntropyOptions,
    ) -> RowStats<Self> {
        register_forward::<B>(inputs, options, None).0
    }

    fn cross_entropy_one_pass(
        inputs: CrossEntropyInputs<Self>,
        scale: OnePassScale<Self>,
        options: &CrossEntropyOptions,
    ) -> (RowStats<Self>, FloatTensor<Self>) {
        match register_forward::<B>(inputs, options, Some(scale)) {
            (rows, Some(grad)) => (rows, grad),
            (_, None) => unreachable!("the op declares its gradient output"),
        }
    }

    fn first_bad_target(
        targets: IntTensor<Self>,
        vocab: usize,
        ignore_index: i64,
    ) -> IntTensor<Self> {
        register_check::<B>(targets, vocab, ignore_index, None)
    }

    fn start_target_check(
        targets: IntTensor<Self>,
        vocab: usize,
        ignore_index: i64,
    ) -> PendingRead {
        let client = targets.client.clone();
        let slot = ReadSlot::default();
        // The result tensor is not needed here: the op hands its read to the slot.
        drop(register_check::<B>(
            targets,
            vocab,
            ignore_index,
            Some(slot.clone()),
        ));
        // A blocking wait first runs what this thread's stream holds, the check included,
        // without waiting for the device.
        PendingRead::new(SlotRead { slot }).flushed_by(move || client.sync(|| ()))
    }

    fn scale_one_pass_gradient(
        grad: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        guess: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let client = grad.client.clone();
        let output = TensorIr::uninit(client.create_empty_handle(), grad.shape.clone(), grad.dtype);
        let next = TensorIr::uninit(client.create_empty_handle(), Shape::new([1]), DType::F32);
        let streams = OperationStreams::with_inputs([&grad, &grad_output, &guess]);
        let desc = CustomOpIr::new(
            "fused_cross_entropy_scale_gradient",
            &[grad.into_ir(), grad_output.into_ir(), guess.into_ir()],
            &[output, next],
        );
        let op = ScaleOp::<B> {
            desc: desc.clone(),
            _backend: PhantomData,
        };
        let [scaled, next] = declared_outputs(&client, streams, desc, op);
        (scaled, next)
    }

    fn max_buffer_bytes(device: &B::Device) -> Option<usize> {
        B::max_buffer_bytes(device)
    }

    fn add_into_columns(
        sum: FloatTensor<Self>,
        block: FloatTensor<Self>,
        start: usize,
    ) -> FloatTensor<Self> {
        let client = sum.client.clone();
        let output = TensorIr::uninit(client.create_empty_handle(), sum.shape.clone(), sum.dtype);
        let streams = OperationStreams::with_inputs([&sum, &block]);
        let desc = CustomOpIr::new(
            "fused_linear_cross_entropy_add_into_columns",
            &[sum.into_ir(), block.into_ir()],
            &[output],
        );
        let op = AddColumnsOp::<B> {
            desc: desc.clone(),
            start,
            _backend: PhantomData,
        };
        let [summed] = declared_outputs(&client, streams, desc, op);
        summed
    }

    fn with_matmul_aligned_rows(matrix: FloatTensor<Self>) -> FloatTensor<Self> {
        let client = matrix.client.clone();
        let output = TensorIr::uninit(
            client.create_empty_handle(),
            matrix.shape.clone(),
            matrix.dtype,
        );
        let streams = OperationStreams::with_inputs([&matrix]);
        let desc = CustomOpIr::new(
            "fused_linear_cross_entropy_matmul_aligned_rows",
            &[matrix.into_ir()],
            &[output],
        );
        let op = MatmulAlignedRowsOp::<B> {
            desc: desc.clone(),
            _backend: PhantomData,
        };
        let [aligned] = declared_outputs(&client, streams, desc, op);
        aligned
    }

    fn accumulate_product(
        sum: FloatTensor<Self>,
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let client = sum.client.clone();
        let output = TensorIr::uninit(client.create_empty_handle(), sum.shape.clone(), sum.dtype);
        let streams = OperationStreams::with_inputs([&sum, &lhs, &rhs]);
        let desc = CustomOpIr::new(
            "fused_linear_cross_entropy_accumulate_product",
            &[sum.into_ir(), lhs.into_ir(), rhs.into_ir()],
            &[output],
        );
        let op = AccumulateProductOp::<B> {
            desc: desc.clone(),
            _backend: PhantomData,
        };
        let [summed] = declared_outputs(&client, streams, desc, op);
        summed
    }

    fn matmul_split_k(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        let client = lhs.client.clone();
        let shape = Shape::new([lhs.shape[0], rhs.shape[1]]);
        let output = TensorIr::uninit(client.create_empty_handle(), shape, lhs.dtype);
        let streams = OperationStreams::with_inputs([&lhs, &rhs]);
        let desc = CustomOpIr::new(
            "fused_linear_cross_entropy_matmul_split_k",
            &[lhs.into_ir(), rhs.into_ir()],
            &[output],
        );
        let op = MatmulSplitKOp::<B> {
            desc: desc.clone(),
            _backend: PhantomData,
        };
        let [product] = declared_outputs(&client, streams, desc, op);
        product
    }

    fn shard_contributions(
        inputs: CrossEntropyInputs<Self>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        let CrossEntropyInputs {
            logits,
            targets,
            class_weights,
        } = inputs;
        let client = logits.client.clone();
        let rows: usize = targets.shape.iter().product();
        let weighted = class_weights.is_some();
        let inputs = inputs_with_weights::<B>([logits, targets], class_weights);
        let streams = OperationStreams::with_inputs(inputs.iter());
        let packed = TensorIr::uninit(
            client.create_empty_handle(),
            Shape::new([exchanged_rows(shard, options), rows]),
            DType::F32,
        );
        let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
        let desc = CustomOpIr::new("vocab_parallel_shard_contributions", &inputs, &[packed]);
        let op = ContributionsOp::<B> {
            desc: desc.clone(),
            shard: *shard,
            options: options.clone(),
            weighted,
            _backend: PhantomData,
        };
        let [packed] = declared_outputs(&client, streams, desc, op);
        packed
    }

    fn shard_gradient_rows(
        inputs: ShardBackwardRows<Self>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
    ) -> KernelBackwardRows<Self> {
        let ShardBackwardRows {
            stats,
            targets,
            logits,
            grad_output,
            denominators,
            weight_total,
        } = inputs;
        let client = stats.client.clone();
        let (stats_shape, int_dtype) = (stats.shape.clone(), targets.dtype);
        let rows = stats_shape[1];
        let (mean, weighted) = (denominators.is_some(), weight_total.is_some());
        let smoothing = options.label_smoothing > 0.0;
        let mut inputs = vec![stats, targets, logits, grad_output];
        inputs.extend(denominators);
        inputs.extend(weight_total);
        let streams = OperationStreams::with_inputs(inputs.iter());
        let output = |shape: Shape, dtype: DType| {
            TensorIr::uninit(client.create_empty_handle(), shape, dtype)
        };
        let mut outputs = vec![
            output(Shape::new([rows]), int_dtype),
            output(stats_shape, DType::F32),
            output(Shape::new([rows]), DType::F32),
        ];
        if smoothing {
            outputs.push(output(Shape::new([rows]), DType::F32));
        }
        let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
        let desc = CustomOpIr::new("vocab_parallel_shard_gradient_rows", &inputs, &outputs);
        let op = GradientRowsOp::<B> {
            desc: desc.clone(),
            shard: *shard,
            options: options.clone(),
            mean,
            weighted,
            _backend: PhantomData,
        };
        let mut outputs = client
            .register(streams, OperationIr::Custom(desc), op)
            .into_iter();
        let mut next = || {
            outputs
                .next()
                .unwrap_or_else(|| unreachable!("the op declares its outputs"))
        };
        KernelBackwardRows {
            targets: next(),
            stats: next(),
            coefficients: next(),
            smooth: smoothing.then(next),
        }
    }

    fn whole_vocabulary_rows(
        exchanged: ExchangedRows<Self>,
        shard: &VocabShard,
        options: &CrossEntropyOptions,
    ) -> RowStats<Self> {
        let ExchangedRows {
            summed,
            targets,
            class_weights,
            shard_totals,
        } = exchanged;
        let client = summed.client.clone();
        let rows = summed.shape[1];
        let int_dtype = targets.dtype;
        let weighted = class_weights.is_some();
        let smoothing = shard_totals.is_some();
        // Held until the op is registered: the op only reads the exchanged sums, which
        // burn-collective may hand to every peer of the device.
        let held = (summed.clone(), targets.clone());
        let mut inputs = inputs_with_weights::<B>([summed, targets], class_weights);
        inputs.extend(shard_totals);
        let streams = OperationStreams::with_inputs(inputs.iter());
        let output = |shape: Shape, dtype: DType| {
            TensorIr::uninit(client.create_empty_handle(), shape, dtype)
        };
        let mut outputs = vec![output(Shape::new([row_stat::COUNT, rows]), DType::F32)];
        if options.outputs.needs_argmax() {
            outputs.push(output(Shape::new([rows]), int_dtype));
        }
        let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
        let desc = CustomOpIr::new("vocab_parallel_whole_vocabulary_rows", &inputs, &outputs);
        let op = WholeVocabularyOp::<B> {
            desc: desc.clone(),
            shard: *shard,
            options: options.clone(),
            weighted,
            smoothing,
            _backend: PhantomData,
        };
        let mut outputs = client
            .register(streams, OperationIr::Custom(desc), op)
            .into_iter();
        drop(held);
        let stats = outputs
            .next()
            .unwrap_or_else(|| unreachable!("the op declares its stats output"));
        RowStats {
            stats,
            predicted: outputs.next(),
            weighted,
        }
    }

    fn cross_entropy_backward(
        inputs: CrossEntropyInputs<Self>,
        backward: TwoPassBackward<Self>,
        options: &CrossEntropyOptions,
    ) -> FloatTensor<Self> {
        let CrossEntropyInputs {
            logits,
            targets,
            class_weights,
        } = inputs;
        let TwoPassBackward {
            stats,
            grad_output,
            denominators,
        } = backward;
        let client = logits.client.clone();
        let grad = TensorIr::uninit(
            client.create_empty_handle(),
            logits.shape.clone(),
            logits.dtype,
        );
        let weighted = class_weights.is_some();
        let mean = denominators.is_some();
        let mut inputs = inputs_with_weights::<B>([logits, targets], class_weights);
        inputs.push(stats);
        inputs.push(grad_output);
        inputs.extend(denominators);
        let streams = OperationStreams::with_inputs(inputs.iter());
        let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
        let desc = CustomOpIr::new("fused_cross_entropy_backward", &inputs, &[grad]);
        let op = BackwardOp::<B> {
            desc: desc.clone(),
            options: options.clone(),
            weighted,
            mean,
            _backend: PhantomData,
        };
        let [grad] = declared_outputs(&client, streams, desc, op);
        grad
    }
}
