"""Times the fused linear cross-entropy's three chunk products with PyTorch's matmuls
(cuBLAS / cuBLASLt) on the GPU the benches run on: the anchor for the same products
through this crate's cuBLASLt path (the LM-head bench's breakdown).

Per LM-head shape (rows N, hidden H, vocabulary V) and chunk of C rows:
  logits   = h_c [C, H] @ W [H, V]
  grad_h   = d [C, V] @ W^T
  grad_W  += h_c^T [H, C] @ d [C, V]      (in place: addmm_ with beta = 1)
in bf16 (f32 accumulation) and in f32 with TF32 off (exact f32, as PyTorch's default).
Beside them: the weight gradient's product without the sum (beta = 0: what the sum's
read and write of the whole weight gradient cost per chunk), and the sum run on a second
stream beside the next chunk's logits (what overlapping the two would save).

Usage: python3 gemm_rates.py [OUT.md]
Per product: the median of 20 after 5 warm-ups by CUDA events, and TFLOP/s."""
import sys
import torch

dev = "cuda"
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
lines = []


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


def report(shape, dtype, name, flops, ms):
    line = f"| {shape} | {dtype} | {name} | {ms:.3f} | {flops / ms / 1e9:.0f} |"
    print(line, flush=True)
    lines.append(line)


# (N, H, V, rows per chunk): the benches' two LM-head shapes with the 1 GiB default chunks,
# and smaller chunks (less memory: the rate they keep decides the chunk budget).
SHAPES = [
    (8192, 4096, 128256, c) for c in (4096, 1024, 512)
] + [(16384, 2048, 151936, c) for c in (3328, 1024, 512)]

print("| N x H x V (chunk) | dtype | product | ms | TFLOP/s |")
print("|---|---|---|---:|---:|")
for n, h, v, c in SHAPES:
    for dtype in (torch.bfloat16, torch.float32):
        shape = f"{n}x{h}x{v} ({c})"
        hc = (torch.rand(c, h, device=dev) - 0.5).to(dtype)
        w = ((torch.rand(h, v, device=dev) - 0.5) / h**0.5).to(dtype)
        d = ((torch.rand(c, v, device=dev) - 0.5) * 1e-3).to(dtype)
        gw = torch.zeros(h, v, device=dev, dtype=dtype)
        flops = 2.0 * c * h * v
        name = str(dtype).removeprefix("torch.")
        report(shape, name, "logits = h_c W", flops, median_ms(lambda: hc @ w))
        report(shape, name, "grad_h = d W^T", flops, median_ms(lambda: d @ w.t()))
        report(shape, name, "grad_W += h_c^T d", flops, median_ms(lambda: gw.addmm_(hc.t(), d)))
        report(shape, name, "grad_W = h_c^T d (no sum)", flops,
               median_ms(lambda: torch.mm(hc.t(), d, out=gw)))
        side = torch.cuda.Stream()

        def overlapped():
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                gw.addmm_(hc.t(), d)
            logits = hc @ w
            torch.cuda.current_stream().wait_stream(side)
            return logits

        report(shape, name, "logits beside grad_W += (two streams)", 2 * flops,
               median_ms(overlapped))
        chunks = -(-n // c)
        step = median_ms(lambda: (hc @ w, d @ w.t(), gw.addmm_(hc.t(), d)))
        report(shape, name, f"three products x {chunks} chunks", 3 * flops * chunks, step * chunks)
        del hc, w, d, gw
        torch.cuda.empty_cache()

if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as out:
        out.write(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}\n\n")
        out.write("| N x H x V (chunk) | dtype | product | ms | TFLOP/s |\n|---|---|---|---:|---:|\n")
        out.write("\n".join(lines) + "\n")
