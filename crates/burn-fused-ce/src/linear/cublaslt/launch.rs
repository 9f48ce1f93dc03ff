//! One product through cuBLASLt, enqueued on the stream cubecl launches the calling
//! thread's kernels on, from a task on the device's thread: the operands' addresses are
//! resolved there (cubecl orders the stream after their producers), nothing else is
//! enqueued meanwhile, and the host waits for no kernel but once per kind of product,
//! the first time it runs in the process, while its algorithm is chosen by measurement
//! (`measure.rs`).

use core::any::TypeId;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{LazyLock, Mutex};

use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::client::Client;
use cubecl::device::DeviceId;
use cubecl::device_handle::DeviceHandle;
use cubecl_cuda::CudaRuntime;
use cubecl_environment::stream::StreamId;
use cubecl_runtime::{
    runtime::Runtime,
    server::{Handle, Server, ServerStorage},
};
use cudarc::cublaslt::sys;

use super::descriptors::{Layout, ProductDesc};
use super::device::{AlgorithmKey, Refusal, with_device};
use super::layout::{LtProduct, Matrix, alignment_bytes, lt_product};
use super::library::cublaslt_version;
use super::measure::{Described, Operands, WORKSPACE_BYTES, choose};
use crate::test_hooks;

type CudaServer = <CudaRuntime as Runtime>::Server;

/// What a product's workspace depends on: the device, the product and its types, and
/// whether it sums into its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct WorkspaceKey {
    device: DeviceId,
    product: LtProduct,
    types: [u32; 3],
    accumulate: bool,
}

/// The workspace the algorithm chosen for each kind of product uses, once one has run:
/// later products of that kind are given that much, not the most, so that a step's
/// peak holds no workspace its products leave unused. Algorithms are chosen within the
/// most; one that uses more than its product was given (operands aligned otherwise than
/// before) refuses that product once and raises what the kind is given.
static WORKSPACE_NEEDED: LazyLock<Mutex<HashMap<WorkspaceKey, usize>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The workspace to give a product of kind `key`.
fn workspace_for(key: &WorkspaceKey) -> usize {
    WORKSPACE_NEEDED
        .lock()
        .ok()
        .and_then(|known| known.get(key).copied())
        .unwrap_or(WORKSPACE_BYTES)
}

/// Remembers the workspace a product of kind `key` used (the most, where several
/// algorithms ran for that kind).
fn note_workspace(key: WorkspaceKey, bytes: usize) {
    if let Ok(mut known) = WORKSPACE_NEEDED.lock() {
        known
            .entry(key)
            .and_modify(|noted| *noted = (*noted).max(bytes))
            .or_insert(bytes);
    }
}

/// A float dtype as cuBLASLt names it.
fn data_type(dtype: DType) -> Option<sys::cudaDataType> {
    match dtype {
        DType::F32 => Some(sys::cudaDataType::CUDA_R_32F),
        DType::F16 => Some(sys::cudaDataType::CUDA_R_16F),
        DType::BF16 => Some(sys::cudaDataType::CUDA_R_16BF),
        _ => None,
    }
}

fn matrix(tensor: &CubeTensor) -> Option<Matrix> {
    let (shape, strides) = (tensor.meta.shape(), tensor.meta.strides());
    (shape.num_dims() == 2).then(|| Matrix {
        shape: [shape[0], shape[1]],
        strides: [strides[0], strides[1]],
    })
}

/// Why cuBLASLt cannot run products on `client`'s device, if it cannot: not a CUDA
/// device, a CUDA graph being captured, or the library not loaded.
fn unavailable(client: &Client) -> Result<(), String> {
    if client.service_id().service != TypeId::of::<CudaServer>() {
        return Err("not a CUDA device".into());
    }
    if client.is_capturing() {
        return Err("a CUDA graph is being captured".into());
    }
    cublaslt_version().map(|_| ())
}

/// See [`super::cublaslt_may_run`].
pub(crate) fn may_run(client: &Client) -> bool {
    unavailable(client).is_ok()
}

/// `out = lhs rhs`, or `out += lhs rhs` when `accumulate`, for 2-D `lhs [M, K]` and
/// `rhs [K, N]` of one dtype and `out [M, N]` of theirs or f32, accumulated in f32
/// (`CUBLAS_COMPUTE_32F`: f32 operands are multiplied in f32, not TF32). `Err` says why
/// it did not run; nothing was written then.
///
/// The algorithm is the one measured fastest for the product's kind (its shapes, layouts,
/// types, alignments, whether it sums): the first product of a kind times cuBLASLt's
/// candidates on its operands first (`measure.rs`, a one-time host wait; a sum's output
/// is not written by the timing), or takes the one kept on disk (`store.rs`).
pub(crate) fn launch_product(
    lhs: &CubeTensor,
    rhs: &CubeTensor,
    out: &CubeTensor,
    accumulate: bool,
) -> Result<(), String> {
    launch(lhs, rhs, out, accumulate, Choice::Measured)
}

/// For the tests (`crate::cublaslt_listed_product`): the product as
/// [`launch_product`] runs it, with the algorithm cuBLASLt's
/// heuristic lists at `rank` (its first at 0; its last where it lists fewer) instead of
/// the kind's measured one. Nothing is measured, kept or counted.
#[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
pub(crate) fn launch_listed_product(
    lhs: &CubeTensor,
    rhs: &CubeTensor,
    out: &CubeTensor,
    accumulate: bool,
    rank: usize,
) -> Result<(), String> {
    launch(lhs, rhs, out, accumulate, Choice::Listed(rank))
}

/// Which algorithm a product runs with.
#[derive(Debug, Clone, Copy)]
enum Choice {
    /// Its kind's, chosen by measurement the first time the kind runs (`measure.rs`).
    Measured,
    /// The heuristic's at this rank, for the tests.
    Listed(usize),
}

/// [`launch_product`] with the algorithm `choice` says.
fn launch(
    lhs: &CubeTensor,
    rhs: &CubeTensor,
    out: &CubeTensor,
    accumulate: bool,
    choice: Choice,
) -> Result<(), String> {
    let client = &out.client;
    unavailable(client)?;
    let (Some(operand_type), Some(out_type)) = (data_type(lhs.dtype), data_type(out.dtype)) else {
        return Err(format!("dtypes {:?} into {:?}", lhs.dtype, out.dtype));
    };
    if rhs.dtype != lhs.dtype || !(out.dtype == lhs.dtype || out.dtype == DType::F32) {
        return Err(format!(
            "dtypes {:?} x {:?} into {:?}",
            lhs.dtype, rhs.dtype, out.dtype
        ));
    }
    let product = match (matrix(lhs), matrix(rhs), matrix(out)) {
        (Some(lhs), Some(rhs), Some(out)) => lt_product(lhs, rhs, out),
        _ => None,
    }
    .ok_or_else(|| {
        format!(
            "operands cuBLASLt cannot read in place: {:?} {:?} x {:?} {:?} into {:?} {:?}",
            lhs.meta.shape(),
            lhs.meta.strides(),
            rhs.meta.shape(),
            rhs.meta.strides(),
            out.meta.shape(),
            out.meta.strides()
        )
    })?;
    let types = [operand_type, operand_type, out_type];
    let device = client.service_id().device;
    let mut call = Call {
        product,
        types,
        elem_bytes: [lhs.dtype.size() as u64, out.dtype.size() as u64],
        accumulate,
        workspace_bytes: 0,
        choice,
    };
    call.workspace_bytes = match choice {
        Choice::Measured => workspace_for(&call.workspace_key(device)),
        Choice::Listed(_) => WORKSPACE_BYTES,
    };
    // cuBLASLt's A is `rhs` and its B `lhs` (see `layout.rs`); the workspace last,
    // where there is one.
    let mut handles = vec![rhs.handle.clone(), lhs.handle.clone(), out.handle.clone()];
    if call.workspace_bytes > 0 {
        handles.push(client.empty(call.workspace_bytes));
    }
    let timed = on_device_thread(device, move |server| {
        probe_memory(server);
        call.run(server, device, handles)
    })?;
    if timed {
        // On the calling thread, for the tests that run side by side.
        test_hooks::count_cublaslt_measurement();
    }
    Ok(())
}

/// Runs `task` on `device`'s thread and waits for it (not for the device). cudarc's
/// symbols panic where missing: a panic is an `Err`, as a failed task is.
fn on_device_thread<R: Send + 'static>(
    device: DeviceId,
    task: impl FnOnce(&mut CudaServer) -> Result<R, String> + Send + 'static,
) -> Result<R, String> {
    DeviceHandle::<CudaServer>::new(device)
        .submit_blocking(move |server| {
            catch_unwind(AssertUnwindSafe(|| task(server)))
                .unwrap_or_else(|_| Err("cuBLASLt panicked".into()))
        })
        .map_err(|error| format!("the device's task failed: {error:?}"))?
}

/// Where the benches ask for it ([`test_hooks::set_probe_memory`]), the device's bytes in
/// use as the product is enqueued: its operands, output and workspace allocated.
fn probe_memory(server: &mut CudaServer) {
    if test_hooks::probe_memory() {
        let in_use = server
            .stream_ids()
            .into_iter()
            .filter_map(|stream| server.memory_report(stream))
            .map(|report| report.usage().bytes_in_use)
            .sum();
        test_hooks::note_bytes_in_use(in_use);
    }
}

/// What one product needs on the device's thread.
struct Call {
    product: LtProduct,
    /// cuBLASLt's A, B and C/D.
    types: [sys::cudaDataType; 3],
    /// Bytes per element of the operands and of the output.
    elem_bytes: [u64; 2],
    accumulate: bool,
    /// The workspace given (its buffer is the fourth handle where this is not 0).
    workspace_bytes: usize,
    choice: Choice,
}

impl Call {
    /// The product's kind, under which the workspace its algorithm uses is noted.
    fn workspace_key(&self, device: DeviceId) -> WorkspaceKey {
        WorkspaceKey {
            device,
            product: self.product,
            types: self.types.map(|t| t as u32),
            accumulate: self.accumulate,
        }
    }

    /// Enqueues the product; whether its algorithm was chosen by timing candidates.
    fn run(
        self,
        server: &mut CudaServer,
        device: DeviceId,
        handles: Vec<Handle>,
    ) -> Result<bool, String> {
        let stream_id = StreamId::current();
        let workspace_key = self.workspace_key(device);
        // Resolving each operand makes the device's context current and orders this
        // stream after the operand's producer; the resources pin the memory meanwhile.
        let mut resources = Vec::with_capacity(handles.len());
        for handle in handles {
            resources.push(
                server
                    .get_resource(handle.binding(), stream_id)
                    .map_err(|error| format!("cubecl could not resolve an operand: {error:?}"))?,
            );
        }
        let address: Vec<u64> = resources
            .iter()
            .map(|resource| resource.resource().ptr)
            .collect();
        let Self {
            product,
            types,
            elem_bytes,
            accumulate,
            workspace_bytes: workspace_given,
            choice,
        } = self;
        let workspace_address = address.get(3).copied().unwrap_or(0);
        // C and D are one matrix.
        let out_alignment = alignment_bytes(address[2], product.d.ld, elem_bytes[1]);
        let alignments = [
            alignment_bytes(address[0], product.a.ld, elem_bytes[0]),
            alignment_bytes(address[1], product.b.ld, elem_bytes[0]),
            out_alignment,
            out_alignment,
        ];
        // The bytes from the output's start to the end of its last column (cuBLASLt's
        // column-major D).
        let d = product.d;
        let out_bytes = ((d.cols.max(1) - 1) * d.ld + d.rows) * elem_bytes[1];
        let server_text = || format!("{server:?}");
        let mut timed = false;
        let used = with_device(device, |lt| {
            let stream = lt.stream(stream_id.value, server_text)?;
            let this_call = Refusal::ThisCall;
            let a = Layout::new(types[0], product.a).map_err(this_call)?;
            let b = Layout::new(types[1], product.b).map_err(this_call)?;
            let d = Layout::new(types[2], product.d).map_err(this_call)?;
            let desc = ProductDesc::new(&product).map_err(this_call)?;
            let described = Described {
                handle: lt.handle,
                desc: &desc,
                a: &a,
                b: &b,
                d: &d,
            };
            let (algorithm, workspace_bytes) = match choice {
                Choice::Measured => {
                    let key = AlgorithmKey {
                        product,
                        types: types.map(|t| t as u32),
                        alignments,
                        accumulate,
                    };
                    let operands = Operands {
                        a: address[0],
                        b: address[1],
                        out: address[2],
                        out_bytes: out_bytes as usize,
                        accumulate,
                        workspace: workspace_address,
                        workspace_bytes: workspace_given,
                        stream,
                    };
                    let chosen = lt.algorithm(key, |store| {
                        // SAFETY: the operands are pinned by `resources` until the end
                        // of this task, in the device's current context; the
                        // descriptors are theirs.
                        unsafe { choose(&described, &operands, alignments, store) }.map(
                            |(algorithm, was_timed)| {
                                timed = was_timed;
                                algorithm
                            },
                        )
                    });
                    let chosen = chosen.map_err(this_call)?;
                    note_workspace(workspace_key, chosen.1);
                    chosen
                }
                Choice::Listed(rank) => {
                    let listed = described.listed(alignments, rank + 1).map_err(this_call)?;
                    listed[rank.min(listed.len() - 1)]
                }
            };
            if workspace_bytes > workspace_given {
                return Err(Refusal::ThisCall(format!(
                    "the algorithm uses {workspace_bytes} bytes of workspace, {workspace_given} given"
                )));
            }
            // SAFETY: the addresses are the operands' (pinned by `resources` until the
            // product is enqueued), within the extents the layouts give them (checked
            // by `lt_product` against the tensors' shapes and strides); the workspace
            // holds `workspace_bytes`.
            unsafe {
                described.enqueue(
                    [address[0], address[1], address[2], address[2]],
                    accumulate,
                    &algorithm,
                    (workspace_address, workspace_bytes),
                    stream,
                )
            }
            .map_err(Refusal::ThisCall)?;
            Ok(())
        });
        drop(resources);
        used.map(|()| timed)
    }
}
