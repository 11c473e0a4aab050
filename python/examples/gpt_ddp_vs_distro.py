#!/usr/bin/env python3
"""A small character-level GPT trained on 2 CPU ranks (gloo), twice from
the same start on the same data: torch.optim.AdamW + DistributedDataParallel,
then distro.torch.DisTrOAdamW at the same lr and schedule (no DDP: the
optimizer exchanges its compressed momentum through torch.distributed).
Prints the loss and the bytes per step of each, and a summary over seeds.

    python gpt_ddp_vs_distro.py [--steps 300] [--seeds 1] [--tsv out.tsv]

Starts its ranks itself (env:// rendezvous on 127.0.0.1; Debian 12's
torchrun fails in its elastic agent). Under a torchrun that works
(`torchrun --nproc_per_node 2 gpt_ddp_vs_distro.py`), RANK/WORLD_SIZE are set
and the script runs as that rank.

Text: Debian's fortunes (apt-get install fortunes), or --text FILE.
"""
import argparse
import glob
import math
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def load_text(path):
    if path:
        return open(path, encoding="utf-8", errors="replace").read()
    files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                   if "." not in os.path.basename(f) and os.path.isfile(f))
    if not files:
        sys.exit("no text: install Debian's fortunes (apt-get install fortunes) or pass --text FILE")
    return "".join(open(f, encoding="utf-8", errors="replace").read() for f in files)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, ctx):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def batch(data, gen, n, ctx):
    i = torch.randint(0, len(data) - ctx - 1, (n,), generator=gen)
    x = torch.stack([data[j:j + ctx] for j in i])
    y = torch.stack([data[j + 1:j + ctx + 1] for j in i])
    return x, y


def train(method, a, seed, data, val, vocab, rank, world, log):
    torch.manual_seed(seed)  # the same initial model on every rank and for both methods
    model = GPT(vocab, a.dim, a.layers, a.heads, a.ctx)
    n_params = sum(p.numel() for p in model.parameters())
    # overlap='backward' sends during backward, before a global norm exists: DisTrO-AdamW clips each tensor then.
    per_tensor = a.clip > 0 and method != "AdamW+DDP" and a.overlap == "backward"
    if method == "AdamW+DDP":
        net = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    else:
        import distro.torch as dt
        net = model
        opt = dt.DisTrOAdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1, overlap=a.overlap,
                             clip_per_tensor=a.clip if per_tensor else None)
    warm = max(1, a.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / a.steps))))
    gen = torch.Generator().manual_seed(seed * 1000 + rank)  # each rank its own shard of batches
    # A ring all-reduce of the gradients (DDP) sends 2 (W-1)/W of them per rank.
    ddp_bytes = 2 * (world - 1) / world * 4 * n_params
    t0, sent = time.time(), []
    for step in range(a.steps):
        x, y = batch(data, gen, a.batch, a.ctx)
        loss = F.cross_entropy(net(x).view(-1, vocab), y.view(-1))
        opt.zero_grad()
        loss.backward()
        if a.clip > 0 and not per_tensor:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        before = 0 if method == "AdamW+DDP" else opt.bytes_sent
        opt.step()
        sched.step()
        sent.append(ddp_bytes if method == "AdamW+DDP" else opt.bytes_sent - before)
        if rank == 0 and (step % a.log_every == 0 or step == a.steps - 1):
            log(f"  {method:<12} seed {seed} step {step:4d}  loss {loss.item():.4f}  bytes sent/step {sent[-1]:12.0f}  "
                f"lr {sched.get_last_lr()[0]:.2e}  {time.time() - t0:6.1f} s")
    if method != "AdamW+DDP":
        opt.flush()  # with overlap: the exchange in flight lands before evaluating
    with torch.no_grad():  # the parameters agree on every rank; rank 0's figure is everyone's
        model.eval()
        g = torch.Generator().manual_seed(12345)
        vl = sum(F.cross_entropy(model(x).view(-1, vocab), y.view(-1)).item()
                 for x, y in (batch(val, g, 32, a.ctx) for _ in range(a.val_batches))) / a.val_batches
    # Check: every rank ends with the same parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    other = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(other, flat)
    agree = all(torch.equal(o, other[0]) for o in other)
    return vl, sum(sent) / len(sent), n_params, agree


def worker(a):
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    text = load_text(a.text)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    # The vocabulary padded to a multiple of 32 (as GPT-2 pads 50257 to
    # 50304): the embedding's rows then chunk 32 at a time, not one by one
    # (a prime row count would leave the DCT chunks a single row tall).
    vocab = -(-len(chars) // 32) * 32
    split = int(0.95 * len(data))
    train_data, val = data[:split], data[split:]

    def log(msg):
        print(msg, flush=True)

    if rank == 0:
        log(f"{world} ranks (gloo), {len(text)} characters, vocab {len(chars)} (padded to {vocab}), model d={a.dim} layers={a.layers} "
            f"ctx={a.ctx}, batch {a.batch}/rank, {a.steps} steps, lr {a.lr}")
    rows = []
    methods = {"both": ("AdamW+DDP", "DisTrO-AdamW"), "adamw": ("AdamW+DDP",), "distro": ("DisTrO-AdamW",)}[a.only]
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        for method in methods:
            vl, bps, n, agree = train(method, a, seed, train_data, val, vocab, rank, world, log)
            rows.append((seed, method, vl, bps, agree))
            if rank == 0:
                log(f"{method} seed {seed}: validation loss {vl:.4f}, {bps:.0f} bytes sent per step per rank "
                    f"({n} parameters), ranks {'agree' if agree else 'DISAGREE'}")
    if rank == 0 and a.only == "both":
        def mean(m, i):
            v = [r[i] for r in rows if r[1] == m]
            return sum(v) / len(v)
        la, ld = mean("AdamW+DDP", 2), mean("DisTrO-AdamW", 2)
        ba, bd = mean("AdamW+DDP", 3), mean("DisTrO-AdamW", 3)
        log(f"\nsummary over {a.seeds} seed(s): validation loss AdamW+DDP {la:.4f}, DisTrO-AdamW {ld:.4f} "
            f"({(ld / la - 1) * 100:+.2f}%); bytes sent per step per rank {ba:.0f} vs {bd:.0f} ({ba / bd:.1f}x fewer)")
    if rank == 0 and a.tsv:
        new = not os.path.exists(a.tsv)
        with open(a.tsv, "a") as f:
            if new:
                f.write("seed\tmethod\tsteps\tlr\tdim\tlayers\tval_loss\tbytes_sent_per_step\tranks_agree\n")
            for s, m, vl, bps, agree in rows:
                if m != "AdamW+DDP" and a.overlap != "off":
                    m += f" ({a.overlap})"
                if a.clip > 0:
                    m += f" clip {a.clip:g}" + (" per tensor" if m.endswith("(backward)") else "")
                f.write(f"{s}\t{m}\t{a.steps}\t{a.lr}\t{a.dim}\t{a.layers}\t{vl:.5f}\t{bps:.0f}\t{int(agree)}\n")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=1, help="how many seeds")
    ap.add_argument("--first-seed", type=int, default=1)
    # AdamW's best peak lr for this model and schedule, from a sweep of AdamW
    # alone (seeds 1-2: 3e-3 ended 7% worse; python/examples/results.tsv).
    ap.add_argument("--lr", type=float, default=1.8e-2, help="peak lr of both optimizers")
    ap.add_argument("--only", choices=("both", "adamw", "distro"), default="both",
                    help="train only one of the two (an lr sweep)")
    ap.add_argument("--overlap", choices=("off", "lookahead", "stale", "backward"), default="off",
                    help="DisTrO-AdamW's exchange behind the next step's compute (lookahead, stale) "
                    "or behind the rest of backward (backward)")
    ap.add_argument("--clip", type=float, default=0.0,
                    help="clip each rank's gradient to this global L2 norm (0: off); with --overlap backward "
                    "DisTrO-AdamW clips each tensor (clip_per_tensor) instead")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--val-batches", type=int, default=20)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--text", default=None)
    ap.add_argument("--tsv", default=None)
    a = ap.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return worker(a)
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(a.world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), LOCAL_RANK=str(r),
                   WORLD_SIZE=str(a.world), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    rc = 0
    for p in procs:
        rc = p.wait() or rc
    sys.exit(rc)


if __name__ == "__main__":
    main()
