#!/bin/sh
# Prints a committed results file as a Markdown table: the '#' lines (the
# command that produced the figures, the machine, the date) as a caption
# below, the first other line as the header, the rest as rows.
#
#   bench/tsv-table.sh FILE.tsv
set -eu
tsv=${1:?usage: tsv-table.sh FILE.tsv}
[ -s "$tsv" ] || { echo "tsv-table: no data in $tsv" >&2; exit 1; }
awk -F'\t' '
/^#/ { sub(/^# ?/, ""); note[++nn] = $0; next }
!head { head = 1; line = "|"; sep = "|"; for (i = 1; i <= NF; i++) { line = line " " $i " |"; sep = sep "---|" }
        print line; print sep; next }
{ line = "|"; for (i = 1; i <= NF; i++) line = line " " $i " |"; print line }
END { if (nn) { print ""; for (i = 1; i <= nn; i++) print "_" note[i] "_" } }' "$tsv"
