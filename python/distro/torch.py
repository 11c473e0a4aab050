"""torch.optim optimizers over the distro C library.

    DisTrOAdamW  DeMo compression with the AdamW-normalized update (the
                 recommended drop-in for torch.optim.AdamW: keep its lr)
    DeMo         the DeMo reference's sign update
    AdamW        the library's baseline: gradient all-reduce + AdamW

Parameters and gradients are CPU float32 contiguous tensors; the library
reads and writes their storage in place. Each param group is one C
optimizer (its own lr at every step, so lr schedulers work); its other
hyperparameters are fixed at construction. Communication: `comm=` a
distro.comm communicator; by default torch.distributed's group when it is
initialized (distro.comm.TorchComm), else a single process.
"""
import ctypes
import math
import os
import tempfile
import weakref

import torch

from . import DistroError, _lib, check, lib
from . import comm as _comm

_HYPER = ("betas", "eps", "weight_decay")


def _tensor_problem(t, what):
    if t.device.type != "cpu":
        if lib.has_cuda:
            return ("%s is on %s: the installed library has a CUDA backend, but this package drives only the CPU "
                    "optimizer; keep the parameters on the CPU" % (what, t.device))
        return ("%s is on %s: GPU tensors need the library's CUDA backend, which the installed library (%s) was "
                "built without; keep the parameters on the CPU" % (what, t.device, lib.path))
    if t.dtype != torch.float32:
        return "%s is %s: distro optimizes float32 tensors only" % (what, t.dtype)
    if not t.is_contiguous():
        return "%s is not contiguous (call .contiguous() before handing it over)" % what
    return None


class _Optimizer(torch.optim.Optimizer):
    _algorithm = _lib.ALG_DEMO
    _update = _lib.UPDATE_SIGN

    def __init__(self, params, defaults, comm=None, threads=0, clip_per_tensor=None, **lib_opts):
        self._records = None
        self._hooks = []
        overlap = lib_opts.get("overlap", "off")
        if overlap not in _lib.OVERLAP:
            raise ValueError("distro: overlap %r: expected one of %s" % (overlap, ", ".join(map(repr, _lib.OVERLAP))))
        if clip_per_tensor is not None and not (math.isfinite(clip_per_tensor) and clip_per_tensor > 0):
            raise ValueError("distro: clip_per_tensor %r must be a finite number > 0 (None: no clip)"
                             % (clip_per_tensor,))
        super().__init__(params, defaults)
        if comm is None:
            d = torch.distributed
            comm = _comm.TorchComm() if d.is_available() and d.is_initialized() else _comm.LocalComm()
        self.comm = comm
        self._threads = int(threads)
        self._lib_opts = lib_opts
        self._backward = overlap == "backward" and self._algorithm == _lib.ALG_DEMO
        self._clip = None if clip_per_tensor is None else float(clip_per_tensor)
        self.bytes_sent = 0
        self.bytes_received = 0
        self.steps = 0
        self.last_stats = None
        self._records = []
        for g in self.param_groups:
            self._register(g)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if self._records is not None:
            if self.steps:
                raise ValueError("distro: param groups can be added only before the first step")
            self._register(self.param_groups[-1])

    def __del__(self):
        for _, h in self._hooks:
            h.remove()
        self._hooks = []
        for r in self._records or []:
            lib.distro_optim_free(r["h"])
        self._records = []

    def _options(self, g):
        o = lib.distro_options_default(self._algorithm)
        o.lr = g["lr"]
        o.beta1, o.beta2 = g["betas"]
        o.eps = g["eps"]
        o.weight_decay = g["weight_decay"]
        o.threads = self._threads
        if self._algorithm == _lib.ALG_DEMO:
            o.update = self._update
            lo = self._lib_opts
            o.compression_decay = lo.get("compression_decay", o.compression_decay)
            o.chunk = lo.get("chunk", o.chunk)
            o.topk = lo.get("topk", o.topk)
            o.values = _lib.VALUES[lo.get("values", "int8")]
            o.overlap = _lib.OVERLAP[lo.get("overlap", "off")]
        if self._clip is not None:  # the library clips each tensor as it takes it, keeping the shares
            o.clip_norm = self._clip
        return o

    def _register(self, g):
        gi = len(self._records)
        o = self._options(g)
        h = ctypes.c_void_p()
        check(lib.distro_optim_create(ctypes.byref(o), self.comm.handle, ctypes.byref(h)), "distro_optim_create")
        rec = {"h": h, "names": [], "pptr": [], "gptr": [], "marks": [], "hyper": {k: g[k] for k in _HYPER}}
        self._records.append(rec)
        for pi, p in enumerate(g["params"]):
            name = "g%d.p%d" % (gi, pi)
            bad = _tensor_problem(p, "parameter %s %s" % (name, tuple(p.shape)))
            if bad:
                raise ValueError("distro: " + bad)
            shape = list(p.shape) or [1]
            arr = (ctypes.c_int64 * len(shape))(*shape)
            check(lib.distro_optim_add_param(h, name.encode(), p.data_ptr(), None, len(shape), arr),
                  "distro_optim_add_param(%s)" % name)
            rec["names"].append(name.encode())
            rec["pptr"].append(p.data_ptr())
            rec["gptr"].append(None)
            rec["marks"].append(None)
        if self._backward:
            self._hook(gi)

    def _hook(self, gi):
        """A post-hook on each parameter's gradient accumulator (as
        DistributedDataParallel does in torch 1.13, which has no
        post-accumulate-grad hook): it runs once per backward, when the
        parameter's .grad is final, on the thread running backward."""
        me = weakref.ref(self)  # the hooks live on the parameters: no cycle through them

        def make(i):
            def hook(*_):
                o = me()
                if o is not None:
                    o._grad_final(gi, i)
            return hook

        with torch.enable_grad():
            for i, p in enumerate(self.param_groups[gi]["params"]):
                if p.requires_grad:
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    self._hooks.append((acc, acc.register_hook(make(i))))  # keep acc: it holds the hook

    @torch.no_grad()
    def _grad_final(self, gi, i):
        g, rec = self.param_groups[gi], self._records[gi]
        p, name = g["params"][i], rec["names"][i]
        if self._backward and rec["marks"][i] is not None:
            raise ValueError("distro: a second backward reached %s before step(): with overlap='backward' each "
                             "step takes the gradient of one backward (no accumulation over several)" % name.decode())
        grad = p.grad
        bad = _tensor_problem(grad, "the gradient of %s" % name.decode())
        if bad:
            raise ValueError("distro: " + bad)
        ptr = grad.data_ptr()
        if ptr != rec["gptr"][i]:
            check(lib.distro_optim_set_grad(rec["h"], name, ptr), "distro_optim_set_grad")
            rec["gptr"][i] = ptr
        check(lib.distro_optim_grad_ready(rec["h"], name, float(g["lr"])),
              "distro_optim_grad_ready(%s)" % name.decode())
        rec["marks"][i] = (grad, grad._version)

    def _prepare(self):
        """Every check before any group steps: nothing moves on bad input."""
        for g, rec in zip(self.param_groups, self._records):
            for k in _HYPER:
                if g[k] != rec["hyper"][k]:
                    raise ValueError("distro: param group %r changed from %r to %r after construction; only lr "
                                     "may change between steps" % (k, rec["hyper"][k], g[k]))
            if len(g["params"]) != len(rec["names"]):
                raise ValueError("distro: a param group's parameter list changed after construction")
            for i, p in enumerate(g["params"]):
                name = rec["names"][i].decode()
                if p.data_ptr() != rec["pptr"][i]:
                    raise ValueError("distro: parameter %s's storage moved (replaced .data?); the library holds the "
                                     "original storage" % name)
                if p.grad is None:
                    raise ValueError("distro: parameter %s %s has no gradient: every registered parameter needs one "
                                     "at every step (freeze it by leaving it out of the optimizer)"
                                     % (name, tuple(p.shape)))
                bad = _tensor_problem(p.grad, "the gradient of %s" % name)
                if bad:
                    raise ValueError("distro: " + bad)
                if p.grad.shape != p.shape:
                    raise ValueError("distro: the gradient of %s has shape %s, the parameter %s"
                                     % (name, tuple(p.grad.shape), tuple(p.shape)))
                m = rec["marks"][i]
                if m is not None and (p.grad is not m[0] or p.grad._version != m[1]):
                    raise ValueError("distro: the gradient of %s changed after backward handed it to the library "
                                     "(clip_grad_norm_, zero_grad or a new .grad between backward and step?): with "
                                     "overlap='backward' its exchange starts during backward, so clip with "
                                     "clip_per_tensor= and leave the gradients alone until step()" % name)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._prepare()
        total = _lib.StepStats()
        for g, rec in zip(self.param_groups, self._records):
            for i, p in enumerate(g["params"]):
                ptr = p.grad.data_ptr()
                if ptr != rec["gptr"][i]:
                    check(lib.distro_optim_set_grad(rec["h"], rec["names"][i], ptr), "distro_optim_set_grad")
                    rec["gptr"][i] = ptr
            s = _lib.StepStats()
            check(lib.distro_optim_step(rec["h"], float(g["lr"]), ctypes.byref(s)), "distro_optim_step")
            rec["marks"] = [None] * len(rec["marks"])
            total.bytes_sent += s.bytes_sent
            total.bytes_received += s.bytes_received
            total.seconds_total += s.seconds_total
            total.step = s.step
        self.bytes_sent += total.bytes_sent
        self.bytes_received += total.bytes_received
        self.steps += 1
        self.last_stats = total
        return loss

    def flush(self):
        """Overlap modes: apply the exchange in flight (call on every rank
        before evaluating or saving)."""
        for rec in self._records:
            s = _lib.StepStats()
            check(lib.distro_optim_flush(rec["h"], ctypes.byref(s)), "distro_optim_flush")
            self.bytes_sent += s.bytes_sent
            self.bytes_received += s.bytes_received

    def grad_norm(self):
        """clip_per_tensor: this rank's gradient norm before the clip, at the
        last step, over every group (the library measures it per group)."""
        if self._clip is None:
            raise ValueError("distro: grad_norm() needs clip_per_tensor (without it the step measures nothing)")
        tot = 0.0
        for rec in self._records:
            n = ctypes.c_double()
            check(lib.distro_optim_grad_norm(rec["h"], ctypes.byref(n)), "distro_optim_grad_norm")
            tot += n.value * n.value
        return math.sqrt(tot)

    def payload_bytes(self):
        """Upper bound of this rank's bytes per step (all groups)."""
        total = 0
        for rec in self._records:
            b = ctypes.c_uint64()
            check(lib.distro_optim_payload_bytes(rec["h"], ctypes.byref(b)), "distro_optim_payload_bytes")
            total += b.value
        return total

    def state_dict(self):
        sd = super().state_dict()
        blobs = []
        with tempfile.TemporaryDirectory(prefix="distro-") as d:
            for i, rec in enumerate(self._records):
                path = os.path.join(d, "g%d" % i)
                check(lib.distro_optim_save(rec["h"], path.encode()), "distro_optim_save")
                with open(path, "rb") as f:
                    blobs.append(f.read())
        # clip_per_tensor's shares are in each group's library state
        sd["distro"] = {"format": 1, "groups": blobs, "bytes": [self.bytes_sent, self.bytes_received, self.steps]}
        return sd

    def load_state_dict(self, state_dict):
        extra = state_dict.get("distro")
        if not extra or extra.get("format") != 1 or len(extra.get("groups", ())) != len(self._records):
            raise ValueError("distro: this state_dict has no distro state for %d param groups (was it saved by "
                             "another optimizer?)" % len(self._records))
        if extra.get("clip_shares"):
            raise ValueError("distro: this state_dict keeps clip_per_tensor's shares outside the library's state "
                             "(an older distro package), where this one cannot restore them: resume it with the "
                             "package that saved it")
        super().load_state_dict(state_dict)
        with tempfile.TemporaryDirectory(prefix="distro-") as d:
            for i, (rec, blob) in enumerate(zip(self._records, extra["groups"])):
                path = os.path.join(d, "g%d" % i)
                with open(path, "wb") as f:
                    f.write(blob)
                check(lib.distro_optim_load(rec["h"], path.encode()), "distro_optim_load")
        self.bytes_sent, self.bytes_received, self.steps = extra["bytes"]
        for g, rec in zip(self.param_groups, self._records):
            for k in _HYPER:  # the C optimizers keep their own; a saved tuple may come back as a list
                g[k] = rec["hyper"][k]


class DisTrOAdamW(_Optimizer):
    """DeMo compression with each rank's AdamW second moment normalizing its
    gradient (the library's DISTRO_UPDATE_ADAMW). Extra keywords: chunk,
    topk, values ('int8', 'int4', 'bf16', 'f32', 'sign1'),
    compression_decay, overlap ('off', 'lookahead', 'stale', 'backward'),
    clip_per_tensor, threads, comm.

    overlap='backward': each tensor is handed to the library as backward
    finishes its gradient, and the exchange of a complete group of tensors
    starts then, behind the rest of backward; step() gives the blocking
    step's parameters, bit for bit. One backward per step, and nothing may
    change a gradient between backward and step(): a global-norm clip
    (clip_grad_norm_) is refused there; clip_per_tensor=X has the library
    clip each tensor as it takes it (options.clip_norm), to X * sqrt(its
    usual share of the squared gradient norm: an EMA over the steps, from
    its share of the parameters; state_dict keeps it), any overlap, and
    AdamW too. The .grad tensors are left as backward made them. Each
    param group is its own library optimizer, so with several groups each
    group is clipped as a whole of its own (to X). grad_norm() gives the
    norm the last step measured."""

    _update = _lib.UPDATE_ADAMW

    def __init__(self, params, lr=4e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kw):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay), **kw)


class DeMo(_Optimizer):
    """The DeMo reference: momentum of lr * g, DCT + top-k, p -= lr *
    sign(aggregate). Same extra keywords as DisTrOAdamW."""

    _update = _lib.UPDATE_SIGN

    def __init__(self, params, lr=4e-4, weight_decay=0.1, compression_decay=0.999, **kw):
        super().__init__(params, dict(lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay),
                         compression_decay=compression_decay, **kw)


class AdamW(_Optimizer):
    """The library's baseline: the gradients' all-reduce (mean) + AdamW."""

    _algorithm = _lib.ALG_ADAMW

    def __init__(self, params, lr=4e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kw):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay), **kw)


__all__ = ["DisTrOAdamW", "DeMo", "AdamW", "DistroError"]
