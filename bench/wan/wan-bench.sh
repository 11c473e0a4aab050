#!/usr/bin/env bash
# bench/wan: the GPT trainer over real rate-limited links (README.md).
#
#   bench/wan/wan-bench.sh [--reduced | --full] [--rates "1000 100 10"] [--modes "..."]
#                          [--ranks 4] [--sampling global|shard] [--out DIR] [--steps N]
#                          [--args "GPT-TRAIN FLAGS"] [--resume] [BUILD_DIR]
#
# N MPI ranks of gpt-train (--ranks, default 4, at most 16; or a distro-syncer
# and N decoupled learners), one
# network namespace each, on links limited by tbf in both directions, for each
# mode and link rate; then one table and a gnuplot PNG of validation loss
# against wall clock. --reduced (the default, a few minutes): 2 layers of
# width 64, context 64, 150 steps. --full: the demo model (4 layers, width
# 128, context 128, 842,496 parameters), 300 steps. Both: batch 4 per rank,
# so every row trains on the same tokens. Modes: adamw distro distro-adamw
# diloco decoupled, distro-overlap when `gpt-train --help` lists
# $WAN_OVERLAP_ARGS (default --overlap-step: the look-ahead overlap), likewise
# distro-adamw-overlap, and distro-stale (--overlap-stale) when it lists that.
# distro-adamw-sign1[-overlap] (DisTrO-AdamW with 1-bit values) and
# distro[-adamw]-backward and distro-adamw-sign1-backward (the gradient-ready
# exchange, --overlap-backward) run when --modes names them. MODE@N (say
# distro-adamw-backward@600) trains N steps instead of --steps, the same
# schedule over N steps: time to AdamW's loss with more, cheaper steps.
# distro, distro-adamw and the overlap modes also run with no limit
# (rate "none"): the floor its 10 Mbit/s step is compared with.
# --sampling passes gpt-train's --sampling (where each rank draws its
# windows; default global, the trainer's). --args appends flags to every
# DisTrO mode's gpt-train command (say "--topk 16"; kept in DIR/meta).
# --resume keeps DIR's results and runs only the rows missing from them.
# WAN_TIMEOUT (seconds, default 3600) bounds each run; one past it is
# stopped and its row marked failed.
# Root; exits 77 where namespaces are not permitted. Results: DIR (default
# BUILD_DIR/wan-PRESET, or wan-PRESET-rN for N ranks other than 4): table.txt,
# table.md, wan.png, per-run CSV and logs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/wan-net.sh"

preset=reduced rates="1000 100 10" modes="" out="" steps="" build="" resume=0 ranks=4 sampling="" extra=""
while [ $# -gt 0 ]; do
  case $1 in
    --reduced | --full) preset=${1#--} ;;
    --rates) rates=$2; shift ;;
    --modes) modes=$2; shift ;;
    --out) out=$2; shift ;;
    --ranks) ranks=$2; shift ;;
    --sampling) sampling=$2; shift ;;
    --args) extra=$2; shift ;;
    --steps) steps=$2; shift ;;
    --resume) resume=1 ;;
    -h | --help) sed -n '2,/^set -e/{/^set -e/d;p}' "$0"; exit 0 ;;
    -*) echo "wan-bench: unknown option $1" >&2; exit 2 ;;
    *) build=$1 ;;
  esac
  shift
done
case $ranks in [2-9] | 1[0-6]) ;; *) echo "wan-bench: --ranks must be 2-16, not '$ranks'" >&2; exit 2 ;; esac
build=$(cd "${build:-build}" && pwd)
gpt=$build/python-free-examples/gpt/gpt-train
syncer=$build/distro-syncer
for f in "$gpt" "$syncer"; do [ -x "$f" ] || { echo "wan-bench: no $f (build first)" >&2; exit 2; }; done
command -v gnuplot > /dev/null || echo "wan-bench: gnuplot missing: no plot (Debian: gnuplot-nox)" >&2

if [ $preset = full ]; then
  model="--layers 4 --dim 128 --heads 4 --context 128" steps=${steps:-300} eval_every=25
else
  model="--layers 2 --dim 64 --heads 4 --context 64" steps=${steps:-150} eval_every=10
fi
# Every periodic validation uses the same 64 windows (16 batches of 4).
common="$model --batch 4 --threads 1 --steps $steps --eval-every $eval_every --eval-batches 16 --seed 1"
case $sampling in "") ;; global | shard) common="$common --sampling $sampling" ;;
  *) echo "wan-bench: --sampling must be global or shard, not '$sampling'" >&2; exit 2 ;; esac
print_every=$(( steps / 5 > 0 ? steps / 5 : 1 ))
overlap_args=${WAN_OVERLAP_ARGS:---overlap-step}
if [ -z "$modes" ]; then
  modes="adamw distro distro-adamw diloco decoupled"
  # Not `--help | grep -q`: grep exits at the first match, the trainer gets
  # SIGPIPE and pipefail turns the match into a failure.
  help=$("$gpt" --help 2>&1 || true)
  case $help in *"${overlap_args%% *}"*) modes="$modes distro-overlap distro-adamw-overlap" ;; esac
  case $help in *--overlap-stale*) modes="$modes distro-stale" ;; esac
fi
args_of() { # mode -> gpt-train flags (nothing: not an MPI mode)
  case $1 in
    adamw | distro | distro-adamw) echo "--optim $1" ;;
    diloco) echo "--optim diloco --learners $ranks" ;;
    distro-overlap) echo "--optim distro $overlap_args" ;;
    distro-adamw-overlap) echo "--optim distro-adamw $overlap_args" ;;
    distro-stale) echo "--optim distro --overlap-stale" ;;
    distro-backward) echo "--optim distro --overlap-backward" ;;
    distro-adamw-backward) echo "--optim distro-adamw --overlap-backward" ;;
    distro-adamw-sign1) echo "--optim distro-adamw --values sign1" ;;
    distro-adamw-sign1-overlap) echo "--optim distro-adamw --values sign1 $overlap_args" ;;
    distro-adamw-sign1-backward) echo "--optim distro-adamw --values sign1 --overlap-backward" ;;
  esac
}
for m in $modes; do
  [ "${m%@*}" = decoupled ] || [ -n "$(args_of "${m%@*}")" ] ||
    { echo "wan-bench: unknown mode '${m%@*}' (see --help)" >&2; exit 2; }
  case $m in *@*) case ${m#*@} in '' | *[!0-9]* | 0*) echo "wan-bench: '$m': steps after @ must be a positive integer" >&2; exit 2 ;; esac ;; esac
  case $m in decoupled@*) echo "wan-bench: '$m': @N is for the MPI modes" >&2; exit 2 ;; esac
done
# Decoupled DiLoCo: the launcher's tuned syncer (python-free-examples/decoupled),
# with timeouts long enough for a 400 ms queue on a 10 Mbit/s link.
sync_args="--fragments 4 --quorum 2 --H 24 --overlap 2 --codec int4 --merge tokens --outer-lr 1 \
--outer-momentum 0 --timeout 5 --heartbeat 0.2"
out=${out:-$build/wan-$preset$([ "$ranks" = 4 ] || echo "-r$ranks")}
mkdir -p "$out"
[ $resume = 1 ] || rm -f "$out"/*.csv "$out"/*.out* "$out"/*.log "$out"/*.dat "$out"/*.rc "$out"/*.ep "$out"/results.tsv
touch "$out/results.tsv"
printf 'ranks=%s\nsampling=%s\nargs=%s\n' "$ranks" "${sampling:-global}" "$extra" > "$out/meta"

wan_check
wan_build_probe "$build"
wan_up $((ranks + 1)) # the ranks or learners, and the syncer's node
nodes_last=$ranks

rate_name() { [ "$1" = 0 ] && echo none || echo "$1"; }
now() { date +%s.%N; }
load() { cut -d' ' -f1 /proc/loadavg; }

# One row's figures from its CSV (header names, not positions) and log.
summarize() { # mode rate csv out wall kernel load0 load1 [learner CSVs...]
  local mode=$1 rate=$2 csv=$3 log=$4 wall=$5 kernel=$6 l0=$7 l1=$8 final library
  shift 8
  if [ "$mode" = decoupled ]; then
    final=$(awk '/of the global copy as this learner/ { s += $4; n++ } END { if (n) printf "%.4f", s / n }' "$log"*)
    library=$(awk '/library bytes, all ranks/ { gsub(/,/, ""); for (i = 1; i <= NF; i++) {
      if ($i == "syncer") up += $(i + 1); if ($i == "it") down += $(i + 1) } } END { print up + down }' "$log"*)
  else
    final=$(awk '/final val loss .*whole validation split/ { print $4; exit }' "$log")
    library=$(awk '/library bytes, all ranks/ { gsub(/,/, ""); print $NF }' "$log")
  fi
  awk -F, -v mode="$mode" -v rate="$rate" -v final="${final:-nan}" -v lib="${library:-0}" -v kernel="$kernel" \
      -v wall="$wall" -v l0="$l0" -v l1="$l1" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    { n++; st = $col["step_s"]; ex = $col["exchange_s"]; ou = ("outer_s" in col) ? $col["outer_s"] : 0
      step += st; comm += ex + ou; if (n <= 5) first += st; last_step = $1
      el = $col["elapsed_s"]; if (n == 1) el1 = el }
    END { printf "%s\t%s\t%d\t%s\t%.4f\t%.4f\t%.4f\t%s\t%s\t%.1f\t%s\t%s\t%.4f\n", mode, rate, last_step, final,
                 step / n, comm / n, first / (n < 5 ? n : 5), lib, kernel, wall, l0, l1, (n > 1 ? (el - el1) / (n - 1) : 0) }' \
    "$csv" >> "$out/results.tsv"
  # The validation curve: elapsed seconds, periodic val loss.
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
           $col["val_loss"] != "nan" { print $col["elapsed_s"], $col["val_loss"] }' "$csv" > "$out/$mode-$rate.dat"
}

# A run that failed keeps its row, marked (the reason is in its log).
failed() { # mode rate name rc
  echo "  $3 FAILED (exit $4; logs: $out/$3.*)"
  printf '%s\t%s\t0\tfailed\t0\t0\t0\t0\t0\t0\t%s\t%s\t0\n' "$1" "$(rate_name "$2")" "$(load)" "$(load)" >> "$out/results.tsv"
}

# The trainer's progress and final lines, live.
progress() { grep --line-buffered -E '^step|final val' | sed -u "s/^/    /" || true; }

run_mpi() { # mode[@steps] rate
  local mode=$1 rate=$2 name k0 t0 l0 rc=0 more=""
  name=$mode-$(rate_name "$rate")
  [ "${mode%@*}" = "$mode" ] || more="--steps ${mode#*@}" # after $common's: the last --steps counts
  case $mode in distro*) more="$more $extra" ;; esac
  wan_rate "$rate"
  l0=$(load) k0=$(wan_tx_sum 0 $((ranks - 1))) t0=$(now)
  # shellcheck disable=SC2046
  { local r=0
    wan_mpirun $ranks "$gpt" --mpi $common --print-every $print_every --log "$out/$name.csv" $(args_of "${mode%@*}") $more 2>&1 || r=$?
    echo $r > "$out/$name.rc"; } | tee "$out/$name.out" | progress
  rc=$(cat "$out/$name.rc")
  local wall kernel
  wall=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
  kernel=$(($(wan_tx_sum 0 $((ranks - 1))) - k0))
  if [ "$rc" != 0 ]; then
    tail -n 20 "$out/$name.out" | sed "s/^/    /"
    failed "$mode" "$rate" "$name" "$rc"
    return 0
  fi
  summarize "$mode" "$(rate_name "$rate")" "$out/$name.csv" "$out/$name.out" "$wall" "$kernel" "$l0" "$(load)"
}

run_decoupled() { # rate
  local rate=$1 name k0 t0 l0 i spid rc=0 pids=()
  name=decoupled-$(rate_name "$rate")
  wan_rate "$rate"
  l0=$(load) k0=$(wan_tx_sum 0 $nodes_last) t0=$(now)
  rm -f "$out/$name.ep"
  # The job runs with CURVE, as the syncer requires on a routable address:
  # fresh keys for the syncer and each learner (their ~40 bytes per message
  # are in the kernel's count).
  local keys=$out/$name.keys
  rm -rf "$keys" && mkdir -m 700 "$keys"
  for k in syncer $(seq 0 $((ranks - 1))); do "$syncer" --keygen "$keys/$k" > /dev/null; done
  # shellcheck disable=SC2086
  ip netns exec "$(wan_ns $ranks)" "$syncer" --endpoint "tcp://$(wan_addr $ranks):5555" --endpoint-file "$out/$name.ep" \
    --curve-keypair "$keys/syncer" $sync_args > "$out/$name.syncer.log" 2>&1 &
  spid=$!
  for ((i = 0; i < 100; i++)); do [ -s "$out/$name.ep" ] && break; sleep 0.05; done
  for ((i = 0; i < ranks; i++)); do
    # shellcheck disable=SC2086
    timeout -k 20 "${WAN_TIMEOUT:-3600}" ip netns exec "$(wan_ns $i)" "$gpt" $common --ranks 1 --optim decoupled --inner adamw \
      --syncer "tcp://$(wan_addr $ranks):5555" --learner-id $i --serve-endpoint "tcp://$(wan_addr $i):*" \
      --curve-server-key "$keys/syncer.pub" --curve-keypair "$keys/$i" --sync-timeout 5 \
      --print-every $print_every --log "$out/$name.l$i.csv" > "$out/$name.out.l$i" 2>&1 &
    pids+=($!)
  done
  tail -n +1 -F "$out/$name.out.l0" 2> /dev/null > >(progress) &
  local tpid=$!
  for ((i = 0; i < ranks; i++)); do wait "${pids[$i]}" || rc=$?; done
  kill "$tpid" 2> /dev/null || true
  kill -TERM "$spid" 2> /dev/null || true
  wait "$spid" || true
  local wall kernel
  wall=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
  kernel=$(($(wan_tx_sum 0 $nodes_last) - k0))
  if [ "$rc" != 0 ]; then
    tail -n 3 "$out/$name".out.l* | sed "s/^/    /"
    failed decoupled "$rate" "$name" "$rc"
    return 0
  fi
  # Learner 0's curve and step times stand for the job's.
  summarize decoupled "$(rate_name "$rate")" "$out/$name.l0.csv" "$out/$name.out.l" "$wall" "$kernel" "$l0" "$(load)"
}

echo "== bench/wan, $preset: $(echo $common | sed 's/--threads 1 //'), $ranks ranks/learners; modes: $modes; rates (Mbit/s): $rates"
echo "   machine: $(nproc) cores, load $(load) at the start; results in $out"
echo "== link check: 1 MB all-gather per rank, $ranks ranks (each rank sends $((ranks - 1)) MB on a ring)"
for rate in 0 $rates; do
  wan_rate "$rate"
  t=$(wan_mpirun $ranks "$WAN_PROBE" 1000000 2 | awk -F'seconds=' '/^exchange/ { t = $2 } END { print t }') || t=""
  floor=$(awk -v r="$rate" -v n="$ranks" 'BEGIN { if (r > 0) printf "%.2f s", (n - 1) * 1e6 * 8 / (r * 1e6); else print "-" }')
  echo "   $(rate_name "$rate") Mbit/s: ${t:-failed} s (payload at the link rate: $floor)"
done

runs=()
for rate in $rates; do for m in $modes; do runs+=("$m:$rate"); done; done
for m in $modes; do case $m in distro*) runs+=("$m:0") ;; esac; done
k=0
start=$(now)
for r in "${runs[@]}"; do
  k=$((k + 1))
  m=${r%%:*} rate=${r#*:}
  if [ $resume = 1 ] && awk -F'\t' -v m="$m" -v r="$(rate_name "$rate")" '$1 == m && $2 == r { f = 1 } END { exit !f }' \
    "$out/results.tsv"; then
    echo "[$k/${#runs[@]}] $m at $(rate_name "$rate") Mbit/s: in $out/results.tsv already (--resume)"
    continue
  fi
  echo "[$k/${#runs[@]}] $m at $(rate_name "$rate") Mbit/s (load $(load), $(awk -v a="$start" -v b="$(now)" \
    'BEGIN { printf "%d:%02d", (b - a) / 60, (b - a) % 60 }') elapsed)"
  if [ "$m" = decoupled ]; then run_decoupled "$rate"; else run_mpi "$m" "$rate"; fi
done

"$here/wan-report.sh" "$out" "$preset"
