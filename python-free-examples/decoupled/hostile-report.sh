#!/bin/sh
# Turns run-hostile.sh's per-run rows (RESULTS) into the README's two tables:
# ATTACKS_TSV, one row per attack (issue 30's "before" figures, the same
# attack with the defences off and with --robust trimmed on this code, the
# honest learners' final val loss against the no-attack run, when and how the
# syncer named learner 3), and NOATTACK_TSV, the no-attack cost per seed
# (mean merge with the defences off against the robust settings, and the
# syncer's merge time). Render either with bench/tsv-table.sh.
#
#   python-free-examples/decoupled/hostile-report.sh RUNS_TSV ATTACKS_TSV NOATTACK_TSV
set -eu
runs=${1:?usage: hostile-report.sh RUNS_TSV ATTACKS_TSV NOATTACK_TSV}
out=${2:?usage: hostile-report.sh RUNS_TSV ATTACKS_TSV NOATTACK_TSV}
out2=${3:?usage: hostile-report.sh RUNS_TSV ATTACKS_TSV NOATTACK_TSV}
[ -s "$runs" ] || { echo "hostile-report: no data in $runs" >&2; exit 1; }

# Columns of RESULTS by name; a cell of the final val loss that says when
# honest learners or the syncer did not finish.
common='
function col(name) { return $(ix[name]) }
function num(v) { return v ~ /^[0-9.]+$/ }
function cell(r,   s, c) {
  c = R[r, "honest_rc"] != "0,0,0" || R[r, "honest_finished"] < 3
  s = c ? "crash (honest exits " R[r, "honest_rc"] ", " R[r, "honest_finished"] " of 3 finished" \
          (num(R[r, "honest_val_loss"]) ? ", loss " R[r, "honest_val_loss"] : "") ")" : R[r, "honest_val_loss"]
  if (!c && R[r, "honest_error_lines"] > 0) s = s " (" R[r, "honest_error_lines"] " error lines)"
  if (R[r, "syncer_rc"] != 0) s = s "; syncer exit " R[r, "syncer_rc"]
  return s
}
function st(r) { return num(R[r, "honest_steps"]) ? " (" R[r, "honest_steps"] " steps)" : "" }
function tl(r) { return R[r, "honest_train_loss"] }
function rel(a, b) { return num(a) && num(b) && b > 0 ? sprintf("%+.1f%%", 100 * (a / b - 1)) : "—" }
/^#/ { note[++nn] = $0; next }
!head { head = 1; for (i = 1; i <= NF; i++) { if ($i ~ /^honest_train_loss_/) { match_ = substr($i, 19); $i = "honest_train_loss" }
                                             ix[$i] = i; name[i] = $i }; nf = NF; next }
{ for (i = 1; i <= nf; i++) R[$1, name[i]] = $i; have[$1] = 1 }
'

awk -F'\t' "$common"'
END {
  split("grad100 neg20 noise huge tokens freeride nan", order, " ")
  what["grad100"] = "outer gradient −100·Δ"; before["grad100"] = "inf"
  what["neg20"] = "θ ← −20θ"; before["neg20"] = "crash"
  what["noise"] = "θ + 1000·N(0,1)"; before["noise"] = "inf"
  what["huge"] = "finite ±3e38"; before["huge"] = "crash"
  what["tokens"] = "2⁵³ tokens in 1 step, −Δ"; before["tokens"] = "3.21 (+35%)"
  what["freeride"] = "Δ = 0 with 2⁵³ tokens"; before["freeride"] = "2.99"
  what["nan"] = "NaN/Inf"; before["nan"] = "2.46"
  base = R["none.robust.s1", "honest_val_loss"]; alone = R["absent.robust", "honest_val_loss"]
  tbase = tl("none.robust.s1"); talone = tl("absent.robust")
  for (i = 1; i <= nn; i++) print note[i]
  print "# before: issue 30 (the code before robust merging; its baselines: 3 honest learners 2.42, 2 honest alone 2.44)."
  print "# off: this code, --robust none and every bound, cap and quarantine off; robust: --robust trimmed, default bounds."
  print "# Final val loss: mean of learners 0-2, their own parameters, after the run'"'"'s fixed time (their mean step count in brackets). Train loss: mean of learners 0-2 over steps " match_ " of each run."
  print "# Seed 1 throughout; \"vs no attack / vs 3 honest alone\" compares with none.robust.s1 (4 honest learners) / absent.robust (learner 3 absent), both with the robust settings."
  print "attack by learner 3\tbefore (issue 30)\tdefences off: final val loss\trobust: final val loss\tvs no attack / 3 honest alone\trobust: train loss, steps " match_ "\tvs no attack / 3 honest alone\tlearner 3 named (robust)\tsyncer, learner 3 (robust): reports / merged / clipped / refused / capped / quarantines"
  if (have["none.robust.s1"])
    print "none (4 honest learners)\t2.42 (3 honest)\t" (have["none.mean.s1"] ? cell("none.mean.s1") st("none.mean.s1") ", mean merge" : "—") \
          "\t" cell("none.robust.s1") st("none.robust.s1") "\t— / " rel(base, alone) "\t" tl("none.robust.s1") "\t— / " rel(tbase, talone) "\t—\t—"
  if (have["absent.robust"])
    print "learner 3 absent (3 honest alone)\t2.44 (2 honest alone)\t—\t" cell("absent.robust") st("absent.robust") "\t" rel(alone, base) " / —\t" \
          tl("absent.robust") "\t" rel(talone, tbase) " / —\t—\t—"
  for (k = 1; k <= 7; k++) {
    a = order[k]; b = a ".before"; r = a ".after"
    if (!have[r]) continue
    named = R[r, "named_after_merges"] == "-" ? "never" : "at merge " R[r, "named_after_merges"] + 1 " (" R[r, "named_as"] ")"
    printf "%s\t%s\t%s\t%s\t%s / %s\t%s\t%s / %s\t%s\t%s / %s / %s / %s / %s / %s\n", what[a], before[a], have[b] ? cell(b) st(b) : "—",
      cell(r) st(r), rel(R[r, "honest_val_loss"], base), rel(R[r, "honest_val_loss"], alone),
      tl(r), rel(tl(r), tbase), rel(tl(r), talone), named,
      R[r, "l3_reports"], R[r, "l3_merged"], R[r, "l3_clipped"], R[r, "l3_refused"], R[r, "l3_capped"], R[r, "l3_quarantines"]
  }
}' "$runs" > "$out"

awk -F'\t' "$common"'
function ms(r) { return num(R[r, "merge_mean_s"]) ? sprintf("%.2f / %.2f", 1000 * R[r, "merge_mean_s"], 1000 * R[r, "merge_max_s"]) : "—" }
END {
  for (i = 1; i <= nn; i++) print note[i]
  print "# mean: --merge mean, defences off (--robust none, every bound, cap and quarantine off); robust: --merge tokens --robust trimmed, default bounds. 4 honest learners."
  print "# Final val loss: mean of learners 0-2, their own parameters, after the run'"'"'s fixed time (their mean step count in brackets). Train loss: mean of learners 0-2 over steps " match_ "."
  print "# Merge time: the syncer'"'"'s exit line (decode, merge, outer step, sends), mean / max, ms."
  print "seed\tfinal val loss, mean merge\tfinal val loss, robust\trobust vs mean\ttrain loss " match_ ", mean merge\ttrain loss " match_ ", robust\trobust vs mean\tmerges, mean / robust\tmerge time, mean merge (ms)\tmerge time, robust (ms)"
  for (s = 1; s <= 99; s++) {
    m = "none.mean.s" s; r = "none.robust.s" s
    if (!have[m] || !have[r]) continue
    print s "\t" cell(m) st(m) "\t" cell(r) st(r) "\t" rel(R[r, "honest_val_loss"], R[m, "honest_val_loss"]) "\t" tl(m) "\t" tl(r) "\t" rel(tl(r), tl(m)) \
          "\t" R[m, "merges"] " / " R[r, "merges"] "\t" ms(m) "\t" ms(r)
    if (num(R[m, "honest_val_loss"]) && num(R[r, "honest_val_loss"])) {
      n++; lm += R[m, "honest_val_loss"]; lr += R[r, "honest_val_loss"]
      tm += R[m, "merge_mean_s"]; tr += R[r, "merge_mean_s"]; mm += R[m, "merges"]; mr += R[r, "merges"]
      sm += R[m, "honest_steps"]; sr += R[r, "honest_steps"]
    }
    if (num(tl(m)) && num(tl(r))) { nt++; am += tl(m); ar += tl(r) }
  }
  if (n > 1)
    printf "mean of %d\t%.4f (%.0f steps)\t%.4f (%.0f steps)\t%s\t%s\t%s\t%s\t%.0f / %.0f\t%.2f (mean)\t%.2f (mean)\n", n, lm / n, sm / n, lr / n,
      sr / n, rel(lr / n, lm / n), nt ? sprintf("%.4f", am / nt) : "—", nt ? sprintf("%.4f", ar / nt) : "—",
      nt ? rel(ar / nt, am / nt) : "—", mm / n, mr / n, 1000 * tm / n, 1000 * tr / n
}' "$runs" > "$out2"
