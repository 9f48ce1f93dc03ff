"""Times the fused linear cross-entropy's chunk loop through PyTorch's cuBLAS, one stream
against two: per chunk of C rows, logits = h_c W into a chunk buffer, an in-place pass
over it (the loss kernel's read and write), grad_h_c = d W^T, and grad_W += h_c^T d.
With two streams the weight gradient's sum runs on a second stream beside the next
chunk's logits, over two chunk buffers (or three), or beside the same chunk's grad_h_c
over one buffer (`beside grad_h`); with `side SMs` as well, each
cuBLAS product is told to leave SMs to the other stream (PyTorch's SM carve-out, where
this PyTorch has it): the sum on that many SMs, the other products on the rest. bf16. Prints step ms, TFLOP/s and the peak
bytes beyond h and W; a step is the mean of 7 queued back to back.

Usage: python3 chunk_pipeline.py [OUT.md]"""
import sys
import torch

dev = "cuda"
torch.manual_seed(0)
lines = []


def steady_ms(step, reps=7):
    """Mean of `reps` steps queued back to back after two alone: a training loop's pace."""
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    begin, finish = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    begin.record()
    for _ in range(reps):
        step()
    finish.record()
    finish.synchronize()
    return begin.elapsed_time(finish) / reps


SMS = torch.cuda.get_device_properties(0).multi_processor_count
carve = getattr(torch._C, "_set_sm_carveout_experimental", None)


def carved(sms_left_out):
    """Leaves `sms_left_out` SMs to the other stream's products (0: none)."""
    if carve is not None:
        carve(sms_left_out if sms_left_out else None)


def run(n, h, v, c, buffers, two_streams, side_sms=0, beside_grad_h=False):
    dt = torch.bfloat16
    hall = (torch.rand(n, h, device=dev) - 0.5).to(dt)
    w = ((torch.rand(h, v, device=dev) - 0.5) / h**0.5).to(dt)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    gw = torch.zeros(h, v, device=dev, dtype=dt)
    gh = torch.empty(n, h, device=dev, dtype=dt)
    bufs = [torch.empty(c, v, device=dev, dtype=dt) for _ in range(buffers)]
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    done = [None] * buffers

    def sum_on_side(hc, buf):
        """grad_W += h_c^T d on the side stream, after everything enqueued on main."""
        ready = torch.cuda.Event()
        ready.record(main)
        side.wait_event(ready)
        carved(SMS - side_sms if side_sms else 0)
        with torch.cuda.stream(side):
            gw.addmm_(hc.t(), buf)
        carved(side_sms)

    def step():
        for i in range(-(-n // c)):
            rows = slice(i * c, min(n, (i + 1) * c))
            hc = hall[rows]
            k = i % buffers
            buf = bufs[k][: hc.shape[0]]
            if two_streams and done[k] is not None:
                main.wait_event(done[k])
            # Beside grad_h, the logits run alone on every SM.
            carved(0 if beside_grad_h else side_sms)
            torch.mm(hc, w, out=buf)
            buf.mul_(1e-3)
            if beside_grad_h:
                sum_on_side(hc, buf)
                torch.mm(buf, w.t(), out=gh[rows])
                main.wait_stream(side)
                continue
            torch.mm(buf, w.t(), out=gh[rows])
            if two_streams:
                sum_on_side(hc, buf)
                done[k] = torch.cuda.Event()
                done[k].record(side)
            else:
                gw.addmm_(hc.t(), buf)
        if two_streams:
            main.wait_stream(side)
        carved(0)

    ms = steady_ms(step)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    flops = 6.0 * n * h * v
    streams = "two" if two_streams else "one"
    if beside_grad_h:
        streams = "two, beside grad_h"
    if side_sms:
        streams += f", sum on {side_sms} SMs"
    line = (f"| {n}x{h}x{v} | {c} | {buffers} | {streams} | "
            f"{ms:.2f} | {flops / ms / 1e9:.0f} | {peak:.0f} |")
    print(line, flush=True)
    lines.append(line)
    del hall, w, gw, gh, bufs
    torch.cuda.empty_cache()


print("| N x H x V | chunk rows | buffers | streams | step ms | TFLOP/s | peak MiB |")
print("|---|---:|---:|---|---:|---:|---:|")
for n, h, v, chunks in [(8192, 4096, 128256, (4096, 640, 512, 320, 256)),
                        (16384, 2048, 151936, (3328, 512, 256, 128))]:
    for c in chunks:
        run(n, h, v, c, 1, False)
        run(n, h, v, c, 2, True)
        if c <= 640:
            run(n, h, v, c, 1, True, beside_grad_h=True)
            if carve is not None:
                run(n, h, v, c, 1, True, 66, beside_grad_h=True)
            run(n, h, v, c, 3, True)
            if carve is not None:
                for side_sms in (16, 32):
                    run(n, h, v, c, 2, True, side_sms)

if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as out:
        out.write(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}\n\n")
        out.write("| N x H x V | chunk rows | buffers | streams | step ms | TFLOP/s | peak MiB |\n"
                  "|---|---:|---:|---|---:|---:|---:|\n")
        out.write("\n".join(lines) + "\n")
