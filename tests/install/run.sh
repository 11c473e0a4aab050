#!/usr/bin/env bash
# install_consumer: install the build tree into a temporary prefix, then build
# and run tests/install/consumer.c against it (a) with pkg-config, shared and
# static, and (b) from a CMake project using find_package(distro).
#
#   run.sh BUILD_DIR [C_COMPILER [CMAKE]]
set -euo pipefail

build_dir=$(cd "$1" && pwd)
cc=${2:-cc}
cmake=${3:-cmake}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/distro-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

step() { printf '\n== %s\n' "$*"; }

step "cmake --install $build_dir --prefix $prefix"
"$cmake" --install "$build_dir" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; exit 1; }

pcfile=$(find "$prefix" -name distro.pc -print -quit)
[ -n "$pcfile" ] || { echo "distro.pc was not installed" >&2; exit 1; }
libdir=$(dirname "$(dirname "$pcfile")")
for f in "$prefix/include/distro/distro.h" "$libdir/libdistro.so" "$libdir/libdistro.a" \
         "$libdir/cmake/distro/distroConfig.cmake" "$libdir/cmake/distro/distroConfigVersion.cmake" \
         "$libdir/cmake/distro/distroTargets.cmake"; do
  [ -e "$f" ] || { echo "missing from the install: $f" >&2; exit 1; }
done

step "pkg-config (shared)"
export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pkg-config --exists --print-errors distro
cflags=$(pkg-config --cflags distro)
libs=$(pkg-config --libs distro)
echo "cflags: $cflags"
echo "libs:   $libs"
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror -o "$work/consumer_pc" "$here/consumer.c" $cflags $libs -lm
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/consumer_pc"

if echo "$cflags" | grep -q -- '-DDISTRO_WITH_MPI=1'; then
  step "pkg-config (shared), a trainer that calls MPI itself"
  # shellcheck disable=SC2086
  "$cc" -std=c11 -Wall -Wextra -Werror -o "$work/consumer_mpi" "$here/consumer_mpi.c" $cflags $libs
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/consumer_mpi"
fi

step "pkg-config --static (libdistro.a)"
static_libs=$(pkg-config --static --libs distro)
echo "libs:   $static_libs"
# Same flags, but take libdistro.a instead of libdistro.so.
static_libs=${static_libs//-ldistro/-l:libdistro.a}
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror -o "$work/consumer_pc_static" "$here/consumer.c" $cflags $static_libs -lm
if ldd "$work/consumer_pc_static" | grep -q 'libdistro\.so'; then
  echo "consumer_pc_static still needs libdistro.so" >&2; exit 1
fi
"$work/consumer_pc_static"

step "find_package(distro)"
"$cmake" -S "$here/project" -B "$work/project" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" \
      >"$work/project.log" || { cat "$work/project.log"; exit 1; }
"$cmake" --build "$work/project" >>"$work/project.log" 2>&1 || { cat "$work/project.log"; exit 1; }
"$work/project/consumer_shared"
if ldd "$work/project/consumer_static" | grep -q 'libdistro\.so'; then
  echo "consumer_static still needs libdistro.so" >&2; exit 1
fi
"$work/project/consumer_static"

step "install_consumer: OK"
