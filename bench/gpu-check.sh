#!/usr/bin/env bash
# GPU check for the CUDA backend (issue 5).
#
#   bench/gpu-check.sh --prepare   here, on a Debian 12 build machine: download
#                                  the .deb files of OpenBLAS and pkg-config
#                                  into .gpu-deps/ (ignored; carry it)
#   bench/gpu-check.sh OUTDIR      on the GPU machine: configure and build with
#                                  CUDA in build-gpu/, run the CUDA tests, the
#                                  step benchmark (1.2B Llama-2 shapes), the
#                                  GEMM-vs-cuFFT DCT comparison at chunk 128 and,
#                                  where PyTorch imports, the PyTorch baseline;
#                                  full logs in OUTDIR, one short table last.
#
# Needs there: nvcc, cmake, a C compiler with OpenMP. OpenBLAS and pkg-config
# come from .gpu-deps/ when missing; NCCL from the CUDA tree or Python's
# nvidia-nccl package. Budget: well under 8 minutes on an H200.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps_dir=$root/.gpu-deps

if [ "${1:-}" = "--prepare" ]; then
  mkdir -p "$deps_dir"
  grep -qx '/.gpu-deps/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu-deps/' >>"$root/.git/info/exclude"
  (cd "$deps_dir" && apt-get download libopenblas0-pthread libopenblas-pthread-dev libgfortran5 \
                                      pkgconf pkgconf-bin libpkgconf3) || exit 1
  ls -l "$deps_dir"
  exit 0
fi

out=${1:?usage: bench/gpu-check.sh OUTDIR | --prepare}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${DISTRO_GPU_BUILD:-$root/build-gpu}
t0=$(date +%s)
say() { printf '[gpu-check %3ds] %s\n' $(($(date +%s) - t0)) "$*"; }
result_build=FAIL result_tests=FAIL result_bench=FAIL result_torch=skipped

export PATH=/usr/local/cuda/bin:$PATH
{ nvidia-smi; echo; nvcc --version; echo; cmake --version; echo; cc --version; } >"$out/env.log" 2>&1
say "environment in env.log: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# OpenBLAS and pkg-config, unpacked from the carried .deb files when missing.
if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists openblas 2>/dev/null; then
  if ls "$deps_dir"/*.deb >/dev/null 2>&1; then
    sys=/tmp/distro-gpu-deps
    rm -rf "$sys" && mkdir -p "$sys"
    for f in "$deps_dir"/*.deb; do dpkg -x "$f" "$sys"; done
    lib=$sys/usr/lib/x86_64-linux-gnu
    command -v pkg-config >/dev/null 2>&1 || export PATH=$sys/usr/bin:$PATH
    export PKG_CONFIG_PATH=$lib/openblas-pthread/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export PKG_CONFIG_SYSROOT_DIR=$sys
    export LD_LIBRARY_PATH=$lib/openblas-pthread:$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    say "OpenBLAS / pkg-config from .gpu-deps ($(pkg-config --modversion openblas 2>&1))"
  else
    say "OpenBLAS or pkg-config missing and no .gpu-deps/ (run bench/gpu-check.sh --prepare here first)"
  fi
fi

# NCCL: beside the CUDA headers, or Python's nvidia-nccl-cu13 wheel.
nccl_flag=()
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
  nccl_root=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
  if [ -n "$nccl_root" ] && [ -f "$nccl_root/include/nccl.h" ]; then
    [ -e "$nccl_root/lib/libnccl.so" ] || ln -sf libnccl.so.2 "$nccl_root/lib/libnccl.so" 2>/dev/null || true
    nccl_flag=(-DNCCL_ROOT="$nccl_root")
    export LD_LIBRARY_PATH=$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    say "NCCL from $nccl_root"
  else
    say "NCCL not found: building without the NCCL communicator"
  fi
fi

gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
say "configure + build in $build (logs: build.log)"
if timeout 240 cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDISTRO_CUDA=ON \
     -DDISTRO_TESTS=OFF -DDISTRO_CUDA_TESTS=ON -DDISTRO_EXAMPLES=OFF -DDISTRO_MPI=OFF -DDISTRO_WERROR=OFF \
     "${nccl_flag[@]}" >"$out/build.log" 2>&1 &&
   timeout 240 cmake --build "$build" -j "$(nproc)" --target bench_cuda_step \
     $(cd "$root/tests/cuda" && ls test_cuda_*.c | sed 's/\.c$//' | \
       { if grep -q 'NCCL ON' "$out/build.log"; then cat; else grep -v nccl; fi; }) >>"$out/build.log" 2>&1; then
  result_build=OK
else
  say "build failed; tail of build.log:"
  tail -30 "$out/build.log"
fi

if [ $result_build = OK ]; then
  say "CUDA tests (tests.log)"
  if timeout 180 ctest --test-dir "$build" -R cuda --output-on-failure >"$out/tests.log" 2>&1; then
    result_tests="OK ($(grep -c ' Passed' "$out/tests.log") passed, $(grep -c '\*\*\*Skipped' "$out/tests.log") skipped)"
  else
    result_tests="FAIL ($(grep -E 'tests passed|tests failed' "$out/tests.log" | tail -1))"
    tail -40 "$out/tests.log"
  fi
  say "step benchmark (bench.log)"
  if timeout 180 "$build/bench/bench_cuda_step" >"$out/bench.log" 2>&1; then
    result_bench=OK
  else
    result_bench="FAIL (rc $?)"
    tail -20 "$out/bench.log"
  fi
  # GEMM vs cuFFT DCT at chunk 128 (the default stays GEMM until this is read).
  for m in gemm fft; do
    say "step at chunk 128, DCT $m (bench-dct-$m.log)"
    timeout 120 "$build/bench/bench_cuda_step" --chunk 128 --steps 5 --warmup 2 --dct $m >"$out/bench-dct-$m.log" 2>&1 ||
      { echo "bench --dct $m failed (rc $?)"; tail -5 "$out/bench-dct-$m.log"; }
  done
fi

if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  say "PyTorch baseline (torch.log)"
  if PYTHONUNBUFFERED=1 timeout 150 python3 "$root/bench/torch_step.py" >"$out/torch.log" 2>&1; then
    result_torch=OK
  else
    result_torch="FAIL (rc $?)"
    tail -20 "$out/torch.log"
  fi
else
  say "PyTorch with CUDA not importable: baseline skipped"
fi

step_ms=$(awk '/^BENCH_STEP_MS/ {print $2}' "$out/bench.log" 2>/dev/null)
torch_ms=$(awk '/^TORCH_STEP_MS/ {print $2}' "$out/torch.log" 2>/dev/null)
{
  echo "== gpu-check summary ($(date -u +%Y-%m-%dT%H:%MZ), $(($(date +%s) - t0)) s)"
  echo "build: $result_build; tests: $result_tests; bench: $result_bench; torch: $result_torch"
  sed -n '/^== table/,/^== end/p' "$out/bench.log" 2>/dev/null | grep -v '^== '
  dg=$(awk '/^BENCH_DCT/ {print $4, $5}' "$out/bench-dct-gemm.log" 2>/dev/null)
  df=$(awk '/^BENCH_DCT/ {print $4, $5}' "$out/bench-dct-fft.log" 2>/dev/null)
  if [ -n "$dg" ] && [ -n "$df" ]; then
    echo "$dg $df" | awk '{ g = $1 + $2; f = $3 + $4;
      printf "DCT at chunk 128 (transform + decode phases, ms): GEMM %.2f + %.2f = %.2f; cuFFT %.2f + %.2f = %.2f; cuFFT/GEMM %.2fx\n",
             $1, $2, g, $3, $4, f, f / g }'
  else
    echo "DCT at chunk 128: GEMM vs cuFFT not measured (see bench-dct-*.log)"
  fi
  if [ -n "$step_ms" ] && [ -n "$torch_ms" ]; then
    awk -v a="$step_ms" -v b="$torch_ms" 'BEGIN { printf "PyTorch step %.2f ms; distro step %.2f ms; speedup %.2fx (target >= 3x)\n", b, a, b / a }'
  fi
} | tee "$out/summary.txt"
