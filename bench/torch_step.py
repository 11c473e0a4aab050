#!/usr/bin/env python3
"""The DeMo step written with stock PyTorch ops, as the references run it:
einsum DCT on chunked tiles, torch.topk on |x|, decode-own-and-subtract,
scatter mean over ranks (one rank here), inverse einsum, sign update. Same
1.2B Llama-2 shape set, fp32 arithmetic; --chunk and --topk as the library's
options, --values f32|bf16 rounds the selected values as the library's codec
before they are aggregated (no index coding: the references send raw
tensors). Prints TORCH_CONFIG (the settings used) and TORCH_STEP_MS."""
import argparse
import math
import sys

import torch

V, H, I, L = 32000, 2048, 8192, 16
LR, DECAY = 1e-4, 0.999
CHUNK, TOPK, VALUES = 64, 32, "f32"


def shapes():
    s = [(V, H)]
    for _ in range(L):
        s += [(H, H)] * 4 + [(I, H), (I, H), (H, I), (1, H), (1, H)]
    return s + [(1, H), (V, H)]


def chunk(n):
    if n <= CHUNK:
        return n
    return next((d for d in range(CHUNK, 1, -1) if n % d == 0), 1)


def basis(n, dev):
    i = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    k = torch.arange(n, dtype=torch.float64).unsqueeze(0)
    f = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    f[:, 0] = math.sqrt(1.0 / n)
    return f.float().to(dev)


def main():
    global CHUNK, TOPK, VALUES
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk", type=int, default=CHUNK)
    ap.add_argument("--topk", type=int, default=TOPK)
    ap.add_argument("--values", choices=("f32", "bf16"), default=VALUES)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    CHUNK, TOPK, VALUES = a.chunk, a.topk, a.values
    print(f"TORCH_CONFIG chunk={CHUNK} topk={TOPK} values={VALUES} wire=none")
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    bases = {}
    ts = []
    for r, c in shapes():
        h, w = chunk(r), chunk(c)
        for n in (h, w):
            bases.setdefault(n, basis(n, dev))
        ts.append(dict(r=r, c=c, h=h, w=w, p=torch.randn(r, c, device=dev) * 0.02,
                       g=torch.empty(r, c, device=dev), m=torch.zeros(r, c, device=dev)))
    n = sum(t["r"] * t["c"] for t in ts)
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: {len(ts)} tensors, {n / 1e9:.3f} B params")

    def step():
        for t in ts:
            r, c, h, w = t["r"], t["c"], t["h"], t["w"]
            fh, fw = bases[h], bases[w]
            k = min(TOPK, h * w)
            t["m"].mul_(DECAY).add_(t["g"], alpha=LR)
            x = t["m"].view(r // h, h, c // w, w)
            coef = torch.einsum("ahbw,hi,wj->abij", x, fh, fw).reshape(-1, h * w)
            _, idx = torch.topk(coef.abs(), k, dim=-1)
            val = torch.gather(coef, -1, idx)
            if VALUES == "bf16":
                val = val.bfloat16().float()
            own = torch.zeros_like(coef).scatter_(-1, idx, val).view(r // h, c // w, h, w)
            t["m"].sub_(torch.einsum("abij,hi,wj->ahbw", own, fh, fw).reshape(r, c))
            agg = torch.zeros_like(coef).scatter_reduce_(-1, idx, val, reduce="mean", include_self=False)
            q = torch.einsum("abij,hi,wj->ahbw", agg.view(r // h, c // w, h, w), fh, fw).reshape(r, c)
            t["p"].sub_(LR * torch.sign(q))

    times = []
    for it in range(3 + a.steps):
        for t in ts:
            t["g"].normal_()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        if it >= 3:
            times.append(a.elapsed_time(b))
    times.sort()
    ms = times[len(times) // 2]
    print(f"step times (ms): {', '.join(f'{x:.2f}' for x in times)}")
    print(f"TORCH_STEP_MS {ms:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
