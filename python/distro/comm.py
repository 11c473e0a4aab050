"""Communicators for the optimizers.

LocalComm: one process, no peers (world 1).
TorchComm: torch.distributed (gloo) through the library's custom
communicator (distro_comm_from_callbacks): the library's payloads travel as
gloo all_gathers, its float sums as gloo all_reduces.
MPIComm: the library's own MPI communicator over MPI_COMM_WORLD, where the
library was built with MPI (OpenMPI).
"""
import ctypes
import ctypes.util
import datetime

from . import _lib, check, lib


class Comm:
    """Owns a distro_comm; keep it alive as long as the optimizers that use it."""

    handle = None
    rank = 0
    world = 1

    def set_timeout(self, seconds):
        check(lib.distro_comm_set_timeout(self.handle, float(seconds)), "distro_comm_set_timeout")

    def close(self):
        if self.handle:
            lib.distro_comm_free(self.handle)
            self.handle = None

    def __del__(self):
        self.close()


class LocalComm(Comm):
    def __init__(self):
        h = ctypes.c_void_p()
        check(lib.distro_comm_local_group(1, ctypes.byref(h)), "distro_comm_local_group")
        self.handle = h


def _put_err(err, exc):
    msg = ("%s: %s" % (type(exc).__name__, exc)).encode(errors="replace")[: _lib.DISTRO_COMM_ERR_MAX - 1]
    ctypes.memmove(err, msg + b"\0", len(msg) + 1)


class _TorchGroup:
    """The collectives of one torch.distributed group, as the C callbacks
    call them. Every exception becomes a nonzero return with its message:
    nothing propagates through the C library."""

    def __init__(self, group):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.group = torch, dist, group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.ranks = list(range(dist.get_world_size()))
        self.bufs = {}
        self.children = []

    def _buffers(self, slot):
        b = self.bufs.get(slot)
        if b is None:
            t = self.torch
            b = (t.empty(slot + 8, dtype=t.uint8), [t.empty(slot + 8, dtype=t.uint8) for _ in range(self.world)])
            self.bufs = {slot: b}  # one size at a time: payload slots are stable
        return b

    def allgatherv(self, ctx, send, nbytes, recv, slot, sizes, err):
        try:
            mine, outs = self._buffers(slot)
            mine[:8].view(self.torch.int64)[0] = nbytes
            if nbytes:
                ctypes.memmove(mine.data_ptr() + 8, send, nbytes)
            self.dist.all_gather(outs, mine, group=self.group)
            for r, o in enumerate(outs):
                n = int(o[:8].view(self.torch.int64)[0])
                if n < 0 or n > slot:
                    raise ValueError("rank %d sent a %d-byte payload for a %d-byte slot" % (r, n, slot))
                if n:
                    ctypes.memmove(recv + r * slot, o.data_ptr() + 8, n)
                sizes[r] = n
            return 0
        except BaseException as e:  # noqa: B902 -- nothing may cross the C frames
            _put_err(err, e)
            return 1

    def allreduce(self, ctx, buf, count, err):
        try:
            if count:
                arr = (ctypes.c_float * count).from_address(ctypes.addressof(buf.contents))
                t = self.torch.frombuffer(arr, dtype=self.torch.float32)
                self.dist.all_reduce(t, group=self.group)
            return 0
        except BaseException as e:  # noqa: B902
            _put_err(err, e)
            return 1

    def barrier(self, ctx, err):
        try:
            self.dist.barrier(group=self.group)
            return 0
        except BaseException as e:  # noqa: B902
            _put_err(err, e)
            return 1

    def set_timeout(self, ctx, seconds, err):
        # gloo fixes a group's timeout at creation: every rank calls this
        # before the same collective, so making a new group is collective.
        try:
            kw = {"timeout": datetime.timedelta(seconds=seconds)} if seconds > 0 else {}
            self.group = self.dist.new_group(ranks=self.ranks, backend="gloo", **kw)
            return 0
        except BaseException as e:  # noqa: B902
            _put_err(err, e)
            return 1

    def dup(self, ctx, out, err):
        try:
            child = _TorchGroup(self.dist.new_group(ranks=self.ranks, backend="gloo"))
            self.children.append(child)
            out[0] = None
            return 0
        except BaseException as e:  # noqa: B902
            _put_err(err, e)
            return 1


class TorchComm(Comm):
    """torch.distributed's default group (initialized, gloo) as a distro
    communicator. The overlap modes' helper thread runs its exchanges on a
    second gloo group made at the first step."""

    def __init__(self, group=None):
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("distro.comm.TorchComm: torch.distributed is not initialized "
                               "(call torch.distributed.init_process_group('gloo', ...) first)")
        if group is not None and dist.get_world_size(group) != dist.get_world_size():
            raise ValueError("distro.comm.TorchComm: only the default group (all ranks) is supported")
        self._root = _TorchGroup(group)
        self.rank, self.world = self._root.rank, self._root.world
        self._keep = []  # ctypes callbacks must outlive the C comm
        self.handle = self._make(self._root)

    def _make(self, g):
        # Duplicates (overlap) share the callback table; the C side passes the
        # ctx back, and ctx indexes the group objects kept here.
        groups = [g]

        def pick(ctx):
            return groups[ctx or 0]

        def ag(ctx, *a):
            return pick(ctx).allgatherv(ctx, *a)

        def ar(ctx, *a):
            return pick(ctx).allreduce(ctx, *a)

        def ba(ctx, *a):
            return pick(ctx).barrier(ctx, *a)

        def st(ctx, *a):
            return pick(ctx).set_timeout(ctx, *a)

        def du(ctx, out, err):
            parent = pick(ctx)
            rc = parent.dup(ctx, out, err)
            if rc == 0:
                groups.append(parent.children[-1])
                out[0] = len(groups) - 1
            return rc

        def de(ctx):
            if ctx:
                groups[ctx] = None

        cbs = [_lib.ALLGATHERV_FN(ag), _lib.ALLREDUCE_FN(ar), _lib.BARRIER_FN(ba), _lib.TIMEOUT_FN(st),
               _lib.DUP_FN(du), _lib.DESTROY_FN(de)]
        self._keep += cbs
        s = _lib.CommCallbacks(_lib.DISTRO_COMM_CALLBACKS_VERSION, g.rank, g.world, None, *cbs)
        h = ctypes.c_void_p()
        check(lib.distro_comm_from_callbacks(ctypes.byref(s), ctypes.byref(h)), "distro_comm_from_callbacks")
        return h


class MPIComm(Comm):
    """The library's MPI communicator over MPI_COMM_WORLD (OpenMPI). Starts
    MPI (MPI_THREAD_MULTIPLE, for the overlap modes) unless already started."""

    def __init__(self):
        if not lib.has_mpi:
            raise RuntimeError("distro.comm.MPIComm: the installed library was built without MPI")
        mpi = ctypes.CDLL(ctypes.util.find_library("mpi") or "libmpi.so", mode=ctypes.RTLD_GLOBAL)
        flag = ctypes.c_int()
        mpi.MPI_Initialized(ctypes.byref(flag))
        if not flag.value:
            provided = ctypes.c_int()
            if mpi.MPI_Init_thread(None, None, 3, ctypes.byref(provided)) != 0:
                raise RuntimeError("distro.comm.MPIComm: MPI_Init_thread failed")
        world = ctypes.c_void_p.in_dll(mpi, "ompi_mpi_comm_world")
        h = ctypes.c_void_p()
        check(lib.distro_comm_mpi(ctypes.addressof(world), ctypes.byref(h)), "distro_comm_mpi")
        self.handle = h
        self.rank, self.world = lib.distro_comm_rank(h), lib.distro_comm_size(h)
