#!/usr/bin/env bash
# Why the first DisTrO steps of `gpt-train --mpi` ranks in namespaces were
# slow (issue 16): 2 ranks on a 10 Mbit/s link (bench/wan/wan-net.sh), the
# demo model, --optim distro, in three thread set-ups, printing the library's
# per-step optimizer and exchange seconds (the trainer's CSV: optim_s =
# distro_step_stats.seconds_total, exchange_s = .seconds_exchange):
#   default    no --threads: each MPI process takes all cores (2 OpenMP threads
#              per rank, 4 threads on this 2-core machine)
#   threads1   --threads 1
#   passive    default threads with OMP_WAIT_POLICY=passive (idle OpenMP
#              threads sleep at once instead of spinning)
#
#   bench/wan/first-steps.sh [BUILD_DIR [STEPS]]
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/wan-net.sh"
build=$(cd "${1:-build}" && pwd)
steps=${2:-12}
gpt=$build/python-free-examples/gpt/gpt-train
[ -x "$gpt" ] || { echo "first-steps: no $gpt (build first)" >&2; exit 2; }
wan_check
wan_up 2
wan_rate 10
echo "== 2 MPI ranks, 10 Mbit/s, demo model, --optim distro, $steps steps; machine: $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
for setup in default threads1 passive; do
  extra=() env=()
  case $setup in
    threads1) extra=(--threads 1) ;;
    passive) env=(-x OMP_WAIT_POLICY=passive) ;;
  esac
  csv=$WAN_DIR/$setup.csv
  wan_mpirun 2 "${env[@]}" "$gpt" --mpi --optim distro --steps "$steps" --eval-every 0 --quiet "${extra[@]}" \
    --log "$csv" > "$WAN_DIR/$setup.out" 2>&1 || { cat "$WAN_DIR/$setup.out"; exit 1; }
  awk -F, -v s="$setup" -v load="$(cut -d' ' -f1 /proc/loadavg)" '
    NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { st = $c["step_s"]; op = $c["optim_s"]; ex = $c["exchange_s"]; n++
      line = line sprintf(" %.2f/%.2f", op - ex, ex)
      if (n <= 4) { a += op - ex; sa += st } else { b += op - ex; sb += st; m++ } }
    END { printf "%-9s optimizer without exchange / exchange, s per step:%s\n", s, line
          printf "%-9s mean steps 1-4: optimizer %.3f s (step %.3f s); steps 5-%d: optimizer %.3f s (step %.3f s); load %s\n",
                 s, a / 4, sa / 4, n, m ? b / m : 0, m ? sb / m : 0, load }' "$csv"
done
