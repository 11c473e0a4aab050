#!/usr/bin/env bash
# The Python package's tests, as ctest runs them (tests/python.cmake):
# install this build tree into a private prefix (cmake --install), make a
# venv that sees Debian's torch, `pip install` the package into it against
# that prefix (pkg-config), build the C driver against the same prefix, run
# test_package.py and test_backward.py. Exit 77 (reported as skipped) without PyTorch or venv.
#
#   python/tests/run.sh BUILD_DIR [CC] [CMAKE]
set -euo pipefail
build=$(cd "$1" && pwd)
cc=${2:-cc}
cmake=${3:-cmake}
here=$(cd "$(dirname "$0")" && pwd)
py=${DISTRO_PYTHON:-/usr/bin/python3}
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "SKIPPED: PyTorch is not importable by $py (Debian: apt-get install python3-torch)"
  exit 77
fi
if ! "$py" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "SKIPPED: $py cannot make a venv (Debian: apt-get install python3-venv)"
  exit 77
fi
work=$build/python-test
rm -rf "$work"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$work/prefix" > /dev/null
pc=$(find "$work/prefix" -name distro.pc -print -quit)
export PKG_CONFIG_PATH=$(dirname "$pc")
"$py" -m venv --system-site-packages "$work/venv"
cp -r "$here/.." "$work/src" # pip builds in the tree: keep the checkout clean
rm -rf "$work/src/build" "$work/src"/*.egg-info
"$work/venv/bin/pip" install -q --no-index --no-deps --no-build-isolation "$work/src"
# shellcheck disable=SC2046
"$cc" -O2 -o "$work/c_driver" "$here/c_driver.c" $(pkg-config --cflags --libs distro) \
  -Wl,-rpath,"$(pkg-config --variable=libdir distro)"
cd "$work" # import the installed package, not the checkout's
export DISTRO_C_DRIVER=$work/c_driver OMP_NUM_THREADS=1
"$work/venv/bin/python" "$here/test_package.py"
exec "$work/venv/bin/python" "$here/test_backward.py"
