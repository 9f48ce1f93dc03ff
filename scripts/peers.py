"""Times the peers on the benches' main shapes, on the GPU the benches run on: PyTorch's
eager cross-entropy and LM head, the same functions under torch.compile, Liger-Kernel's
(fused linear) cross-entropy and Cut Cross-Entropy's linear cross-entropy, whichever are
installed (a missing one leaves its rows out with a note). bf16, `Mean`, one training
step (forward + backward).

Inputs, drawn on the GPU in f32 and cast to bf16 as the Rust benches draw them (random,
never zeros):
- loss only, N x V (crates/fused-ce-suite/benches/throughput.rs): logits uniform in [-6, 6), targets uniform in
  [0, V), none ignored.
- LM head, N x H x V (crates/fused-ce-suite/benches/linear_head.rs): hidden states uniform in [-1, 1), the
  weight uniform in [-2/sqrt(H), 2/sqrt(H)) (held here as PyTorch's [V, H]), targets
  uniform in [0, V), none ignored; the logits' std is then 2/3.
- LM head, "old" inputs: as this script drew them before (the figures of 2026-12-03/04
  in docs/performance.md): hidden states and weight N(0, 1) / H^0.25 (logits of std 1),
  every 17th target -100. Only Cut Cross-Entropy runs on them too: its
  backward skips each 128 x 128 block of the softmax gradient whose entries are all below
  `filter_eps` (2^-12 in bf16), so its time depends on the logits' scale. Before the
  rows, the script prints the share of blocks that pass that filter on each input set.
Cut Cross-Entropy has no loss-only entry (it takes the hidden states and the classifier),
so the loss-only case has no row of it.

Usage: python3 peers.py [OUT.md] [--steps 20] [--warmup 5] [--only TEXT] [--dry-run]
Per row: the median step of `--steps` after `--warmup` warm-ups by CUDA events, the peak
memory the steps allocated beyond their inputs (torch.cuda.max_memory_allocated; the
inputs' gradients included, and, in the next column, without them; a gradient written
over its input, as Liger's loss writes it, counts as nothing), the package's
version and the exact call. `--only` keeps the rows whose way, call or inputs hold TEXT
(case-insensitive); `--dry-run` lists the rows without a GPU. Each line of progress
starts with the seconds since the start."""
import argparse
import sys
import time

T0 = time.perf_counter()

LOSS_SHAPES = [(8192, 128256)]
HEAD_SHAPES = [(8192, 4096, 128256), (16384, 2048, 151936)]
LOSS_FN = "F.cross_entropy(x, y)"
HEAD_FN = "F.cross_entropy((hs @ w.T).float(), y)"
# Cut Cross-Entropy 25.1.1 (PyPI) knows impl "cce" (its default) and "torch_compile"; its
# filter_eps "high" (its default) and "auto" are both torch.finfo(dtype).eps / 32 (2^-12 in
# bf16), and None turns the gradient filter off. Later versions (GitHub, 25.3.1 on) take
# "auto" (their default) but no longer "high", and add impl presets (cce_exact,
# cce_kahan_full_c, ...): "auto" names the same filter in both.
CCE_FILTERS = ['"auto"', "None"]

rows_out = []
notes = []


def stamp(message):
    print(f"[{time.perf_counter() - T0:6.1f} s] {message}", flush=True)


def row(case, shape, inputs, way, package, call, setup=None):
    return dict(case=case, shape=shape, inputs=inputs, way=way, package=package,
                call=call, setup=setup)


def loss_rows(n, v):
    shape = f"{n}x{v}"
    return [
        row("loss", shape, "bench", "PyTorch eager F.cross_entropy", "torch", LOSS_FN),
        row("loss", shape, "bench", "torch.compile (the same function)", "torch",
            "compiled(x, y)",
            f"compiled = torch.compile(lambda x, y: {LOSS_FN}, dynamic=False)"),
        # Liger writes its gradient over the logits: it runs last.
        row("loss", shape, "bench", "Liger-Kernel LigerCrossEntropyLoss", "liger-kernel",
            "LigerCrossEntropyLoss()(x, y)"),
    ]


def head_rows(n, h, v):
    shape = f"{n}x{h}x{v}"
    rows = [
        row("head", shape, "bench", "PyTorch eager (matmul, f32 cross_entropy)", "torch",
            HEAD_FN),
        row("head", shape, "bench", "torch.compile (the same step)", "torch",
            "compiled(hs, w, y)",
            f"compiled = torch.compile(lambda hs, w, y: {HEAD_FN}, dynamic=False)"),
        row("head", shape, "bench", "Liger-Kernel LigerFusedLinearCrossEntropyLoss",
            "liger-kernel", "LigerFusedLinearCrossEntropyLoss()(w, hs, y)"),
    ]
    for inputs in ("bench", "old"):
        for eps in CCE_FILTERS:
            filtered = "filter 2^-12" if eps != "None" else "filter off"
            rows.append(row(
                "head", shape, inputs, f"Cut Cross-Entropy impl=cce, {filtered}",
                "cut-cross-entropy",
                f'linear_cross_entropy(hs, w, y, impl="cce", filter_eps={eps})'))
    return rows


def plan(only):
    rows = [r for n, v in LOSS_SHAPES for r in loss_rows(n, v)]
    rows += [r for n, h, v in HEAD_SHAPES for r in head_rows(n, h, v)]
    if only:
        text = only.lower()
        rows = [r for r in rows
                if text in f"{r['way']} {r['call']} {r['inputs']} {r['package']}".lower()]
    return rows


def version_of(package):
    from importlib import metadata

    try:
        return f"{package} {metadata.version(package)}"
    except metadata.PackageNotFoundError:
        return None


def timed(r, step, leaves, args):
    """Warm-ups (the first compiles), then `args.steps` steps timed by CUDA events."""
    import torch

    def clear():
        for leaf in leaves:
            leaf.grad = None

    def one():
        clear()
        step().backward()

    stamp(f"{r['shape']} {r['inputs']}: {r['way']}: warm-up")
    for i in range(args.warmup):
        start = time.perf_counter()
        one()
        torch.cuda.synchronize()
        if i == 0:
            stamp(f"  first step {time.perf_counter() - start:.1f} s (compiles included)")
    # The inputs alone: the gradients a step makes count as its memory.
    clear()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        one()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    # The gradients the last step left, less any written over its input (Liger's loss).
    grads = sum(leaf.grad.numel() * leaf.grad.element_size() for leaf in leaves
                if leaf.grad is not None
                and leaf.grad.untyped_storage().data_ptr() != leaf.untyped_storage().data_ptr())
    grads /= 2**20
    clear()
    call = r["call"] + (f"; {r['setup']}" if r["setup"] else "")
    r.update(ms=times[len(times) // 2], peak=peak, peak_no_grads=peak - grads)
    line = (f"| {r['shape']} | {r['inputs']} | {r['way']} | {r['ms']:.2f} | {peak:.0f} | "
            f"{peak - grads:.0f} | {r['version']} | `{call}` |")
    print(line, flush=True)
    rows_out.append(line)


def run_rows(rows, tensors, namespace, args):
    """Runs `rows` on `tensors` (inputs name -> dict of tensors), skipping those whose
    package is missing."""
    import torch

    for r in rows:
        version = version_of(r["package"])
        if version is None:
            note = f"{r['shape']} {r['way']}: skipped, {r['package']} not installed"
            print(note, flush=True)
            notes.append(note)
            continue
        r["version"] = version
        scope = dict(namespace)
        scope.update(tensors[r["inputs"]])
        leaves = [t for t in tensors[r["inputs"]].values() if t.requires_grad]
        try:
            if r["setup"]:
                exec(r["setup"], scope)
            step = eval(f"lambda: {r['call']}", scope)
            timed(r, step, leaves, args)
        except Exception as error:  # a peer that fails here leaves its row out
            note = f"{r['shape']} {r['way']}: failed, {type(error).__name__}: {error}"
            print(note, flush=True)
            notes.append(note)
            for leaf in leaves:
                leaf.grad = None
        torch.cuda.empty_cache()


def peer_namespace():
    import torch
    import torch.nn.functional as F

    namespace = {"torch": torch, "F": F}
    try:
        from liger_kernel.transformers import (
            LigerCrossEntropyLoss,
            LigerFusedLinearCrossEntropyLoss,
        )

        namespace.update(LigerCrossEntropyLoss=LigerCrossEntropyLoss,
                         LigerFusedLinearCrossEntropyLoss=LigerFusedLinearCrossEntropyLoss)
    except ImportError as error:
        print(f"Liger-Kernel: {error}", flush=True)
    try:
        from cut_cross_entropy import linear_cross_entropy

        namespace["linear_cross_entropy"] = linear_cross_entropy
    except ImportError as error:
        print(f"Cut Cross-Entropy: {error}", flush=True)
    return namespace


def cce_filter_share(hs, w, y, sample_rows=2048, block=128):
    """The share of Cut Cross-Entropy's 128 x 128 backward blocks that its gradient filter
    keeps (some |softmax - one-hot| >= eps / 32 of the dtype), on `sample_rows` counted rows,
    the vocabulary in its order (sorted by the logit average), and the share that holds a
    target (always kept), and the logits' std."""
    import torch

    eps = torch.finfo(hs.dtype).eps / 32
    with torch.no_grad():
        counted = y != -100
        hs, y = hs[counted][:sample_rows], y[counted][:sample_rows]
        logits = (hs @ w.T).float()
        std = logits.std().item()
        order = torch.argsort(logits.mean(0))
        grad = torch.softmax(logits, dim=1)
        del logits
        rows = torch.arange(len(y), device=y.device)
        grad[rows, y] -= 1
        target = torch.zeros_like(grad, dtype=torch.bool)
        target[rows, y] = True
        r, v = (len(y) // block) * block, (w.shape[0] // block) * block

        def blocks(t):
            t = t[:r][:, order][:, :v]
            return t.reshape(r // block, block, v // block, block).amax(dim=(1, 3))

        kept = (blocks(grad.abs()) >= eps).float().mean().item()
        with_target = blocks(target.to(torch.uint8)).float().mean().item()
    return kept, with_target, std


def loss_case(n, v, rows, namespace, args):
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.rand(n, v, device="cuda", generator=g) * 12 - 6).to(torch.bfloat16)
    y = torch.randint(0, v, (n,), device="cuda", generator=g)
    stamp(f"{n}x{v}: inputs drawn")
    run_rows(rows, {"bench": {"x": x.requires_grad_(), "y": y}}, namespace, args)


def head_case(n, h, v, rows, namespace, args):
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    bf16 = torch.bfloat16
    scale = 2 / h**0.5
    tensors = {"bench": {
        "hs": (torch.rand(n, h, device="cuda", generator=g) * 2 - 1).to(bf16),
        "w": ((torch.rand(v, h, device="cuda", generator=g) * 2 - 1) * scale).to(bf16),
        "y": torch.randint(0, v, (n,), device="cuda", generator=g),
    }}
    if any(r["inputs"] == "old" for r in rows):
        y = torch.randint(0, v, (n,), device="cuda", generator=g)
        y[::17] = -100
        tensors["old"] = {
            "hs": (torch.randn(n, h, device="cuda", generator=g) / h**0.25).to(bf16),
            "w": (torch.randn(v, h, device="cuda", generator=g) / h**0.25).to(bf16),
            "y": y,
        }
    for name, t in tensors.items():
        try:
            kept, with_target, std = cce_filter_share(t["hs"], t["w"], t["y"])
            note = (f"{n}x{h}x{v} {name} inputs: logits std {std:.3f}; Cut Cross-Entropy's "
                    f"filter (2^-12) keeps {100 * kept:.1f}% of its 128x128 backward blocks, "
                    f"{100 * with_target:.1f}% for the targets alone (2048 rows sampled)")
        except Exception as error:  # a diagnostic: the rows still run
            note = f"{n}x{h}x{v} {name} inputs: filter share failed, {error}"
        stamp(note)
        notes.append(note)
        t["hs"].requires_grad_()
        t["w"].requires_grad_()
    torch.cuda.empty_cache()
    run_rows(rows, tensors, namespace, args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="also write the table's rows to this file")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--only", help="keep the rows whose way, call or inputs hold this")
    parser.add_argument("--dry-run", action="store_true", help="list the rows; no GPU")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be at least 1")
    rows = plan(args.only)
    if args.dry_run:
        for r in rows:
            setup = f"; {r['setup']}" if r["setup"] else ""
            print(f"{r['shape']} | {r['inputs']} | {r['way']} | {r['package']} | "
                  f"`{r['call']}{setup}`")
        return

    import torch
    import triton

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}, "
          f"{version_of('liger-kernel') or 'liger-kernel not installed'}, "
          f"{version_of('cut-cross-entropy') or 'cut-cross-entropy not installed'}",
          flush=True)
    namespace = peer_namespace()
    header = ("| shape | inputs | way | median ms | peak MiB beyond inputs | "
              "the same without the gradients | version | call |\n"
              "|---|---|---|---:|---:|---:|---|---|")
    print(header, flush=True)
    for n, v in LOSS_SHAPES:
        selected = [r for r in rows if r["case"] == "loss" and r["shape"] == f"{n}x{v}"]
        if selected:
            loss_case(n, v, selected, namespace, args)
            torch.cuda.empty_cache()
    for n, h, v in HEAD_SHAPES:
        selected = [r for r in rows if r["case"] == "head" and r["shape"] == f"{n}x{h}x{v}"]
        if selected:
            head_case(n, h, v, selected, namespace, args)
            torch.cuda.empty_cache()
    stamp("done")

    print("\n| shape | inputs | way | median ms | peak MiB | without the gradients |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        if "ms" in r:
            print(f"| {r['shape']} | {r['inputs']} | {r['way']} | {r['ms']:.2f} | "
                  f"{r['peak']:.0f} | {r['peak_no_grads']:.0f} |")
    for note in notes:
        print(f"- {note}")
    if args.out:
        with open(args.out, "w") as out:
            out.write(header + "\n" + "\n".join(rows_out) + "\n\n")
            out.write("".join(f"- {note}\n" for note in notes))


if __name__ == "__main__":
    sys.exit(main())
