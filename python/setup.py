"""distro's Python package: torch.optim optimizers over the installed C library.

The library is found with pkg-config at install time (`make install
PREFIX=...` puts distro.pc under PREFIX/lib/pkgconfig; set PKG_CONFIG_PATH
when that is not a default location). Its path is recorded in
distro/_build_config.py, so nothing needs pkg-config at run time.
"""
import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", "--print-errors", *args, "distro"], check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit("distro: pkg-config is not installed (Debian: apt-get install pkg-config)")
    except subprocess.CalledProcessError as e:
        raise SystemExit(
            "distro: pkg-config cannot find the C library 'distro' (" + e.stderr.strip() + "). "
            "Install it first (make install PREFIX=/opt/distro) and point PKG_CONFIG_PATH at "
            "PREFIX/lib/pkgconfig (or PREFIX/lib/x86_64-linux-gnu/pkgconfig)."
        )
    return out.stdout.strip()


class BuildPy(build_py):
    def run(self):
        super().run()
        libdir = pkg_config("--variable=libdir")
        version = pkg_config("--modversion")
        lib = os.path.join(libdir, "libdistro.so")
        if not os.path.exists(lib):
            raise SystemExit("distro: pkg-config names " + libdir + " but it holds no libdistro.so")
        target = os.path.join(self.build_lib, "distro", "_build_config.py")
        with open(target, "w") as f:
            f.write("# Written by setup.py from pkg-config at install time.\n")
            f.write("LIBRARY = %r\nVERSION = %r\n" % (lib, version))


setup(
    name="distro-optim",
    version="0.1.0",
    description="DeMo / DisTrO-AdamW optimizers for PyTorch over the distro C library",
    packages=["distro"],
    python_requires=">=3.9",
    cmdclass={"build_py": BuildPy},
)
