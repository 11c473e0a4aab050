#!/bin/sh
# The make demo table (Markdown) from the TSV that gpt-train --compare --tsv
# writes: final validation loss, its ratio to the adamw row, bytes per rank
# per step (mean and peak) and how many times fewer than the all-reduce.
#
#   python-free-examples/gpt/demo-report.sh [FILE.tsv]
#   (default: python-free-examples/gpt/results/demo.tsv, the committed run)
set -eu
tsv=${1:-$(dirname "$0")/results/demo.tsv}
[ -s "$tsv" ] || { echo "demo-report: no data in $tsv" >&2; exit 1; }
awk -F'\t' '
function human(b) {
  if (b >= 1e6) return sprintf("%.2f MB", b / 1e6)
  if (b >= 1e3) return sprintf("%.1f kB", b / 1e3)
  return sprintf("%.0f B", b)
}
/^#/ { sub(/^# /, ""); head = head (head != "" ? "; " : "") $0; next }
$1 == "row" { for (i = 1; i <= NF; i++) col[$i] = i; next }
{
  n++; for (i = 1; i <= NF; i++) R[n, i] = $i
  if ($col["row"] == "adamw") { ref_loss = $col["val_loss"]; ref_bytes = $col["sent_per_step"] }
}
END {
  if (!ref_loss) { print "demo-report: no adamw row" > "/dev/stderr"; exit 1 }
  print "| row | setting | val loss | vs adamw | bytes/step/rank | peak | fewer than all-reduce |"
  print "|---|---|---|---|---|---|---|"
  for (r = 1; r <= n; r++) {
    name = R[r, col["row"]]; opt = R[r, col["optimizer"]]
    if (R[r, col["learners"]] > 0)
      set = sprintf("%d learners (%s inside), H %d, %d fragment(s), %s outer", R[r, col["learners"]], opt,
                    R[r, col["H"]], R[r, col["fragments"]], R[r, col["outer"]])
    else if (R[r, col["chunk"]] > 0)
      set = sprintf("%s, chunk %d, topk %d, %s values, lr %s", opt, R[r, col["chunk"]], R[r, col["topk"]],
                    R[r, col["values"]], R[r, col["lr"]])
    else
      set = sprintf("fp32 all-reduce + AdamW, lr %s", R[r, col["lr"]])
    sent = R[r, col["sent_per_step"]]
    printf "| %s | %s | %.4f | %.3f | %s | %s | %.0fx |\n", name, set, R[r, col["val_loss"]],
           R[r, col["val_loss"]] / ref_loss, human(sent), human(R[r, col["peak_sent"]]), (sent > 0 ? ref_bytes / sent : 0)
  }
  print ""
  print "(" head ")"
}' "$tsv"
