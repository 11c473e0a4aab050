/* Test helpers: deterministic random inputs and float comparisons. */
#ifndef DISTRO_TESTUTIL_H
#define DISTRO_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* splitmix64-based generator; each test seeds its own. */
typedef struct { uint64_t s; } tu_rng;
uint64_t tu_next(tu_rng *r);
double   tu_uniform(tu_rng *r);   /* [0, 1) */
double   tu_normal(tu_rng *r);    /* standard normal */
void     tu_fill_normal(tu_rng *r, float *x, size_t n, float scale);
/* Seed from the environment (DISTRO_TEST_SEED) or the clock, so every run
 * sees fresh inputs; the value is printed on failure by the caller. */
uint64_t tu_seed(void);

/* Max |a-b| / (atol + rtol*|b|) style check: index of the first element out
 * of tolerance, or -1. */
long tu_first_mismatch(const float *a, const double *b, size_t n, double atol, double rtol);

#endif
