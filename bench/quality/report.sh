#!/usr/bin/env bash
# The tables and the figure of bench/quality, rebuilt from its data:
#   bench/quality/report.sh [--figure PNG] ROWS.tsv... -- CURVES.tsv...
# (bench/quality/run.sh --report calls it with every set in data/.)
# Table 1: each optimizer at AdamW's lr (lr scale 1): mean +- sd, median and
# worst seed of the final validation loss, the gap of its mean to AdamW's
# over the seeds both ran, the worst
# seed's gap to AdamW on the same seed, bytes per step. Table 2: the lr
# sensitivity (every lr scale with an AdamW row). Figure (--figure, default
# docs/quality.png): mean validation curves at AdamW's lr. Rows of the same run in several
# files count once (the last one read).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rows=() curves=() fig=$here/../../docs/quality.png
if [ "${1:-}" = --figure ]; then fig=$2; shift 2; fi
while [ $# -gt 0 ] && [ "$1" != -- ]; do rows+=("$1"); shift; done
[ $# -gt 0 ] && shift
curves=("$@")
[ ${#rows[@]} -gt 0 ] || { echo "report: no data files" >&2; exit 2; }

awk -F'\t' '
$1 == "size" { next }
{ key = $1 SUBSEP $2 SUBSEP $4 SUBSEP $5 SUBSEP $6
  if (!(key in fin)) { order[++nrun] = key }
  fin[key] = $7; bytes[key] = $8; steps[key] = $9; params[key] = $10; lr[$1 SUBSEP $2 SUBSEP $4 SUBSEP $5] = $3 }
function sortnum(a, n,   i, j, t) { for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t } }
END {
  # groups: size, optimizer, lr scale, wd (in order of first appearance)
  for (r = 1; r <= nrun; r++) {
    split(order[r], f, SUBSEP); g = f[1] SUBSEP f[2] SUBSEP f[3] SUBSEP f[4]
    if (!(g in gn)) { groups[++ng] = g }
    gn[g]++; gseed[g, gn[g]] = f[5]
  }
  for (pass = 1; pass <= 2; pass++) {
    if (pass == 1) {
      print "Table 1. Final validation loss at AdamW'\''s lr (lr scale 1), per size and optimizer."
      printf "%-6s %-5s %-20s %8s %5s %6s %19s %8s %8s %9s %11s %10s %9s\n", "size", "wd", "optimizer", "lr", "seeds",
             "tok/p", "mean +- sd", "median", "worst", "vs adamw", "worst seed", "bytes/step", "x fewer"
    } else {
      print ""; print "Table 2. lr sensitivity: each optimizer against AdamW at the same lr (seeds both ran)."
      printf "%-6s %-5s %-20s %6s %9s %5s %19s %19s %9s %11s\n", "size", "wd", "optimizer", "lr x", "lr", "seeds",
             "adamw mean +- sd", "mean +- sd", "vs adamw", "worst seed"
    }
    for (i = 1; i <= ng; i++) {
      split(groups[i], f, SUBSEP); size = f[1]; opt = f[2]; sc = f[3]; wd = f[4]
      if (pass == 1 && sc + 0 != 1) continue
      if (pass == 2 && opt == "adamw") continue
      a = size SUBSEP "adamw" SUBSEP sc SUBSEP wd
      if (pass == 2 && !(a in gn)) continue
      n = 0; s = 0; q = 0; b = 0; sp = 0; delete v; worst_gap = -1e9; an = 0; as = 0; aq = 0; both = 0; bs = 0; ab = 0
      for (j = 1; j <= gn[groups[i]]; j++) {
        sd_ = gseed[groups[i], j]; k = groups[i] SUBSEP sd_; x = fin[k]
        if (pass == 2) { ak = a SUBSEP sd_; if (!(ak in fin)) continue }
        n++; s += x; q += x * x; b += bytes[k]; v[n] = x; tp = steps[k] * 2048 / params[k]
        ak = a SUBSEP sd_
        if (ak in fin) { g = 100 * (x / fin[ak] - 1); if (g > worst_gap) worst_gap = g; both++; bs += fin[ak]; aq += fin[ak] * fin[ak]; sp += x }
      }
      if (!n) continue
      m = s / n; sd = n > 1 ? sqrt((q - n * m * m) / (n - 1)) : 0; sortnum(v, n)
      med = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
      am = 0; ab = 0; na = 0
      for (j = 1; j <= gn[a]; j++) { ak = a SUBSEP gseed[a, j]; am += fin[ak]; ab += bytes[ak]; na++ }
      am = na ? am / na : 0; ab = na ? ab / na : 0
      # the gap of the means over the seeds both ran
      gap = (opt == "adamw" || !both) ? "" : sprintf("%+.2f%%", 100 * (sp / bs - 1))
      wg = (opt == "adamw" || !both) ? "" : sprintf("%+.2f%%", worst_gap)
      if (pass == 1) {
        printf "%-6s %-5s %-20s %8s %5d %6.1f %10.4f +- %.4f %8.4f %8.4f %9s %11s %10.0f %8.0fx\n", size, wd, opt,
               lr[groups[i]], n, tp, m, sd, med, v[n], gap, wg, b / n, (b && ab) ? ab / (b / n) : 0
      } else {
        bm = bs / both; bsd = both > 1 ? sqrt((aq - both * bm * bm) / (both - 1)) : 0
        printf "%-6s %-5s %-20s %6s %9s %5d %10.4f +- %.4f %10.4f +- %.4f %+8.2f%% %10s\n", size, wd, opt, sc,
               lr[groups[i]], n, bm, bsd, m, sd, 100 * (m / bm - 1), wg
      }
    }
  }
}' "${rows[@]}"

# Figure: mean validation curve per size and optimizer at lr scale 1 (the
# first wd of each size), one panel per size.
[ ${#curves[@]} -gt 0 ] || exit 0
command -v gnuplot >/dev/null 2>&1 || { echo "figure: skipped (gnuplot not installed)"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
awk -F'\t' -v dir="$tmp" '
$1 == "size" || $3 + 0 != 1 { next }
{ if (!($1 in wd1)) { wd1[$1] = $4; sizes[++ns] = $1 } if ($4 != wd1[$1]) next
  k = $1 SUBSEP $2 SUBSEP $6; s[k] += $7; n[k]++; if (!(($1 SUBSEP $2) in seen)) { seen[$1 SUBSEP $2] = 1; opts[$1, ++no[$1]] = $2 } }
END {
  for (k in s) { split(k, f, SUBSEP); print f[3], s[k] / n[k] | ("sort -n > " dir "/" f[1] "-" f[2] ".mean") }
  for (i = 1; i <= ns; i++) { line = sizes[i]; for (j = 1; j <= no[sizes[i]]; j++) line = line " " opts[sizes[i], j]; print line > (dir "/panels") }
}' "${curves[@]}"
[ -s "$tmp/panels" ] || { echo "figure: skipped (no run at lr scale 1)"; exit 0; }
npanels=$(wc -l < "$tmp/panels")
# One colour per optimizer in every panel.
colour() {
  case "$1" in
    adamw) echo '#1f1f1f' ;; distro-adamw) echo '#0072b2' ;; distro) echo '#009e73' ;; diloco) echo '#cc79a7' ;;
    distro-adamw-overlap) echo '#56b4e9' ;; distro-adamw-sign1) echo '#6a3d9a' ;; distro-overlap) echo '#e69f00' ;; *-stale) echo '#d55e00' ;; *) echo '#999999' ;;
  esac
}
{
  echo "set terminal pngcairo size $((560 * npanels)),480 noenhanced; set output '$fig'"
  echo "set multiplot layout 1,$npanels; set grid; set xlabel 'step'; set ylabel 'validation loss (mean over seeds)'"
  while read -r size opts; do
    echo "set title 'bench/quality: $size model, AdamW lr'"
    plot="plot"
    for opt in $opts; do plot="$plot '$tmp/$size-$opt.mean' using 1:2 with lines lw 2 lc rgb '$(colour "$opt")' title '$opt',"; done
    echo "${plot%,}"
  done < "$tmp/panels"
  echo "unset multiplot"
} | gnuplot
echo "figure: $fig"
