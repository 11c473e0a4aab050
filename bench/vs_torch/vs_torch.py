#!/usr/bin/env python3
"""Side by side on one thread: distro's DeMo step, DisTrO-AdamW step and
AdamW baseline through the Python package (distro.torch, a torch.optim
optimizer over the installed library) and through shim.c (the same calls
from C: what the binding adds), against the PyTorch formulation of the
DeMo reference step and torch.optim.AdamW(foreach=True), on the GPT-2 124M
tensor shapes, in interleaved rounds (median per method). Prints a table
next to a memory-copy floor measured in the same process, and appends the
medians to a TSV (--tsv). A benchmark: it asserts nothing about time.

  vs_torch.py --shim libshim.so [--layers N] [--rounds R] [--chunk C] [--topk K] [--tsv FILE]
"""
import argparse
import ctypes
import math
import os
import platform
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("vs_torch: skipped: PyTorch is not installed for this python3 (Debian: python3-torch)")
    sys.exit(0)
import distro.torch as dt


def gpt2_shapes(layers):
    V, T, C = 50257, 1024, 768
    s = [("wte", (V, C)), ("wpe", (T, C))]
    for l in range(layers):
        p = f"h.{l}."
        s += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
              (p + "attn.c_attn.weight", (3 * C, C)), (p + "attn.c_attn.bias", (3 * C,)),
              (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
              (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
              (p + "mlp.c_fc.weight", (4 * C, C)), (p + "mlp.c_fc.bias", (4 * C,)),
              (p + "mlp.c_proj.weight", (C, 4 * C)), (p + "mlp.c_proj.bias", (C,))]
    return s + [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]


def chunk_size(n, target):
    if n <= target:
        return n
    return next((d for d in range(target, 1, -1) if n % d == 0), 1)


class TorchDeMo:
    """The DeMo reference step written with stock PyTorch ops (DCT by einsum
    on chunked tiles, torch.topk, decode own payload and subtract, scatter
    mean over the ranks (one here), inverse, sign update), as bench/torch_step.py
    does on a GPU."""

    def __init__(self, params, chunk, topk, decay=0.999, wd=0.0):
        self.p, self.chunk, self.topk, self.decay, self.wd = params, chunk, topk, decay, wd
        self.delta = [torch.zeros_like(p) for p in params]
        self.bases = {}

    def basis(self, n):
        if n not in self.bases:
            i = torch.arange(n, dtype=torch.float64).unsqueeze(1)
            k = torch.arange(n, dtype=torch.float64).unsqueeze(0)
            f = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
            f[:, 0] = math.sqrt(1.0 / n)
            self.bases[n] = f.float()
        return self.bases[n]

    @torch.no_grad()
    def step(self, grads, lr):
        for p, g, d in zip(self.p, grads, self.delta):
            r, c = (p.shape[0], p.shape[1]) if p.dim() == 2 else (1, p.shape[0])
            h, w = chunk_size(r, self.chunk) if p.dim() == 2 else 1, chunk_size(c, self.chunk)
            fh, fw = self.basis(h), self.basis(w)
            k = min(self.topk, h * w)
            p.mul_(1 - lr * self.wd)
            d.mul_(self.decay).add_(g, alpha=lr)
            x = d.view(r // h, h, c // w, w)
            coef = torch.einsum("ahbw,hi,wj->abij", x, fh, fw).reshape(-1, h * w)
            _, idx = torch.topk(coef.abs(), k, dim=-1)
            val = torch.gather(coef, -1, idx)
            own = torch.zeros_like(coef).scatter_(-1, idx, val).view(r // h, c // w, h, w)
            d.sub_(torch.einsum("abij,hi,wj->ahbw", own, fh, fw).reshape(d.shape))
            agg = torch.zeros_like(coef).scatter_reduce_(-1, idx, val, reduce="mean", include_self=False)
            q = torch.einsum("abij,hi,wj->ahbw", agg.view(r // h, c // w, h, w), fh, fw).reshape(p.shape)
            p.add_(torch.sign(q), alpha=-lr)


def copy_floor(n):
    """Seconds to copy n floats once (torch, one thread): the memory floor's unit."""
    a, b = torch.ones(n), torch.empty(n)
    best = 1e30
    for _ in range(5):
        t = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--topk", type=int, default=32)
    ap.add_argument("--tsv", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    lib = ctypes.CDLL(a.shim)
    lib.shim_create.restype = ctypes.c_void_p
    lib.shim_create.argtypes = [ctypes.c_int] * 5 + [ctypes.c_float]
    lib.shim_add.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                             ctypes.POINTER(ctypes.c_int64)]
    lib.shim_step.argtypes = [ctypes.c_void_p, ctypes.c_float]
    shapes = gpt2_shapes(a.layers)
    n = sum(math.prod(s) for _, s in shapes)
    gen = torch.Generator().manual_seed(1)
    init = [torch.randn(s, generator=gen) * 0.02 for _, s in shapes]
    grads = [torch.randn(s, generator=gen) * 1e-3 for _, s in shapes]

    def ours(algo):
        o = lib.shim_create(algo, a.chunk, a.topk, 0, 1, 0.0)  # F32 values, like the reference
        if not o:
            sys.exit("vs_torch: the library refused the options")
        ps = [t.clone() for t in init]
        for (name, s), p, g in zip(shapes, ps, grads):
            dims = (ctypes.c_int64 * len(s))(*s)
            if lib.shim_add(o, name.encode(), p.data_ptr(), g.data_ptr(), len(s), dims) != 0:
                sys.exit("vs_torch: shim_add failed")
        return o, ps

    demo, demo_p = ours(0)
    dadam, dadam_p = ours(1)  # keep the tensors: the library holds their storage
    base, base_p = ours(2)

    def package(cls, **kw):
        ps = [torch.nn.Parameter(t.clone()) for t in init]
        for p, g in zip(ps, grads):
            p.grad = g  # the same gradient storage every step, as after a backward into .grad
        return cls(ps, lr=1e-3, weight_decay=0.0, threads=1, **kw), ps

    dk = dict(chunk=a.chunk, topk=a.topk, values="f32")
    pkg_demo, pkg_demo_p = package(dt.DeMo, **dk)
    pkg_dadam, pkg_dadam_p = package(dt.DisTrOAdamW, **dk)
    pkg_base, pkg_base_p = package(dt.AdamW)
    ref_p = [t.clone() for t in init]
    ref = TorchDeMo(ref_p, a.chunk, a.topk)
    adam_p = [t.clone().requires_grad_(True) for t in init]
    adam = torch.optim.AdamW(adam_p, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, foreach=True)
    for p, g in zip(adam_p, grads):
        p.grad = g.clone()
    lr = 1e-3
    runs = {
        "package DeMo step": lambda: pkg_demo.step(),
        "C DeMo step": lambda: lib.shim_step(demo, lr),
        "PyTorch DeMo reference": lambda: ref.step(grads, lr),
        "package DisTrO-AdamW": lambda: pkg_dadam.step(),
        "C DisTrO-AdamW": lambda: lib.shim_step(dadam, lr),
        "package AdamW baseline": lambda: pkg_base.step(),
        "C AdamW baseline": lambda: lib.shim_step(base, lr),
        "torch AdamW foreach": lambda: adam.step(),
    }
    times = {k: [] for k in runs}
    pkgs = {"package DeMo step": pkg_demo, "package DisTrO-AdamW": pkg_dadam, "package AdamW baseline": pkg_base}
    outside = {k: [] for k in pkgs}  # wall time of step() minus the library's own seconds_total
    print(f"vs_torch: GPT-2 124M shapes, {a.layers} of 12 blocks, {len(shapes)} tensors, {n / 1e6:.1f} M parameters; "
          f"chunk {a.chunk}, topk {a.topk}, f32 values; PyTorch {torch.__version__}, 1 thread each; "
          f"{a.rounds} interleaved rounds (the first is warm-up)")
    for r in range(a.rounds + 1):
        for k, f in runs.items():
            t = time.perf_counter()
            rc = f()
            if rc not in (None, 0):
                sys.exit(f"vs_torch: {k} failed")
            if r > 0:
                times[k].append(time.perf_counter() - t)
                if k in pkgs:
                    outside[k].append(times[k][-1] - pkgs[k].last_stats.seconds_total)
        print(f"  round {r}: " + ", ".join(f"{k} {times[k][-1]:.3f} s" if r else f"{k} (warm-up)" for k in runs))
    floor = copy_floor(n)  # seconds to move 8 B/param (4 read + 4 written)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmemory-copy floor: {8 * n / floor / 1e9:.2f} GB/s (torch copy, 1 thread); one pass of 20 B/param = "
          f"{2.5 * floor:.3f} s, of AdamW's 28 B/param = {3.5 * floor:.3f} s")
    print(f"{'method':<26} {'median s':>9} {'min s':>8} {'x floor':>8}")
    for k, v in times.items():
        fl = 3.5 * floor if "AdamW" in k else 2.5 * floor
        print(f"{k:<26} {med[k]:9.3f} {min(v):8.3f} {med[k] / fl:8.1f}")
    ratios = {
        "package DeMo step vs PyTorch DeMo reference (x faster, target >= 5)":
            med["PyTorch DeMo reference"] / med["package DeMo step"],
        "package DisTrO-AdamW vs PyTorch DeMo reference (x faster)":
            med["PyTorch DeMo reference"] / med["package DisTrO-AdamW"],
        "binding overhead, DeMo step (package / C - 1, target <= 5%)": med["package DeMo step"] / med["C DeMo step"] - 1,
        "binding overhead, DisTrO-AdamW": med["package DisTrO-AdamW"] / med["C DisTrO-AdamW"] - 1,
        "binding overhead, AdamW baseline": med["package AdamW baseline"] / med["C AdamW baseline"] - 1,
        "package AdamW baseline vs torch AdamW foreach (x faster)":
            med["torch AdamW foreach"] / med["package AdamW baseline"],
    }
    for k, v in outside.items():
        ratios[f"binding time outside the C call, {k} (median s / median step, target <= 5%)"] = \
            statistics.median(v) / med[k]
    print()
    for k, v in ratios.items():
        print(f"{k}: {v * 100:+.2f}%" if "overhead" in k or "outside" in k else f"{k}: {v:.2f}x")
    if a.tsv:
        new = not os.path.exists(a.tsv)
        with open(a.tsv, "a") as f:
            if new:
                f.write("date\thost\tlayers\tchunk\ttopk\trounds\tmethod\tmedian_s\tmin_s\tfloor_copy_s\n")
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            for k, v in times.items():
                f.write(f"{stamp}\t{platform.node()}\t{a.layers}\t{a.chunk}\t{a.topk}\t{a.rounds}\t{k}\t"
                        f"{med[k]:.4f}\t{min(v):.4f}\t{floor:.5f}\n")
            for k, v in outside.items():
                f.write(f"{stamp}\t{platform.node()}\t{a.layers}\t{a.chunk}\t{a.topk}\t{a.rounds}\t"
                        f"{k}: outside the C call\t{statistics.median(v):.5f}\t{min(v):.5f}\t{floor:.5f}\n")
    # Same inputs, same steps: how far apart the DeMo parameters ended.
    for label, c_p, py_p in (("DeMo", demo_p, pkg_demo_p), ("DisTrO-AdamW", dadam_p, pkg_dadam_p),
                             ("AdamW baseline", base_p, pkg_base_p)):
        same = all(torch.equal(x, y.detach()) for x, y in zip(c_p, py_p))
        print(f"{label} parameters after {a.rounds + 1} steps, package vs C: {'bit-identical' if same else 'DIFFERENT'}")
    diff = max((x - y).abs().max().item() for x, y in zip(demo_p, ref_p))
    moved = max((x - y).abs().max().item() for x, y in zip(ref_p, init))
    print(f"DeMo parameters after {a.rounds + 1} steps: max |distro - reference| {diff:.3g} "
          f"(max movement {moved:.3g}; a difference of 2 lr marks a sign decided by rounding)")


if __name__ == "__main__":
    main()
