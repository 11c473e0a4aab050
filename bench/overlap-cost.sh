#!/usr/bin/env bash
# What the overlap modes cost a step's compute and memory: bench_step at
# GPT-2 124M shapes, one in-process rank (so the exchange in the background
# is instant and the figure is the step's own work), built against the
# *installed* library as an outside trainer links it. Each update (DeMo
# sign, DisTrO-AdamW) runs blocking, look-ahead and stale, interleaved over
# --rounds rounds so that a change in the machine's load falls on every
# mode alike. A benchmark: it prints figures and asserts nothing.
#
#   bench/overlap-cost.sh [--build DIR] [--rounds R] [--steps S] [--layers N] [--tsv FILE]
#
# One row per run goes to FILE (default: print only): mean and best step,
# the memory floor bench_step measures in the same run, and peak resident
# bytes per parameter (params and grads included).
set -euo pipefail
build=build rounds=2 steps=5 layers='' tsv=''
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --tsv) tsv=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/{/^set -e/d;p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "overlap-cost: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$build" && pwd)
work=$build/overlap-cost
rm -rf "$work"
mkdir -p "$work"
# shellcheck source=bench/installed.sh
. "$here/installed.sh"
distro_installed "$build" "$work/prefix"
# shellcheck disable=SC2086
cc -O2 -fopenmp -I"$here" -o "$work/bench_step" "$here/bench_step.c" "$here/shapes.c" "$here/bench_util.c" \
   $DISTRO_CFLAGS $DISTRO_LIBS -lm

cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
echo "== overlap-cost: GPT-2 124M shapes${layers:+ ($layers blocks)}, $rounds rounds, $steps steps after 2 warm-up; $cpu, $(nproc) CPUs; $(date -u '+%Y-%m-%d %H:%M UTC')"
rows=()
header="update	overlap	round	mean_s	best_s	floor_s	peak_B_per_param	load_start	load_end"
for r in $(seq 1 "$rounds"); do
  for u in sign adamw; do
    for m in off lookahead stale; do
      log=$work/$u-$m-$r.log
      "$work/bench_step" --model gpt2 --update "$u" --overlap "$m" --steps "$steps" ${layers:+--layers "$layers"} > "$log"
      row=$(awk -v u="$u" -v m="$m" -v r="$r" '
        /wall \(around step\)/ {mean = $4}
        /wall, best step/ {best = $4}
        /one pass:/ {floor = $(NF - 1)}
        /peak resident memory/ {p = $0; sub(/.*\(/, "", p); sub(/ B\/param.*/, "", p); peak = p}
        /load average .* at start/ {l0 = $3}
        /load average .* at the end/ {l1 = $3}
        END {printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", u, m, r, mean, best, floor, peak, l0, l1}' "$log")
      rows+=("$row")
      echo "$row"
    done
  done
done

echo
echo "mean step over the rounds, against the memory floor of the same runs, and what each overlap mode adds to the blocking step:"
printf '%s\n' "${rows[@]}" | awk -F'\t' '
  {k = $1 SUBSEP $2; s[k] += $4; f[k] += $6; if (!(k in n) || $5 + 0 < b[k]) b[k] = $5 + 0; n[k]++; pk[k] = $7}
  END {
    split("sign adamw", U, " "); split("off lookahead stale", M, " ")
    printf "%-8s %-10s %9s %9s %9s %8s %10s %11s\n", "update", "overlap", "mean s", "best s", "floor s", "x floor", "vs off s", "B/param"
    for (i = 1; i <= 2; i++) for (j = 1; j <= 3; j++) {
      k = U[i] SUBSEP M[j]; if (!(k in n)) continue
      off = s[U[i] SUBSEP "off"] / n[U[i] SUBSEP "off"]
      printf "%-8s %-10s %9.3f %9.3f %9.3f %7.1fx %+10.3f %11s\n", U[i], M[j], s[k] / n[k], b[k], f[k] / n[k], s[k] / f[k],
             s[k] / n[k] - off, pk[k]
    }
  }'
if [ -n "$tsv" ]; then
  {
    echo "# bench/overlap-cost.sh --rounds $rounds --steps $steps${layers:+ --layers $layers}: bench_step --model gpt2 --update U --overlap M against the installed library, one in-process rank; $cpu, $(nproc) CPUs; $(date -u '+%Y-%m-%d')"
    echo "$header"
    printf '%s\n' "${rows[@]}"
  } > "$tsv"
  echo "rows: $tsv"
fi
