//! The rows of a batch whose targets count, gathered before the fused linear
//! cross-entropy so that ignored rows cost it no matmul work. The op itself multiplies
//! every row it is given: which rows are ignored is known only from the targets, and
//! the op never reads the device back. Knowing them is this type's one host step.

use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};

use crate::error::{CrossEntropyError, Input};
use crate::targets::Targets;

/// The rows whose target is not the ignore index, in order: pass
/// [`CountedRows::hidden`] and [`CountedRows::targets`] to the fused linear
/// cross-entropy instead of the whole batch, and its matmuls multiply only these rows.
///
/// The result is the whole batch's: `Mean` and `Sum` are equal (ignored rows add nothing
/// and are not in `Mean`'s denominator), and the gradient of an ignored row's hidden state
/// is exactly 0, as without. Under `Reduction::None` (and for the per-row extra outputs)
/// the outputs have one element per row passed on ([`CountedRows::selected`]: the counted
/// ones, or the first row alone when none counts); [`CountedRows::spread`] puts them back
/// in the batch's rows.
///
/// Built from the targets on the host ([`CountedRows::from_host_targets`]: a batcher's
/// `Vec`, no device read) or on the device ([`CountedRows::read_from_targets`]: one read
/// that waits for the work queued before it).
///
/// # Example
///
/// ```rust
/// # use burn::nn::{Linear, LinearConfig};
/// # use burn::tensor::{Device, DeviceKind, Distribution, Int, Tensor, TensorData};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let device = Device::wgpu(DeviceKind::DefaultDevice).autodiff();
/// # let (batch, seq, d_model, vocab) = (2, 4, 32, 1000);
/// # let hidden = Tensor::<3>::random([batch, seq, d_model], Distribution::Default, &device)
/// #     .require_grad();
/// # let head: Linear = LinearConfig::new(d_model, vocab).init(&device);
/// use burn_fused_ce::FusedLinearCrossEntropyLossConfig;
/// use burn_fused_ce::linear::CountedRows;
///
/// // A batch with padding: -100 is the ignore index.
/// let host_targets = [5, 17, -100, -100, 3, 42, 7, -100];
/// let targets = Tensor::<2, Int>::from_data(TensorData::new(host_targets.to_vec(), [batch, seq]), &device);
/// let loss_fn = FusedLinearCrossEntropyLossConfig::new().init(&device);
///
/// let counted = CountedRows::from_host_targets(&host_targets, -100, &device);
/// assert_eq!((counted.rows(), counted.counted()), (8, 5));
/// let loss = loss_fn.try_forward(counted.hidden(hidden.clone())?, &head, counted.targets(targets)?)?;
///
/// let grads = loss.backward(); // the whole batch's mean, and its gradients
/// assert_eq!(hidden.grad(&grads).unwrap().dims(), [batch, seq, d_model]); // 0 on padding
/// # device.sync()?; // exiting with work in flight can crash lavapipe
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct CountedRows {
    /// The indices of the rows passed on, ascending, `[selected]`; `None` for an empty
    /// batch (nothing to select).
    indices: Option<Tensor<1, Int>>,
    rows: usize,
    counted: usize,
}

impl CountedRows {
    /// The rows of `targets` (the batch's targets flattened, `[N]` or `[B, T]` in row-major
    /// order) that are not `ignore_index`, with their indices put on `device`. Reads
    /// nothing from a device.
    pub fn from_host_targets(targets: &[i64], ignore_index: i64, device: &Device) -> Self {
        Self::from_iter(targets.iter().copied(), ignore_index, device)
    }

    /// [`Self::from_host_targets`] for targets on the device: reads them back (a few bytes
    /// per row), which waits for everything queued on the device before it. Call it before
    /// the model's forward is queued (for instance where the batch is loaded), so that the
    /// wait is not for the model.
    pub fn read_from_targets<const D: usize>(targets: &Tensor<D, Int>, ignore_index: i64) -> Self {
        let data = targets.to_data();
        Self::from_iter(data.iter::<i64>(), ignore_index, &targets.device())
    }

    fn from_iter(targets: impl Iterator<Item = i64>, ignore_index: i64, device: &Device) -> Self {
        let mut rows = 0;
        let mut indices: Vec<i64> = targets
            .inspect(|_| rows += 1)
            .enumerate()
            .filter(|&(_, target)| target != ignore_index)
            .map(|(row, _)| row as i64)
            .collect();
        let counted = indices.len();
        if counted == 0 && rows > 0 {
            // No row counts: pass the first one on (ignored, it adds nothing) rather than
            // none, so that no op downstream runs on an empty tensor.
            indices.push(0);
        }
        let selected = indices.len();
        Self {
            indices: (rows > 0)
                .then(|| Tensor::from_data(TensorData::new(indices, [selected]), device)),
            rows,
            counted,
        }
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Rows whose target counts.
    pub fn counted(&self) -> usize {
        self.counted
    }

    /// Rows passed on: the counted ones, or the batch's first when none counts (its target
    /// is ignored, so it adds nothing), 0 for an empty batch.
    pub fn selected(&self) -> usize {
        match &self.indices {
            Some(indices) => indices.dims()[0],
            None => 0,
        }
    }

    /// The indices in the batch of the rows passed on, ascending, `[selected]`.
    pub fn indices(&self) -> Option<Tensor<1, Int>> {
        self.indices.clone()
    }

    /// The rows passed on of `hidden` (`[N, H]` or `[B, T, H]`), `[selected, H]`. Under
    /// autodiff the gradient reaches `hidden`, 0 on the rows left out.
    pub fn hidden<const D: usize>(
        &self,
        hidden: Tensor<D>,
    ) -> Result<Tensor<2>, CrossEntropyError> {
        let dims = hidden.dims();
        let (rows, width) = match dims.split_last() {
            Some((&width, leading)) if D >= 2 => (leading.iter().product(), width),
            _ => (0, 0),
        };
        if D < 2 || rows != self.rows {
            return Err(CrossEntropyError::shape(
                Input::Hidden,
                format!("{} rows of hidden units, [N, H] or [B, T, H]", self.rows),
                &dims,
            ));
        }
        let hidden = hidden.reshape([rows, width]);
        Ok(match self.indices() {
            Some(indices) => hidden.select(0, indices),
            None => hidden,
        })
    }

    /// The targets of the rows passed on, `[selected]`, from the batch's (`[N]` or
    /// `[B, T]`: class indices, or [`Targets`] with the rows' weights, which are passed on
    /// alike).
    pub fn targets<const D: usize>(
        &self,
        targets: impl Into<Targets<D>>,
    ) -> Result<Targets<1>, CrossEntropyError> {
        let targets = targets.into();
        let rows = targets.classes.shape().num_elements();
        if rows != self.rows {
            return Err(CrossEntropyError::shape(
                Input::Targets,
                format!("{} rows, [N] or [B, T]", self.rows),
                &targets.classes.dims(),
            ));
        }
        targets.check()?;
        let indices = self.indices();
        let classes = targets.classes.reshape([rows]);
        let classes = match &indices {
            Some(indices) => classes.select(0, indices.clone()),
            None => classes,
        };
        let pass_on = |weights: Option<Tensor<D>>| {
            weights.map(|weights| {
                let weights = weights.reshape([rows]);
                match &indices {
                    Some(indices) => weights.select(0, indices.clone()),
                    None => weights,
                }
            })
        };
        Ok(Targets::new(classes)
            .with_weights(pass_on(targets.weights))
            .with_entropy_weights(pass_on(targets.entropy_weights)))
    }

    /// One value per row passed on (`Reduction::None`'s loss, the per-row `lse` and
    /// `entropy`) back in the batch's rows, `[N]`, 0 on the rows left out: what the loss
    /// gives an ignored row. Under autodiff the gradient reaches `per_row`.
    pub fn spread(&self, per_row: Tensor<1>) -> Result<Tensor<1>, CrossEntropyError> {
        let [selected] = per_row.dims();
        if selected != self.selected() {
            return Err(CrossEntropyError::shape(
                Input::PerRow,
                format!("[{}], one per row passed on", self.selected()),
                &[selected],
            ));
        }
        Ok(match self.indices() {
            Some(indices) => {
                let zeros =
                    Tensor::<1>::zeros([self.rows], &per_row.device()).cast(per_row.dtype());
                zeros.select_assign(0, indices, per_row, IndexingUpdateOp::Add)
            }
            None => per_row,
        })
    }
}
