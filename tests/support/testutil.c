#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

uint64_t tu_next(tu_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double tu_uniform(tu_rng *r) { return (double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0); }

double tu_normal(tu_rng *r) {
  double u1 = tu_uniform(r), u2 = tu_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void tu_fill_normal(tu_rng *r, float *x, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) x[i] = (float)(scale * tu_normal(r));
}

uint64_t tu_seed(void) {
  const char *e = getenv("DISTRO_TEST_SEED");
  if (e && *e) return strtoull(e, NULL, 0);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000007ULL ^ (uint64_t)ts.tv_nsec;
}

long tu_first_mismatch(const float *a, const double *b, size_t n, double atol, double rtol) {
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (!(d <= atol + rtol * fabs(b[i]))) return (long)i;
  }
  return -1;
}
