/* The syncer's merge of one fragment (src/sync/merge.c) for each rule: the
 * mean, token and radial merges of optim/outer_merge.h and the robust
 * trimmed mean, on n reports of random outer gradients, next to a floor
 * measured in the same run (reading the n reports and writing the result
 * once, at the memcpy bandwidth). Prints figures; asserts nothing about time.
 *
 *   bench_merge [--reports N] [--numel E] [--f F] [--min-time S] [--threads T]
 *
 * Default: 4 reports (the hostile runs' 4 learners), f = 1, a fragment of
 * 1,048,576 elements (a quarter of a 4 M model in 4 fragments). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

#include "optim/outer_merge.h"
#include "sync/sync_internal.h"


typedef struct {
  const distro__sy_layout *L;
  int n, f;
  distro_merge mode; /* -1: the trimmed mean */
  const float *const *d;
  const double *w;
  float *out, *coef;
  double *nrm;
} job;

static void run(const job *j) {
  if ((int)j->mode < 0) distro__sy_trimmed_mean(j->L, 0, j->n, j->f, j->d, j->out);
  else distro__sy_merge(j->L, 0, j->mode, j->n, j->d, j->w, j->out, j->coef, j->nrm);
}

/* Best time of the calls made in min_time seconds (at least 3). */
static double best_of(const job *j, double min_time) {
  double best = 1e30, t_end = bench_now() + min_time;
  for (int k = 0; k < 3 || bench_now() < t_end; k++) {
    const double t0 = bench_now();
    run(j);
    const double t = bench_now() - t0;
    if (t < best) best = t;
  }
  return best;
}

int main(int argc, char **argv) {
  int n = 4, f = 1, threads = 0;
  int64_t numel = 1 << 20;
  double min_time = 1.0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "bench_merge: %s needs a value\n", a);
      return 2;
    }
    if (!strcmp(a, "--reports")) n = atoi(v);
    else if (!strcmp(a, "--numel")) numel = atoll(v);
    else if (!strcmp(a, "--f")) f = atoi(v);
    else if (!strcmp(a, "--min-time")) min_time = atof(v);
    else if (!strcmp(a, "--threads")) threads = atoi(v);
    else {
      fprintf(stderr, "bench_merge: unknown option %s\n", a);
      return 2;
    }
    i++;
  }
  if (n < 1 || n > 255 || f < 0 || n < 2 * f + 1 || numel < 1) {
    fprintf(stderr, "bench_merge: need 1 <= reports <= 255, reports >= 2f + 1, numel >= 1\n");
    return 2;
  }
  if (threads > 0) omp_set_num_threads(threads);
  distro__sy_layout L;
  const unsigned flags = 0;
  if (distro__sy_layout_build(&L, 1, &numel, &flags, 0, 1, DISTRO_FRAG_BALANCED, 1 << 20, DISTRO_OUTER_F32, 64) !=
      DISTRO_OK) {
    fprintf(stderr, "bench_merge: layout: %s\n", distro_last_error());
    return 1;
  }
  float **d = malloc(sizeof(float *) * (size_t)n);
  double *w = malloc(sizeof(double) * (size_t)n), *nrm = malloc(sizeof(double) * (size_t)n);
  float *coef = malloc(sizeof(float) * 2 * (size_t)n), *out = bench_alloc("bench_merge", sizeof(float) * (size_t)numel);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int r = 0; r < n; r++) {
    d[r] = bench_alloc("bench_merge", sizeof(float) * (size_t)numel);
    for (int64_t j = 0; j < numel; j++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      d[r][j] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * 1e-3f;
    }
    w[r] = 1.0 / n;
  }
  /* read n reports, write one result */
  const double floor = 4.0 * (double)numel * (n + 1) / (bench_copy_gbs("bench_merge", (size_t)1 << 28) * 1e9);
  printf("bench_merge: %d reports of %lld elements, f = %d, %d threads; floor (read the reports, write the "
         "result, at the copy bandwidth) %.3f ms\n",
         n, (long long)numel, f, omp_get_max_threads(), 1e3 * floor);
  const struct {
    const char *name;
    int mode;
  } rules[] = {{"mean", DISTRO_MERGE_MEAN},
               {"tokens", DISTRO_MERGE_TOKENS},
               {"radial", DISTRO_MERGE_RADIAL},
               {"trimmed mean (robust)", -1}};
  double mean_s = 0;
  printf("%-22s %10s %9s %9s\n", "rule", "best ms", "x floor", "x mean");
  for (unsigned k = 0; k < sizeof rules / sizeof rules[0]; k++) {
    const job j = {&L, n, f, (distro_merge)rules[k].mode, (const float *const *)d, w, out, coef, nrm};
    const double t = best_of(&j, min_time);
    if (k == 0) mean_s = t;
    printf("%-22s %10.3f %9.2f %9.2f\n", rules[k].name, 1e3 * t, t / floor, t / mean_s);
  }
  for (int r = 0; r < n; r++) free(d[r]);
  free(d), free(w), free(nrm), free(coef), free(out);
  distro__sy_layout_destroy(&L);
  return 0;
}
