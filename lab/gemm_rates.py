"""Times the fused linear cross-entropy's chunk products with PyTorch's matmuls
(cuBLAS / cuBLASLt) on the GPU the benches run on: the anchor for the same products
through this crate's cuBLASLt path (the LM-head bench's breakdown, `linear_head`).

Per LM-head shape (rows N, hidden H, vocabulary V), the rows are cut into chunks as
`LinearChunking::rows_per_chunk` cuts them with cuBLASLt on (crates/burn-fused-ce/src/
linear/chunking.rs): as many rows as the logits budget holds, a multiple of 128, spread
evenly, so that all chunks but the last have C rows and the last the rest. Per chunk,
with W [H, V] row-major as Burn's `Linear` keeps it:
  logits   = h_c [C, H] @ W [H, V]
  grad_h   = d [C, V] @ W^T               (W^T a transposed view, as in the op)
  grad_W   = h_c^T [H, C] @ d [C, V]      (the first chunk: into a new buffer, beta = 0)
  grad_W  += h_c^T [H, C] @ d [C, V]      (every later chunk: in place, beta = 1, addmm_)
The first table is exactly the products the op runs at the benches' two shapes with the
default chunking (160 MiB of logits): each distinct (product, rows) once, how many times a
step runs it, and the step's three products summed over its chunks. The second table
times other budgets (the rate each keeps against its memory decides the budget) with, beside
the products, the weight gradient's product without the sum (the sum's read and write
of the whole weight gradient per chunk) and the sum on a second stream beside the next
chunk's logits. bf16 (f32 accumulation) and f32 with TF32 off (exact f32, as PyTorch's
default and the crate's f32 path); the weight gradient's sum in the weight's dtype, as
the op keeps it by default.

Usage: python3 gemm_rates.py [OUT.md]
Per product: the median of 20 after 5 warm-ups by CUDA events, and TFLOP/s."""
import sys
import torch

dev = "cuda"
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
lines = []

# `LinearChunking::DEFAULT_LOGITS_BYTES`, and the rows a chunk is a multiple of.
DEFAULT_LOGITS_BYTES = 160 << 20
TILE_ROWS, STAGE_ROWS, MIN_CHUNK_ROWS = 128, 256, 16
# The benches' two LM-head shapes (`crates/fused-ce-suite/benches/linear_head.rs`).
HEADS = [(8192, 4096, 128256), (16384, 2048, 151936)]
# Other logits budgets for the second table, in MiB.
SMALL_BUDGETS_MIB = [1024, 300, 128]


def rows_per_chunk(rows, vocab, dtype_bytes, budget=DEFAULT_LOGITS_BYTES, cublaslt=True):
    """`LinearChunking::rows_per_chunk`."""
    fit = budget // max(vocab * dtype_bytes, 1)
    steps = [TILE_ROWS] if cublaslt else [STAGE_ROWS, TILE_ROWS]
    step = next((s for s in steps if fit >= s), MIN_CHUNK_ROWS)
    fit = max(fit - fit % step, MIN_CHUNK_ROWS)
    if rows <= fit:
        return max(rows, 1)
    even = -(-rows // -(-rows // fit))
    return min(-(-even // step) * step, fit)


def chunk_rows(rows, chunk):
    """The rows of each chunk, in order."""
    return [min(chunk, rows - start) for start in range(0, rows, chunk)]


def median_ms(step):
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def report(shape, rows, dtype, name, flops, ms):
    line = f"| {shape} | {rows} | {dtype} | {name} | {ms:.3f} | {flops / ms / 1e9:.0f} |"
    print(line, flush=True)
    lines.append(line)


def header(title):
    for line in ("", f"**{title}**", "",
                 "| N x H x V | rows | dtype | product | ms | TFLOP/s |",
                 "|---|---|---|---|---:|---:|"):
        print(line, flush=True)
        lines.append(line)


def operands(c, h, v, dtype):
    hc = (torch.rand(c, h, device=dev) - 0.5).to(dtype)
    d = ((torch.rand(c, v, device=dev) - 0.5) * 1e-3).to(dtype)
    return hc, d


def op_products():
    """Each distinct product the op runs at the default chunking, once."""
    header("The op's products at the default chunking (160 MiB of logits)")
    for n, h, v in HEADS:
        for dtype in (torch.bfloat16, torch.float32):
            name = str(dtype).removeprefix("torch.")
            size = torch.tensor([], dtype=dtype).element_size()
            chunks = chunk_rows(n, rows_per_chunk(n, v, size))
            shape = f"{n}x{h}x{v}"
            w = ((torch.rand(h, v, device=dev) - 0.5) / h**0.5).to(dtype)
            gw = torch.zeros(h, v, device=dev, dtype=dtype)
            step_ms = 0.0
            # Each chunk's rows, and whether its weight gradient is summed into the one
            # started by the first chunk: how many chunks of each.
            kinds = {}
            for i, c in enumerate(chunks):
                kinds[(c, i > 0)] = kinds.get((c, i > 0), 0) + 1
            forward_ms = {}
            for (c, summed), count in kinds.items():
                hc, d = operands(c, h, v, dtype)
                flops = 2.0 * c * h * v
                if c not in forward_ms:
                    rows = f"{c} (x{chunks.count(c)})"
                    logits = median_ms(lambda: hc @ w)
                    report(shape, rows, name, "logits = h_c W", flops, logits)
                    grad_h = median_ms(lambda: d @ w.t())
                    report(shape, rows, name, "grad_h = d W^T", flops, grad_h)
                    forward_ms[c] = logits + grad_h
                rows = f"{c} (x{count})"
                if summed:
                    grad_w = median_ms(lambda: gw.addmm_(hc.t(), d))
                    report(shape, rows, name, "grad_W += h_c^T d (beta = 1)", flops, grad_w)
                else:
                    grad_w = median_ms(lambda: torch.mm(hc.t(), d, out=gw))
                    report(shape, rows, name, "grad_W = h_c^T d (first chunk, beta = 0)",
                           flops, grad_w)
                step_ms += count * (forward_ms[c] + grad_w)
                del hc, d
            report(shape, f"{len(chunks)} chunks: {'+'.join(map(str, chunks))}", name,
                   "a step's three products", 6.0 * n * h * v, step_ms)
            del w, gw
            torch.cuda.empty_cache()


def smaller_budgets():
    """The products at smaller chunk budgets, with the sum's cost and its overlap."""
    header("Other logits budgets: a full chunk's products")
    for n, h, v in HEADS:
        for mib in SMALL_BUDGETS_MIB:
            for dtype in (torch.bfloat16, torch.float32):
                name = str(dtype).removeprefix("torch.")
                size = torch.tensor([], dtype=dtype).element_size()
                c = rows_per_chunk(n, v, size, budget=mib << 20)
                chunks = chunk_rows(n, c)
                shape = f"{n}x{h}x{v} ({mib} MiB)"
                w = ((torch.rand(h, v, device=dev) - 0.5) / h**0.5).to(dtype)
                gw = torch.zeros(h, v, device=dev, dtype=dtype)
                hc, d = operands(c, h, v, dtype)
                flops = 2.0 * c * h * v
                rows = f"{c} (x{chunks.count(c)})"
                report(shape, rows, name, "logits = h_c W", flops, median_ms(lambda: hc @ w))
                report(shape, rows, name, "grad_h = d W^T", flops, median_ms(lambda: d @ w.t()))
                report(shape, rows, name, "grad_W += h_c^T d", flops,
                       median_ms(lambda: gw.addmm_(hc.t(), d)))
                report(shape, rows, name, "grad_W = h_c^T d (no sum)", flops,
                       median_ms(lambda: torch.mm(hc.t(), d, out=gw)))
                side = torch.cuda.Stream()

                def overlapped():
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        gw.addmm_(hc.t(), d)
                    logits = hc @ w
                    torch.cuda.current_stream().wait_stream(side)
                    return logits

                report(shape, rows, name, "logits beside grad_W += (two streams)", 2 * flops,
                       median_ms(overlapped))
                step = median_ms(lambda: (hc @ w, d @ w.t(), gw.addmm_(hc.t(), d)))
                report(shape, rows, name, f"three products x {len(chunks)} chunks",
                       3 * flops * len(chunks), step * len(chunks))
                del hc, w, d, gw
                torch.cuda.empty_cache()


op_products()
smaller_budgets()

if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as out:
        out.write(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}\n")
        out.write("\n".join(lines) + "\n")
