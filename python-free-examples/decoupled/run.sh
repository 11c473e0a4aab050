#!/bin/sh
# Decoupled DiLoCo launcher: a syncer and 4 learners of different speeds on
# loopback (ipc endpoints in a temp dir). Runs the job twice, once without
# failures and once with learner 3 SIGKILLed at 30% of the run and
# restarted at 60% (it joins through a peer), plus the data-parallel SGD
# baseline. Prints the merge timeline around the failure, the survivors'
# throughput before and while learner 3 is dead, goodput, merge latency
# and the final validation losses.
#
#   python-free-examples/decoupled/run.sh BUILD_DIR [SECONDS] [FRAGMENTS]
#
# CURVE=1 runs the same job with CURVE keys (what a job across machines
# needs; without keys the syncer serves only local endpoints, with a
# warning): a keypair per process, and the learners' public keys as the
# syncer's and the learners' allowed list.
set -eu
B=${1:?usage: run.sh BUILD_DIR [SECONDS] [FRAGMENTS]}
S=${2:-10}
P=${3:-4}
SYNCER=$B/distro-syncer
LEARNER=$B/python-free-examples/decoupled/decoupled_learner
DIR=$(mktemp -d /tmp/decoupled-XXXXXX)
SPEEDS="8 8 10 16"   # ms per step of learners 0..3 (learner 3 is 2x slower)
uptime_s() { cut -d' ' -f1 /proc/uptime; }
SKEYS=""
if [ "${CURVE:-0}" = 1 ]; then
  $SYNCER --keygen "$DIR/syncer.key" > /dev/null
  : > "$DIR/allowed"
  for i in 0 1 2 3; do $SYNCER --keygen "$DIR/l$i.key" > /dev/null; cat "$DIR/l$i.key.pub" >> "$DIR/allowed"; done
  SKEYS="--curve-keypair $DIR/syncer.key --curve-allowed $DIR/allowed"
fi
lkeys() { # CURVE flags of learner $1
  [ "${CURVE:-0}" = 1 ] && echo "--curve-server-key $DIR/syncer.key.pub --curve-keypair $DIR/l$1.key --curve-allowed $DIR/allowed"
  return 0
}

run() { # $1 = name, $2 = 1 to kill and restart learner 3
  name=$1
  ep=ipc://$DIR/$name.ipc
  $SYNCER --endpoint "$ep" --fragments "$P" --quorum 2 --H 24 --overlap 2 --codec int4 \
    --merge radial-tokens --timeout 1 --heartbeat 0.1 --checkpoint "$DIR/$name.ckpt" $SKEYS > "$DIR/$name.syncer.log" &
  spid=$!
  sleep 0.3
  i=0
  for ms in $SPEEDS; do
    $LEARNER --syncer "$ep" --learner-id $i --seconds "$S" --step-ms "$ms" $(lkeys $i) > "$DIR/$name.l$i.log" \
      2> "$DIR/$name.l$i.err" &
    eval "lpid$i=$!"
    i=$((i + 1))
  done
  if [ "$2" = 1 ]; then
    sleep "$(echo "$S * 0.3" | bc -l)"
    kill -9 "$lpid3"
    uptime_s > "$DIR/$name.kill"
    sleep "$(echo "$S * 0.3" | bc -l)"
    uptime_s > "$DIR/$name.restart"
    $LEARNER --syncer "$ep" --learner-id 3 --seconds "$(echo "$S * 0.4" | bc -l)" --step-ms 16 $(lkeys 3) \
      > "$DIR/$name.l3b.log" 2> "$DIR/$name.l3b.err" &
    lpid3=$!
  fi
  wait "$lpid0" "$lpid1" "$lpid2" "$lpid3" 2>/dev/null || true
  kill -TERM "$spid"
  wait "$spid" || true
}

echo "== run 1: no failures ($S s, 4 learners at $SPEEDS ms/step, P=$P, K=2, INT4, radial-token merge)"
run nofail 0
echo "== run 2: learner 3 SIGKILLed at 30%, restarted at 60%"
run fail 1

echo
echo "== merge timeline around the failure (syncer log, run 2)"
grep -n -E "timed out|joins|pulls|served|ready" "$DIR/fail.syncer.log" | sed 's/^/  /' | head -12
echo "  ... per-merge lines (time, fragment, version, quorum, live, participants, grace, waited, bytes):"
awk '/merge frag=/ {print}' "$DIR/fail.syncer.log" | awk -v n="$(grep -c 'merge frag=' "$DIR/fail.syncer.log")" \
  'NR % int(n/24 + 1) == 0' | sed 's/^/  /'

kill_t=$(cat "$DIR/fail.kill")
restart_t=$(cat "$DIR/fail.restart")
echo
echo "== survivors' throughput (steps/s), learner 3 dead from kill+1s (timeout) to restart"
for i in 0 1 2; do
  awk -v k="$kill_t" -v r="$restart_t" -v S="$S" '
    /time .* step/ {t=$4; s=$6;
      if (t >= k - 0.3*S + 0.5 && t <= k) { if (!b0) {b0=t; bs=s}; b1=t; be=s }
      if (t >= k + 1.0 && t <= r) { if (!d0) {d0=t; ds=s}; d1=t; de=s } }
    END { rb=(be-bs)/(b1-b0); rd=(de-ds)/(d1-d0);
          printf "  learner %s: %.1f before the kill, %.1f while learner 3 is dead (%+.1f%%)\n", id, rb, rd, 100*(rd/rb-1) }' \
    id=$i "$DIR/fail.l$i.log"
done

echo
echo "== goodput and final validation loss (mean of learners 0-2, their own parameters)"
for name in nofail fail; do
  awk -v name=$name '/done steps/ {n++; printf "  %-6s learner %s: steps %s, %s steps/s, goodput %s, val_loss %s\n", name, $2, $5, $7, $9, $13}
    END {}' "$DIR/$name.l0.log" "$DIR/$name.l1.log" "$DIR/$name.l2.log"
done
[ -f "$DIR/fail.l3b.log" ] && grep -E "joined|done" "$DIR/fail.l3b.log" | sed 's/^/  restarted /'
steps=$(awk '/done steps/ {s+=$5; n++} END {printf "%d", s/n}' "$DIR/nofail.l0.log" "$DIR/nofail.l1.log" "$DIR/nofail.l2.log")
base=$($LEARNER --baseline --learners 4 --steps "$steps" | awk '{print $5}')
nf=$(awk '/done steps/ {l+=$13; n++} END {printf "%.6f", l/n}' "$DIR/nofail.l0.log" "$DIR/nofail.l1.log" "$DIR/nofail.l2.log")
fl=$(awk '/done steps/ {l+=$13; n++} END {printf "%.6f", l/n}' "$DIR/fail.l0.log" "$DIR/fail.l1.log" "$DIR/fail.l2.log")
echo "  final val_loss: no-failure run $nf, with failure $fl ($(echo "100*($fl/$nf-1)" | bc -l | cut -c1-6)%), data-parallel SGD baseline ($steps steps, 4x batch) $base"
echo
echo "== syncer merge latency (run 2) vs a learner step (8-16 ms)"
grep "stopped" "$DIR/fail.syncer.log" | sed 's/^/  /'
echo "logs in $DIR"
