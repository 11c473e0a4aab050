/* A Decoupled DiLoCo learner for the launcher (run.sh): linear regression
 * y = x.w* + noise, D features, on its own data shard, plain SGD inner
 * steps, the syncer over <distro/sync.h>. Runs for --seconds, sleeping
 * --step-ms per step to emulate its speed; prints progress lines with
 * times and a final validation loss of its parameters.
 *
 *   learner --syncer EP --learner-id N --seconds S --step-ms MS
 *           [--curve-server-key F --curve-keypair F [--curve-allowed F]] [--insecure]
 *   learner --baseline --learners M --steps T   (data-parallel SGD, M x batch) */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <distro/distro.h>

#define D 256
#define B 16
#define NVAL 2048

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double normal(uint64_t *s) {
  const double u = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0,
               v = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
  return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static float wstar[D];
static void sample(uint64_t *s, float *x, float *y) {
  double t = 0;
  for (int j = 0; j < D; j++) x[j] = (float)normal(s), t += x[j] * wstar[j];
  *y = (float)(t + 0.1 * normal(s));
}
static double val_loss(const float *w, const float *bias) {
  static float X[NVAL][D], Y[NVAL];
  static int init;
  if (!init) {
    uint64_t s = 999;
    for (int i = 0; i < NVAL; i++) sample(&s, X[i], &Y[i]);
    init = 1;
  }
  double l = 0;
  for (int i = 0; i < NVAL; i++) {
    double p = bias[0];
    for (int j = 0; j < D; j++) p += (double)w[j] * X[i][j];
    l += 0.5 * (p - Y[i]) * (p - Y[i]);
  }
  return l / NVAL;
}
/* One SGD step on `batch` fresh samples. */
static void sgd(uint64_t *s, float *w, float *bias, int batch, float lr) {
  static float g[D];
  float x[D], y, gb = 0;
  memset(g, 0, sizeof g);
  for (int i = 0; i < batch; i++) {
    sample(s, x, &y);
    double p = bias[0];
    for (int j = 0; j < D; j++) p += (double)w[j] * x[j];
    const float e = (float)(p - y);
    for (int j = 0; j < D; j++) g[j] += e * x[j];
    gb += e;
  }
  for (int j = 0; j < D; j++) w[j] -= lr * g[j] / batch;
  bias[0] -= lr * gb / batch;
}

static void log_line(void *ctx, const char *line) {
  (void)ctx;
  fprintf(stderr, "%s\n", line);
}

static void usage(FILE *f) {
  fprintf(f, "usage: decoupled_learner --syncer EP --learner-id N [--seconds S] [--step-ms MS] [--lr LR]\n"
             "                         [--curve-server-key F --curve-keypair F [--curve-allowed F]] [--insecure]\n"
             "       decoupled_learner --baseline [--learners M] [--steps T]\n");
}

int main(int argc, char **argv) {
  const char *ep = NULL, *server_key = NULL, *keypair = NULL, *allowed = NULL;
  int id = 0, baseline = 0, learners = 4, steps = 1000, insecure = 0;
  double seconds = 8, step_ms = 10, lr = 0.01;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(a, "--help")) return usage(stdout), 0;
    if (!strcmp(a, "--syncer")) ep = v, i++;
    else if (!strcmp(a, "--curve-server-key")) server_key = v, i++;
    else if (!strcmp(a, "--curve-keypair")) keypair = v, i++;
    else if (!strcmp(a, "--curve-allowed")) allowed = v, i++;
    else if (!strcmp(a, "--insecure")) insecure = 1;
    else if (!strcmp(a, "--learner-id")) id = atoi(v), i++;
    else if (!strcmp(a, "--seconds")) seconds = atof(v), i++;
    else if (!strcmp(a, "--step-ms")) step_ms = atof(v), i++;
    else if (!strcmp(a, "--lr")) lr = atof(v), i++;
    else if (!strcmp(a, "--learners")) learners = atoi(v), i++;
    else if (!strcmp(a, "--steps")) steps = atoi(v), i++;
    else if (!strcmp(a, "--baseline")) baseline = 1;
    else return usage(stderr), 2;
  }
  uint64_t ws = 7;
  for (int j = 0; j < D; j++) wstar[j] = (float)(normal(&ws) / sqrt((double)D) * 2.0);
  static float w[D], bias[1];
  uint64_t data = 1000 + (uint64_t)id * 7919;
  if (baseline) {
    for (int t = 0; t < steps; t++) sgd(&data, w, bias, B * learners, (float)lr);
    printf("baseline steps %d val_loss %.6f\n", steps, val_loss(w, bias));
    return 0;
  }
  distro_learner_options o = distro_learner_options_default();
  o.syncer = ep;
  o.learner_id = id;
  o.heartbeat_s = 0.1;
  o.timeout_s = 1.0;
  o.log = log_line;
  o.curve_server_key = server_key;
  o.curve_keypair = keypair;
  o.curve_allowed = allowed;
  o.insecure = insecure;
  o.tokens_per_step = B; /* declared at HELLO: each step counts B samples */
  distro_learner *l = NULL;
  if (!ep || distro_learner_create(&o, &l) != DISTRO_OK || distro_learner_add_tensor(l, "w", w, D, 0) != DISTRO_OK ||
      distro_learner_add_tensor(l, "bias", bias, 1, DISTRO_DILOCO_PLAIN_MERGE) != DISTRO_OK ||
      distro_learner_start(l) != DISTRO_OK) {
    fprintf(stderr, "learner %d: %s\n", id, distro_last_error());
    return 1;
  }
  distro_learner_stats st;
  distro_learner_get_stats(l, &st);
  printf("learner %d joined source=%d val_loss %.6f\n", id, st.joined_from_peer, val_loss(w, bias));
  fflush(stdout);
  const double t0 = now_s();
  double busy = 0;
  long t = 0;
  while (now_s() - t0 < seconds) {
    const double a = now_s();
    sgd(&data, w, bias, B, (float)lr);
    const double until = a + step_ms * 1e-3;
    while (now_s() < until) {
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL);
    }
    busy += now_s() - a;
    distro_learner_step(l, B, &st);
    if (++t % 50 == 0) {
      printf("learner %d time %.3f step %ld val_loss %.6f goodput %.4f\n", id, now_s(), t, val_loss(w, bias),
             st.goodput);
      fflush(stdout);
    }
  }
  printf("learner %d done steps %ld steps_per_s %.2f goodput %.4f applies %llu val_loss %.6f\n", id, t,
         t / (now_s() - t0), st.goodput, (unsigned long long)st.applies, val_loss(w, bias));
  distro_learner_free(l);
  return 0;
}
