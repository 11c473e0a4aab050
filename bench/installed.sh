# shellcheck shell=bash disable=SC2034  # the variables are for the sourcing script
# Sourced by the benchmarks that link the library as an outside program
# does: `distro_installed BUILD PREFIX` installs BUILD into PREFIX (cmake
# --install) and sets DISTRO_CFLAGS and DISTRO_LIBS from the installed
# distro.pc (pkg-config), the libraries with an rpath to PREFIX, so the
# program runs with no environment variable; DISTRO_PKG_CONFIG_PATH is the
# folder of that distro.pc, for a build that runs pkg-config itself.
distro_installed() {
  cmake --install "$1" --prefix "$2" > /dev/null
  local pc
  pc=$(find "$2" -name distro.pc -print -quit)
  [ -n "$pc" ] || { echo "distro_installed: no distro.pc under $2" >&2; return 1; }
  local dir
  dir=$(dirname "$pc")
  DISTRO_PKG_CONFIG_PATH=$dir
  DISTRO_CFLAGS=$(PKG_CONFIG_PATH=$dir pkg-config --cflags distro)
  DISTRO_LIBS="$(PKG_CONFIG_PATH=$dir pkg-config --libs distro) -Wl,-rpath,$(PKG_CONFIG_PATH=$dir pkg-config --variable=libdir distro)"
}
