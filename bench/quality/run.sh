#!/usr/bin/env bash
# Training quality of every optimizer, as a mean over seeds with its spread:
# adamw (all-reduce), distro (DeMo sign), distro-adamw and diloco, at two
# model sizes, each with the trainer's recommended settings for that
# optimizer (gpt-train --optim X and nothing else) at the AdamW row's lr.
# Prints progress lines, then one table (final validation loss mean +- sd,
# ratio to AdamW, bytes per step) and writes a gnuplot PNG of the mean
# validation curves. A benchmark, not a test: it asserts nothing.
#
#   bench/quality/run.sh [--build DIR] [--out DIR] [--sizes small,large] [--seeds 1,2,3]
#                        [--optims adamw,distro,distro-adamw,diloco] [--quick] [--report]
#
# --report runs nothing: it prints the table and redraws the plot from the
# results.tsv and CSVs already in --out (e.g. after rerunning one optimizer
# into a copy of an earlier run's directory and replacing its lines there).
#
# An optimizer named X-overlap (distro-overlap, distro-adamw-overlap) runs X
# with --overlap-step (the look-ahead overlap); X-stale (distro-stale,
# distro-adamw-stale) with --overlap-stale, the one-step-stale exchange.
# small: the demo model (4 layers, width 128, 842,496 parameters), 300 steps.
# large: 5 layers, width 256, 8 heads (4.03 M parameters, 4.8x), 900 steps (3x).
# Both: 2 ranks x batch 8 x context 128 (DiLoCo: 4 learners x batch 4, the
# same tokens: --batch 4). --quick runs 30 steps of each, to check the script.
# About 85 minutes on 2 idle cores for the whole matrix (24 runs: the small
# ones ~35 s each, the large ones ~6-6.5 min); 1 h 51 min when shared.
set -euo pipefail

build=build out= sizes=small,large seeds=1,2,3 optims=adamw,distro,distro-adamw,diloco quick=0 report=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --optims) optims=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --report) report=1; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "quality: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
gpt=$build/python-free-examples/gpt/gpt-train
[ "$report" = 1 ] || [ -x "$gpt" ] || { echo "quality: $gpt not built (make build)" >&2; exit 1; }
out=${out:-$build/quality}
mkdir -p "$out"
results=$out/results.tsv
if [ "$report" = 1 ]; then
  [ -s "$results" ] || { echo "quality: --report: no $results" >&2; exit 1; }
else
  : > "$results"
fi

# size -> trainer flags, steps, evaluation interval, and the lr of AdamW at
# that size, which every optimizer's row uses: the trainer's default 0.004 at
# the small size; at the large size 0.002 (300-step AdamW runs: 0.004 ended
# at 2.8002, 0.002 at 2.4905; 900 steps, seed 1: 0.003 ended at 1.9834,
# 0.002 at 1.9779).
size_flags() {
  case "$1" in
    small) echo "--steps 300 --eval-every 25 --lr 0.004" ;;
    large) echo "--layers 5 --dim 256 --heads 8 --steps 900 --eval-every 75 --lr 0.002" ;;
    *) echo "quality: unknown size '$1'" >&2; exit 2 ;;
  esac
}

IFS=, read -r -a S <<< "$sizes"
IFS=, read -r -a O <<< "$optims"
IFS=, read -r -a D <<< "$seeds"
total=$(( ${#S[@]} * ${#O[@]} * ${#D[@]} )) k=0 t0=$(date +%s)
[ "$report" = 1 ] && S_RUN=() || S_RUN=("${S[@]}")
echo "== bench/quality: sizes ${sizes}, optimizers ${optims}, seeds ${seeds}; $(nproc) cores; $(date -u '+%F %T') UTC"
for size in "${S_RUN[@]}"; do
  flags=$(size_flags "$size")
  [ "$quick" = 1 ] && flags="$flags --steps 30 --eval-every 10"
  for opt in "${O[@]}"; do
    for seed in "${D[@]}"; do
      k=$((k + 1))
      tag=$size-$opt-s$seed
      start=$(date +%s)
      # DiLoCo's 4 learners split the baseline's 2 ranks x batch 8: the same tokens.
      extra="" gopt=$opt
      [ "$opt" = diloco ] && extra="--batch 4"
      # X-overlap / X-stale: optimizer X with the look-ahead / one-step-stale
      # exchange in the background.
      case "$opt" in
        *-overlap) gopt=${opt%-overlap} extra="--overlap-step" ;;
        *-stale) gopt=${opt%-stale} extra="--overlap-stale" ;;
      esac
      # shellcheck disable=SC2086
      if ! "$gpt" --optim "$gopt" --seed "$seed" $flags $extra --print-every 100000 --log "$out/$tag.csv" \
             > "$out/$tag.log" 2>&1; then
        echo "[$k/$total] $tag: FAILED (see $out/$tag.log)"; continue
      fi
      final=$(awk '/^final val loss/ {print $4; exit}' "$out/$tag.log")
      # Mean bytes this rank sent per step (DiLoCo: amortized outer payloads).
      bytes=$(awk -F, 'NR > 1 {s += $7; n++} END {if (n) printf "%.0f", s / n}' "$out/$tag.csv")
      lr=$(awk '/^optimizer:/ {for (i = 1; i <= NF; i++) if ($i == "lr") {gsub(",", "", $(i+1)); print $(i+1); exit}}' "$out/$tag.log")
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$size" "$opt" "$seed" "$final" "$bytes" "${lr:-?}" >> "$results"
      el=$(( $(date +%s) - t0 ))
      echo "[$k/$total] $tag: final val loss $final, $bytes B/step, $(( $(date +%s) - start )) s" \
           "(elapsed $((el / 60)):$(printf %02d $((el % 60))), ETA $(( el * (total - k) / k / 60 )) min)"
    done
  done
done

# Table: per size and optimizer, mean +- sd (sample) of the final loss, its
# ratio to AdamW's mean, and bytes per step against AdamW's.
echo
awk -F'\t' '
{ key = $1 SUBSEP $2; n[key]++; s[key] += $4; q[key] += $4 * $4; b[key] += $5; lr[key] = $6; v[key] = v[key] sprintf(" %.4f", $4)
  if (!($1 in seen)) { seen[$1] = 1; sizes[++ns] = $1 } if (!($2 in oseen)) { oseen[$2] = 1; opts[++no] = $2 } }
END {
  printf "%-6s %-13s %6s %5s %18s %9s %12s %10s  %s\n", "size", "optimizer", "lr", "seeds", "final val (mean+-sd)",
         "vs adamw", "bytes/step", "less than", "per seed"
  for (i = 1; i <= ns; i++) {
    a = sizes[i] SUBSEP "adamw"; am = n[a] ? s[a] / n[a] : 0; ab = n[a] ? b[a] / n[a] : 0
    for (j = 1; j <= no; j++) {
      key = sizes[i] SUBSEP opts[j]; if (!n[key]) continue
      m = s[key] / n[key]; sd = n[key] > 1 ? sqrt((q[key] - n[key] * m * m) / (n[key] - 1)) : 0
      bb = b[key] / n[key]
      printf "%-6s %-13s %6s %5d %11.4f +- %.4f %+8.2f%% %12.0f %9.0fx %s\n", sizes[i], opts[j], lr[key], n[key], m, sd,
             am ? 100 * (m / am - 1) : 0, bb, bb ? ab / bb : 0, v[key]
    }
  }
}' "$results" | tee "$out/table.txt"

# Mean validation curve per size and optimizer (periodic validation rows of
# the CSVs: step in column 1, val loss in column 4), then one plot.
for size in "${S[@]}"; do
  for opt in "${O[@]}"; do
    awk -F, 'FNR > 1 && $4 != "nan" {s[$1] += $4; n[$1]++} END {for (k in s) print k, s[k] / n[k]}' \
      "$out/$size-$opt"-s*.csv 2>/dev/null | sort -n > "$out/$size-$opt.mean" || true
  done
done
if command -v gnuplot >/dev/null 2>&1; then
  {
    echo "set terminal pngcairo size 1400,560 noenhanced; set output '$out/quality.png'"
    echo "set multiplot layout 1,${#S[@]}; set grid; set xlabel 'step'; set ylabel 'validation loss (mean over seeds ${seeds})'"
    for size in "${S[@]}"; do
      echo "set title 'bench/quality: $size model'; set yrange [*:*]"
      plot="plot"
      for opt in "${O[@]}"; do
        [ -s "$out/$size-$opt.mean" ] && plot="$plot '$out/$size-$opt.mean' using 1:2 with lines lw 2 title '$opt',"
      done
      echo "${plot%,}"
    done
    echo "unset multiplot"
  } | gnuplot && echo "plot: $out/quality.png"
else
  echo "plot: skipped (gnuplot not installed)"
fi
