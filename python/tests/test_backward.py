"""overlap='backward' and clip_per_tensor in the Python package (run by
python/tests/run.sh after test_package.py).

The gradient-ready exchange starts during backward, from hooks on the
parameters' gradient accumulators; the library promises the blocking
step's parameters bit for bit. So: the same model and data through
overlap='off' and overlap='backward' give the same bits, on one process
and on two gloo ranks; clip_per_tensor gives the bits of the same clip
done by hand in float64; and what would break the promise (a gradient
changed between backward and step, two backward passes, another lr) is
refused with nothing applied."""
import math
import sys
import unittest

import torch

import distro
import distro.torch as dt
from test_package import SEED, same_bits, spawn_ranks

VOCAB, DIM, STEPS = 24, 16, 5
CLASSES = {"distro_adamw": dt.DisTrOAdamW, "demo": dt.DeMo}


class Tiny(torch.nn.Module):
    """A tied embedding (used twice, so its gradient sums two paths), a
    linear layer and a norm: the hooks must fire once per backward per
    parameter, after the sum."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(SEED)
        self.emb = torch.nn.Parameter(torch.randn(VOCAB, DIM, generator=g) * 0.3)
        self.lin = torch.nn.Linear(DIM, DIM)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(DIM, DIM, generator=g) * 0.3)
            self.lin.bias.copy_(torch.randn(DIM, generator=g) * 0.1)
        self.norm = torch.nn.LayerNorm(DIM)

    def forward(self, tok):
        h = self.norm(torch.tanh(self.lin(self.emb[tok])))
        return h @ self.emb.t()


def batch(rank, step):
    g = torch.Generator().manual_seed(SEED * 7919 + 101 * rank + step)
    tok = torch.randint(0, VOCAB, (12,), generator=g)
    return tok, torch.randint(0, VOCAB, (12,), generator=g)


def loss_of(m, rank, step):
    tok, tgt = batch(rank, step)
    return torch.nn.functional.cross_entropy(m(tok), tgt)


def make(kind, m, overlap, clip=None, comm=None):
    kw = dict(lr=2e-2, weight_decay=0.05, threads=1, chunk=8, topk=4, overlap=overlap, comm=comm)
    if clip is not None:
        kw["clip_per_tensor"] = clip
    return CLASSES[kind](m.parameters(), **kw)


class ClipByHand:
    """The per-tensor clip, written out: each tensor to clip * sqrt(its usual
    share of the squared norm), by its own float64 norm; the shares start at
    the tensors' shares of the parameters and move as an EMA (0.9)."""

    def __init__(self, m, clip):
        n_all = sum(p.numel() for p in m.parameters())
        self.clip, self.share = clip, [p.numel() / n_all for p in m.parameters()]

    def __call__(self, m):
        ss = []
        with torch.no_grad():
            for k, p in enumerate(m.parameters()):
                norm = float(torch.linalg.vector_norm(p.grad, dtype=torch.float64))
                ss.append(norm * norm)
                budget = self.clip * math.sqrt(self.share[k])
                if norm > budget:
                    p.grad.mul_(budget / norm)
        tot = 0.0
        for v in ss:
            tot += v
        if tot > 0:
            self.share = [0.9 * a + 0.1 * v / tot for a, v in zip(self.share, ss)]


def run_steps(m, opt, steps, rank=0, sched=None, by_hand=None):
    for s in range(steps):
        opt.zero_grad()
        loss_of(m, rank, s).backward()
        if by_hand is not None:
            by_hand(m)
        opt.step()
        if sched is not None:
            sched.step()


def train(kind, overlap, rank=0, clip=None, by_hand=None, comm=None):
    m = Tiny()
    opt = make(kind, m, overlap, clip, comm)
    by_hand = None if by_hand is None else ClipByHand(m, by_hand)
    run_steps(m, opt, STEPS, rank, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - 0.1 * s), by_hand)
    return [p.detach().clone() for p in m.parameters()]


def worker(kind, seed, out):
    import torch.distributed as dist
    global SEED
    SEED = seed  # the parent's: this process drew its own at import
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    res = {"off": train(kind, "off", rank), "backward": train(kind, "backward", rank),
           "clip_off": train(kind, "off", rank, clip=0.05), "clip_backward": train(kind, "backward", rank, clip=0.05)}
    torch.save(res, out)
    dist.destroy_process_group()


class Backward(unittest.TestCase):
    def test_one_rank_gives_the_blocking_bits(self):
        for kind in CLASSES:
            off, bw = train(kind, "off"), train(kind, "backward")
            self.assertTrue(same_bits(off, bw), "%s: overlap='backward' differs from the blocking step (seed %d)"
                            % (kind, SEED))
            self.assertFalse(same_bits(off, [p.detach() for p in Tiny().parameters()]), "%s: nothing moved" % kind)

    def test_clip_per_tensor_is_the_clip_by_hand(self):
        for kind in CLASSES:
            by_hand = train(kind, "off", by_hand=0.05)
            self.assertTrue(same_bits(by_hand, train(kind, "off", clip=0.05)), kind)
            self.assertTrue(same_bits(by_hand, train(kind, "backward", clip=0.05)), kind)
            self.assertFalse(same_bits(by_hand, train(kind, "off")), "%s: the clip (0.05) never acted" % kind)

    def test_grad_norm_is_the_norm_before_the_clip(self):
        """grad_norm(): the float64 norm of the gradients backward made;
        the clip leaves .grad as it was."""
        for kind in CLASSES:
            m = Tiny()
            opt = make(kind, m, "off", clip=0.05)
            for s in range(3):
                opt.zero_grad()
                loss_of(m, 0, s).backward()
                grads = [p.grad.detach().clone() for p in m.parameters()]
                ref = math.sqrt(sum(float(torch.linalg.vector_norm(g, dtype=torch.float64)) ** 2 for g in grads))
                opt.step()
                self.assertLessEqual(abs(opt.grad_norm() - ref), 1e-12 * ref, "%s step %d" % (kind, s + 1))
                self.assertGreater(ref, 0.05, "%s: the clip (0.05) never acted" % kind)
                self.assertTrue(same_bits(grads, [p.grad for p in m.parameters()]), "%s: .grad was written" % kind)

    def test_clip_shares_travel_in_the_state_dict(self):
        """3 steps, state_dict into a fresh optimizer, 2 more: the bits of 5
        in a row (the shares are in the library's state); from a state of
        an optimizer without the clip, the shares start afresh and the run
        differs; a state_dict of the older package, with its shares beside
        the library's state, is refused with nothing changed."""
        whole = Tiny()
        wopt = make("distro_adamw", whole, "backward", clip=0.05)
        run_steps(whole, wopt, STEPS)
        self.assertGreater(wopt.grad_norm(), 0.05)
        for clipped in (True, False):
            m = Tiny()
            opt = make("distro_adamw", m, "backward", clip=0.05 if clipped else None)
            run_steps(m, opt, 3)
            sd = opt.state_dict()
            self.assertNotIn("clip_shares", sd["distro"])
            m2 = Tiny()
            with torch.no_grad():
                for a, b in zip(m2.parameters(), m.parameters()):
                    a.copy_(b)
            o2 = make("distro_adamw", m2, "backward", clip=0.05)
            if clipped:
                old = dict(sd, distro=dict(sd["distro"], clip_shares=[0.5] * len(list(m.parameters()))))
                with self.assertRaisesRegex(ValueError, "older distro package"):
                    o2.load_state_dict(old)
            o2.load_state_dict(sd)
            for s in range(3, STEPS):
                o2.zero_grad()
                loss_of(m2, 0, s).backward()
                o2.step()
            self.assertEqual(same_bits([p.detach() for p in whole.parameters()], [p.detach() for p in m2.parameters()]),
                             clipped, "from a state %s the clip" % ("with" if clipped else "without"))

    def test_two_gloo_ranks_give_the_blocking_bits(self):
        for kind in CLASSES:
            res = spawn_ranks("backward", kind, script=__file__)
            for r in range(2):
                self.assertTrue(same_bits(res[r]["off"], res[r]["backward"]), "%s rank %d (seed %d)" % (kind, r, SEED))
                self.assertTrue(same_bits(res[r]["clip_off"], res[r]["clip_backward"]), "%s rank %d" % (kind, r))
            self.assertTrue(same_bits(res[0]["backward"], res[1]["backward"]), "%s: ranks differ" % kind)
            self.assertFalse(same_bits(res[0]["off"], res[0]["clip_off"]), "%s: the clip never acted" % kind)


class Refusals(unittest.TestCase):
    def started(self):
        """An optimizer past its first step (the library marks nothing
        before the ranks have agreed on the tensors), with a backward done."""
        m = Tiny()
        opt = make("distro_adamw", m, "backward")
        run_steps(m, opt, 2)
        opt.zero_grad()
        loss_of(m, 0, 2).backward()
        return m, opt, [p.detach().clone() for p in m.parameters()]

    def test_a_gradient_changed_after_backward(self):
        m, opt, before = self.started()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-3)
        with self.assertRaisesRegex(ValueError, r"changed after backward.*clip_per_tensor"):
            opt.step()
        self.assertTrue(same_bits(before, [p.detach() for p in m.parameters()]), "a refused step moved parameters")

    def test_two_backward_passes_before_a_step(self):
        m, opt, before = self.started()
        with self.assertRaisesRegex(ValueError, "second backward"):
            loss_of(m, 0, 3).backward()
        self.assertTrue(same_bits(before, [p.detach() for p in m.parameters()]))

    def test_another_lr_at_the_step_then_the_right_one(self):
        """The library itself holds the marks: a step with another lr than
        the one backward sent with is refused, and the right one goes on to
        the blocking step's bits."""
        m, opt, before = self.started()
        lr = opt.param_groups[0]["lr"]
        opt.param_groups[0]["lr"] = lr * 0.5
        with self.assertRaises(distro.DistroError) as cm:
            opt.step()
        self.assertIn("distro_optim_grad_ready", str(cm.exception))
        self.assertTrue(same_bits(before, [p.detach() for p in m.parameters()]))
        opt.param_groups[0]["lr"] = lr
        opt.step()
        ref = Tiny()
        run_steps(ref, make("distro_adamw", ref, "off"), 3)
        self.assertTrue(same_bits([p.detach() for p in ref.parameters()], [p.detach() for p in m.parameters()]))

    def test_bad_options(self):
        with self.assertRaisesRegex(ValueError, "overlap 'backwards'"):
            make("demo", Tiny(), "backwards")
        for bad in (0.0, -1.0, float("nan")):
            with self.assertRaisesRegex(ValueError, "clip_per_tensor"):
                make("demo", Tiny(), "off", clip=bad)
        with self.assertRaisesRegex(ValueError, "grad_norm.*clip_per_tensor"):
            make("demo", Tiny(), "off").grad_norm()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[3], int(sys.argv[4]), sys.argv[5])
        sys.exit(0)
    print("distro %s from %s, torch %s, DISTRO_TEST_SEED=%d" % (distro.__version__, distro.lib.path,
                                                                 torch.__version__, SEED), flush=True)
    unittest.main(verbosity=2)
