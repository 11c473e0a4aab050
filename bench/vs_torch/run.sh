#!/usr/bin/env bash
# bench/vs_torch: distro against PyTorch on one thread (vs_torch.py), with the
# library installed the way an outside trainer gets it.
#
#   bench/vs_torch/run.sh [--build DIR] [vs_torch.py options: --layers N --rounds R --chunk C --topk K]
set -euo pipefail
build=build
if [ "${1:-}" = --build ]; then build=$2; shift 2; fi
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "vs_torch: skipped: PyTorch is not installed for $py (Debian: apt-get install python3-torch)"; exit 0
fi
prefix=$build/vs_torch/prefix
cmake --install "$build" --prefix "$prefix" > /dev/null
pc=$(find "$prefix" -name distro.pc -print -quit)
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(pkg-config --variable=libdir distro)
# shellcheck disable=SC2046
cc -O2 -shared -fPIC -o "$build/vs_torch/libshim.so" "$here/shim.c" $(pkg-config --cflags --libs distro) \
   -Wl,-rpath,"$libdir"
exec "$py" "$here/vs_torch.py" --shim "$build/vs_torch/libshim.so" "$@"
