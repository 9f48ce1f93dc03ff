//! Data-parallel training: one replica of the model per device, each on its share of every
//! global batch, their gradients averaged before each optimizer step. With the same global
//! batch the replicas train the curve one device trains.
//!
//! Two ways of averaging, one result ([`GradientSync`]): Burn's distributed data
//! parallelism (`burn::tensor::distributed`: parameters marked distributed, their gradients
//! all-reduced during backward, one thread per replica) where the runtime has collectives
//! between distinct devices (CUDA with NCCL); otherwise the replicas' gradients moved to the
//! first device and averaged there, as Burn's multi-device training does without
//! collectives (wgpu has none, and replicas that share a device cannot all-reduce).

use std::sync::mpsc;
use std::time::Instant;

use burn::{
    backend::DispatchDevice,
    module::{Module, ModuleMapper, ModuleVisitor, Param},
    optim::GradientsParams,
    tensor::{
        Device, Tensor,
        distributed::{DistributedConfig, DistributedContext, ReduceOperation},
    },
};
use rand::{SeedableRng, rngs::SmallRng};

use super::data::Corpus;
use super::model::{Gpt, GptConfig};
use super::train::{LossKind, RunConfig, StepLog, Trainer};

/// How the replicas' gradients are averaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradientSync {
    /// Burn's all-reduce (mean) of each parameter's gradient during backward, one thread per
    /// replica, each replica stepping its own optimizer. Needs distinct devices whose
    /// runtime has collectives.
    AllReduce,
    /// Each replica's gradients moved to the first device and averaged there, one optimizer
    /// step there, and the stepped model handed to every replica for the next step. Any
    /// runtime; a device may appear more than once (several replicas on it).
    OnFirstDevice,
}

impl GradientSync {
    /// [`GradientSync::AllReduce`] where `devices` are distinct and all have collectives,
    /// else [`GradientSync::OnFirstDevice`].
    pub fn for_devices(devices: &[Device]) -> Self {
        if all_reduce_unavailable(devices).is_none() {
            GradientSync::AllReduce
        } else {
            GradientSync::OnFirstDevice
        }
    }
}

/// Why a data-parallel run could not train.
#[derive(Debug)]
pub enum ParallelError {
    /// The global batch does not split evenly over the devices.
    UnevenBatch { batch: usize, devices: usize },
    /// [`GradientSync::AllReduce`] was asked for devices it cannot reduce across.
    AllReduceUnavailable(String),
}

impl core::fmt::Display for ParallelError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ParallelError::UnevenBatch { batch, devices } => write!(
                f,
                "a global batch of {batch} sequences does not split evenly over {devices} devices"
            ),
            ParallelError::AllReduceUnavailable(why) => {
                write!(f, "gradients cannot be all-reduced: {why}")
            }
        }
    }
}

impl std::error::Error for ParallelError {}

/// Trains `model` as [`super::train`] does, with each global batch of `run.batch`
/// sequences split evenly over `devices` (autodiff devices), the gradients averaged as
/// [`GradientSync::for_devices`] picks. The logs carry the global batch's mean loss and all
/// its tokens; the model returned is the first replica's, on the first device.
pub fn train_data_parallel(
    config: &GptConfig,
    run: &RunConfig,
    kind: LossKind,
    model: Gpt,
    corpus: &Corpus,
    devices: &[Device],
    on_step: impl FnMut(usize, &StepLog),
) -> Result<(Vec<StepLog>, Gpt), ParallelError> {
    let sync = GradientSync::for_devices(devices);
    train_data_parallel_with(sync, config, run, kind, model, corpus, devices, on_step)
}

/// [`train_data_parallel`] with the gradients averaged the way `sync` says.
#[allow(clippy::too_many_arguments)]
pub fn train_data_parallel_with(
    sync: GradientSync,
    config: &GptConfig,
    run: &RunConfig,
    kind: LossKind,
    model: Gpt,
    corpus: &Corpus,
    devices: &[Device],
    on_step: impl FnMut(usize, &StepLog),
) -> Result<(Vec<StepLog>, Gpt), ParallelError> {
    let replicas = devices.len();
    if replicas == 0 || !run.batch.is_multiple_of(replicas) {
        return Err(ParallelError::UnevenBatch {
            batch: run.batch,
            devices: replicas,
        });
    }
    let split = Split {
        share: run.batch / replicas,
        seq: config.seq_len,
    };
    match sync {
        GradientSync::AllReduce => {
            if let Some(why) = all_reduce_unavailable(devices) {
                return Err(ParallelError::AllReduceUnavailable(why));
            }
            Ok(train_all_reduced(
                run, kind, model, corpus, devices, split, on_step,
            ))
        }
        GradientSync::OnFirstDevice => Ok(train_on_first_device(
            run, kind, model, corpus, devices, split, on_step,
        )),
    }
}

/// Why Burn's all-reduce cannot average gradients over `devices`, if it cannot.
fn all_reduce_unavailable(devices: &[Device]) -> Option<String> {
    if devices.is_empty() {
        return Some("no devices".into());
    }
    if let Some(again) = (1..devices.len()).find(|&i| devices[..i].contains(&devices[i])) {
        return Some(format!(
            "device {again} ({:?}) appears twice, and replicas on one device do not all-reduce",
            devices[again]
        ));
    }
    devices
        .iter()
        .find(|device| !has_collectives(device))
        .map(|device| format!("{device:?} has no collectives between devices"))
}

/// Whether `device`'s runtime runs collectives between devices (cubecl: CUDA with NCCL).
fn has_collectives(device: &Device) -> bool {
    match device.as_dispatch().clone().inner() {
        DispatchDevice::Cube(device) => device.client().has_device_transport(),
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// How a global batch splits over the replicas: `share` sequences of `seq` tokens each.
#[derive(Debug, Clone, Copy)]
struct Split {
    share: usize,
    seq: usize,
}

impl Split {
    /// Replica `rank`'s rows of a global batch (every replica draws the same global batches
    /// from `run.seed` and takes the sequences `rank * share ..`).
    fn rows(self, (inputs, targets): &(Vec<i64>, Vec<i64>), rank: usize) -> (Vec<i64>, Vec<i64>) {
        let tokens = self.share * self.seq;
        let mine = rank * tokens..(rank + 1) * tokens;
        (inputs[mine.clone()].to_vec(), targets[mine].to_vec())
    }
}

/// [`GradientSync::OnFirstDevice`]: one thread, one optimizer on the first device; each
/// step forks the model to every replica's device, takes each replica's gradients of its
/// share and averages them on the first device.
fn train_on_first_device(
    run: &RunConfig,
    kind: LossKind,
    mut model: Gpt,
    corpus: &Corpus,
    devices: &[Device],
    split: Split,
    mut on_step: impl FnMut(usize, &StepLog),
) -> (Vec<StepLog>, Gpt) {
    let first = &devices[0];
    model = model.fork(first);
    let mut trainer = Trainer::new(run, kind, first);
    let mut rng = SmallRng::seed_from_u64(run.seed);
    let mut logs = Vec::with_capacity(run.steps);
    for step in 0..run.steps {
        let started = Instant::now();
        let batch = corpus.batch(run.batch, split.seq, &mut rng);
        let (grads, losses): (Vec<GradientsParams>, Vec<Tensor<1>>) = devices
            .iter()
            .enumerate()
            .map(|(rank, device)| {
                // A graph of its own per replica, also where replicas share a device.
                let replica = model.clone().fork(device);
                trainer.gradients(&replica, split.rows(&batch, rank), split.seq, device)
            })
            .unzip();
        let mean = mean_gradients(&model, grads, first);
        model = trainer.apply(model, mean);
        let loss = losses
            .into_iter()
            .map(|loss| loss.into_scalar::<f64>())
            .sum::<f64>()
            / devices.len() as f64;
        let log = StepLog {
            loss,
            seconds: started.elapsed().as_secs_f64(),
            tokens: run.batch * split.seq,
        };
        on_step(step, &log);
        logs.push(log);
    }
    (logs, model)
}

/// The mean over `replicas` of each of `model`'s parameters' gradients, on `device`; a
/// replica without a gradient for a parameter counts as a zero one.
fn mean_gradients(model: &Gpt, replicas: Vec<GradientsParams>, device: &Device) -> GradientsParams {
    struct Mean<'a> {
        replicas: Vec<GradientsParams>,
        device: &'a Device,
        mean: GradientsParams,
    }
    impl ModuleVisitor for Mean<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let count = self.replicas.len() as f64;
            let sum = self
                .replicas
                .iter_mut()
                .filter_map(|grads| grads.remove::<D>(param.id))
                .map(|grad| grad.to_device(self.device))
                .reduce(|sum, grad| sum + grad);
            if let Some(sum) = sum {
                self.mean.register(param.id, sum.div_scalar(count));
            }
        }
    }
    let mut mean = Mean {
        replicas,
        device,
        mean: GradientsParams::new(),
    };
    model.visit(&mut mean);
    mean.mean
}

/// What a replica reports of a step to the thread that logs.
struct Report {
    step: usize,
    loss: f64,
    /// Set by the first replica: its wall time of the step.
    seconds: Option<f64>,
}

/// [`GradientSync::AllReduce`]: one thread per replica, each with its own optimizer; Burn
/// all-reduces every distributed parameter's gradient (mean) during each replica's
/// backward, so the replicas step alike and stay equal.
fn train_all_reduced(
    run: &RunConfig,
    kind: LossKind,
    model: Gpt,
    corpus: &Corpus,
    devices: &[Device],
    split: Split,
    mut on_step: impl FnMut(usize, &StepLog),
) -> (Vec<StepLog>, Gpt) {
    let replicas = devices.len();
    // Dropping the context closes the communication server: it outlives the replicas.
    let _context = DistributedContext::init(
        devices.to_vec(),
        DistributedConfig {
            all_reduce_op: ReduceOperation::Mean,
        },
    );
    let (sender, receiver) = mpsc::channel::<Report>();
    std::thread::scope(|scope| {
        let workers: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, device)| {
                let replica = model.clone().fork(device).map(&mut Distributed(true));
                let sender = sender.clone();
                scope.spawn(move || {
                    all_reduced_steps(run, kind, replica, corpus, device, rank, split, &sender)
                })
            })
            .collect();
        drop(sender);
        // A step is logged once every replica has reported its loss (equal shares: the
        // global batch's mean loss is the mean of theirs).
        let mut pending: Vec<(f64, usize, f64)> = vec![(0.0, 0, 0.0); run.steps];
        let mut logs = Vec::with_capacity(run.steps);
        for report in receiver {
            let entry = &mut pending[report.step];
            entry.0 += report.loss;
            entry.1 += 1;
            if let Some(seconds) = report.seconds {
                entry.2 = seconds;
            }
            while let Some(&(sum, reported, seconds)) = pending.get(logs.len())
                && reported == replicas
            {
                let log = StepLog {
                    loss: sum / replicas as f64,
                    seconds,
                    tokens: run.batch * split.seq,
                };
                on_step(logs.len(), &log);
                logs.push(log);
            }
        }
        let mut trained = Vec::with_capacity(replicas);
        for worker in workers {
            match worker.join() {
                Ok(model) => trained.push(model),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        let first = trained.into_iter().next().expect("at least one replica");
        (logs, first.map(&mut Distributed(false)))
    })
}

/// One replica's steps under [`GradientSync::AllReduce`]: its share of each global batch,
/// its gradients (all-reduced during backward) and its optimizer step; it reports each
/// step's loss on its share.
#[allow(clippy::too_many_arguments)]
fn all_reduced_steps(
    run: &RunConfig,
    kind: LossKind,
    mut model: Gpt,
    corpus: &Corpus,
    device: &Device,
    rank: usize,
    split: Split,
    report: &mpsc::Sender<Report>,
) -> Gpt {
    let mut trainer = Trainer::new(run, kind, device);
    let mut rng = SmallRng::seed_from_u64(run.seed);
    for step in 0..run.steps {
        let started = Instant::now();
        let batch = corpus.batch(run.batch, split.seq, &mut rng);
        let (grads, loss) = trainer.gradients(&model, split.rows(&batch, rank), split.seq, device);
        model = trainer.apply(model, grads);
        let loss = loss.into_scalar::<f64>();
        // The receiver lives until every replica has finished.
        let _ = report.send(Report {
            step,
            loss,
            seconds: (rank == 0).then(|| started.elapsed().as_secs_f64()),
        });
    }
    model
}

/// Marks every float parameter distributed (`true`: its gradient is all-reduced during
/// backward, under its parameter id), or clears the mark (`false`), keeping whether it
/// requires a gradient.
struct Distributed(bool);

impl ModuleMapper for Distributed {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let id = param.id;
        let mark = self.0;
        param.map(|tensor| {
            if mark {
                tensor.set_distributed(id)
            } else if tensor.is_distributed() {
                let require_grad = tensor.is_require_grad();
                let plain = Tensor::from_inner(tensor.inner());
                if require_grad {
                    plain.require_grad()
                } else {
                    plain
                }
            } else {
                tensor
            }
        })
    }
}
