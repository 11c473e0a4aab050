/* Minimal harness for the CUDA tests (plain programs, no Criterion, so they
 * also build on GPU machines without it). Exit 77 = skipped (ctest
 * SKIP_RETURN_CODE), 1 = a check failed. */
#ifndef DISTRO_CUDA_TEST_H
#define DISTRO_CUDA_TEST_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

static int ct_failures = 0;
static unsigned long long ct_seed_used = 0;

#define CT_CHECK(cond, ...)                                                         \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      ct_failures++;                                                                \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);               \
      fprintf(stderr, __VA_ARGS__);                                                 \
      fprintf(stderr, " (DISTRO_TEST_SEED=%llu)\n", ct_seed_used);                  \
    }                                                                               \
  } while (0)

/* Fatal CUDA error inside a test. */
#define CT_CUDA(call)                                                               \
  do {                                                                              \
    cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess) {                                                        \
      fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,            \
              cudaGetErrorString(e_));                                              \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

/* Exits with 77 and says why when no CUDA device can be used. */
static inline void ct_require_gpu(const char *test) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    printf("SKIP %s: no CUDA device (%s)\n", test, e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    exit(77);
  }
  struct cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
    printf("%s: on %s (sm_%d%d)\n", test, p.name, p.major, p.minor);
}

static inline int ct_finish(const char *test) {
  if (ct_failures) {
    fprintf(stderr, "%s: %d check(s) failed\n", test, ct_failures);
    return 1;
  }
  printf("%s: OK\n", test);
  return 0;
}

#endif
