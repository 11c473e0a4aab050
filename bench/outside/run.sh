#!/usr/bin/env bash
# bench/outside: DisTrO-AdamW against the AdamW it replaces in a plain C loop
# (plain_loop.c) compiled against the *installed* library with pkg-config and
# run with no environment variable, as an outside trainer would. Picks the
# baseline's own lr from a sweep (seed 1), then runs both at that lr over the
# seeds and prints mean +- sd of the held-out loss and bytes per step.
# --lr X skips the sweep; --overlap adds DisTrO-AdamW with the look-ahead,
# the stale overlap and the gradient-ready exchange (options.overlap, which
# must end where the blocking step does: no clip here); --sign1 adds DisTrO-AdamW with 1-bit
# values (options.values = DISTRO_VALUES_SIGN1), --topk16 DisTrO-AdamW with
# 16 coefficients a chunk (options.topk = 16); --ranks N runs N in-process
# ranks (4).
#
#   bench/outside/run.sh [--build DIR] [--lrs 0.003,0.01,0.03 | --lr X] [--seeds 1,2,3] [--steps 300] [--overlap] [--sign1] [--topk16] [--ranks N]
# Needs the fortunes corpus (Debian: fortunes); about 5 minutes on 2 cores.
set -euo pipefail
build=build lrs=0.003,0.01,0.03 seeds=1,2,3 steps=300 ranks=4 lr= optims="adamw distro-adamw"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --lrs) lrs=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --overlap) optims="$optims distro-adamw-lookahead distro-adamw-stale distro-adamw-backward"; shift ;;
    --sign1) optims="$optims distro-adamw-sign1"; shift ;;
    --topk16) optims="$optims distro-adamw-topk16"; shift ;;
    --seeds) seeds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "outside: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
work=$build/outside
mkdir -p "$work"
corpus=$work/fortunes.txt
if [ ! -s "$corpus" ]; then
  files=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' 2>/dev/null | sort)
  [ -n "$files" ] || { echo "outside: skipped: no fortunes corpus (Debian: apt-get install fortunes)"; exit 0; }
  # shellcheck disable=SC2086
  cat $files > "$corpus"
fi
# shellcheck source=bench/installed.sh
. "$here/../installed.sh"
distro_installed "$build" "$work/prefix"
# shellcheck disable=SC2086
cc -O2 -o "$work/plain_loop" "$here/plain_loop.c" $DISTRO_CFLAGS $DISTRO_LIBS -lm
loop() { "$work/plain_loop" --data "$corpus" --steps "$steps" --ranks "$ranks" "$@"; }
loss() { sed -n 's/.*held-out loss \([0-9.]*\),.*/\1/p'; }

best=$lr best_loss=
if [ -z "$best" ]; then
  echo "== bench/outside: $(nproc) cores; AdamW lr sweep (seed 1): $lrs"
  IFS=, read -r -a L <<< "$lrs"
  for x in "${L[@]}"; do
    l=$(loop --optim adamw --lr "$x" --seed 1 | loss)
    echo "adamw lr $x seed 1: $l"
    if [ -z "$best" ] || awk -v a="$l" -v b="$best_loss" 'BEGIN { exit !(a < b) }'; then best=$x best_loss=$l; fi
  done
fi
echo "the baseline's lr: $best"
IFS=, read -r -a S <<< "$seeds"
res=$work/results.tsv
: > "$res"
for o in $optims; do
  case $o in
    distro-adamw-sign1) args=(--optim distro-adamw --values sign1) ;;
    distro-adamw-topk16) args=(--optim distro-adamw --topk 16) ;;
    distro-adamw-*) args=(--optim distro-adamw --overlap "${o#distro-adamw-}") ;;
    *) args=(--optim "$o") ;;
  esac
  for s in "${S[@]}"; do
    line=$(loop "${args[@]}" --lr "$best" --seed "$s")
    echo "$line"
    printf '%s\t%s\t%s\n' "$o" "$(echo "$line" | loss)" "$(echo "$line" | sed -n 's/.*, \([0-9]*\) bytes.*/\1/p')" >> "$res"
  done
done
awk -F'\t' -v order="$optims" '
{ n[$1]++; s[$1] += $2; q[$1] += $2 * $2; b[$1] += $3; v[$1] = v[$1] " " $2 }
END {
  am = s["adamw"] / n["adamw"]; ab = b["adamw"] / n["adamw"]
  printf "\n%-22s %20s %9s %12s %10s  %s\n", "optimizer", "held-out (mean+-sd)", "vs adamw", "bytes/step", "less than", "per seed"
  no = split(order, o, " ")
  for (i = 1; i <= no; i++) {
    k = o[i]; m = s[k] / n[k]; sd = n[k] > 1 ? sqrt((q[k] - n[k] * m * m) / (n[k] - 1)) : 0
    printf "%-22s %11.4f +- %.4f %+8.2f%% %12.0f %9.1fx %s\n", k, m, sd, 100 * (m / am - 1), b[k] / n[k], ab / (b[k] / n[k]), v[k]
  }
}' "$res"
