"""Compares our CUDA results (written by the torch_oracle example) with PyTorch's
torch.nn.functional.cross_entropy on the same inputs (with its `weight` and
`label_smoothing`; softcap and z-loss written around it as the spec defines them), and with
an f64 reference.

Usage: python3 torch_check.py <oracle dir>
Prints, per case, the relative error of our loss and gradient and PyTorch's own, both
against float64, and fails if ours is over the spec's bound or 4x worse than PyTorch's."""
import sys, pathlib, torch
import torch.nn.functional as F

DT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
BOUND = {"BF16": (1e-2, 2e-2), "F16": (1e-3, 1e-2), "F32": (1e-5, 1e-5)}
d = pathlib.Path(sys.argv[1])
dev = "cuda"
def load(name, dtype, shape):
    raw = bytearray((d / name).read_bytes())
    return torch.frombuffer(raw, dtype=dtype).reshape(shape).to(dev)
def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
def loss_rows(x, y, w, ls, z, cap):
    """Per-row ce + z (0 on ignored rows) and the Mean, per the spec."""
    xc = cap * torch.tanh(x / cap) if cap > 0 else x
    ce = F.cross_entropy(xc, y, weight=w, reduction="none", ignore_index=-100,
                         label_smoothing=ls)
    valid = y != -100
    lse = torch.logsumexp(xc.float() if xc.dtype != torch.float64 else xc, dim=1).to(xc.dtype)
    zl = torch.where(valid, z * lse * lse, torch.zeros_like(lse))
    wy = w[y.clamp_min(0)] if w is not None else torch.ones_like(lse)
    d = torch.where(valid, wy, torch.zeros_like(wy)).sum().clamp_min(1e-30)
    n = valid.sum().clamp_min(1)
    mean = ce.sum() / d + zl.sum() / n
    return ce + zl, mean
ok = True
for line in (d / "manifest.txt").read_text().split("\n"):
    if not line.strip():
        continue
    i, n, v, name, ls, z, cap, weighted = line.split(); n, v = int(n), int(v); dt = DT[name]
    ls, z, cap = float(ls), float(z), float(cap)
    cw = load(f"{i}.class_weights", torch.float32, (v,)) if weighted == "1" else None
    x = load(f"{i}.logits", dt, (n, v)); w = load(f"{i}.weights", dt, (n,))
    y = load(f"{i}.targets", torch.int64, (n,))
    ours_none = load(f"{i}.loss_none", dt, (n,)); ours_grad = load(f"{i}.grad_none", dt, (n, v))
    ours_mean = load(f"{i}.loss_mean", dt, (1,))
    # float64 reference
    x64 = x.double().requires_grad_()
    cw64 = cw.double() if cw is not None else None
    l64, _ = loss_rows(x64, y, cw64, ls, z, cap)
    (l64 * w.double()).sum().backward()
    _, mean64 = loss_rows(x.double(), y, cw64, ls, z, cap)
    # PyTorch at the input precision
    xt = x.clone().requires_grad_()
    cwt = cw.to(dt) if cw is not None else None
    lt, _ = loss_rows(xt, y, cwt, ls, z, cap)
    (lt * w).sum().backward()
    res = dict(loss=rel(ours_none, l64), loss_torch=rel(lt, l64),
               grad=rel(ours_grad, x64.grad), grad_torch=rel(xt.grad, x64.grad),
               mean=rel(ours_mean, mean64.reshape(1)))
    lb, gb = BOUND[name]
    good = (res["loss"] <= lb and res["mean"] <= lb and res["grad"] <= gb
            and res["grad"] <= max(4 * res["grad_torch"], 1e-6))
    ok &= good
    print(f"{n}x{v} {name} ls={ls} z={z} cap={cap} w={weighted}: " + " ".join(f"{k}={val:.2e}" for k, val in res.items())
          + ("  OK" if good else "  FAIL"))
    del x64, xt, lt, l64
    torch.cuda.empty_cache()
sys.exit(0 if ok else 1)
