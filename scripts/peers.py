"""Times the peers on the benches' main shapes, on the GPU the benches run on: PyTorch's
eager cross-entropy and LM head (the head under torch.compile too), Liger-Kernel's
(fused linear) cross-entropy and Cut Cross-Entropy's linear cross-entropy, whichever
are installed. Random bf16 inputs as the
benches draw them (logits in [-6, 6); hidden states and weights scaled so the logits
have unit scale), `Mean`, ignore index -100, one training step (forward + backward).

Usage: python3 peers.py [OUT.md]
Per row: the median step of 20 after 5 warm-ups by CUDA events, and the peak memory the
step allocated beyond its inputs, its gradients included
(torch.cuda.max_memory_allocated)."""
import sys
import torch
import torch.nn.functional as F

dev = "cuda"
torch.manual_seed(0)
rows_out = []


def timed(name, shape, step, clear):
    for _ in range(5):
        step()
    # The inputs alone: the gradients a step makes count as its memory.
    clear()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    line = f"| {shape} | {name} | {times[len(times) // 2]:.3f} | {peak:.0f} |"
    print(line, flush=True)
    rows_out.append(line)


def loss_peers(n, v):
    x = ((torch.rand(n, v, device=dev) * 12 - 6).to(torch.bfloat16)).requires_grad_()
    y = torch.randint(0, v, (n,), device=dev)
    y[::17] = -100
    shape = f"{n}x{v}"

    def clear():
        x.grad = None

    def torch_step():
        clear()
        F.cross_entropy(x, y).backward()

    timed("PyTorch eager F.cross_entropy", shape, torch_step, clear)
    try:
        from liger_kernel.transformers import LigerCrossEntropyLoss

        liger = LigerCrossEntropyLoss()

        def liger_step():
            clear()
            liger(x, y).backward()

        timed("Liger-Kernel LigerCrossEntropyLoss", shape, liger_step, clear)
    except ImportError as error:
        print(f"Liger-Kernel: {error}")


def head_peers(n, h, v):
    hs = (torch.randn(n, h, device=dev) / h**0.25).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(v, h, device=dev) / h**0.25).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, v, (n,), device=dev)
    y[::17] = -100
    shape = f"{n}x{h}x{v}"

    def clear():
        hs.grad = None
        w.grad = None

    def torch_step():
        clear()
        F.cross_entropy((hs @ w.T).float(), y).backward()

    timed("PyTorch eager (matmul, f32 cross_entropy)", shape, torch_step, clear)
    try:
        head = torch.compile(lambda hs, w, y: F.cross_entropy((hs @ w.T).float(), y))

        def compiled_step():
            clear()
            head(hs, w, y).backward()

        timed("torch.compile (the same step)", shape, compiled_step, clear)
    except Exception as error:  # no compiler on the host
        print(f"torch.compile: {error}")
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss()

        def liger_step():
            clear()
            liger(w, hs, y).backward()

        timed("Liger-Kernel LigerFusedLinearCrossEntropyLoss", shape, liger_step, clear)
    except ImportError as error:
        print(f"Liger-Kernel: {error}")
    try:
        from cut_cross_entropy import linear_cross_entropy

        def cce_step():
            clear()
            linear_cross_entropy(hs, w, y).backward()

        timed("Cut Cross-Entropy linear_cross_entropy", shape, cce_step, clear)
    except ImportError as error:
        print(f"Cut Cross-Entropy: {error}")


print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
print("| shape | way | median ms | peak MiB beyond inputs |")
print("|---|---|---:|---:|")
loss_peers(8192, 128256)
torch.cuda.empty_cache()
head_peers(8192, 4096, 128256)
torch.cuda.empty_cache()
head_peers(16384, 2048, 151936)
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as out:
        out.write("\n".join(rows_out) + "\n")
