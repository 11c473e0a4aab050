/* A learner process for the syncer tests (tests/test_sync_*.c): a synthetic
 * quadratic f_m(theta) = 1/2 |theta - c_m|^2 with c_m = c + offset_m,
 * plain SGD inner steps, a fixed sleep per step (its speed). Prints
 * machine-readable lines:
 *   joined source=S versions=v0,v1,...     after start (S: 1 peer, 2 syncer, 3 seeded)
 *   param p version v crc=0x...             per fragment right after the join
 *   step t goodput g errors e rejoins r applies a rss KB no_merge S   every 10 steps
 *   done steps t goodput g                   at the end
 * Usage: sync_learner EP ID STEPS STEP_MS OFFSET [SERVE_EP|- [NPARAMS]]
 * (SERVE_EP: where it serves its state, "-" the default; NPARAMS: the model
 * size, 256 by default; the full parameters are printed only at 256). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <distro/distro.h>

static long rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) v = atol(line + 6);
  if (f) fclose(f);
  return v;
}

static void sleep_ms(double ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
  nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: sync_learner EP ID STEPS STEP_MS OFFSET [SERVE_EP|- [NPARAMS]]\n");
    return 2;
  }
  const char *ep = argv[1];
  const int id = atoi(argv[2]), steps = atoi(argv[3]);
  const double step_ms = atof(argv[4]), offset = atof(argv[5]);
  const int n = argc > 7 ? atoi(argv[7]) : 256, N1 = n / 4, N0 = n - N1;
  float *w = malloc(sizeof(float) * (size_t)n), *b = w + N0;
  if (n < 8 || !w) return 2;
  for (int i = 0; i < N0; i++) w[i] = (float)(0.5 * sin(0.37 * i));
  for (int i = 0; i < N1; i++) b[i] = (float)(0.25 * cos(0.11 * i));
  distro_learner_options o = distro_learner_options_default();
  o.syncer = ep;
  if (argc > 6 && strcmp(argv[6], "-") != 0) o.serve_endpoint = argv[6];
  o.learner_id = id;
  o.heartbeat_s = 0.1;
  o.timeout_s = 1.0;
  o.join_timeout_s = 20;
  distro_learner *l = NULL;
  if (distro_learner_create(&o, &l) != DISTRO_OK || distro_learner_add_tensor(l, "w", w, N0, 0) != DISTRO_OK ||
      distro_learner_add_tensor(l, "b", b, N1, 0) != DISTRO_OK || distro_learner_start(l) != DISTRO_OK) {
    fprintf(stderr, "learner %d: %s\n", id, distro_last_error());
    printf("failed %s\n", distro_last_error());
    return 1;
  }
  distro_learner_stats st;
  distro_learner_get_stats(l, &st);
  const int P = distro_learner_fragments(l);
  uint64_t v[64];
  distro_learner_versions(l, v, P);
  printf("joined source=%d versions=", st.joined_from_peer);
  for (int p = 0; p < P; p++) printf("%s%llu", p ? "," : "", (unsigned long long)v[p]);
  printf("\n");
  /* Full parameters right after the join, for the peer-join check. */
  if (n == 256) {
    printf("params");
    for (int i = 0; i < N0; i++) printf(" %a", (double)w[i]);
    for (int i = 0; i < N1; i++) printf(" %a", (double)b[i]);
    printf("\n");
  }
  fflush(stdout);
  const double lr = 0.2;
  for (int t = 1; t <= steps; t++) {
    for (int i = 0; i < N0; i++) w[i] -= (float)(lr * (w[i] - (1.0 + offset)));
    for (int i = 0; i < N1; i++) b[i] -= (float)(lr * (b[i] - (-1.0 + offset)));
    sleep_ms(step_ms);
    distro_learner_step(l, 128, &st);
    if (t % 10 == 0) {
      printf("step %d goodput %.4f errors %llu rejoins %llu applies %llu rss %ld no_merge %.2f\n", t, st.goodput,
             (unsigned long long)st.errors, (unsigned long long)st.rejoins, (unsigned long long)st.applies, rss_kb(),
             st.no_merge_s);
      fflush(stdout);
    }
  }
  printf("done steps %d goodput %.4f\n", steps, st.goodput);
  fflush(stdout);
  distro_learner_free(l);
  free(w);
  return 0;
}
