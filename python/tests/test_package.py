"""Tests of the distro Python package (run by tests/python/run.sh from ctest).

Bit-identity against the C library: the same inputs through c_driver (the
library's own optimizer on in-process ranks, a C program) and through
distro.torch (one process, or two gloo ranks started here) give the same
bits. Needs DISTRO_C_DRIVER (the built c_driver)."""
import os
import socket
import struct
import subprocess
import sys
import tempfile
import unittest

import torch

import distro
import distro.torch as dt

SHAPES = [(40, 72), (50,), (2, 33, 40), (17, 9)]
STEPS = 5
KINDS = {"demo": (dt.DeMo, 0), "distro_adamw": (dt.DisTrOAdamW, 1), "adamw": (dt.AdamW, 2)}
# Overlap modes (the exchange on the library's helper thread, over a second
# gloo group): 2 ranks only, against the C driver with the same mode.
OVERLAP_KINDS = {"distro_adamw_lookahead": (dt.DisTrOAdamW, 1, "lookahead"), "demo_stale": (dt.DeMo, 0, "stale")}
OVERLAP_CODE = {"off": 0, "lookahead": 1, "stale": 2}


def kind_info(kind):
    if kind in KINDS:
        return KINDS[kind] + ("off",)
    return OVERLAP_KINDS[kind]
SEED = int(os.environ.get("DISTRO_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")


def inputs(world, seed):
    g = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=g) * 0.1 for s in SHAPES]
    grads = [[[torch.randn(s, generator=g) for s in SHAPES] for _ in range(world)] for _ in range(STEPS)]
    return init, grads


def make_opt(kind, params, comm=None):
    cls, _, overlap = kind_info(kind)
    kw = dict(lr=1e-3, weight_decay=0.05, threads=1, comm=comm)
    if cls is not dt.DeMo:
        kw["betas"] = (0.9, 0.99)
    if cls is not dt.AdamW:
        kw.update(chunk=16, topk=8, overlap=overlap)
    return cls(params, **kw)


def run_torch(kind, rank, init, grads, comm=None):
    """STEPS steps with a LambdaLR schedule; returns (params, lrs, opt)."""
    params = [torch.nn.Parameter(t.clone()) for t in init]
    opt = make_opt(kind, params, comm)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 + 0.5 * s)
    lrs = []
    for s in range(STEPS):
        opt.zero_grad()
        for p, gr in zip(params, grads[s][rank]):
            p.grad = gr.clone()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    if kind_info(kind)[2] != "off":
        opt.flush()
    return [p.detach() for p in params], lrs, opt


def run_c(kind, world, init, grads, lrs):
    driver = os.environ.get("DISTRO_C_DRIVER")
    if not driver:
        raise unittest.SkipTest("DISTRO_C_DRIVER is not set")
    opt = make_opt(kind, [torch.nn.Parameter(torch.zeros(1))])
    g = opt.param_groups[0]
    chunk, topk = (16, 8) if kind != "adamw" else (32, 32)
    _, alg, overlap = kind_info(kind)
    b = struct.pack("<8i", alg, world, STEPS, len(SHAPES), chunk, topk, 1, OVERLAP_CODE[overlap])
    b += struct.pack("<4f", g["betas"][0], g["betas"][1], g["eps"], g["weight_decay"])
    b += struct.pack("<%df" % STEPS, *lrs)
    for s in SHAPES:
        b += struct.pack("<i", len(s)) + struct.pack("<%dq" % len(s), *s)
    b += b"".join(t.numpy().tobytes() for t in init)
    for s in range(STEPS):
        for r in range(world):
            b += b"".join(t.numpy().tobytes() for t in grads[s][r])
    with tempfile.TemporaryDirectory() as d:
        fin, fout = os.path.join(d, "in"), os.path.join(d, "out")
        with open(fin, "wb") as f:
            f.write(b)
        subprocess.run([driver, fin, fout], check=True)
        with open(fout, "rb") as f:
            out = f.read()
    res, off = [], 0
    for r in range(world):
        ranks = []
        for s in SHAPES:
            n = 1
            for e in s:
                n *= e
            ranks.append(torch.frombuffer(bytearray(out[off:off + 4 * n]), dtype=torch.float32).reshape(s))
            off += 4 * n
        res.append(ranks)
    return res


def same_bits(a, b):
    return all(x.numpy().tobytes() == y.numpy().tobytes() for x, y in zip(a, b))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(mode, kind, world=2, script=__file__):
    """Starts `world` processes of `script` (this file) in worker mode over env://."""
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        procs = []
        for r in range(world):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                       WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, script, "--worker", mode, kind, str(SEED),
                                           os.path.join(d, "r%d.pt" % r)], env=env))
        for p in procs:
            p.wait(timeout=240)
        for r, p in enumerate(procs):
            if p.returncode != 0:
                raise AssertionError("worker rank %d exited with %d" % (r, p.returncode))
        return [torch.load(os.path.join(d, "r%d.pt" % r)) for r in range(world)]


def worker(mode, kind, seed, out):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    init, grads = inputs(world, seed)
    res = {}
    if mode == "train":
        params, lrs, opt = run_torch(kind, rank, init, grads)
        res = {"params": params, "lrs": lrs, "sent": opt.bytes_sent, "received": opt.bytes_received}
    elif mode == "mismatch":
        shapes = list(init) if rank == 0 else list(init[:-1]) + [torch.zeros(9, 17)]
        params = [torch.nn.Parameter(t.clone()) for t in shapes]
        opt = make_opt(kind, params)
        for p in params:
            p.grad = torch.ones_like(p)
        before = [p.detach().clone() for p in params]
        try:
            opt.step()
            res = {"error": None}
        except distro.DistroError as e:
            res = {"error": str(e), "status": e.status, "same": same_bits(before, [p.detach() for p in params])}
    torch.save(res, out)
    dist.destroy_process_group()


class BitIdentity(unittest.TestCase):
    def test_one_rank_matches_the_c_library(self):
        for kind in KINDS:
            init, grads = inputs(1, SEED)
            params, lrs, opt = run_torch(kind, 0, init, grads)
            self.assertEqual(len(set(lrs)), STEPS, "the scheduler did not change the lr")
            ref = run_c(kind, 1, init, grads, lrs)
            self.assertTrue(same_bits(params, ref[0]), "%s: Python and C parameters differ (seed %d)" % (kind, SEED))
            self.assertFalse(same_bits(params, init), "%s: nothing moved" % kind)

    def test_two_gloo_ranks_match_each_other_and_the_c_library(self):
        for kind in ("distro_adamw", "demo", "adamw"):
            res = spawn_ranks("train", kind)
            init, grads = inputs(2, SEED)
            ref = run_c(kind, 2, init, grads, res[0]["lrs"])
            for r in range(2):
                self.assertTrue(same_bits(res[r]["params"], ref[r]),
                                "%s rank %d: gloo parameters differ from the C library's (seed %d)" % (kind, r, SEED))
            self.assertTrue(same_bits(res[0]["params"], res[1]["params"]), "%s: ranks differ" % kind)
            self.assertGreater(res[0]["sent"], 0)
            if kind != "adamw":  # DeMo: each rank receives what the other sent
                self.assertEqual(res[0]["received"], res[1]["sent"])
                self.assertEqual(res[1]["received"], res[0]["sent"])

    def test_overlap_modes_over_gloo_match_the_c_library(self):
        for kind in OVERLAP_KINDS:
            res = spawn_ranks("train", kind)
            init, grads = inputs(2, SEED)
            ref = run_c(kind, 2, init, grads, res[0]["lrs"])
            for r in range(2):
                self.assertTrue(same_bits(res[r]["params"], ref[r]),
                                "%s rank %d: gloo parameters differ from the C library's (seed %d)" % (kind, r, SEED))
            self.assertTrue(same_bits(res[0]["params"], res[1]["params"]), "%s: ranks differ after flush" % kind)
            self.assertFalse(same_bits(res[0]["params"], init), "%s: nothing moved" % kind)


class StateAndGroups(unittest.TestCase):
    def test_state_dict_round_trip_continues_bit_identically(self):
        for kind in KINDS:
            init, grads = inputs(1, SEED)
            params = [torch.nn.Parameter(t.clone()) for t in init]
            opt = make_opt(kind, params)

            def steps(o, ps, rng):
                for s in rng:
                    for p, gr in zip(ps, grads[s][0]):
                        p.grad = gr.clone()
                    o.step()
            steps(opt, params, range(3))
            sd = opt.state_dict()
            mid = [p.detach().clone() for p in params]
            steps(opt, params, range(3, 5))
            params2 = [torch.nn.Parameter(t.clone()) for t in mid]
            opt2 = make_opt(kind, params2)
            opt2.load_state_dict(sd)
            steps(opt2, params2, range(3, 5))
            self.assertTrue(same_bits([p.detach() for p in params], [p.detach() for p in params2]), kind)
            fresh = [torch.nn.Parameter(t.clone()) for t in mid]
            steps(make_opt(kind, fresh), fresh, range(3, 5))
            self.assertFalse(same_bits([p.detach() for p in params], [p.detach() for p in fresh]),
                             "%s: the loaded state made no difference" % kind)

    def test_param_groups_have_their_own_lr(self):
        init, grads = inputs(1, SEED)
        a, b = torch.nn.Parameter(init[0].clone()), torch.nn.Parameter(init[1].clone())
        opt = dt.DisTrOAdamW([{"params": [a]}, {"params": [b], "lr": 0.0, "weight_decay": 0.0}], lr=1e-3, threads=1)
        a.grad, b.grad = grads[0][0][0].clone(), grads[0][0][1].clone()
        opt.step()
        self.assertFalse(torch.equal(a.detach(), init[0]))
        self.assertTrue(torch.equal(b.detach(), init[1]), "a group with lr 0 moved")
        self.assertGreater(opt.bytes_sent, 0)
        opt.zero_grad()
        self.assertTrue(a.grad is None or not a.grad.any())


class BadInput(unittest.TestCase):
    def test_tensors_the_library_cannot_take(self):
        with self.assertRaisesRegex(ValueError, "not contiguous"):
            dt.DisTrOAdamW([torch.nn.Parameter(torch.zeros(8, 6).t())])
        with self.assertRaisesRegex(ValueError, "float32"):
            dt.DeMo([torch.nn.Parameter(torch.zeros(8, dtype=torch.float64))])
        p = torch.nn.Parameter(torch.ones(8, 6))
        opt = dt.AdamW([p])
        p.grad = torch.ones(6, 8).t()
        with self.assertRaisesRegex(ValueError, "not contiguous"):
            opt.step()
        self.assertTrue(torch.equal(p.detach(), torch.ones(8, 6)))

    def test_parameter_without_gradient_changes_nothing(self):
        a, b = torch.nn.Parameter(torch.ones(4, 4)), torch.nn.Parameter(torch.ones(3))
        opt = dt.DisTrOAdamW([a, b], threads=1)
        a.grad = torch.ones(4, 4)
        with self.assertRaisesRegex(ValueError, r"g0\.p1 \(3,\) has no gradient"):
            opt.step()
        self.assertTrue(torch.equal(a.detach(), torch.ones(4, 4)))
        self.assertEqual(opt.bytes_sent, 0)

    def test_library_errors_carry_its_message(self):
        p = torch.nn.Parameter(torch.ones(4))
        opt = dt.DisTrOAdamW([p], lr=1e-3, threads=1)
        p.grad = torch.ones(4)
        opt.param_groups[0]["lr"] = float("nan")
        with self.assertRaises(distro.DistroError) as cm:
            opt.step()
        self.assertIn("distro_optim_step: ", str(cm.exception))
        self.assertIn("lr", str(cm.exception))
        self.assertEqual(cm.exception.status, "ERR_INVALID")
        self.assertTrue(torch.equal(p.detach(), torch.ones(4)))

    def test_gpu_tensors_are_refused_without_the_cuda_backend(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device")
        with self.assertRaisesRegex(ValueError, "CUDA backend|CPU"):
            dt.DisTrOAdamW([torch.nn.Parameter(torch.zeros(4, device="cuda"))])

    def test_ranks_whose_registration_differs(self):
        res = spawn_ranks("mismatch", "distro_adamw")
        for r in range(2):
            self.assertIsNotNone(res[r]["error"], "rank %d stepped with a different tensor list" % r)
            self.assertEqual(res[r]["status"], "ERR_SHAPE", res[r]["error"])
            self.assertIn("distro_optim_step", res[r]["error"])
            self.assertTrue(res[r]["same"], "rank %d: parameters changed" % r)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        sys.exit(0)
    print("distro %s from %s, torch %s, DISTRO_TEST_SEED=%d" % (distro.__version__, distro.lib.path,
                                                                 torch.__version__, SEED), flush=True)
    unittest.main(verbosity=2)
