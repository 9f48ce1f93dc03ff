//! One product through cuBLASLt, enqueued on the stream cubecl launches the calling
//! thread's kernels on, from a task on the device's thread: the operands' addresses are
//! resolved there (cubecl orders the stream after their producers), nothing else is
//! enqueued meanwhile, and the host waits for no kernel.

use core::any::TypeId;
use core::ffi::c_void;
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
use cudarc::cublaslt::{result, sys};

use super::descriptors::{Layout, Preference, ProductDesc, failed};
use super::device::{AlgorithmKey, Refusal, with_device};
use super::layout::{LtProduct, Matrix, alignment_bytes, lt_product};
use super::library::cublaslt_version;
use crate::test_hooks;

type CudaServer = <CudaRuntime as Runtime>::Server;

/// The most workspace a product may use: what cuBLAS asks for on Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

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
/// With `second_stream`, the product runs on a second stream beside cubecl's
/// (`second_stream.rs`), after everything enqueued so far; [`join_second_stream`] orders
/// cubecl's stream after it. Where it did not run, the caller joins before writing
/// `out` another way.
pub(crate) fn launch_product(
    lhs: &CubeTensor,
    rhs: &CubeTensor,
    out: &CubeTensor,
    accumulate: bool,
    second_stream: bool,
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
        second_stream,
    };
    call.workspace_bytes = workspace_for(&call.workspace_key(device));
    // cuBLASLt's A is `rhs` and its B `lhs` (see `layout.rs`); the workspace last,
    // where there is one.
    let mut handles = vec![rhs.handle.clone(), lhs.handle.clone(), out.handle.clone()];
    if call.workspace_bytes > 0 {
        handles.push(client.empty(call.workspace_bytes));
    }
    on_device_thread(device, move |server| {
        probe_memory(server);
        call.run(server, device, handles)
    })
}

/// Runs `task` on `device`'s thread and waits for it (not for the device). cudarc's
/// symbols panic where missing: a panic is an `Err`, as a failed task is.
fn on_device_thread(
    device: DeviceId,
    task: impl FnOnce(&mut CudaServer) -> Result<(), String> + Send + 'static,
) -> Result<(), String> {
    DeviceHandle::<CudaServer>::new(device)
        .submit_blocking(move |server| {
            catch_unwind(AssertUnwindSafe(|| task(server)))
                .unwrap_or_else(|_| Err("cuBLASLt panicked".into()))
        })
        .map_err(|error| format!("the device's task failed: {error:?}"))?
}

/// The algorithm cuBLASLt's heuristic lists at `rank` for the product (its first at 0;
/// its last where it lists fewer) and the workspace it uses.
///
/// # Safety
/// The descriptors must be live ones of one product.
unsafe fn listed_algorithm(
    handle: sys::cublasLtHandle_t,
    desc: &ProductDesc,
    [a, b, d]: [&Layout; 3],
    preference: &Preference,
    rank: usize,
) -> Result<(sys::cublasLtMatmulAlgo_t, usize), String> {
    let requested = rank.min(31) + 1;
    // SAFETY: plain data, each entry written by the call before it is read.
    let mut listed: Vec<sys::cublasLtMatmulHeuristicResult_t> =
        vec![unsafe { core::mem::zeroed() }; requested];
    let mut count = 0;
    // SAFETY: the descriptors are live (the caller's promise); the array holds
    // `requested` entries.
    unsafe {
        sys::cublasLtMatmulAlgoGetHeuristic(
            handle,
            desc.0,
            a.0,
            b.0,
            d.0,
            d.0,
            preference.0,
            requested as i32,
            listed.as_mut_ptr(),
            &mut count,
        )
    }
    .result()
    .map_err(|error| failed("algorithm heuristic", error))?;
    let count = usize::try_from(count).unwrap_or(0).min(requested);
    if count == 0 {
        return Err("cuBLASLt found no algorithm".into());
    }
    let found = listed[rank.min(count - 1)];
    Ok((found.algo, found.workspaceSize))
}

/// cubecl's stream (the calling thread's) waits, on the device, for the products
/// [`launch_product`] enqueued on its second stream, whose operands are then released: a
/// no-op where there were none. `sum` is the tensor they wrote, on that device.
pub(crate) fn join_second_stream(sum: &CubeTensor) -> Result<(), String> {
    let client = &sum.client;
    if unavailable(client).is_err() {
        return Ok(());
    }
    let handle = sum.handle.clone();
    let device = client.service_id().device;
    on_device_thread(device, move |server| {
        let stream_id = StreamId::current();
        // Resolving the sum makes the device's context current.
        let resource = server
            .get_resource(handle.binding(), stream_id)
            .map_err(|error| format!("cubecl could not resolve the sum: {error:?}"))?;
        let server_text = || format!("{server:?}");
        let joined = with_device(device, |lt| {
            let main = lt.stream(stream_id.value, server_text)?;
            lt.join_second_stream(stream_id.value, main)
        });
        drop(resource);
        joined
    })
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
    second_stream: bool,
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

    fn run(
        self,
        server: &mut CudaServer,
        device: DeviceId,
        handles: Vec<Handle>,
    ) -> Result<(), String> {
        let stream_id = StreamId::current();
        let workspace_key = self.workspace_key(device);
        // On the second stream, what the product reads stays allocated until cubecl's
        // stream waits for it: the operands and the workspace, not the output.
        let held: Vec<Handle> = if self.second_stream {
            handles
                .iter()
                .enumerate()
                .filter(|&(at, _)| at != 2)
                .map(|(_, handle)| handle.clone())
                .collect()
        } else {
            Vec::new()
        };
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
            second_stream,
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
        let server_text = || format!("{server:?}");
        let used = with_device(device, |lt| {
            let main = lt.stream(stream_id.value, server_text)?;
            let this_call = Refusal::ThisCall;
            let a = Layout::new(types[0], product.a).map_err(this_call)?;
            let b = Layout::new(types[1], product.b).map_err(this_call)?;
            let d = Layout::new(types[2], product.d).map_err(this_call)?;
            // The SMs the product is to run on, where the benches ask for a split: on
            // cubecl's stream only while sums on the second stream may run beside it.
            let sm_target = test_hooks::sm_targets().map_or(0, |[cubecl, second]| {
                if second_stream {
                    second
                } else if lt.sums_pending(stream_id.value) {
                    cubecl
                } else {
                    0
                }
            });
            let desc = ProductDesc::new(&product, sm_target).map_err(this_call)?;
            let key = AlgorithmKey {
                product,
                types: types.map(|t| t as u32),
                alignments,
                accumulate,
                rank: if accumulate {
                    test_hooks::accumulate_algorithm_rank()
                } else {
                    0
                },
                sm_target,
            };
            let handle = lt.handle;
            let (algorithm, workspace_bytes) = lt
                .algorithms
                .entry(key)
                .or_insert_with(|| {
                    let preference = Preference::new(WORKSPACE_BYTES as u64, alignments)?;
                    // SAFETY: the descriptors live until the end of this task.
                    unsafe { listed_algorithm(handle, &desc, [&a, &b, &d], &preference, key.rank) }
                })
                .clone()
                .map_err(this_call)?;
            note_workspace(workspace_key, workspace_bytes);
            if workspace_bytes > workspace_given {
                return Err(Refusal::ThisCall(format!(
                    "the algorithm uses {workspace_bytes} bytes of workspace, {workspace_given} given"
                )));
            }
            let mut second = if second_stream {
                Some(lt.second_stream(stream_id.value)?)
            } else {
                None
            };
            let stream = match second.as_mut() {
                Some(second) => second.follow(main).map_err(Refusal::ThisCall)?,
                None => main,
            };
            let alpha = 1.0f32;
            let beta = if accumulate { 1.0f32 } else { 0.0 };
            let pointer = |at: u64| at as usize as *mut c_void;
            // SAFETY: the addresses are the operands' (pinned by `resources` until the
            // product is enqueued), within the extents the layouts give them (checked
            // by `lt_product` against the tensors' shapes and strides); C and D are one
            // matrix with one layout, which cuBLASLt allows in place.
            unsafe {
                result::matmul(
                    handle,
                    desc.0,
                    (&alpha as *const f32).cast(),
                    (&beta as *const f32).cast(),
                    pointer(address[0]),
                    a.0,
                    pointer(address[1]),
                    b.0,
                    pointer(address[2]),
                    d.0,
                    pointer(address[2]),
                    d.0,
                    &algorithm,
                    pointer(workspace_address),
                    workspace_bytes,
                    stream,
                )
            }
            .map_err(|error| Refusal::ThisCall(failed("matmul", error)))?;
            if let Some(second) = second {
                // The product ran: a failure to order it makes the host wait for it
                // instead (`SecondStream::enqueued`), and is no refusal.
                let _ = second.enqueued(main, held);
            }
            Ok(())
        });
        drop(resources);
        used
    }
}
