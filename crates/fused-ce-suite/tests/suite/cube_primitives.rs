//! The plain `CubeBackend`, on its primitives. In Burn 0.22 a cube device's `Tensor<D>`
//! runs on `Fusion<CubeBackend>` when Burn's fusion is on (as in this build), and
//! `Autodiff<CubeBackend>` has no `Tensor<D>` either: the plain backend's ops are called
//! here through the extension trait, in the order `Autodiff` calls them on its inner
//! backend (`burn-fused-ce/src/loss/autodiff.rs`): the one pass or the rows and their
//! statistics in forward, the rescale or the backward kernel in backward. The tests then
//! apply the same checks as through `Tensor<D>`.
#![allow(dead_code)]

use burn::backend::ops::{FloatTensorOps, IntTensorOps};
use burn::backend::{
    TensorMetadata, get_device_settings,
    tensor::{FloatTensor, IntTensor},
};
use burn::tensor::{DType, FloatDType, Shape, Slice, TensorData};
use burn_cubecl::CubeDevice;
use burn_fused_ce::backend::{
    ClassWeights, CrossEntropyInputs, FusedCrossEntropyBackend, IncomingGuess, LossParts,
    OnePassScale, OptionalFloat, RowWeights, TwoPassBackward,
};
use burn_fused_ce::{CrossEntropyOptions, EntropyOutput, GradientPlan, Reduction};

use crate::call::{Call, HostOutput, HostTensor, Tracked, assert_same_values};
use crate::common::data_to_f64;

/// The plain cube backend.
pub(crate) type C = fused_ce_suite::CubeBackend;
/// A float primitive of it.
pub(crate) type Float = FloatTensor<C>;
/// An int primitive of it.
pub(crate) type Ints = IntTensor<C>;

/// The cube device of this build's runtime.
pub(crate) fn cube() -> CubeDevice {
    fused_ce_suite::cube_device(&fused_ce_suite::device())
}

/// `values` (row-major, `dims`) on the device, in `dtype`.
pub(crate) fn floats(values: Vec<f32>, dims: &[usize], dtype: DType) -> Float {
    if values.is_empty() {
        return C::float_empty(Shape::from(dims.to_vec()), &cube(), FloatDType::from(dtype));
    }
    let tensor = C::float_from_data(TensorData::new(values, dims.to_vec()), &cube());
    cast(tensor, dtype)
}

pub(crate) fn cast(tensor: Float, dtype: DType) -> Float {
    if tensor.dtype() == dtype {
        tensor
    } else {
        C::float_cast(tensor, FloatDType::from(dtype))
    }
}

/// Class indices in the device's int type, as `Tensor<D, Int>` makes them.
pub(crate) fn ints(values: &[i64], dims: &[usize]) -> Ints {
    let dtype: DType = get_device_settings::<C>(&cube()).int_dtype.into();
    C::int_from_data(
        TensorData::new(values.to_vec(), dims.to_vec()).convert_dtype(dtype),
        &cube(),
    )
}

pub(crate) fn dims_of(shape: Shape) -> Vec<usize> {
    shape.iter().copied().collect()
}

/// A float primitive read back.
pub(crate) fn read(tensor: Float) -> HostTensor {
    let dims = dims_of(tensor.shape());
    let dtype = tensor.dtype();
    let data = cubecl::future::block_on(C::float_into_data(tensor)).expect("reads back");
    HostTensor {
        values: data_to_f64(data),
        dims,
        dtype,
    }
}

/// An int primitive read back.
pub(crate) fn read_int(tensor: Ints) -> HostTensor {
    let dims = dims_of(tensor.shape());
    let dtype = tensor.dtype();
    let data = cubecl::future::block_on(C::int_into_data(tensor)).expect("reads back");
    HostTensor {
        values: data_to_f64(data),
        dims,
        dtype,
    }
}

pub(crate) fn reshape(tensor: Float, dims: &[usize]) -> Float {
    C::float_reshape(tensor, Shape::from(dims.to_vec()))
}

pub(crate) fn slice(tensor: Float, ranges: &[core::ops::Range<usize>]) -> Float {
    let slices: Vec<Slice> = ranges.iter().cloned().map(Slice::from).collect();
    C::float_slice(tensor, &slices)
}

pub(crate) fn int_slice(tensor: Ints, ranges: &[core::ops::Range<usize>]) -> Ints {
    let slices: Vec<Slice> = ranges.iter().cloned().map(Slice::from).collect();
    C::int_slice(tensor, &slices)
}

/// The class weights as the function layer hands them to the op: f32 `[V]` and their
/// sum.
pub(crate) fn class_weights(weights: Option<&[f32]>) -> ClassWeights<C> {
    match weights {
        None => ClassWeights::Unweighted,
        Some(w) => {
            let weights = floats(w.to_vec(), &[w.len()], DType::F32);
            ClassWeights::Weighted {
                total: C::float_sum(weights.clone()),
                weights,
            }
        }
    }
}

pub(crate) fn inputs(
    logits: Float,
    targets: Ints,
    weights: Option<&[f32]>,
) -> CrossEntropyInputs<C> {
    CrossEntropyInputs {
        logits,
        targets,
        class_weights: class_weights(weights),
        row_weights: RowWeights::none(),
    }
}

/// The outputs of one call read back; per-row ones are `[N]` (`rows`).
pub(crate) fn host_output(parts: LossParts<C>, rows: usize) -> HostOutput {
    HostOutput {
        target_dims: vec![rows],
        loss: read(parts.loss),
        z_loss: parts.z_loss.into_option().map(read),
        accuracy: parts.accuracy.into_option().map(read),
        predicted: parts.predicted.into_option().map(read_int),
        lse: parts.lse.into_option().map(read),
        entropy: parts.entropy.into_option().map(read),
    }
}

/// What backward needs of a tracked call, as `Autodiff` keeps it.
pub(crate) enum Pending {
    /// The gradient the one pass formed for the incoming gradient `guess`.
    OnePass { grad: Float, guess: Float },
    /// The inputs, forward's statistics and the mean's denominators.
    TwoPass {
        /// Boxed: the inputs dwarf the one pass's two tensors.
        inputs: Box<CrossEntropyInputs<C>>,
        stats: Float,
        denominators: OptionalFloat<C>,
        options: CrossEntropyOptions,
    },
}

/// Forward of a tracked call as `Autodiff` runs it on the plain backend: the one pass
/// (asked for, Mean or Sum, at least one row) forming the gradient for `guess` (f32
/// `[1]`), else the rows with their statistics (and the mean's denominators) kept.
pub(crate) fn tracked_forward(
    inputs: CrossEntropyInputs<C>,
    options: &CrossEntropyOptions,
    guess: Float,
) -> (LossParts<C>, Pending) {
    let shape = inputs.logits.shape();
    let rows: usize = shape.iter().take(shape.num_dims() - 1).product();
    let dtype = inputs.logits.dtype();
    // As `Autodiff` decides it (`CrossEntropyOptions::one_pass`).
    let one_pass = options.gradient_plan != GradientPlan::TwoPass
        && options.outputs.entropy != EntropyOutput::Differentiable
        && options.reduction != Reduction::None
        && rows > 0;
    let row_weights = inputs.row_weights.clone();
    if one_pass {
        let scale = OnePassScale {
            guess: guess.clone(),
            denominators: OptionalFloat::Absent,
        };
        let output = C::cross_entropy_one_pass(inputs, scale, options.clone());
        let parts =
            C::reduce_row_stats(output.rows, row_weights, options.clone(), dtype, false).parts;
        (
            parts,
            Pending::OnePass {
                grad: output.grad,
                guess,
            },
        )
    } else {
        let rows = C::cross_entropy_rows(inputs.clone(), options.clone());
        let stats = rows.stats.clone();
        let reduced = C::reduce_row_stats(rows, row_weights, options.clone(), dtype, true);
        let pending = Pending::TwoPass {
            inputs: Box::new(inputs),
            stats,
            denominators: reduced.denominators,
            options: options.clone(),
        };
        (reduced.parts, pending)
    }
}

impl Pending {
    /// Backward for the incoming gradient `grad_output` (`[N]` for None, `[1]`
    /// otherwise): the logits' gradient and, after the one pass, the guess for the next
    /// call.
    pub(crate) fn backward(self, grad_output: Float) -> (Float, Option<Float>) {
        match self {
            Self::OnePass { grad, guess } => {
                let (grad, next) = C::scale_one_pass_gradient(grad, grad_output, guess);
                (grad, Some(next))
            }
            Self::TwoPass {
                inputs,
                stats,
                denominators,
                options,
            } => {
                let backward = TwoPassBackward {
                    stats,
                    grad_output,
                    denominators,
                    entropy_grad_output: OptionalFloat::Absent,
                };
                (C::cross_entropy_backward(*inputs, backward, options), None)
            }
        }
    }
}

/// The guess of a call with no remembered incoming gradient: 1.
pub(crate) fn first_guess() -> Float {
    floats(vec![1.0], &[1], DType::F32)
}

/// A call's logits and targets on the plain backend, shaped as `call` says, and the
/// logits as the kernel sees them (f64).
fn call_inputs(call: &Call) -> (Float, Ints, Vec<f64>) {
    let logits = floats(call.values.clone(), &[call.rows, call.vocab], call.dtype);
    let seen = read(logits.clone()).values;
    let logits = reshape(logits, &call.logits_dims());
    let targets = ints(call.targets, &call.target_dims());
    (logits, targets, seen)
}

/// The call untracked: the extension's whole loss (the function layer's op).
pub(crate) fn untracked_call(call: &Call) -> (Vec<f64>, HostOutput) {
    let (logits, targets, seen) = call_inputs(call);
    let parts = C::fused_cross_entropy(
        inputs(logits, targets, call.weights),
        call.options.clone(),
        IncomingGuess::new(),
    );
    (seen, host_output(parts, call.rows))
}

/// The call tracked, with guess 1, and its backward for `call.incoming`. Held logits are
/// checked unchanged after backward.
pub(crate) fn tracked_call(call: &Call) -> Tracked {
    let (logits, targets, seen) = call_inputs(call);
    let held = (!call.exclusive).then(|| logits.clone());
    let (parts, pending) = tracked_forward(
        inputs(logits, targets, call.weights),
        call.options,
        first_guess(),
    );
    let len = parts.loss.shape().num_elements();
    let out = host_output(parts, call.rows);
    let grad_output = floats(call.incoming.values(len), &[len], call.dtype);
    let g = read(grad_output.clone()).values;
    let (grad, _) = pending.backward(grad_output);
    let grad = read(grad);
    if let Some(held) = held {
        let context = "CubeBackend: backward changed held logits";
        assert_same_values(&read(held).values, &seen, context);
    }
    Tracked { seen, out, grad, g }
}
