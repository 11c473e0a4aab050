#!/bin/sh
# One hostile learner among four (issue 30): distro-syncer, 3 honest
# gpt-train learners and 1 gpt-train-hostile learner (id 3, every report
# rewritten as DISTRO_HOSTILE_ATTACK says; hostile.c) on loopback (ipc
# endpoints in a temp dir), quorum 3, 4 fragments, H 24, int4, token merge.
# Each attack runs twice: with the defences off (--robust none and every
# bound, cap and quarantine off: the arithmetic before them) and with the
# robust settings (--robust trimmed, f = 1 of quorum 3, default bounds).
# Then the no-attack cost: 4 honest learners, the mean merge (today's
# default arithmetic) against the robust settings, over 3 seeds, with the
# syncer's mean merge time; and, as the reference for the attacks, the 3
# honest learners alone (learner 3 absent, robust settings, seed 1). Prints
# the honest learners' mean final val loss (their own parameters), failures,
# and when the syncer's log first named learner 3; writes one tab-separated
# row per run to RESULTS (default DIR/runs.tsv; hostile-report.sh turns it
# into the README's tables). The runs last SECONDS each, so the honest
# learners' step counts follow the machine's load; each row also gives their
# mean step count and their mean training loss over the same steps (MATCH,
# default 101-150) of every run, which does not.
# REPORT_DIR=DIR (a previous run's log folder) writes the rows again from its
# logs without running anything.
#
#   [RESULTS=FILE] [MATCH=FIRST-LAST] [REPORT_DIR=DIR] python-free-examples/decoupled/run-hostile.sh BUILD_DIR [SECONDS] [ATTACKS] [SEEDS]
#
# ATTACKS "" skips the attacks and the 3-learner reference, SEEDS "" the no-attack runs.
# About (2 x attacks + 1 + 2 x seeds) x (SECONDS + 5) seconds (defaults 25 s, all 7 attacks, 3 seeds: ~11 min).
set -eu
B=${1:?usage: run-hostile.sh BUILD_DIR [SECONDS] [ATTACKS] [SEEDS]}
T=${2:-25}
ATTACKS=${3-"grad100 neg20 noise huge tokens freeride nan"}
SEEDS=${4-"1 2 3"}
SYNCER=$B/distro-syncer
GPT=$B/python-free-examples/gpt/gpt-train
HOSTILE=$B/python-free-examples/decoupled/gpt-train-hostile
MATCH=${MATCH:-101-150}
REPORT_DIR=${REPORT_DIR:-}
if [ -n "$REPORT_DIR" ]; then
  DIR=$REPORT_DIR
else
  for f in "$SYNCER" "$GPT" "$HOSTILE"; do [ -x "$f" ] || { echo "run-hostile.sh: no $f (build first)" >&2; exit 2; }; done
  DIR=$(mktemp -d /tmp/decoupled-hostile-XXXXXX)
fi
RESULTS=${RESULTS:-$DIR/runs.tsv}
[ -n "$REPORT_DIR" ] || printf '# %s %s; %s UTC; %s cores, load average at start %s\n' "$0" "$*" \
  "$(date -u '+%Y-%m-%d %H:%M')" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" > "$DIR/header"
cat "$DIR/header" > "$RESULTS" 2>/dev/null || : > "$RESULTS"
[ -z "$REPORT_DIR" ] || echo "# rows written again from the logs in $REPORT_DIR ($(date -u '+%Y-%m-%d %H:%M') UTC)" >> "$RESULTS"
printf 'run\tattack\tdefences\tseed\tmerge\thonest_val_loss\thonest_finished\thonest_steps\thonest_train_loss_%s\thonest_rc\thostile_rc\tsyncer_rc\thonest_error_lines\tmerges\tnamed_after_merges\tnamed_as\tl3_reports\tl3_merged\tl3_clipped\tl3_refused\tl3_capped\tl3_quarantines\trejected\tmerge_mean_s\tmerge_max_s\n' "$MATCH" >> "$RESULTS"
MODEL="--layers 2 --dim 64 --heads 4 --context 64 --batch 4 --threads 1"
SCHED="--lr-final 1 --warmup 20 --steps 1000000 --eval-every 0 --print-every 100000"
DELAYS="15 15 20 20"
SYNC="--fragments 4 --quorum 3 --H 24 --overlap 2 --codec int4 --outer-lr 1 --outer-momentum 0 --timeout 1 --heartbeat 0.1"
OFF="--robust none --clip-multiple 0 --report-max-rel 0 --step-max-rel 0 --weight-cap 0 --quarantine-after 0"
ON="--robust trimmed"

run() { # name attack(- none, absent: no learner 3) seed merge defences...
  name=$1 attack=$2 seed=$3 merge=$4
  shift 4
  case " $* " in *" --robust none "*) defences=off ;; *) defences=robust ;; esac
  $SYNCER --endpoint "ipc://$DIR/$name.ipc" --endpoint-file "$DIR/$name.ep" $SYNC --merge "$merge" "$@" \
    > "$DIR/$name.syncer.log" 2>&1 &
  spid=$!
  while [ ! -s "$DIR/$name.ep" ]; do sleep 0.05; done
  i=0
  pids=""
  for d in $DELAYS; do
    bin=$GPT
    env=""
    [ $i = 3 ] && [ "$attack" = absent ] && break
    if [ $i = 3 ] && [ "$attack" != - ]; then bin=$HOSTILE; env="DISTRO_HOSTILE_ATTACK=$attack"; fi
    env $env $bin $MODEL $SCHED --seed "$seed" --optim decoupled --ranks 1 --syncer "ipc://$DIR/$name.ipc" \
      --learner-id $i --step-delay-ms "$d" --time-limit "$T" --log "$DIR/$name.l$i.csv" \
      > "$DIR/$name.l$i.out" 2> "$DIR/$name.l$i.err" &
    pids="$pids $!"
    [ $i = 0 ] && sleep 1 # learner 0 seeds
    i=$((i + 1))
  done
  rcs="" # exit statuses of learners 0, 1, 2[, 3]
  for p in $pids; do
    wait "$p" 2>/dev/null && r=0 || r=$?
    rcs="$rcs $r"
  done
  kill -TERM "$spid" 2>/dev/null || true # a syncer that died already is reported below
  wait "$spid" && src=0 || src=$?
  printf '%s %s %s %s\n%s\n%s\n' "$attack" "$defences" "$seed" "$merge" "$rcs" "$src" > "$DIR/$name.run"
}

report() { # name: honest mean final val loss (own parameters), failures, first line naming learner 3
  name=$1
  [ -s "$DIR/$name.run" ] || return 0
  read -r attack defences seed merge < "$DIR/$name.run"
  rcs=$(sed -n 2p "$DIR/$name.run")
  src=$(sed -n 3p "$DIR/$name.run")
  loss=$(awk '/this learner.s parameters/ { if (tolower($4) ~ /nan/) bad = "nan"; else if (tolower($4) ~ /inf/ && bad == "") bad = "inf"; else s += $4; n++ }
      END { if (n && bad != "") printf "%s (%d of 3)", bad, n; else if (n) printf "%.4f (%d of 3)", s / n, n; else print "none" }' \
    "$DIR/$name.l0.out" "$DIR/$name.l1.out" "$DIR/$name.l2.out")
  # gpt-train's fatal errors (a peer that did not serve its state at a join is not one)
  fail=$(cat "$DIR/$name.l0.err" "$DIR/$name.l1.err" "$DIR/$name.l2.err" | grep -c "^gpt: \|non-finite" || true)
  steps=$(awk '/global copy/ { for (i = 2; i <= NF; i++) if ($i == "steps,") { s += $(i - 1); n++ } }
      END { if (n) printf "%.0f", s / n }' "$DIR/$name.l0.out" "$DIR/$name.l1.out" "$DIR/$name.l2.out")
  tl=$(cat "$DIR/$name.l0.csv" "$DIR/$name.l1.csv" "$DIR/$name.l2.csv" 2>/dev/null |
    awk -F, -v m="$MATCH" 'BEGIN { split(m, r, "-") } $1 ~ /^[0-9]+$/ && $1 >= r[1] && $1 <= r[2] { s += $3; n++ }
      END { if (n == 3 * (r[2] - r[1] + 1)) printf "%.4f", s / n }')
  merges=$(grep -c " merge frag=" "$DIR/$name.syncer.log" || true)
  named=$(awk '/ merge frag=/ { m++ } /learner 3 |learner=3 / && /clipped|refused|capped|quarantined|reason=payload/ { print m + 0; exit }' \
    "$DIR/$name.syncer.log")
  how=$(awk '/learner 3 |learner=3 / && /clipped|refused|capped|quarantined|reason=payload/ {
      if (/reason=payload/) print "reject (payload)"; else if (/quarantined/) print "quarantined"
      else { n = split($0, w, "; "); print w[n] }; exit }' "$DIR/$name.syncer.log")
  mt=$(awk '/stopped:/ { for (i = 1; i <= NF; i++) if ($i == "mean") print $(i + 1) }' "$DIR/$name.syncer.log")
  mx=$(awk '/stopped:/ { for (i = 1; i <= NF; i++) if ($i == "max") print $(i + 1) }' "$DIR/$name.syncer.log")
  rej=$(awk '/stopped:/ { for (i = 1; i <= NF; i++) if ($i == "rejected") { v = $(i + 1); sub(/,/, "", v); print v } }' "$DIR/$name.syncer.log")
  l3=$(awk '/\[syncer\] learner 3:/ { for (i = 1; i <= NF; i++) { v = $(i + 1); sub(/,/, "", v)
      if ($i == "reports") p = v; if ($i == "merged") m = v
      if ($i == "clipped") c = v; if ($i == "refused") r = v; if ($i == "capped") k = v; if ($i == "quarantines") q = v }
      printf "%s\t%s\t%s\t%s\t%s\t%s", p, m, c, r, k, q }' "$DIR/$name.syncer.log")
  set -- $rcs
  hrc="$1,$2,$3"
  xrc=${4:--}
  printf "  %-22s honest val loss %s, honest exit %s, syncer exit %s, honest error lines %s, merges %s, learner 3 named after %s merges%s, merge time mean %s s\n" \
    "$name" "$loss" "$hrc" "$src" "$fail" "$merges" "${named:-never}" "${how:+ ($how)}" "$mt"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$attack" "$defences" "$seed" "$merge" \
    "$(echo "$loss" | awk '{ print $1 }')" "$(echo "$loss" | awk -F'[( ]' '{ print $3 + 0 }')" "${steps:--}" "${tl:--}" "$hrc" "$xrc" "$src" "$fail" \
    "$merges" "${named:--}" "${how:--}" "${l3:--	-	-	-	-	-}" "${rej:--}" "${mt:--}	${mx:--}" >> "$RESULTS"
}

step() { # name attack seed merge defences...
  [ -n "$REPORT_DIR" ] || run "$@"
  report "$1"
}

echo "== one hostile learner (id 3) among 4, quorum 3, $T s per run; syncer: $SYNC"
if [ -n "$ATTACKS" ]; then
  step "absent.robust" absent 1 tokens $ON # the reference: the 3 honest learners alone
fi
for a in $ATTACKS; do
  step "$a.before" "$a" 1 tokens $OFF
  step "$a.after" "$a" 1 tokens $ON
done
echo "== no attack: mean merge (defences off) vs robust settings, seeds $SEEDS"
for s in $SEEDS; do
  step "none.mean.s$s" - "$s" mean $OFF
  step "none.robust.s$s" - "$s" tokens $ON
done
echo "logs in $DIR, results in $RESULTS"
