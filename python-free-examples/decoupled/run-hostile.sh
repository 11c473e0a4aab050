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
# syncer's mean merge time. Prints the honest learners' mean final val loss
# (their own parameters), failures, and when the syncer's log first named
# learner 3.
#
#   python-free-examples/decoupled/run-hostile.sh BUILD_DIR [SECONDS] [ATTACKS] [SEEDS]
#
# About (2 x attacks + 2 x seeds) x (SECONDS + 5) seconds (defaults 25 s, all 7 attacks, 3 seeds: ~11 min).
set -eu
B=${1:?usage: run-hostile.sh BUILD_DIR [SECONDS] [ATTACKS] [SEEDS]}
T=${2:-25}
ATTACKS=${3:-"grad100 neg20 noise huge tokens freeride nan"}
SEEDS=${4:-"1 2 3"}
SYNCER=$B/distro-syncer
GPT=$B/python-free-examples/gpt/gpt-train
HOSTILE=$B/python-free-examples/decoupled/gpt-train-hostile
for f in "$SYNCER" "$GPT" "$HOSTILE"; do [ -x "$f" ] || { echo "run-hostile.sh: no $f (build first)" >&2; exit 2; }; done
DIR=$(mktemp -d /tmp/decoupled-hostile-XXXXXX)
MODEL="--layers 2 --dim 64 --heads 4 --context 64 --batch 4 --threads 1"
SCHED="--lr-final 1 --warmup 20 --steps 1000000 --eval-every 0 --print-every 100000"
DELAYS="15 15 20 20"
SYNC="--fragments 4 --quorum 3 --H 24 --overlap 2 --codec int4 --outer-lr 1 --outer-momentum 0 --timeout 1 --heartbeat 0.1"
OFF="--robust none --clip-multiple 0 --report-max-rel 0 --step-max-rel 0 --weight-cap 0 --quarantine-after 0"
ON="--robust trimmed"

run() { # name attack(- none) seed merge defences...
  name=$1 attack=$2 seed=$3 merge=$4
  shift 4
  $SYNCER --endpoint "ipc://$DIR/$name.ipc" --endpoint-file "$DIR/$name.ep" $SYNC --merge "$merge" "$@" \
    > "$DIR/$name.syncer.log" 2>&1 &
  spid=$!
  while [ ! -s "$DIR/$name.ep" ]; do sleep 0.05; done
  i=0
  pids=""
  for d in $DELAYS; do
    bin=$GPT
    env=""
    if [ $i = 3 ] && [ "$attack" != - ]; then bin=$HOSTILE; env="DISTRO_HOSTILE_ATTACK=$attack"; fi
    env $env $bin $MODEL $SCHED --seed "$seed" --optim decoupled --ranks 1 --syncer "ipc://$DIR/$name.ipc" \
      --learner-id $i --step-delay-ms "$d" --time-limit "$T" --log "$DIR/$name.l$i.csv" \
      > "$DIR/$name.l$i.out" 2> "$DIR/$name.l$i.err" &
    pids="$pids $!"
    [ $i = 0 ] && sleep 1 # learner 0 seeds
    i=$((i + 1))
  done
  for p in $pids; do wait "$p" 2>/dev/null || true; done
  kill -TERM "$spid"
  wait "$spid" || true
}

report() { # name: honest mean final val loss (own parameters), failures, first line naming learner 3
  name=$1
  loss=$(awk '/this learner.s parameters/ { s += $4; n++ } END { if (n) printf "%.4f (%d of 3)", s / n, n; else print "none" }' \
    "$DIR/$name.l0.out" "$DIR/$name.l1.out" "$DIR/$name.l2.out")
  fail=$(cat "$DIR/$name.l0.err" "$DIR/$name.l1.err" "$DIR/$name.l2.err" | grep -ci "non-finite\|error" || true)
  merges=$(grep -c " merge frag=" "$DIR/$name.syncer.log" || true)
  named=$(awk '/ merge frag=/ { m++ } /learner 3 |learner=3 / && /clipped|refused|capped|quarantined|reason=payload/ { print m + 0; exit }' \
    "$DIR/$name.syncer.log")
  mt=$(awk '/stopped:/ { for (i = 1; i <= NF; i++) if ($i == "mean") print $(i + 1) }' "$DIR/$name.syncer.log")
  printf "  %-22s honest val loss %s, honest error lines %s, merges %s, learner 3 named after %s merges, merge time mean %s s\n" \
    "$name" "$loss" "$fail" "$merges" "${named:-never}" "$mt"
}

echo "== one hostile learner (id 3) among 4, quorum 3, $T s per run; syncer: $SYNC"
for a in $ATTACKS; do
  run "$a.before" "$a" 1 tokens $OFF
  report "$a.before"
  run "$a.after" "$a" 1 tokens $ON
  report "$a.after"
done
echo "== no attack: mean merge (defences off) vs robust settings, seeds $SEEDS"
for s in $SEEDS; do
  run "none.mean.s$s" - "$s" mean $OFF
  report "none.mean.s$s"
  run "none.robust.s$s" - "$s" tokens $ON
  report "none.robust.s$s"
done
echo "logs in $DIR"
