#!/usr/bin/env bash
# ctest wan_link: two MPI ranks in their own network namespaces, on links
# limited to 10 Mbit/s by tbf (bench/wan/wan-net.sh). Asserts
#  1. the limit is real: an all-gather of 1 MB per rank through the installed
#     library's MPI communicator takes >= 0.8 s (8 Mbit at 10 Mbit/s; TCP/IP
#     framing only adds to it). A lower bound only: a loaded machine makes it
#     slower, never faster. The same exchange with no limit is printed as the
#     machine's floor.
#  2. the library's byte counts are honest: for a short gpt-train job per
#     optimizer (adamw, distro), the bytes the kernel counted leaving the two
#     ranks' links are within [1.0, 1.15]x the bytes distro_step_stats says the
#     ranks received (what crossed the links: for an all-gather each payload
#     reaches every other rank). The kernel's count includes TCP/IP and
#     Ethernet headers, ACKs, MPI headers and start-up, and the trainer's own
#     small all-reduces (loss, validation).
# Exits 77 (ctest: skipped) where namespaces, veth, bridges or tbf are not
# permitted (not root, a container without CAP_NET_ADMIN, no sch_tbf).
#
#   wan-test.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: wan-test.sh BUILD_DIR}" && pwd)
source "$(cd "$(dirname "$0")" && pwd)/wan-net.sh"
gpt=$build/python-free-examples/gpt/gpt-train

export WAN_TIMEOUT=60 # each mpirun; the whole test takes ~15 s
wan_check
command -v mpirun > /dev/null || wan_skip "mpirun missing (Debian: openmpi-bin)"
[ -x "$gpt" ] || { echo "FAIL: no $gpt (build first)"; exit 1; }
wan_build_probe "$build"
wan_up 2
fail=0

echo "== 1 MB all-gather, 2 ranks (seconds of the slowest rank)"
wan_rate 0
floor=$(wan_mpirun 2 "$WAN_PROBE" 1000000 1 | awk -F'seconds=' '/^exchange/ {print $2}')
wan_rate 10
limited=$(wan_mpirun 2 "$WAN_PROBE" 1000000 1 | awk -F'seconds=' '/^exchange/ {print $2}')
echo "no limit: ${floor:-?} s; 10 Mbit/s: ${limited:-?} s (>= 0.8 s expected: 8 Mbit of payload)"
if [ -z "$limited" ] || ! awk -v t="$limited" 'BEGIN { exit !(t >= 0.8) }'; then
  echo "FAIL: the 1 MB exchange at 10 Mbit/s took ${limited:-no} s, less than 0.8 s: the limit is not applied"
  fail=1
fi

# Short jobs whose traffic is mostly the optimizer's: MPI start-up (~8.5 kB
# for 2 ranks) and the trainer's per-step all-reduce of its loss (~1.4 kB a
# step with headers) are the kernel's alone. adamw all-reduces 476 kB per
# rank per step of this model; distro with f32 values sends ~19 kB (with the
# default 1-bit values, 5 kB: the trainer's own traffic would be 25% of it).
model="--layers 2 --dim 64 --heads 4 --context 64 --batch 4 --threads 1 --eval-every 0 --quiet"
for optim in adamw distro; do
  extra=""
  [ $optim = distro ] && extra="--values f32"
  log=$WAN_DIR/$optim.csv
  before=$(wan_tx_sum 0 1)
  wan_mpirun 2 "$gpt" --mpi $model --optim "$optim" $extra --steps 12 --log "$log" > "$WAN_DIR/$optim.out" 2>&1 ||
    { cat "$WAN_DIR/$optim.out"; echo "FAIL: gpt-train --optim $optim under mpirun"; exit 1; }
  kernel=$(($(wan_tx_sum 0 1) - before))
  # total_recv (column 10): bytes received, summed over the ranks, through the last step.
  library=$(awk -F, 'NR > 1 { r = $10 } END { print r + 0 }' "$log")
  ratio=$(awk -v k="$kernel" -v l="$library" 'BEGIN { printf "%.4f", (l > 0 ? k / l : 0) }')
  echo "== $optim, 12 steps at 10 Mbit/s: kernel $kernel B, library $library B, ratio $ratio (expected 1.0-1.15)"
  if ! awk -v r="$ratio" 'BEGIN { exit !(r >= 1.0 && r <= 1.15) }'; then
    echo "FAIL: $optim: kernel-counted bytes are ${ratio}x the library's count, outside [1.0, 1.15]"
    fail=1
  fi
done
[ $fail = 0 ] && echo "PASS"
exit $fail
