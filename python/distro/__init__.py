"""distro: DeMo / DisTrO-AdamW over the installed C library.

    import distro.torch
    opt = distro.torch.DisTrOAdamW(model.parameters(), lr=6e-4, weight_decay=0.1)

The optimizers live in distro.torch (PyTorch is imported only there);
communicators in distro.comm.
"""
from . import _lib

lib = _lib.load()
__version__ = lib.distro_version_string().decode()


class DistroError(RuntimeError):
    """A distro call failed. `status` is the library's status name (e.g.
    'ERR_SHAPE'); the message is the library's distro_last_error()."""

    def __init__(self, status, message):
        self.status = _lib.STATUS[status] if 0 <= status < len(_lib.STATUS) else str(status)
        super().__init__(message)


def check(status, what):
    """Raises DistroError carrying the library's message unless status is OK."""
    if status != 0:
        msg = lib.distro_last_error().decode(errors="replace")
        raise DistroError(status, "%s: %s" % (what, msg or lib.distro_status_string(status).decode()))
