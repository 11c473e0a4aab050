#!/usr/bin/env bash
# Training quality of every optimizer over seeds: adamw (all-reduce), distro
# (DeMo sign), distro-adamw and diloco, at up to three model sizes, each with
# the trainer's recommended settings for that optimizer (gpt-train --optim X
# and nothing else) at the AdamW row's lr (times --lr-scales, for the lr
# sensitivity table). A benchmark, not a test: it asserts nothing.
#
#   bench/quality/run.sh [--build DIR] [--set NAME] [--sizes small,large,xl] [--seeds 1,2,3]
#                        [--optims adamw,distro,distro-adamw,diloco] [--lr-scales 1]
#                        [--wd X] [--sampling global|shard] [--warmup F] [--ckpt-dir DIR] [--quick]
#                        [--fresh] [--report]
#
# Results are data: one row per run in bench/quality/data/NAME.tsv (default
# set "main") and its validation curve in NAME.curves.tsv, both committed.
# A run whose row is there already is skipped, so an interrupted set resumes
# where it stopped (--fresh starts the set over). --report runs nothing: it
# rebuilds the tables and docs/quality.png from the set (main unless --set
# says otherwise). Logs and per-step CSVs go to DIR/quality. Each run also
# checkpoints itself every --eval-every steps into --ckpt-dir (default
# ~/.cache/distro-quality, outside the work tree): a run that was cut off
# (a session's end, a reboot) continues from its last checkpoint when the
# set is run again, with the same result as an uninterrupted run (overlap
# runs too: a save keeps the exchange in flight).
#
# X-overlap runs optimizer X with --overlap-step (look-ahead), X-stale with
# --overlap-stale, X-sign1, X-int4 and X-int8 with --values sign1, int4 or
# int8 (X-sign1-overlap: both), X-kN with --topk N (X-k16-sign1: both). --wd
# X sets the decoupled weight decay for every run (the DisTrO report's
# schedule: 0.1; the trainer's default: 0). --sampling is gpt-train's (where
# each rank draws its windows); a set keeps the mode it was started with in
# NAME.meta (the sets measured before the option existed say shard there),
# and a run asking for another mode is refused. A new set takes --sampling,
# or the trainer's default, global. --warmup F gives every run a linear
# warm-up over the fraction F of its steps (default: each optimizer's own,
# which for adamw, distro and distro-adamw is 15% since 2026-12-03 and was
# 5% for adamw and distro-adamw before); NAME.meta keeps it too, and the
# sets from before the change say so there, so no run of another schedule is
# added to them. NAME.meta also names the CPU (model, widest vector ISA,
# cores): a set is one machine's, and a run on another CPU is refused.
# small: the demo model (4 layers, width 128, 842,496 parameters), 300 steps.
# large: 5 layers, width 256, 8 heads (4,047,616 parameters), 900 steps.
# xl:    7 layers, width 384, 6 heads (12.57 M parameters), 1800 steps.
# All: 2 ranks x batch 8 x context 128 = 2048 tokens per step (DiLoCo: 4
# learners x batch 4, the same tokens). --quick runs 30 steps of each.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=build set= sizes=small,large seeds=1,2,3 optims=adamw,distro,distro-adamw,diloco lrs=1 wd=0 sampling= warmup=
ckpt=${XDG_CACHE_HOME:-$HOME/.cache}/distro-quality
quick=0 report=0 fresh=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --set) set=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --optims) optims=$2; shift 2 ;;
    --lr-scales) lrs=$2; shift 2 ;;
    --wd) wd=$2; shift 2 ;;
    --sampling) sampling=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --ckpt-dir) ckpt=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --fresh) fresh=1; shift ;;
    --report) report=1; shift ;;
    -h|--help) sed -n '2,/^set -e/{/^set -e/d;p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "quality: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
data=$here/data
mkdir -p "$data"

# Only the main set draws docs/quality.png; any other set's figure goes to /tmp.
figure() { if [ "$1" = main ]; then echo "$here/../../docs/quality.png"; else echo "${TMPDIR:-/tmp}/quality-$1.png"; fi; }

if [ "$report" = 1 ]; then
  files=("$data/${set:-main}.tsv")
  rows=() curves=()
  for f in "${files[@]}"; do
    case "$f" in *.curves.tsv) continue ;; esac
    [ -s "$f" ] || { echo "quality: --report: no data in $f" >&2; exit 1; }
    rows+=("$f"); [ -s "${f%.tsv}.curves.tsv" ] && curves+=("${f%.tsv}.curves.tsv")
  done
  m=$data/${set:-main}.meta
  if [ -s "$m" ]; then echo "Set ${set:-main}: $(paste -sd ';' "$m" | sed 's/;/; /g')"; echo; fi
  exec "$here/report.sh" --figure "$(figure "${set:-main}")" "${rows[@]}" -- "${curves[@]}"
fi

set=${set:-main}
gpt=$build/python-free-examples/gpt/gpt-train
[ -x "$gpt" ] || { echo "quality: $gpt not built (make build)" >&2; exit 1; }
out=$build/quality
mkdir -p "$out" "$ckpt"
results=$data/$set.tsv curvefile=$data/$set.curves.tsv meta=$data/$set.meta
case $sampling in "" | global | shard) ;; *) echo "quality: --sampling must be global or shard" >&2; exit 2 ;; esac
[ "$fresh" = 1 ] && rm -f "$meta"
had=$(sed -n 's/^sampling=//p' "$meta" 2> /dev/null || true)
if [ -n "$had" ] && [ -n "$sampling" ] && [ "$had" != "$sampling" ]; then
  echo "quality: set $set was measured with --sampling $had; use another --set for $sampling" >&2; exit 2
fi
sampling=${sampling:-${had:-global}}
if [ -n "$warmup" ] && ! awk -v f="$warmup" 'BEGIN {exit !(f + 0 >= 0 && f + 0 <= 1 && f ~ /^[0-9.]+$/)}'; then
  echo "quality: --warmup must be a fraction of the steps in [0, 1]" >&2; exit 2
fi
# The label a set keeps for the trainer's own warm-ups (update it with them).
schedule=${warmup:-"trainer default: adamw, distro, distro-adamw 15%"}
hadw=$(sed -n 's/^warmup=//p' "$meta" 2> /dev/null || true)
if [ -s "$results" ] && [ "$(wc -l < "$results")" -gt 1 ] && [ "$hadw" != "$schedule" ]; then
  echo "quality: set $set was measured with warm-up '${hadw:-?}'; use another --set for '$schedule'" >&2; exit 2
fi
# The CPU a set ran on (other CPUs round differently, so a set is one
# machine's): a set with rows from before this was kept says so, and takes
# runs from any machine.
cpu="$(lscpu 2> /dev/null | sed -n 's/^Model name: *//p' | head -n 1)"
cpu="${cpu:-unknown} ($(grep -qw avx512f /proc/cpuinfo 2> /dev/null && echo avx512f ||
  { grep -qw avx2 /proc/cpuinfo 2> /dev/null && echo avx2 || echo "no avx2"; }), $(nproc) cores)"
hadc=$(sed -n 's/^cpu=//p' "$meta" 2> /dev/null || true)
if [ -s "$results" ] && [ "$(wc -l < "$results")" -gt 1 ]; then
  if [ -z "$hadc" ]; then hadc="not recorded (before 2026-12-03)"; fi
  case "$hadc" in
    "not recorded"*) ;;
    "$cpu") ;;
    *) echo "quality: set $set ran on '$hadc', this is '$cpu'; use another --set" >&2; exit 2 ;;
  esac
  cpu=$hadc
fi
# The kernels the trainer's matrix products run on (OpenBLAS picks them per
# CPU; they round differently too): a set keeps one kind.
blas=$("$gpt" --layers 1 --dim 32 --heads 2 --context 32 --batch 1 --ranks 1 --steps 1 --eval-every 0 2> /dev/null |
  sed -n 's/^matrix products: //p')
blas=${blas:-unknown}
hadb=$(sed -n 's/^blas=//p' "$meta" 2> /dev/null || true)
if [ -s "$results" ] && [ "$(wc -l < "$results")" -gt 1 ]; then
  case "$hadb" in
    "" | "not recorded"*) blas="not recorded (before 2026-12-05)" ;;
    "$blas") ;;
    *) echo "quality: set $set ran its matrix products on '$hadb', this build on '$blas'; use another --set" >&2
       exit 2 ;;
  esac
fi
# Overlap runs (X-overlap, X-stale): a save keeps the exchange in flight,
# so a checkpointed run is the run that never saves, bit for bit. From
# 2026-12-02 to 2026-12-06 a save first applied the exchange in flight, so
# the next gradient was taken at the agreed parameters, as the blocking
# step takes it, and a run saved every --eval-every steps was in part a
# blocking one (demo size, seed 1, look-ahead: 2.5957 against 2.6046); for
# the rest of 2026-12-06 overlap runs were not checkpointed, which gives
# the same runs as now. A set with flushed overlap rows says so in
# NAME.meta and takes no more of them.
ovl="exact: the run that does not save (not checkpointed, or checkpointed keeping the exchange in flight)"
hado=$(sed -n 's/^overlap=//p' "$meta" 2> /dev/null || true)
if [ -z "$hado" ] && [ -s "$results" ] && awk -F'\t' '$2 ~ /-(overlap|stale)$/ {f = 1} END {exit !f}' "$results"; then
  hado="not recorded (if run from 2026-12-02 to 2026-12-06, flushed at every checkpoint)"
fi
case "$hado" in "not checkpointed"*) hado=$ovl ;; esac # the same runs
if [ -n "$hado" ] && [ "$hado" != "$ovl" ] && [[ ",$optims," =~ -(overlap|stale), ]]; then
  echo "quality: set $set's overlap runs were $hado; use another --set" >&2; exit 2
fi
# Lines of NAME.meta other than these five (a note= on how the set's build
# differs from main, say) are the set's own and kept.
extra=$(grep -v -E '^(sampling|warmup|cpu|blas|overlap)=' "$meta" 2> /dev/null || true)
printf 'sampling=%s\nwarmup=%s\ncpu=%s\nblas=%s\noverlap=%s\n' "$sampling" "$schedule" "$cpu" "$blas" "${hado:-$ovl}" > "$meta"
[ -z "$extra" ] || printf '%s\n' "$extra" >> "$meta"
header="size	optimizer	lr	lr_scale	wd	seed	final_val	bytes_per_step	steps	params"
if [ "$fresh" = 1 ] || [ ! -s "$results" ]; then
  echo "$header" > "$results"
  echo "size	optimizer	lr_scale	wd	seed	step	val_loss" > "$curvefile"
fi

# size -> trainer flags, and the lr of AdamW at that size, which every
# optimizer's row uses (times the lr scale): 0.004 (the trainer's default)
# at the small size, 0.002 at the large one (900 steps, seed 1: 0.003 ended
# at 1.9834, 0.002 at 1.9779), 0.0013 at xl (scaled with 1/width from the two).
size_flags() {
  case "$1" in
    small) echo "--steps 300 --eval-every 25" ;;
    large) echo "--layers 5 --dim 256 --heads 8 --steps 900 --eval-every 75" ;;
    xl) echo "--layers 7 --dim 384 --heads 6 --steps 1800 --eval-every 150" ;;
    *) echo "quality: unknown size '$1'" >&2; exit 2 ;;
  esac
}
size_lr() { case "$1" in small) echo 0.004 ;; large) echo 0.002 ;; xl) echo 0.0013 ;; esac; }

IFS=, read -r -a S <<< "$sizes"
IFS=, read -r -a O <<< "$optims"
IFS=, read -r -a D <<< "$seeds"
IFS=, read -r -a L <<< "$lrs"
total=$(( ${#S[@]} * ${#O[@]} * ${#D[@]} * ${#L[@]} )) k=0 t0=$(date +%s) ran=0
echo "== bench/quality: set $set, sizes $sizes, optimizers $optims, seeds $seeds, lr x $lrs, wd $wd," \
     "$sampling sampling;" \
     "$(nproc) cores; $(date -u '+%F %T') UTC"
for size in "${S[@]}"; do
  flags=$(size_flags "$size")
  [ "$quick" = 1 ] && flags="$flags --steps 30 --eval-every 10"
  for scale in "${L[@]}"; do
    lr=$(awk -v a="$(size_lr "$size")" -v s="$scale" 'BEGIN {printf "%.6g", a * s}')
    for opt in "${O[@]}"; do
      for seed in "${D[@]}"; do
        k=$((k + 1))
        tag=$set-$size-$opt-x$scale-wd$wd-s$seed
        if awk -F'\t' -v a="$size" -v b="$opt" -v c="$scale" -v d="$wd" -v e="$seed" \
             '$1 == a && $2 == b && $4 == c && $5 == d && $6 == e {f = 1} END {exit !f}' "$results"; then
          echo "[$k/$total] $tag: in $results already"; continue
        fi
        start=$(date +%s)
        extra="" gopt=$opt
        case "$opt" in
          diloco) extra="--batch 4" ;;   # 4 learners x batch 4: the baseline's tokens
          *-overlap) gopt=${opt%-overlap} extra="--overlap-step" ;;
          *-backward) gopt=${opt%-backward} extra="--overlap-backward" ;;
          *-stale) gopt=${opt%-stale} extra="--overlap-stale" ;;
        esac
        case "$gopt" in # X-sign1-overlap: both
          *-sign1 | *-int4 | *-int8) extra="$extra --values ${gopt##*-}" gopt=${gopt%-*} ;;
        esac
        case "$gopt" in # X-k16: the coefficients kept per chunk
          *-k[0-9]*) extra="$extra --topk ${gopt##*-k}" gopt=${gopt%-k*} ;;
        esac
        # Checkpoints (not for DiLoCo, whose trainer does not save): resume
        # a run that was cut off; its CSV then holds the steps after the
        # checkpoint twice, and the last copy of each step is kept below.
        every=$(echo "$flags" | awk '{for (i = 1; i < NF; i++) if ($i == "--eval-every") n = $(i+1)} END {print n}')
        save="" ck=$ckpt/$tag.ckpt
        [ "$opt" = diloco ] || save="--save $ck --save-every $every"
        if [ -n "$save" ] && [ -s "$ck" ]; then
          save="$save --resume $ck"; echo "[$k/$total] $tag: resuming from $ck"
        else
          rm -f "$out/$tag.csv" "$out/$tag.log"
        fi
        if [ -n "$warmup" ]; then
          n=$(echo "$flags" | awk '{for (i = 1; i < NF; i++) if ($i == "--steps") n = $(i+1)} END {print n}')
          extra="$extra --warmup $(awk -v n="$n" -v f="$warmup" 'BEGIN {printf "%d", n * f + 0.5}')"
        fi
        # shellcheck disable=SC2086
        if ! "$gpt" --optim "$gopt" --seed "$seed" $flags --lr "$lr" --wd "$wd" --sampling "$sampling" $extra --print-every 100000 \
               --log "$out/$tag.csv" $save >> "$out/$tag.log" 2>&1; then
          echo "[$k/$total] $tag: FAILED (see $out/$tag.log)"; continue
        fi
        # The last copy of each step's row, in step order.
        awk -F, 'NR == 1 {print; next} {row[$1] = $0; if (!($1 in seen)) {seen[$1] = 1; ord[++n] = $1}}
                 END {for (i = 1; i <= n; i++) print row[ord[i]]}' "$out/$tag.csv" > "$out/$tag.csv.tmp" &&
          mv "$out/$tag.csv.tmp" "$out/$tag.csv"
        final=$(awk '/^final val loss/ {f = $4} END {print f}' "$out/$tag.log")
        # Mean bytes this rank sent per step (DiLoCo: amortized outer payloads).
        bytes=$(awk -F, 'NR > 1 {s += $7; n++} END {if (n) printf "%.0f", s / n}' "$out/$tag.csv")
        steps=$(awk -F, 'NR > 1 {n = $1} END {print n}' "$out/$tag.csv")
        # Parameters of the byte-level GPT (vocab 256, context 128, tied head).
        params=$(echo "$flags" | awk '{L = 4; d = 128; for (i = 1; i < NF; i++) { if ($i == "--layers") L = $(i+1);
                 if ($i == "--dim") d = $(i+1) } printf "%d", 256*d + 128*d + L*(12*d*d + 13*d) + 2*d}')
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$size" "$opt" "$lr" "$scale" "$wd" "$seed" "$final" \
               "$bytes" "$steps" "${params:-?}" >> "$results"
        awk -F, -v a="$size" -v b="$opt" -v c="$scale" -v d="$wd" -v e="$seed" -v f="$final" -v n="$steps" \
          'NR > 1 && $4 != "nan" && $1 != n {printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a, b, c, d, e, $1, $4}
           END {printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a, b, c, d, e, n, f}' "$out/$tag.csv" >> "$curvefile"
        rm -f "$ck"
        ran=$((ran + 1)) el=$(( $(date +%s) - t0 ))
        echo "[$k/$total] $tag: final val loss $final, $bytes B/step, $(( $(date +%s) - start )) s" \
             "(elapsed $((el / 60)):$(printf %02d $((el % 60))), ETA $(( el * (total - k) / k / 60 )) min)"
      done
    done
  done
done
echo
"$here/report.sh" --figure "$(figure "$set")" "$results" -- "$curvefile"
