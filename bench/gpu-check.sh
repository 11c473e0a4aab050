#!/usr/bin/env bash
# GPU check for the CUDA backend (issues 5 and 26).
#
#   bench/gpu-check.sh --prepare   here, on a Debian 12 build machine: download
#                                  the .deb files of OpenBLAS and pkg-config
#                                  into .gpu-deps/ (ignored: carry it to the
#                                  GPU machine with the working tree)
#   bench/gpu-check.sh OUTDIR      on the GPU machine: configure and build with
#                                  CUDA in build-gpu/, run the CUDA tests, the
#                                  step benchmark (1.2B Llama-2 shapes) with the
#                                  exact DCT (wire v2 and v1) and the cuBLAS
#                                  option, and the PyTorch formulation with the
#                                  same chunk, top-k and values; full logs in
#                                  OUTDIR, one PASS/FAIL line per check, the
#                                  table last (OUTDIR/summary.txt).
#
# Exits 0 only when every check passed (a skipped check, e.g. PyTorch not
# importable, is reported as SKIP and does not fail the run). Every step has
# a time limit and the whole run stops starting new work at GPU_CHECK_BUDGET
# seconds (default 470: all of it within 8 minutes).
#
# Needs there: nvcc, cmake, a C compiler with OpenMP. OpenBLAS and pkg-config
# come from .gpu-deps/ when missing; NCCL from the CUDA tree or Python's
# nvidia-nccl package.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps_dir=$root/.gpu-deps

if [ "${1:-}" = "--prepare" ]; then
  mkdir -p "$deps_dir"
  grep -qx '/.gpu-deps/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu-deps/' >>"$root/.git/info/exclude"
  (cd "$deps_dir" && apt-get download libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libquadmath0 \
                                      pkgconf pkgconf-bin libpkgconf3)
  ls -l "$deps_dir"
  echo "carry: .gpu-deps (run: bench/gpu-check.sh OUTDIR on the GPU machine)"
  exit 0
fi

out=${1:?usage: bench/gpu-check.sh OUTDIR | --prepare}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${DISTRO_GPU_BUILD:-$root/build-gpu}
budget=${GPU_CHECK_BUDGET:-470}
t0=$(date +%s)
say() { printf '[gpu-check %3ds] %s\n' $(($(date +%s) - t0)) "$*"; }

# Checks: record "PASS name detail" / "FAIL name detail" / "SKIP name detail".
results=()
failed=0
pass() { results+=("PASS $1${2:+  ($2)}"); say "PASS $1${2:+ ($2)}"; }
fail() { results+=("FAIL $1${2:+  ($2)}"); failed=1; say "FAIL $1${2:+ ($2)}"; }
skip() { results+=("SKIP $1${2:+  ($2)}"); say "SKIP $1${2:+ ($2)}"; }
# Seconds a step may take: its own limit, cut to what is left of the budget.
limit() {
  local left=$((t0 + budget - $(date +%s)))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
# run NAME LIMIT LOG CMD...: a check that passes when CMD exits 0 in time.
run() {
  local name=$1 lim log=$3 rc=0
  lim=$(limit "$2")
  shift 3
  if [ "$lim" -le 5 ]; then
    fail "$name" "not started: the ${budget}s budget is spent"
    return 1
  fi
  timeout "$lim" "$@" >"$log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then
    pass "$name"
    return 0
  fi
  if [ $rc -eq 124 ]; then fail "$name" "timed out after ${lim}s, see $(basename "$log")"; else
    fail "$name" "exit $rc, see $(basename "$log")"; fi
  tail -15 "$log" || true
  return 1
}

export PATH=/usr/local/cuda/bin:$PATH
{ nvidia-smi || true; echo; nvcc --version || true; echo; cmake --version; echo; cc --version; } >"$out/env.log" 2>&1
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
say "environment in env.log: ${gpu:-no nvidia-smi}"

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
    say "OpenBLAS / pkg-config from .gpu-deps ($(pkg-config --modversion openblas 2>&1 || true))"
  else
    say "OpenBLAS or pkg-config missing and no .gpu-deps/ (run bench/gpu-check.sh --prepare here first)"
  fi
fi

# NCCL: beside the CUDA headers, or Python's nvidia-nccl wheel.
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

# 1. Configure and build (the library, the CUDA tests, the benchmark).
gen=()
if command -v ninja >/dev/null 2>&1; then gen=(-G Ninja); fi
build_ok=0
if run configure 60 "$out/configure.log" cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
     -DDISTRO_CUDA=ON -DDISTRO_TESTS=OFF -DDISTRO_CUDA_TESTS=ON -DDISTRO_EXAMPLES=OFF -DDISTRO_MPI=OFF \
     -DDISTRO_WERROR=OFF "${nccl_flag[@]}"; then
  targets=(bench_cuda_step)
  for f in "$root"/tests/cuda/test_cuda_*.c; do
    t=$(basename "$f" .c)
    if [ "$t" = test_cuda_nccl ] && ! grep -q 'NCCL ON' "$out/configure.log"; then continue; fi
    targets+=("$t")
  done
  if run build 200 "$out/build.log" cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"; then build_ok=1; fi
fi

# 2. The CUDA tests, one check each.
lim=$(limit 120)
if [ $build_ok = 1 ] && [ "$lim" -le 5 ]; then
  fail "tests" "not started: the ${budget}s budget is spent"
elif [ $build_ok = 1 ]; then
  rc=0
  timeout "$lim" ctest --test-dir "$build" -R cuda --output-on-failure >"$out/tests.log" 2>&1 || rc=$?
  while read -r name verdict; do
    case $verdict in
      Passed) pass "test $name" ;;
      Skipped) fail "test $name" "skipped on a GPU machine" ;;
      *) fail "test $name" "$verdict, see tests.log" ;;
    esac
  done < <(sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([A-Za-z0-9_]+) \.+ *(\*+)?([A-Za-z]+).*/\1 \3/p' "$out/tests.log")
  if ! grep -qE 'Test +#' "$out/tests.log"; then fail "tests" "ctest ran nothing (rc $rc), see tests.log"; fi
  if [ $rc -eq 124 ]; then fail "tests" "timed out"; fi
fi

# 3. The step benchmark: exact DCT, wire v2 and v1, and the cuBLAS option,
# all at the settings the PyTorch formulation uses below.
chunk=64 topk=32 values=f32
bench() { # NAME LOG ARGS...
  local name=$1 log=$2
  shift 2
  run "$name" 75 "$log" "$build/bench/bench_cuda_step" --chunk $chunk --topk $topk --values $values \
    --steps 4 --warmup 1 "$@"
}
if [ $build_ok = 1 ]; then
  bench "bench exact wire v2" "$out/bench-exact-v2.log" --wire 2 --dct exact || true
  bench "bench exact wire v1" "$out/bench-exact-v1.log" --wire 1 --dct exact || true
  bench "bench cuBLAS wire v2" "$out/bench-gemm-v2.log" --wire 2 --dct gemm || true
fi

# 4. The PyTorch formulation at the same chunk, top-k and values.

if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  if run "PyTorch formulation" 90 "$out/torch.log" env PYTHONUNBUFFERED=1 python3 "$root/bench/torch_step.py" \
       --chunk $chunk --topk $topk --values $values --steps 4; then :; fi
else
  skip "PyTorch formulation" "torch with CUDA not importable"
fi

# 5. Targets, read from the logs.
num() { awk -v k="$1" '$1 == k {print $2}' "$2" 2>/dev/null | tail -1 || true; }
cfg() { sed -n "s/^$1 //p" "$2" 2>/dev/null | tail -1 || true; }
ms_v2=$(num BENCH_STEP_MS "$out/bench-exact-v2.log")
ms_v1=$(num BENCH_STEP_MS "$out/bench-exact-v1.log")
ms_gemm=$(num BENCH_STEP_MS "$out/bench-gemm-v2.log")
ms_torch=$(num TORCH_STEP_MS "$out/torch.log")
floor=$(sed -nE 's/^step \/ floor: ([0-9.]+)x.*/\1/p' "$out/bench-exact-v2.log" 2>/dev/null | tail -1 || true)
if [ -n "$floor" ]; then
  if awk -v f="$floor" 'BEGIN { exit !(f <= 2.0) }'; then pass "exact step <= 2x the copy floor" "${floor}x"; else
    fail "exact step <= 2x the copy floor" "${floor}x"; fi
fi
if [ -n "$ms_v2" ] && [ -n "$ms_torch" ]; then
  label="library $(cfg BENCH_CONFIG "$out/bench-exact-v2.log") vs PyTorch $(cfg TORCH_CONFIG "$out/torch.log")"
  if awk -v a="$ms_v2" -v b="$ms_torch" 'BEGIN { exit !(b / a >= 10) }'; then pass ">= 10x the PyTorch formulation" "$label"; else
    fail ">= 10x the PyTorch formulation" "$label"; fi
fi

{
  echo "== gpu-check summary ($(date -u +%Y-%m-%dT%H:%MZ), $(($(date +%s) - t0)) s, ${gpu:-unknown GPU})"
  printf '%s\n' "${results[@]}"
  echo
  sed -n '/^== table/,/^== end/p' "$out/bench-exact-v2.log" 2>/dev/null | grep -v '^== ' || true
  echo
  printf '%-44s %10s\n' "step, median ms (settings as labelled)" "ms"
  show() { [ -n "$2" ] && printf '%-44s %10.2f\n' "$1" "$2"; return 0; }
  show "exact DCT: $(cfg BENCH_CONFIG "$out/bench-exact-v2.log")" "$ms_v2"
  show "exact DCT: $(cfg BENCH_CONFIG "$out/bench-exact-v1.log")" "$ms_v1"
  show "cuBLAS option: $(cfg BENCH_CONFIG "$out/bench-gemm-v2.log")" "$ms_gemm"
  show "PyTorch: $(cfg TORCH_CONFIG "$out/torch.log")" "$ms_torch"
  if [ -n "$ms_v2" ] && [ -n "$ms_gemm" ]; then
    awk -v a="$ms_v2" -v b="$ms_gemm" 'BEGIN { printf "exact DCT costs %.2fx the cuBLAS option\n", a / b }'
  fi
  if [ -n "$ms_v2" ] && [ -n "$ms_torch" ]; then
    awk -v a="$ms_v2" -v b="$ms_torch" 'BEGIN { printf "PyTorch / library (exact, wire v2): %.2fx\n", b / a }'
  fi
  if [ -n "$ms_v1" ] && [ -n "$ms_torch" ]; then
    awk -v a="$ms_v1" -v b="$ms_torch" 'BEGIN { printf "PyTorch / library (exact, wire v1): %.2fx\n", b / a }'
  fi
  if [ $failed = 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
} | tee "$out/summary.txt"
exit $failed
