#!/usr/bin/env bash
# bench/vs_torch: distro against PyTorch on one thread (vs_torch.py), with the
# library installed the way an outside trainer gets it, and driven through
# the Python package (pip-installed into a venv that sees Debian's torch)
# and through shim.c (the same calls from C).
#
#   bench/vs_torch/run.sh [--build DIR] [vs_torch.py options: --layers N --rounds R --chunk C --topk K --tsv F]
set -euo pipefail
build=build
if [ "${1:-}" = --build ]; then build=$2; shift 2; fi
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$build" && pwd)
py=/usr/bin/python3
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "vs_torch: skipped: PyTorch is not installed for $py (Debian: apt-get install python3-torch)"; exit 0
fi
work=$build/vs_torch
prefix=$work/prefix
rm -rf "$prefix" "$work/venv" "$work/src"
mkdir -p "$work"
# shellcheck source=bench/installed.sh
. "$here/../installed.sh"
distro_installed "$build" "$prefix"
# shellcheck disable=SC2086
cc -O2 -shared -fPIC -o "$work/libshim.so" "$here/shim.c" $DISTRO_CFLAGS $DISTRO_LIBS
"$py" -m venv --system-site-packages "$work/venv"
cp -r "$here/../../python" "$work/src"
rm -rf "$work/src/build" "$work/src"/*.egg-info
PKG_CONFIG_PATH=$DISTRO_PKG_CONFIG_PATH "$work/venv/bin/pip" install -q --no-index --no-deps --no-build-isolation "$work/src"
cd "$work"
exec "$work/venv/bin/python" "$here/vs_torch.py" --shim "$work/libshim.so" "$@"
