//! The vocabulary-parallel loss as a function of `Tensor`s: validate, the shard's
//! contributions, one exchange, the whole vocabulary's statistics, then the loss on this
//! shard (its backward needs no exchange).

use burn::backend::{Dispatch, tensor::FloatTensor};
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use crate::loss::api::cross_entropy_checked;
use crate::loss::checks::{check_class_weights, check_logits, checked_values};
use crate::loss::incoming_guess::IncomingGuess;

use crate::error::{CrossEntropyError, Input};
use crate::options::CrossEntropyOptions;
use crate::output::{CrossEntropyOutput, shaped_output};
use crate::targets::Targets;
use crate::values::{ClassWeights, CrossEntropyInputs, OptionalFloat, RowWeights};
use crate::vocab_parallel::exchange::ShardExchange;
use crate::vocab_parallel::extension::VocabParallelBackend;
use crate::vocab_parallel::extension_types::ExchangedRows;
use crate::vocab_parallel::shard::{VocabShard, exchanged_rows};

/// The vocabulary-parallel cross-entropy on one shard: `logits` are this device's classes
/// (`[N, V_s]` or `[B, T, V_s]`, `V_s` = `shard.classes().len()`), `targets` the whole
/// vocabulary's class indices (`[N]` or `[B, T]`, the same on every shard), and the class
/// weights, when given, the whole vocabulary's (`[V]`). Every shard calls it with the same
/// targets and options; `exchange` sums a few numbers per row over the shards (see
/// [`ShardExchange`]). Returns the whole vocabulary's loss and extra outputs, the same on
/// every shard; under autodiff the gradient reaches this shard's logits, with no further
/// exchange. Every option and reduction of [`crate::try_fused_cross_entropy`] applies but
/// given mean denominators, the temperature and the entropy output (refused).
/// Errors as [`crate::try_fused_cross_entropy`], and the exchange's.
///
/// # Example
///
/// Two shards on one device, one thread each:
///
/// ```rust
/// # use burn::tensor::{Device, DeviceKind, Distribution, Int, Tensor};
/// # let device = Device::wgpu(DeviceKind::DefaultDevice).autodiff();
/// use burn_fused_ce::CrossEntropyOptions;
/// use burn_fused_ce::vocab_parallel::{InProcessExchange, VocabShard, try_vocab_parallel_cross_entropy};
///
/// let (shards, vocab) = (2, 1000); // two shards on one device, one thread each
/// let exchange = InProcessExchange::new(shards);
/// let losses: Vec<f32> = std::thread::scope(|scope| {
///     let workers: Vec<_> = (0..shards)
///         .map(|k| {
///             let (exchange, device) = (&exchange, &device);
///             scope.spawn(move || {
///                 let shard = VocabShard::new(k, shards, vocab).unwrap(); // 500 classes each
///                 // This shard's columns of the logits, e.g. from its part of the LM head.
///                 let columns = shard.classes().len();
///                 let logits = Tensor::<2>::random([4, columns], Distribution::Default, device)
///                     .require_grad();
///                 let targets = Tensor::<1, Int>::from_ints([1, 999, -100, 7], device);
///                 let options = CrossEntropyOptions::default();
///                 let out = try_vocab_parallel_cross_entropy(
///                     logits.clone(), targets, None, &shard, &options, exchange,
///                 )
///                 .unwrap();
///                 let grads = out.loss.backward(); // the whole vocabulary's mean loss
///                 assert_eq!(logits.grad(&grads).unwrap().dims(), [4, 500]); // this shard's columns
///                 out.loss.into_scalar::<f32>()
///             })
///         })
///         .collect();
///     workers.into_iter().map(|worker| worker.join().unwrap()).collect()
/// });
/// assert_eq!(losses[0], losses[1]); // the same loss on every shard
/// # device.sync().unwrap(); // exiting with work in flight can crash lavapipe
/// ```
pub fn try_vocab_parallel_cross_entropy<
    E: ShardExchange + ?Sized,
    const DL: usize,
    const DT: usize,
>(
    logits: Tensor<DL>,
    targets: Tensor<DT, Int>,
    class_weights: Option<Tensor<1>>,
    shard: &VocabShard,
    options: &CrossEntropyOptions,
    exchange: &E,
) -> Result<CrossEntropyOutput<DT>, CrossEntropyError> {
    options.validate()?;
    refuse_unsupported(options)?;
    let target_dims = targets.dims();
    let (rows, width) = check_logits(&logits, &targets, "V_s")?;
    let classes = shard.classes().len();
    if width != classes {
        return Err(CrossEntropyError::shape(
            Input::Logits,
            format!(
                "[.., {classes}]: the {classes} classes of vocabulary shard {} of {}",
                shard.index(),
                shard.count()
            ),
            &logits.dims(),
        ));
    }
    check_class_weights(class_weights.as_ref(), shard.vocab())?;
    let class_weights =
        checked_values(&targets, class_weights, rows, shard.vocab(), options, true)?;
    if rows == 0 {
        // Nothing to exchange: every shard sees the same empty batch.
        return cross_entropy_checked(
            logits,
            Targets::new(targets),
            None,
            options,
            false,
            &IncomingGuess::new(),
        );
    }
    let device = logits.device();
    // The row ops take the targets in the logits' row shape, the exchanged rows flat.
    let inputs = || CrossEntropyInputs {
        logits: logits.clone().into_dispatch(),
        targets: targets.clone().into_dispatch(),
        class_weights: class_weights.clone(),
        row_weights: RowWeights::none(),
    };
    let packed = Tensor::<2>::from_dispatch(
        <Dispatch as VocabParallelBackend>::shard_contributions(inputs(), *shard, options.clone()),
    );
    let summed = exchange.sum(packed)?;
    let expected = [exchanged_rows(shard, options), rows];
    if summed.dims() != expected {
        return Err(CrossEntropyError::Exchange(format!(
            "the exchange returned statistics of shape {:?}, expected {expected:?}",
            summed.dims()
        )));
    }
    let shard_totals = (options.label_smoothing > 0.0)
        .then(|| shard_weight_totals(&class_weights, shard, &device));
    let exchanged = ExchangedRows {
        summed: summed.cast(DType::F32).into_dispatch(),
        targets: targets.clone().reshape([rows]).into_dispatch(),
        class_weights: class_weights.clone(),
        shard_totals: OptionalFloat::from_option(shard_totals),
    };
    let stats = <Dispatch as VocabParallelBackend>::whole_vocabulary_rows(
        exchanged,
        *shard,
        options.clone(),
    );
    let parts = <Dispatch as VocabParallelBackend>::vocab_parallel_cross_entropy(
        inputs(),
        stats,
        *shard,
        options.clone(),
    );
    Ok(shaped_output(parts, target_dims, options.reduction))
}

/// Each shard's class-weight total `W_k` (its class count without weights), f32 `[K]`.
fn shard_weight_totals(
    class_weights: &ClassWeights<Dispatch>,
    shard: &VocabShard,
    device: &Device,
) -> FloatTensor<Dispatch> {
    match class_weights {
        ClassWeights::Weighted { weights, .. } => {
            let weights = Tensor::<1>::from_dispatch(weights.clone());
            let totals = (0..shard.count())
                .map(|k| weights.clone().slice([shard.range(k)]).sum())
                .collect();
            Tensor::cat(totals, 0).into_dispatch()
        }
        ClassWeights::Unweighted => {
            let counts: Vec<f32> = (0..shard.count())
                .map(|k| shard.range(k).len() as f32)
                .collect();
            Tensor::<1>::from_data(TensorData::new(counts, [shard.count()]), device)
                .cast(DType::F32)
                .into_dispatch()
        }
    }
}

/// The options the vocabulary-parallel loss does not have, refused by name.
fn refuse_unsupported(options: &CrossEntropyOptions) -> Result<(), CrossEntropyError> {
    let refused = if let Some(denominators) = options.mean_denominators {
        CrossEntropyError::invalid_option(
            "mean_denominators",
            format!("{denominators:?}"),
            "none: the vocabulary-parallel loss divides by its call's own",
        )
    } else if let Some(temperature) = options.temperature {
        CrossEntropyError::invalid_option(
            "temperature",
            temperature,
            "none: the vocabulary-parallel loss has no temperature",
        )
    } else if options.outputs.entropy.is_on() {
        CrossEntropyError::invalid_option(
            "outputs.entropy",
            format!("{:?}", options.outputs.entropy),
            "Off: the vocabulary-parallel loss has no entropy output",
        )
    } else {
        return Ok(());
    };
    Err(refused)
}
