#!/bin/sh
# Decoupled DiLoCo launcher, GPT mode: distro-syncer and 4 gpt-train
# learners (--optim decoupled, 1 rank each, AdamW inside) of different
# speeds on loopback (ipc endpoints in a temp dir). Runs the job twice for
# SECONDS each, once without failures and once with learner 3 SIGKILLed at
# 30% of the run and restarted at 60% (it joins from a peer and continues
# the schedule at its last step), then the data-parallel AdamW baseline
# (gpt-train --optim adamw, 4 ranks) with the no-failure run's total tokens.
# Prints the merge timeline around the failure, the survivors' throughput
# before and while learner 3 is dead, goodput with the killed learner's lost
# work counted, the final validation losses, and the syncer's merge latency
# at P = 4 (this model) and P = 24 (the demo model, 842,496 parameters)
# next to one learner step.
#
#   python-free-examples/decoupled/run-gpt.sh BUILD_DIR [SECONDS] [P24_SECONDS]
#
# About 3 x SECONDS + P24_SECONDS + 20 s in all (defaults 60 and 25: ~4 min).
set -eu
B=${1:?usage: run-gpt.sh BUILD_DIR [SECONDS] [P24_SECONDS]}
T=${2:-60}
T24=${3:-25}
SYNCER=$B/distro-syncer
GPT=$B/python-free-examples/gpt/gpt-train
for f in "$SYNCER" "$GPT"; do [ -x "$f" ] || { echo "run-gpt.sh: no $f (build first)" >&2; exit 2; }; done
DIR=$(mktemp -d /tmp/decoupled-gpt-XXXXXX)
MODEL="--layers 2 --dim 64 --heads 4 --context 64 --batch 4 --threads 1"
# Constant lr after a short warm-up (--lr-final 1), so a time-bounded run
# and the token-matched baseline follow the same schedule.
SCHED="--lr-final 1 --warmup 20 --steps 1000000 --eval-every 0 --print-every 100000"
DELAYS="15 15 20 35" # extra ms per step of learners 0..3 (learner 3 ~2x slower): sleeps, so that 4 learners
                     # (~7 ms of compute a step each) fit on 2 cores and step rates are not CPU-bound
# Outer lr 1 without momentum: with a fragment merged every H/P = 6 steps the
# paper's Nesterov 0.7/0.9 overshoots (2 learners, 3000 steps each, int4:
# final val 2.96 with 0.7/0.9 vs 2.42 with 1/0; README.md).
SYNC="--fragments 4 --quorum 2 --H 24 --overlap 2 --codec int4 --merge tokens --outer-lr 1 --outer-momentum 0 --timeout 1 --heartbeat 0.1"
now() { date +%s.%N; }
frac() { echo "$1 * $2" | bc -l; }

learner() { # name id delay seconds start-step log-suffix (exec: $! is gpt-train itself, for kill -9)
  exec $GPT $MODEL $SCHED --optim decoupled --ranks 1 --syncer "ipc://$DIR/$1.ipc" --learner-id "$2" \
    --step-delay-ms "$3" --time-limit "$4" --start-step "${5:-0}" --log "$DIR/$1.l$2$6.csv" \
    > "$DIR/$1.l$2$6.out" 2> "$DIR/$1.l$2$6.err"
}

run() { # name, 1 to kill and restart learner 3
  name=$1
  $SYNCER --endpoint "ipc://$DIR/$name.ipc" --endpoint-file "$DIR/$name.ep" $SYNC > "$DIR/$name.syncer.log" 2>&1 &
  spid=$!
  while [ ! -s "$DIR/$name.ep" ]; do sleep 0.05; done
  i=0
  for d in $DELAYS; do
    learner "$name" $i "$d" "$T" 0 "" &
    eval "lpid$i=$!"
    i=$((i + 1))
  done
  if [ "$2" = 1 ]; then
    sleep "$(frac "$T" 0.3)"
    kill -9 "$lpid3"
    now > "$DIR/$name.kill"
    sleep "$(frac "$T" 0.3)"
    now > "$DIR/$name.restart"
    last=$(tail -n 1 "$DIR/$name.l3.csv" | cut -d, -f1)
    learner "$name" 3 "$(echo $DELAYS | cut -d' ' -f4)" "$(frac "$T" 0.4)" "$last" b &
    lpid3=$!
  fi
  wait "$lpid0" "$lpid1" "$lpid2" "$lpid3" 2>/dev/null || true
  kill -TERM "$spid"
  wait "$spid" || true
}

echo "== Decoupled DiLoCo, GPT (layers 2, dim 64, context 64, batch 4, AdamW inside): syncer + 4 learners"
echo "   extra delay per step ${DELAYS} ms, $T s per run, syncer: $SYNC"
echo "== run 1: no failures"
run nofail 0
echo "== run 2: learner 3 SIGKILLed at 30% ($(frac "$T" 0.3) s), restarted at 60%"
run fail 1

zero=$(awk '/clock zero at unix/ {print $NF}' "$DIR/fail.syncer.log")
kill_t=$(cat "$DIR/fail.kill")
restart_t=$(cat "$DIR/fail.restart")
echo
echo "== merge timeline around the failure (run 2; t: seconds since the kill, per merge: fragment, quorum K,"
echo "   live learners, participants (* late), grace granted, time from round open to merge, bytes in/out)"
awk -v z="$zero" -v k="$kill_t" -v r="$restart_t" '
  { t = substr($2, 1, length($2) - 1) + z - k }
  / merge frag=/ {
    for (i = 3; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    line = sprintf("  t=%+7.2f frag=%s v%-4s K=%s live=%s participants=%s ids=%-8s grace=%.3fs waited=%.3fs in=%sB out=%sB",
                   t, v["frag"], v["version"], v["quorum"], v["live"], v["participants"], v["ids"], v["grace"],
                   v["waited"], v["bytes_in"], v["bytes_out"])
    if ((t > -0.6 && t < 1.8) || (t > r - k - 0.3 && t < r - k + 1.5)) print line
    next }
  /timed out|joins|seeds|is ready|goodbye/ { printf "  t=%+7.2f %s\n", t, substr($0, index($0, "]") + 2) }
' "$DIR/fail.syncer.log" | awk '/frag=/ { if (++n % 2) print; next } { print }' | head -40

echo
echo "== survivors' throughput (steps/s, from their CSV logs), learner 3 dead from the kill to the restart"
for i in 0 1 2; do
  awk -F, -v k="$kill_t" -v r="$restart_t" -v T="$T" -v id=$i 'NR > 1 { t = $15; s = $1
      if (t >= k - 0.25 * T && t <= k) { if (!b0) { b0 = t; bs = s } b1 = t; be = s }
      if (t >= k + 1.0 && t <= r) { if (!d0) { d0 = t; ds = s } d1 = t; de = s } }
    END { rb = (be - bs) / (b1 - b0); rd = (de - ds) / (d1 - d0)
          printf "  learner %d: %.1f before the kill, %.1f while learner 3 is dead (%+.1f%%)\n", id, rb, rd, 100 * (rd / rb - 1) }' \
    "$DIR/fail.l$i.csv"
done
for name in nofail; do
  for i in 0 1 2; do
    awk -F, -v id=$i 'NR > 1 { if (!t0) t0 = $15; t1 = $15; s = $1 } END { printf "  (no-failure run, learner %d: %.1f steps/s over the run)\n", id, s / (t1 - t0) }' "$DIR/$name.l$i.csv"
  done
done

echo
echo "== goodput: step time whose work reached a merge / all step time (library accounting, CSV columns"
echo "   useful_s, wasted_s, pending_s; work not yet merged at the end of a run is left out, except the"
echo "   killed learner's, which is counted as lost: its pending_s at its last step)"
for name in nofail fail; do
  files="$DIR/$name.l0.csv $DIR/$name.l1.csv $DIR/$name.l2.csv $DIR/$name.l3.csv"
  [ -f "$DIR/$name.l3b.csv" ] && files="$files $DIR/$name.l3b.csv"
  for f in $files; do tail -n 1 "$f" | awk -F, -v f="$(basename "$f" .csv)" -v name=$name \
    '{ print f, $1, $22, $23, $24 }'; done | awk -v name=$name '
    { u += $3; w += $4; pend = $5; steps += $2
      if (name == "fail" && $1 ~ /\.l3$/) { lost = pend; lsteps = $2 } }
    END { g = u / (u + w + lost)
          printf "  %-6s: useful %.1f s, wasted %.1f s, lost with the killed learner %.2f s -> goodput %.4f (%.2f%% of step time lost)\n",
                 name, u, w, lost, g, 100 * (1 - g) }'
done
grep -h "joined the syncer" "$DIR/fail.l3b.out" | sed 's/^/  restarted learner 3: /'
echo "  learner 3's goodput as the library reports it (lost work of a dead process is invisible to it):"
for f in fail.l3 fail.l3b; do tail -n 1 "$DIR/$f.csv" | awk -F, -v f=$f '{ printf "    %s: step %s, goodput %s\n", f, $1, $18 }'; done

echo
echo "== final validation loss (whole split; mean over learners 0-2 of their own parameters, and of the"
echo "   global copy each last applied)"
for name in nofail fail; do
  awk -v name=$name '/this learner.s parameters/ { own += $4; n++ } /of the global copy/ { glob += $4; g++ }
    END { printf "  %-6s: own %.4f, global copy %.4f\n", name, own / n, glob / g }' \
    "$DIR/$name.l0.out" "$DIR/$name.l1.out" "$DIR/$name.l2.out"
done
tokens=0
for i in 0 1 2 3; do tokens=$((tokens + $(tail -n 1 "$DIR/nofail.l$i.csv" | cut -d, -f19))); done
bsteps=$((tokens / (4 * 4 * 64)))
$GPT $MODEL --optim adamw --ranks 4 --lr-final 1 --warmup 20 --steps "$bsteps" --eval-every 0 --print-every 100000 \
  > "$DIR/baseline.out" 2>&1
nf=$(awk '/this learner.s parameters/ { s += $4; n++ } END { printf "%.4f", s / n }' "$DIR/nofail.l0.out" "$DIR/nofail.l1.out" "$DIR/nofail.l2.out")
fl=$(awk '/this learner.s parameters/ { s += $4; n++ } END { printf "%.4f", s / n }' "$DIR/fail.l0.out" "$DIR/fail.l1.out" "$DIR/fail.l2.out")
bl=$(awk '/final val loss/ { print $4 }' "$DIR/baseline.out")
echo "  failure run $fl vs no-failure run $nf: $(echo "100 * ($fl / $nf - 1)" | bc -l | xargs printf '%+.2f')%"
echo "  data-parallel AdamW baseline (4 ranks x batch 4, $bsteps steps = the no-failure run's $tokens tokens): $bl"

echo
echo "== syncer merge latency (decode, merge, outer step, sends) vs one learner step"
step_ms=$(awk -F, 'NR > 1 { s += $11; n++ } END { printf "%.1f", 1000 * s / n }' "$DIR/fail.l0.csv")
grep "stopped" "$DIR/fail.syncer.log" | sed 's/^\[syncer\] stopped: /  P=4, this model:  /'
echo "  (a step of learner 0, the fastest, averaged $step_ms ms)"

# P = 24 on the demo model (842,496 parameters): 2 learners for T24 seconds.
DEMO="--layers 4 --dim 128 --heads 4 --context 128 --batch 4 --threads 1"
$SYNCER --endpoint "ipc://$DIR/p24.ipc" --endpoint-file "$DIR/p24.ep" --fragments 24 --quorum 2 --H 48 --overlap 2 \
  --codec int4 --merge radial-tokens --timeout 2 --heartbeat 0.1 > "$DIR/p24.syncer.log" 2>&1 &
spid=$!
while [ ! -s "$DIR/p24.ep" ]; do sleep 0.05; done
for i in 0 1; do
  $GPT $DEMO $SCHED --optim decoupled --ranks 1 --syncer "ipc://$DIR/p24.ipc" --learner-id $i --time-limit "$T24" \
    --log "$DIR/p24.l$i.csv" > "$DIR/p24.l$i.out" 2>&1 &
  eval "p$i=$!"
done
wait "$p0" "$p1" || true
kill -TERM "$spid"
wait "$spid" || true
step24=$(awk -F, 'NR > 1 { s += $11; n++ } END { printf "%.1f", 1000 * s / n }' "$DIR/p24.l0.csv")
grep "stopped" "$DIR/p24.syncer.log" | sed 's/^\[syncer\] stopped: /  P=24, demo model: /'
echo "  (a demo-model learner step averaged $step24 ms with 2 learners sharing the machine)"
echo "logs in $DIR"
