/* See bench_util.h. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "bench_util.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

void *bench_alloc(const char *who, size_t n) {
  void *p = aligned_alloc(64, (n + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "%s: out of memory (%zu bytes)\n", who, n);
    exit(1);
  }
  return p;
}

double bench_copy_gbs(const char *who, size_t bytes) {
  char *a = bench_alloc(who, bytes), *b = bench_alloc(who, bytes);
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  double best = 1e30;
  for (int r = 0; r < 5; r++) {
    const double t0 = bench_now();
#pragma omp parallel
    {
      const size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
      const size_t lo = bytes * id / nt, hi = bytes * (id + 1) / nt;
      memcpy(b + lo, a + lo, hi - lo);
    }
    const double t = bench_now() - t0;
    if (t < best) best = t;
  }
  free(a);
  free(b);
  return 2.0 * (double)bytes / best / 1e9;
}
