/* distro-syncer: the Decoupled DiLoCo syncer service (docs/protocol.md).
 *
 *   distro-syncer --endpoint tcp://0.0.0.0:5555 --curve-keypair F [--curve-allowed F]
 *                 [--fragments P] [--quorum K] [--codec int4] [--merge radial-tokens]
 *                 [--H 24] [--overlap 2] [--checkpoint FILE --checkpoint-every N]
 *                 [--timeout S] [--heartbeat S] [--round-timeout S] ...
 *   distro-syncer --keygen PATH      writes PATH (keypair, 0600) and PATH.pub
 *   distro-syncer --help
 *
 * Prints one line per event to stdout (merge timeline, joins, deaths,
 * rejected messages) and stops on SIGINT/SIGTERM, writing a final checkpoint. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <distro/distro.h>
#include <distro/sync.h>

static distro_syncer *g_syncer;
static double g_t0;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void on_signal(int sig) {
  (void)sig;
  distro_syncer_stop(g_syncer);
}

static void log_line(void *ctx, const char *line) {
  (void)ctx;
  printf("[syncer %9.3f] %s\n", now_s() - g_t0, line);
  fflush(stdout);
}

static int parse_codec(const char *s, distro_outer_codec *c) {
  static const char *const n[] = {"f32", "bf16", "int8", "int4", "fp4"};
  for (int i = 0; i < 5; i++)
    if (strcmp(s, n[i]) == 0) return *c = (distro_outer_codec)i, 1;
  return 0;
}
static int parse_merge(const char *s, distro_merge *m) {
  static const char *const n[] = {"mean", "tokens", "radial", "radial-tokens"};
  for (int i = 0; i < 4; i++)
    if (strcmp(s, n[i]) == 0) return *m = (distro_merge)i, 1;
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: distro-syncer --endpoint EP [options]     the Decoupled DiLoCo syncer (docs/protocol.md)\n"
          "       distro-syncer --keygen PATH               write a CURVE keypair: PATH (0600) and PATH.pub\n"
          "       distro-syncer --help\n"
          "job:      [--fragments P] [--quorum K] [--gamma G] [--H H] [--overlap TAU] [--interval S]\n"
          "          [--staleness S] [--codec f32|bf16|int8|int4|fp4] [--block B]\n"
          "          [--merge mean|tokens|radial|radial-tokens] [--outer-lr LR] [--outer-momentum MU]\n"
          "          [--no-nesterov]\n"
          "hostile:  [--robust none|trimmed|median] [--robust-f F] [--out-of-bound clip|refuse]\n"
          "          [--clip-multiple X (4)] [--report-max-rel X (100)] [--step-max-rel X (100)]\n"
          "          [--weight-cap X (2)] [--min-step-s S (0: the learner's own step times)]\n"
          "          [--quarantine-after N (3)] [--quarantine S (60)]\n"
          "liveness: [--heartbeat S] [--timeout S] [--round-timeout S (0: max(2 timeout, 3 median steps))]\n"
          "state:    [--checkpoint FILE] [--checkpoint-every N] [--no-resume]\n"
          "security: [--curve-keypair FILE] [--curve-allowed FILE] [--insecure]\n"
          "          [--model-signature HEX] [--max-params N (default 67108864)]\n"
          "          Without --curve-keypair only a loopback, ipc or inproc endpoint is served, unless\n"
          "          --insecure: anyone who reaches the port could join, download the model and report.\n"
          "other:    [--endpoint-file FILE]\n");
}

int main(int argc, char **argv) {
  distro_syncer_options o = distro_syncer_options_default();
  const char *endpoint_file = NULL;
  g_t0 = now_s();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v && (i++, 1))
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (ARG("--keygen")) {
      if (distro_sync_keygen(v) != DISTRO_OK) {
        fprintf(stderr, "distro-syncer: %s\n", distro_last_error());
        return 1;
      }
      printf("wrote %s and %s.pub\n", v, v);
      return 0;
    } else if (ARG("--endpoint")) o.endpoint = v;
    else if (ARG("--fragments")) o.fragments = atoi(v);
    else if (ARG("--quorum")) o.quorum = atoi(v);
    else if (ARG("--gamma")) o.grace_gamma = atof(v);
    else if (ARG("--H")) o.H = atoi(v);
    else if (ARG("--overlap")) o.overlap = atoi(v);
    else if (ARG("--interval")) o.interval_s = atof(v);
    else if (ARG("--staleness")) o.max_staleness = atoi(v);
    else if (ARG("--block")) o.codec_block = atoi(v);
    else if (ARG("--outer-lr")) o.outer_lr = (float)atof(v);
    else if (ARG("--outer-momentum")) o.outer_momentum = (float)atof(v);
    else if (ARG("--heartbeat")) o.heartbeat_s = atof(v);
    else if (ARG("--timeout")) o.timeout_s = atof(v);
    else if (ARG("--checkpoint")) o.checkpoint = v;
    else if (ARG("--checkpoint-every")) o.checkpoint_every = atoi(v);
    else if (ARG("--curve-keypair")) o.curve_keypair = v;
    else if (ARG("--curve-allowed")) o.curve_allowed = v;
    else if (ARG("--endpoint-file")) endpoint_file = v;
    else if (ARG("--round-timeout")) o.round_timeout_s = atof(v);
    else if (ARG("--max-params")) o.max_params = strtoll(v, NULL, 10);
    else if (ARG("--robust-f")) o.robust_f = atoi(v);
    else if (ARG("--clip-multiple")) o.clip_multiple = atof(v);
    else if (ARG("--report-max-rel")) o.report_max_rel = atof(v);
    else if (ARG("--step-max-rel")) o.step_max_rel = atof(v);
    else if (ARG("--weight-cap")) o.weight_cap = atof(v);
    else if (ARG("--min-step-s")) o.min_step_s = atof(v);
    else if (ARG("--quarantine-after")) o.quarantine_after = atoi(v);
    else if (ARG("--quarantine")) o.quarantine_s = atof(v);
    else if (ARG("--robust")) {
      if (!strcmp(v, "none")) o.robust = DISTRO_SYNC_ROBUST_NONE;
      else if (!strcmp(v, "trimmed")) o.robust = DISTRO_SYNC_ROBUST_TRIMMED;
      else if (!strcmp(v, "median")) o.robust = DISTRO_SYNC_ROBUST_MEDIAN;
      else return usage(stderr), 2;
    } else if (ARG("--out-of-bound")) {
      if (!strcmp(v, "clip")) o.out_of_bound = DISTRO_SYNC_BOUND_CLIP;
      else if (!strcmp(v, "refuse")) o.out_of_bound = DISTRO_SYNC_BOUND_REFUSE;
      else return usage(stderr), 2;
    }
    else if (ARG("--model-signature")) {
      char *end;
      o.signature = strtoull(v, &end, 16);
      if (!*v || *end || !o.signature) {
        fprintf(stderr, "distro-syncer: --model-signature wants the learners' hex signature (see their log)\n");
        return 2;
      }
    } else if (ARG("--codec")) {
      if (!parse_codec(v, &o.codec)) return usage(stderr), 2;
    } else if (ARG("--merge")) {
      if (!parse_merge(v, &o.merge)) return usage(stderr), 2;
    } else if (strcmp(a, "--no-nesterov") == 0) o.nesterov = 0;
    else if (strcmp(a, "--no-resume") == 0) o.resume = 0;
    else if (strcmp(a, "--insecure") == 0) o.insecure = 1;
    else {
      fprintf(stderr, "distro-syncer: unknown or incomplete argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
#undef ARG
  }
  o.log = log_line;
  {
    /* Log times are seconds since this moment (wall clock here, to line them up with other logs). */
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    printf("[syncer] clock zero at unix %.3f\n", (double)wall.tv_sec + 1e-9 * (double)wall.tv_nsec - (now_s() - g_t0));
  }
  if (distro_syncer_create(&o, &g_syncer) != DISTRO_OK) {
    fprintf(stderr, "distro-syncer: %s\n", distro_last_error());
    return 1;
  }
  if (endpoint_file) {
    FILE *f = fopen(endpoint_file, "w");
    if (f) {
      fprintf(f, "%s\n", distro_syncer_endpoint(g_syncer));
      fclose(f);
    }
  }
  if (o.insecure && !o.curve_keypair)
    fprintf(stderr, "distro-syncer: warning: --insecure: the endpoint is open to anyone who reaches it\n");
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  distro_status st = distro_syncer_run(g_syncer);
  if (st != DISTRO_OK) fprintf(stderr, "distro-syncer: %s\n", distro_last_error());
  distro_syncer_stats s;
  distro_syncer_get_stats(g_syncer, &s);
  if (o.checkpoint && s.initialized && distro_syncer_checkpoint(g_syncer) != DISTRO_OK)
    fprintf(stderr, "distro-syncer: final checkpoint: %s\n", distro_last_error());
  printf("[syncer] stopped: merges %llu, reports %llu, rejected %llu, rounds abandoned %llu, merge time mean %.5f s "
         "max %.5f s\n",
         (unsigned long long)s.merges, (unsigned long long)s.reports, (unsigned long long)s.rejected,
         (unsigned long long)s.abandoned, s.merge_s_mean, s.merge_s_max);
  printf("[syncer] hostile-learner defences: clipped %llu, refused %llu, capped %llu, steps not applied %llu, "
         "quarantines %llu\n",
         (unsigned long long)s.clipped, (unsigned long long)s.refused, (unsigned long long)s.capped,
         (unsigned long long)s.steps_skipped, (unsigned long long)s.quarantines);
  for (int id = 0; id < 256; id++) {
    distro_syncer_learner_stats ls;
    if (distro_syncer_get_learner_stats(g_syncer, id, &ls) != DISTRO_OK || !ls.known) continue;
    printf("[syncer] learner %d: reports %llu, merged %llu, clipped %llu, refused %llu, capped %llu, quarantines %llu, "
           "tokens/step %.6g, weight share last %.4f max %.4f\n",
           id, (unsigned long long)ls.reports, (unsigned long long)ls.merged, (unsigned long long)ls.clipped,
           (unsigned long long)ls.refused, (unsigned long long)ls.capped, (unsigned long long)ls.quarantines,
           ls.tokens_per_step, ls.weight_share, ls.weight_share_max);
  }
  distro_syncer_free(g_syncer);
  return st == DISTRO_OK ? 0 : 1;
}
