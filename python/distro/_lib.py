"""ctypes declarations of the C API (include/distro/*.h) used by the package."""
import ctypes
import ctypes.util
import os
import subprocess

c_float_p = ctypes.POINTER(ctypes.c_float)
c_size_p = ctypes.POINTER(ctypes.c_size_t)

DISTRO_OPTIONS_VERSION = 3
DISTRO_COMM_CALLBACKS_VERSION = 1
DISTRO_COMM_ERR_MAX = 256

STATUS = ["OK", "ERR_INVALID", "ERR_NOMEM", "ERR_SHAPE", "ERR_PAYLOAD", "ERR_COMM", "ERR_NONFINITE",
          "ERR_IO", "ERR_UNSUPPORTED", "ERR_CUDA", "ERR_TIMEOUT"]

ALG_DEMO, ALG_ADAMW = 0, 1
UPDATE_SIGN, UPDATE_ADAMW = 0, 1
VALUES = {"f32": 0, "bf16": 1, "sign1": 2, "int8": 3, "int4": 4}
OVERLAP = {"off": 0, "lookahead": 1, "stale": 2, "backward": 3}


class Options(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int), ("algorithm", ctypes.c_int),
        ("lr", ctypes.c_float), ("beta1", ctypes.c_float), ("beta2", ctypes.c_float),
        ("eps", ctypes.c_float), ("weight_decay", ctypes.c_float),
        ("compression_decay", ctypes.c_float), ("chunk", ctypes.c_int), ("topk", ctypes.c_int),
        ("update", ctypes.c_int), ("values", ctypes.c_int), ("wire_version", ctypes.c_int),
        ("drop_invalid_peers", ctypes.c_int), ("threads", ctypes.c_int),
        ("clip_median_multiple", ctypes.c_float), ("overlap", ctypes.c_int),
        ("clip_norm", ctypes.c_float),  # version 4
    ]


class StepStats(ctypes.Structure):
    _fields_ = [
        ("bytes_sent", ctypes.c_uint64), ("bytes_received", ctypes.c_uint64),
        ("seconds_transform", ctypes.c_double), ("seconds_topk", ctypes.c_double),
        ("seconds_exchange", ctypes.c_double), ("seconds_decode", ctypes.c_double),
        ("seconds_total", ctypes.c_double), ("step", ctypes.c_int64),
        ("peers_dropped", ctypes.c_int), ("peers_dropped_mask", ctypes.c_uint64),
        ("peers_clipped", ctypes.c_int), ("seconds_codec", ctypes.c_double),
        ("seconds_exchange_bg", ctypes.c_double),
    ]


ALLGATHERV_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                 ctypes.c_size_t, c_size_p, ctypes.c_void_p)
ALLREDUCE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, c_float_p, ctypes.c_size_t, ctypes.c_void_p)
BARRIER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
TIMEOUT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_double, ctypes.c_void_p)
DUP_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
DESTROY_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class CommCallbacks(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int), ("rank", ctypes.c_int), ("world", ctypes.c_int), ("ctx", ctypes.c_void_p),
        ("allgatherv", ALLGATHERV_FN), ("allreduce_sum", ALLREDUCE_FN), ("barrier", BARRIER_FN),
        ("set_timeout", TIMEOUT_FN), ("dup", DUP_FN), ("destroy", DESTROY_FN),
    ]


def _find_library():
    """DISTRO_LIBRARY, else the path recorded at install, else pkg-config now."""
    env = os.environ.get("DISTRO_LIBRARY")
    if env:
        return env
    try:
        from . import _build_config
        if os.path.exists(_build_config.LIBRARY):
            return _build_config.LIBRARY
    except ImportError:
        pass
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "distro"], check=True, capture_output=True,
                                text=True).stdout.strip()
        path = os.path.join(libdir, "libdistro.so")
        if os.path.exists(path):
            return path
    except (OSError, subprocess.CalledProcessError):
        pass
    found = ctypes.util.find_library("distro")
    if found:
        return found
    raise ImportError("distro: cannot find libdistro.so: install the C library (make install) and reinstall this "
                      "package, or set DISTRO_LIBRARY to the library's path")


def load():
    path = _find_library()
    lib = ctypes.CDLL(path)  # CDLL releases the GIL around every call
    P = ctypes.c_void_p
    sig = {
        "distro_status_string": (ctypes.c_char_p, [ctypes.c_int]),
        "distro_last_error": (ctypes.c_char_p, []),
        "distro_version_string": (ctypes.c_char_p, []),
        "distro_options_default": (Options, [ctypes.c_int]),
        "distro_comm_local_group": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(P)]),
        "distro_comm_from_callbacks": (ctypes.c_int, [ctypes.POINTER(CommCallbacks), ctypes.POINTER(P)]),
        "distro_comm_set_timeout": (ctypes.c_int, [P, ctypes.c_double]),
        "distro_comm_free": (None, [P]),
        "distro_comm_rank": (ctypes.c_int, [P]),
        "distro_comm_size": (ctypes.c_int, [P]),
        "distro_optim_create": (ctypes.c_int, [ctypes.POINTER(Options), P, ctypes.POINTER(P)]),
        "distro_optim_add_param": (ctypes.c_int, [P, ctypes.c_char_p, P, P, ctypes.c_int,
                                                  ctypes.POINTER(ctypes.c_int64)]),
        "distro_optim_set_grad": (ctypes.c_int, [P, ctypes.c_char_p, P]),
        "distro_optim_grad_ready": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_float]),
        "distro_optim_step": (ctypes.c_int, [P, ctypes.c_float, ctypes.POINTER(StepStats)]),
        "distro_optim_flush": (ctypes.c_int, [P, ctypes.POINTER(StepStats)]),
        "distro_optim_grad_norm": (ctypes.c_int, [P, ctypes.POINTER(ctypes.c_double)]),
        "distro_optim_save": (ctypes.c_int, [P, ctypes.c_char_p]),
        "distro_optim_load": (ctypes.c_int, [P, ctypes.c_char_p]),
        "distro_optim_payload_bytes": (ctypes.c_int, [P, ctypes.POINTER(ctypes.c_uint64)]),
        "distro_optim_free": (None, [P]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    lib.path = path
    lib.has_mpi = hasattr(lib, "distro_comm_mpi")
    if lib.has_mpi:
        lib.distro_comm_mpi.restype = ctypes.c_int
        lib.distro_comm_mpi.argtypes = [P, ctypes.POINTER(P)]
    lib.has_cuda = hasattr(lib, "distro_cuda_optim_create")
    return lib
