//! Data-parallel training through Burn's own collective operations (burn-collective): one
//! replica of the model per device, each on its share of every global batch, their
//! gradients averaged by an all-reduce before each optimizer step. With the same global
//! batch the replicas train the curve one device trains.

use std::sync::mpsc;
use std::time::Instant;

use burn::{
    collective::{
        self, AllReduceStrategy, CollectiveConfig, CollectiveError, PeerId, ReduceOperation,
    },
    module::Module,
    tensor::{
        ElementConversion, Tensor, TensorPrimitive,
        backend::{AutodiffBackend, Backend},
    },
};
use burn_fused_ce::FusedCrossEntropyBackend;
use rand::{SeedableRng, rngs::SmallRng};

use super::data::Corpus;
use super::model::{Gpt, GptConfig};
use super::train::{LossKind, RunConfig, StepLog, Trainer};

/// Why a data-parallel run could not train.
#[derive(Debug)]
pub enum ParallelError {
    /// The global batch does not split evenly over the devices.
    UnevenBatch { batch: usize, devices: usize },
    /// A collective operation failed.
    Collective(CollectiveError),
}

impl core::fmt::Display for ParallelError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ParallelError::UnevenBatch { batch, devices } => write!(
                f,
                "a global batch of {batch} sequences does not split evenly over {devices} devices"
            ),
            ParallelError::Collective(error) => write!(f, "collective operation failed: {error:?}"),
        }
    }
}

impl std::error::Error for ParallelError {}

impl From<CollectiveError> for ParallelError {
    fn from(error: CollectiveError) -> Self {
        ParallelError::Collective(error)
    }
}

/// Trains `model` as [`super::train`] does, with each global batch of `run.batch`
/// sequences split evenly over `devices` (one replica and one thread each; a device may
/// appear more than once, which runs several replicas on it). Each replica's gradients
/// are averaged with the others' before its optimizer step, so with equal shares the
/// replicas stay equal and follow the one-device curve. The logs carry the global batch's
/// mean loss and all its tokens; the model returned is the first replica.
pub fn train_data_parallel<B>(
    config: &GptConfig,
    run: &RunConfig,
    kind: LossKind,
    model: Gpt<B>,
    corpus: &Corpus,
    devices: &[B::Device],
    mut on_step: impl FnMut(usize, &StepLog),
) -> Result<(Vec<StepLog>, Gpt<B>), ParallelError>
where
    B: AutodiffBackend + FusedCrossEntropyBackend,
{
    let replicas = devices.len();
    if replicas == 0 || !run.batch.is_multiple_of(replicas) {
        return Err(ParallelError::UnevenBatch {
            batch: run.batch,
            devices: devices.len(),
        });
    }
    let share = run.batch / replicas;
    let seq = config.seq_len;
    let collective = CollectiveConfig::default()
        .with_num_devices(replicas)
        .with_local_all_reduce_strategy(AllReduceStrategy::Tree(2));
    let (sender, receiver) = mpsc::channel::<(usize, StepLog)>();
    std::thread::scope(|scope| {
        let workers: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, device)| {
                let (model, collective, sender) = (
                    model.clone().fork(device),
                    collective.clone(),
                    sender.clone(),
                );
                scope.spawn(move || -> Result<Gpt<B>, ParallelError> {
                    let peer = PeerId::from(rank);
                    collective::register::<B::InnerBackend>(peer, device.clone(), collective)?;
                    let trained = replica_steps(
                        run, kind, model, corpus, device, peer, rank, share, seq, &sender,
                    );
                    leave_collective::<B::InnerBackend>(peer, device)?;
                    trained
                })
            })
            .collect();
        drop(sender);
        let mut logs = Vec::with_capacity(run.steps);
        for (step, log) in receiver {
            on_step(step, &log);
            logs.push(log);
        }
        let mut models = Vec::with_capacity(workers.len());
        for worker in workers {
            match worker.join() {
                Ok(trained) => models.push(trained?),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        let first = models.into_iter().next().expect("at least one replica");
        Ok((logs, first))
    })
}

/// Leaves burn-collective once every peer has reached this point (one last all-reduce),
/// so that no peer leaves while another still reduces.
pub fn leave_collective<B: Backend>(
    peer: PeerId,
    device: &B::Device,
) -> Result<(), CollectiveError> {
    let barrier = Tensor::<B, 1>::zeros([1], device);
    collective::all_reduce::<B>(
        peer,
        barrier.into_primitive().tensor(),
        ReduceOperation::Sum,
    )?;
    collective::finish_collective::<B>(peer)
}

/// One replica's steps: its share of each global batch (every replica draws the same
/// global batches from `run.seed` and takes the sequences `rank * share ..`), the
/// gradients and the loss averaged over the replicas. The first replica reports each step.
#[allow(clippy::too_many_arguments)]
fn replica_steps<B>(
    run: &RunConfig,
    kind: LossKind,
    mut model: Gpt<B>,
    corpus: &Corpus,
    device: &B::Device,
    peer: PeerId,
    rank: usize,
    share: usize,
    seq: usize,
    report: &mpsc::Sender<(usize, StepLog)>,
) -> Result<Gpt<B>, ParallelError>
where
    B: AutodiffBackend + FusedCrossEntropyBackend,
{
    let mut trainer = Trainer::new(run, kind, device);
    let mut rng = SmallRng::seed_from_u64(run.seed);
    for step in 0..run.steps {
        let started = Instant::now();
        let (inputs, targets) = corpus.batch(run.batch, seq, &mut rng);
        let mine = rank * share * seq..(rank + 1) * share * seq;
        let batch = (inputs[mine.clone()].to_vec(), targets[mine].to_vec());
        let (grads, loss) = trainer.gradients(&model, batch, seq, device);
        let grads = grads.all_reduce::<B::InnerBackend>(peer, ReduceOperation::Mean)?;
        model = trainer.apply(model, grads);
        let loss = collective::all_reduce::<B::InnerBackend>(
            peer,
            loss.inner().into_primitive().tensor(),
            ReduceOperation::Mean,
        )?;
        let loss: f64 = Tensor::<B::InnerBackend, 1>::from_primitive(TensorPrimitive::Float(loss))
            .into_scalar()
            .elem();
        if rank == 0 {
            let log = StepLog {
                loss,
                seconds: started.elapsed().as_secs_f64(),
                tokens: run.batch * seq,
            };
            // The receiver lives until every replica has finished.
            let _ = report.send((step, log));
        }
    }
    Ok(model)
}
