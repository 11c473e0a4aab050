#!/usr/bin/env bash
# Where a GPU step's device time goes, kernel by kernel: one DeMo step of
# bench_cuda_step (1.2B Llama-2 shapes, chunk 64, top-k 32, F32 values, wire
# v2) under Nsight Compute with the clocks left alone, each kernel's
# gpu__time_duration summed by name, largest first. Host work (the wire
# codec) and copies are not kernels: the step's own table (gpu-check's
# bench logs) has them.
#
#   bench/gpu-profile.sh OUTDIR [exact|gemm]    after bench/gpu-check.sh built build-gpu/
#
# Writes OUTDIR/ncu-METHOD.csv (ncu's rows) and OUTDIR/kernels-METHOD.tsv.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DISTRO_GPU_BUILD:-$root/build-gpu}
out=${1:?usage: bench/gpu-profile.sh OUTDIR [exact|gemm]}
dct=${2:-exact}
mkdir -p "$out"
command -v ncu >/dev/null 2>&1 || { echo "gpu-profile: ncu not found" >&2; exit 1; }
timeout "${GPU_PROFILE_LIMIT:-240}" ncu --clock-control none --metrics gpu__time_duration.sum --csv \
  --print-units base --print-kernel-base function --log-file "$out/ncu-$dct.csv" \
  "$build/bench/bench_cuda_step" --chunk 64 --topk 32 --values f32 --wire 2 --dct "$dct" --steps 1 --warmup 0 \
  >"$out/ncu-$dct.log" 2>&1
python3 - "$out/ncu-$dct.csv" "$out/kernels-$dct.tsv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head = rows[0]
name, metric, value = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
tot, cnt = collections.Counter(), collections.Counter()
for r in rows[1:]:
    if r[metric] != "gpu__time_duration.sum":
        continue
    k = r[name]
    tot[k] += float(r[value].replace(",", "")) * 1e-6  # ns -> ms
    cnt[k] += 1
allms = sum(tot.values())
with open(sys.argv[2], "w") as f:
    f.write("kernel\tlaunches\tms\tshare\n")
    for k, ms in tot.most_common():
        f.write(f"{k}\t{cnt[k]}\t{ms:.3f}\t{ms / allms:.3f}\n")
        print(f"{ms:10.3f} ms {cnt[k]:5d}x  {k}")
print(f"{allms:10.3f} ms in all kernels")
PY
