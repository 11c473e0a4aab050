#!/usr/bin/env bash
# The table, the targets and the plot of a bench/wan run, from DIR/results.tsv
# and the per-run curves DIR/MODE-RATE.dat (written by wan-bench.sh; rerun
# this on a finished DIR at will).
#
#   bench/wan/wan-report.sh DIR [PRESET]
set -euo pipefail
dir=${1:?usage: wan-report.sh DIR [PRESET]}
preset=${2:-}
tsv=$dir/results.tsv
[ -s "$tsv" ] || { echo "wan-report: no results in $tsv" >&2; exit 1; }

# Columns of results.tsv: mode rate steps final_val step_s comm_s first5_s library_B kernel_B wall_s load0 load1
# wall_per_step_s (the trainer's elapsed seconds per step: its logging collectives and validations included; absent in older runs).
# The target: the AdamW run's last periodic validation loss (the same 64 windows every run evaluates),
# reached when a run's periodic validation first gets to it; the time is the trainer's elapsed seconds.
# The number of ranks (learners) the run had: DIR/meta, written by wan-bench.sh (4 before it existed).
ranks=$(sed -n 's/^ranks=//p' "$dir/meta" 2> /dev/null || true)
ranks=${ranks:-4}
sampling=$(sed -n 's/^sampling=//p' "$dir/meta" 2> /dev/null || true)
awk -F'\t' -v dir="$dir" -v preset="$preset" -v ranks="$ranks" -v sampling="${sampling:-shard}" '
function curve_time(mode, rate, target,   f, line, a, t) {
  f = dir "/" mode "-" rate ".dat"; t = -1
  while ((getline line < f) > 0) { split(line, a, " "); if (t < 0 && a[2] + 0 <= target) t = a[1] + 0 }
  close(f); return t
}
function last_val(mode, rate,   f, line, a, v) {
  f = dir "/" mode "-" rate ".dat"; v = ""
  while ((getline line < f) > 0) { split(line, a, " "); v = a[2] }
  close(f); return v
}
function mb(b) { return sprintf("%.2f", b / 1e6) }
{ n++; for (i = 1; i <= 13; i++) R[n, i] = $i; if ($1 == "adamw" && $4 != "failed") target[$2] = last_val("adamw", $2) }
END {
  for (r = 1; r <= n; r++) {
    mode = R[r, 1]; rate = R[r, 2]; tg = (rate in target) ? target[rate] : ""
    if (R[r, 4] == "failed") { T[r] = -1; TG[r] = tg; continue }
    if (tg == "") for (x in target) tg = target[x]           # AdamW ends identically at every rate
    t = tg == "" ? -1 : curve_time(mode, rate, tg)
    T[r] = t; TG[r] = tg
    if (mode == "adamw") tadam[rate] = t
  }
  hdr = sprintf("%-20s %6s %9s %7s %8s %8s %8s %8s %8s %9s %9s %9s %8s %7s %7s", "mode", "link", "to target", "speed-up",
                "final", "step", "wall", "compute", "comm", "steps 1-5", "link floor", "library", "kernel", "kern/lib", "wall")
  print "== bench/wan" (preset != "" ? " (" preset ")" : "") ": " ranks " ranks/learners, same tokens, " sampling " sampling; target (AdamW, last periodic validation): " (TG[1] != "" ? TG[1] : "none")
  print hdr
  print sprintf("%-20s %6s %9s %7s %8s %8s %8s %8s %8s %9s %9s %9s %8s %7s %7s", "", "Mbit/s", "s", "vs adamw", "val loss",
                "s", "s/step", "s", "s", "s/step", "s/step", "MB", "MB", "", "s (load)")
  md = "| mode | link Mbit/s | time to target s | vs adamw | final val loss | step s | wall s/step | compute s | comm s | steps 1-5 s | link floor s/step | library MB | kernel MB | kernel/library | run wall s (load) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  for (r = 1; r <= n; r++) {
    mode = R[r, 1]; rate = R[r, 2]; steps = R[r, 3]; lib = R[r, 8]; ker = R[r, 9]
    if (R[r, 4] == "failed") {
      printf "%-20s %6s %9s   (the run failed: see its log)\n", mode, rate, "FAILED"
      md = md sprintf("\n| %s | %s | failed | - | - | - | - | - | - | - | - | - | - | - | (%s-%s) |", mode, rate, R[r, 11], R[r, 12])
      continue
    }
    tt = T[r] < 0 ? "not reached" : sprintf("%.1f", T[r])
    sp = (T[r] > 0 && (rate in tadam) && tadam[rate] > 0) ? sprintf("%.1fx", tadam[rate] / T[r]) : "-"
    floor = (rate == "none" || steps == 0) ? "-" : sprintf("%.3f", lib / ranks / steps * 8 / (rate * 1e6))
    ratio = lib > 0 ? sprintf("%.3f", ker / lib) : "-"
    comp = sprintf("%.3f", R[r, 5] - R[r, 6])
    comm = mode == "decoupled" ? "bg" : sprintf("%.3f", R[r, 6])
    wl = sprintf("%.0f (%s-%s)", R[r, 10], R[r, 11], R[r, 12])
    ws = R[r, 13] > 0 ? sprintf("%.3f", R[r, 13]) : "-"
    printf "%-20s %6s %9s %7s %8s %8.3f %8s %8s %8s %9.3f %9s %9s %8s %7s %s\n", mode, rate, tt, sp, R[r, 4], R[r, 5], ws,
           comp, comm, R[r, 7], floor, mb(lib), mb(ker), ratio, wl
    md = md sprintf("\n| %s | %s | %s | %s | %s | %.3f | %s | %s | %s | %.3f | %s | %s | %s | %s | %s |", mode, rate, tt, sp,
                    R[r, 4], R[r, 5], ws, comp, comm, R[r, 7], floor, mb(lib), mb(ker), ratio, wl)
    key[mode, rate] = r
  }
  print md > (dir "/table.md")
  print ""
  print "targets:"
  # 1. The step of each DisTrO mode at 10 Mbit/s vs no limit, mean and over the first 5 steps. The overlap
  #    modes (look-ahead, gradient-ready) are what hides the exchange (target <= 1.1x from the first step on); blocking rows for reference.
  #    Every mode that also ran unlimited, in the order of the table.
  ns = 0
  for (r = 1; r <= n; r++) if (R[r, 2] == "none" && ((R[r, 1], "10") in key)) sm[++ns] = R[r, 1]
  for (q = 1; q <= ns; q++) {
    a = key[sm[q], "10"]; b = key[sm[q], "none"]
    # The wall clock per step where the run has it (what a user waits), else the step as the trainer times it.
    w = (R[a, 13] > 0 && R[b, 13] > 0) ? 13 : 5
    m = R[a, w] / R[b, w]; f = R[a, 7] / R[b, 7]
    printf "  %s step at 10 Mbit/s vs no limit%s: %s %.3f / %.3f s = %.2fx, steps 1-5 %.3f / %.3f s = %.2fx%s\n", sm[q],
           (sm[q] ~ /overlap|backward/ ? " (target <= 1.1x, from the first step on)" : ""), (w == 13 ? "wall per step" : "mean step"),
           R[a, w], R[b, w], m, R[a, 7], R[b, 7], f,
           (sm[q] ~ /overlap|backward/ ? ((m <= 1.1 && f <= 1.1) ? ": met" : ": MISSED") : "")
  }
  # 2. Time to the AdamW loss: best non-AdamW row per rate.
  split("10 100", need, " "); want["10"] = 20; want["100"] = 3
  for (q = 1; q <= 2; q++) {
    rate = need[q]; if (!(rate in tadam)) continue
    best = ""; bt = -1
    for (r = 1; r <= n; r++) if (R[r, 2] == rate && R[r, 1] != "adamw" && T[r] > 0 && (bt < 0 || T[r] < bt)) { bt = T[r]; best = R[r, 1] }
    if (best == "") { printf "  time to the AdamW loss at %s Mbit/s (target >= %dx sooner): no other mode reached it: MISSED\n", rate, want[rate]; continue }
    printf "  time to the AdamW loss at %s Mbit/s (target >= %dx sooner): best %s %.1f s vs adamw %.1f s = %.1fx: %s\n", rate,
           want[rate], best, bt, tadam[rate], tadam[rate] / bt, (tadam[rate] / bt >= want[rate] ? "met" : "MISSED")
  }
  # 2b. The other way round, for runs that end above the AdamW loss: the
  #     time AdamW takes to the last periodic validation of each (its first
  #     validation at or below it, so an upper bound on the AdamW time).
  for (q = 1; q <= 2; q++) {
    rate = need[q]; if (!(rate in tadam)) continue
    for (r = 1; r <= n; r++) if (R[r, 2] == rate && R[r, 1] != "adamw" && R[r, 4] != "failed" && T[r] <= 0) {
      lv = last_val(R[r, 1], rate); if (lv == "") continue
      tm = curve_time(R[r, 1], rate, lv); ta = curve_time("adamw", rate, lv)
      if (tm <= 0) continue
      if (ta < 0) printf "  adamw at %s Mbit/s never reaches the last validation of %s, %.4f (%.1f s)\n", rate, R[r, 1], lv, tm
      else printf "  adamw at %s Mbit/s reaches the last validation of %s, %.4f, after %.1f s, %s after %.1f s: %.1fx\n", rate,
                  R[r, 1], lv, ta, R[r, 1], tm, ta / tm
    }
  }
  # 3. Byte counts.
  lo = 9; hi = 0; bad = ""
  for (r = 1; r <= n; r++) if (R[r, 8] > 0) { x = R[r, 9] / R[r, 8]; if (x < lo) lo = x; if (x > hi) hi = x
    if (x < 1.0 || x > 1.15) bad = bad " " R[r, 1] "@" R[r, 2] sprintf("=%.3f", x) }
  printf "  kernel / library bytes (target 1.0-1.15 for every run): %.3f-%.3f: %s\n", lo, hi, (bad == "" ? "met" : "MISSED:" bad)
  # 4. Overlap quality.
  for (r = 1; r <= n; r++) if (R[r, 1] ~ /-(overlap|backward)$/ && R[r, 4] != "failed") {
    base = R[r, 1]; sub(/-(overlap|backward)$/, "", base)
    if (!((base, R[r, 2]) in key)) continue
    b = key[base, R[r, 2]]; d = R[r, 4] / R[b, 4] - 1
    printf "  %s at %s: final val %s vs %s %s (%+.2f%%, target within 0.5%%): %s\n", R[r, 1], R[r, 2], R[r, 4], base,
           R[b, 4], 100 * d, (d <= 0.005) ? "met" : "MISSED"
  }
}' "$tsv" | tee "$dir/table.txt"
cat << 'EOF'
columns: to target = the trainer's elapsed seconds (rank 0 / learner 0, from its first step; start-up excluded) when
its periodic validation first reaches the AdamW run's last one; final = whole validation split (decoupled: mean
over learners of the global copy each last applied); step = mean seconds per step (rank 0), comm = in the
library's collective (exchange_s, DiLoCo: plus its outer sync), compute = the rest; decoupled learners exchange
on a background thread (bg); link floor = library bytes per rank per step at the link rate; library = bytes the
ranks received by the library's count (each all-gathered payload once per receiver; decoupled: to and from the
syncer), kernel = bytes leaving every namespace's link (TCP/IP and Ethernet headers, ACKs, MPI start-up and the
trainer's own small all-reduces included); wall = the whole run (launch to exit) and the load average around it.
EOF

command -v gnuplot > /dev/null || exit 0
rates=$(awk -F'\t' '$2 != "none" && !seen[$2]++ { print $2 }' "$tsv" | sort -rn)
modes=$(awk -F'\t' '!seen[$1]++ { print $1 }' "$tsv")
adamw_dat=$(ls "$dir"/adamw-*.dat 2> /dev/null | head -1 || true) # no AdamW row: no target line
target=$([ -n "$adamw_dat" ] && tail -n 1 "$adamw_dat" | cut -d' ' -f2 || true)
nr=$(echo "$rates" | wc -w)
{
  echo "set terminal pngcairo size $((520 * nr)),480 font 'sans,10'"
  echo "set output '$dir/wan.png'"
  echo "set multiplot layout 1,$nr title 'validation loss vs wall clock, $ranks ranks, tbf links (bench/wan)'"
  echo "set grid; set logscale x; set xlabel 'seconds since the first step'; set ylabel 'validation loss'; set key top right"
  for rate in $rates; do
    echo "set title '$rate Mbit/s'"
    plot="plot "
    for m in $modes; do
      [ -s "$dir/$m-$rate.dat" ] && plot="$plot'$dir/$m-$rate.dat' using 1:2 with linespoints pt 7 ps 0.5 title '$m', "
    done
    [ -n "$target" ] && plot="$plot$target with lines dt 2 lc 'black' title 'AdamW final'"
    echo "${plot%, }"
  done
  echo "unset multiplot"
} > "$dir/wan.gp"
gnuplot "$dir/wan.gp" && echo "plot: $dir/wan.png"
