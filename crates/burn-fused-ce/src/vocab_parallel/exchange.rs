//! How the shards of one call add up their per-row statistics: the [`ShardExchange`]
//! trait, and two exchanges: between threads of one process ([`InProcessExchange`]) and
//! through Burn's collective all-reduce ([`DistributedExchange`]).

use std::sync::{Barrier, Mutex, PoisonError};

use burn::tensor::{Device, Tensor, distributed};

use crate::error::CrossEntropyError;

/// How the shards of one call add up their per-row statistics: the element-wise sum of
/// one small f32 tensor `[R, N]` over every shard, returned to each (an all-reduce). Every
/// shard of a call calls it once, with the same shape. An exchange moves `O(N)` numbers,
/// never `N x V`.
pub trait ShardExchange {
    /// The sum of `stats` over all shards, on `stats`'s device.
    fn sum(&self, stats: Tensor<2>) -> Result<Tensor<2>, CrossEntropyError>;
}

impl<E: ShardExchange + ?Sized> ShardExchange for &E {
    fn sum(&self, stats: Tensor<2>) -> Result<Tensor<2>, CrossEntropyError> {
        (**self).sum(stats)
    }
}

/// The exchange between the shards of one process, one thread per shard (on one device
/// or several): each shard leaves its statistics, waits for the others, and sums them all
/// on its own device, in the same order on every shard (so every shard gets the same
/// numbers). Nothing is read back to the host.
///
/// Every shard's thread must call it for each call of the loss: a shard that fails
/// before its exchange leaves the others waiting.
#[derive(Debug)]
pub struct InProcessExchange {
    deposits: Mutex<Vec<Tensor<2>>>,
    barrier: Barrier,
}

impl InProcessExchange {
    /// An exchange between `shards` threads.
    pub fn new(shards: usize) -> Self {
        Self {
            deposits: Mutex::new(Vec::with_capacity(shards)),
            barrier: Barrier::new(shards),
        }
    }

    fn deposits(&self) -> std::sync::MutexGuard<'_, Vec<Tensor<2>>> {
        // A shard that panicked holding the lock left nothing half-written.
        self.deposits.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ShardExchange for InProcessExchange {
    fn sum(&self, stats: Tensor<2>) -> Result<Tensor<2>, CrossEntropyError> {
        let device = stats.device();
        let dims = stats.dims();
        self.deposits().push(stats);
        self.barrier.wait();
        let deposits: Vec<Tensor<2>> = self.deposits().clone();
        // Every shard has taken its copies before the deposits are cleared for the next
        // call.
        if self.barrier.wait().is_leader() {
            self.deposits().clear();
        }
        self.barrier.wait();
        if let Some(other) = deposits.iter().find(|deposit| deposit.dims() != dims) {
            return Err(CrossEntropyError::Exchange(format!(
                "the shards' statistics differ in shape: {dims:?} and {:?}",
                other.dims()
            )));
        }
        deposits
            .into_iter()
            .map(|deposit| deposit.to_device(&device))
            .reduce(|sum, deposit| sum + deposit)
            .ok_or_else(|| CrossEntropyError::Exchange("no shard left its statistics".into()))
    }
}

/// The exchange through Burn's collective all-reduce ([`burn::tensor::distributed`]): a
/// sum over `devices`, one shard per device, each on its own thread. The caller starts
/// the communication between those devices first
/// ([`distributed::DistributedContext::init`]) and keeps it while the loss runs. It needs
/// a backend that moves tensors between devices (CUDA); other backends panic in Burn.
///
/// # Example
///
/// The exchange for one shard per device:
///
/// ```rust,no_run
/// use burn::tensor::Device;
/// use burn::tensor::distributed::{DistributedConfig, DistributedContext, ReduceOperation};
/// use burn_fused_ce::vocab_parallel::DistributedExchange;
///
/// /// For one shard per device, e.g. `vec![Device::cuda(0), Device::cuda(1)]`.
/// fn exchange_over(devices: Vec<Device>) -> (DistributedContext, DistributedExchange) {
///     let config = DistributedConfig { all_reduce_op: ReduceOperation::Sum };
///     (DistributedContext::init(devices.clone(), config), DistributedExchange::new(devices))
/// }
/// ```
#[derive(Debug, Clone)]
pub struct DistributedExchange {
    devices: Vec<Device>,
}

impl DistributedExchange {
    /// An exchange over `devices`, the devices of the shards (each shard's logits on its
    /// own).
    pub fn new(devices: Vec<Device>) -> Self {
        Self { devices }
    }

    /// The devices the sum runs over.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }
}

impl ShardExchange for DistributedExchange {
    fn sum(&self, stats: Tensor<2>) -> Result<Tensor<2>, CrossEntropyError> {
        let device = stats.device();
        let inner = device.clone().inner();
        if !self.devices.iter().any(|d| d.clone().inner() == inner) {
            return Err(CrossEntropyError::Exchange(format!(
                "the shard's device {device:?} is not one of the exchange's {:?}",
                self.devices
            )));
        }
        let reduced = distributed::all_reduce(
            stats,
            distributed::ReduceOperation::Sum,
            self.devices.clone(),
        );
        Ok(reduced.resolve())
    }
}
