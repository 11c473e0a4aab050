/* The library owns its threading (issue 14): the DeMo step and the AdamW
 * baseline call no BLAS at all, so OpenBLAS's own thread pool can never
 * start inside the step's OpenMP regions whatever OPENBLAS_NUM_THREADS says;
 * options.threads is honoured and the caller's OpenMP thread count is
 * restored afterwards. BLAS calls are counted by interposing cblas_sgemm
 * and cblas_sgemv: this executable's definitions win over libopenblas's
 * and forward to them (openblas_get_num_threads, called below, keeps
 * libopenblas linked for RTLD_NEXT to find). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <distro/distro.h>

#include "compress/chunk.h"
#include "compress/dct.h"
#include "testutil.h"

static _Atomic long blas_calls;

typedef void (*sgemm_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE, const enum CBLAS_TRANSPOSE,
                         const blasint, const blasint, const blasint, const float, const float *, const blasint,
                         const float *, const blasint, const float, float *, const blasint);
typedef void (*sgemv_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE, const blasint, const blasint,
                         const float, const float *, const blasint, const float *, const blasint, const float,
                         float *, const blasint);

void cblas_sgemm(const enum CBLAS_ORDER o, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                 const blasint m, const blasint n, const blasint k, const float alpha, const float *a,
                 const blasint lda, const float *b, const blasint ldb, const float beta, float *c,
                 const blasint ldc) {
  blas_calls++;
  sgemm_fn next = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
  next(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_sgemv(const enum CBLAS_ORDER o, const enum CBLAS_TRANSPOSE t, const blasint m, const blasint n,
                 const float alpha, const float *a, const blasint lda, const float *x, const blasint incx,
                 const float beta, float *y, const blasint incy) {
  blas_calls++;
  sgemv_fn next = (sgemv_fn)dlsym(RTLD_NEXT, "cblas_sgemv");
  next(o, t, m, n, alpha, a, lda, x, incx, beta, y, incy);
}

/* Two tensors the step splits into many tiles and across threads. */
enum { NT = 2 };
static const int ndims[NT] = {2, 1};
static const int64_t sh0[] = {192, 256}, sh1[] = {5000};
static const int64_t *const shapes[NT] = {sh0, sh1};

typedef struct {
  distro_comm *comm;
  distro_optim *o;
  float *p[NT], *g[NT];
} one_rank;

static int64_t numel(int t) { return ndims[t] == 2 ? shapes[t][0] * shapes[t][1] : shapes[t][0]; }

static void build(one_rank *r, const distro_options *opt, uint64_t seed) {
  memset(r, 0, sizeof *r);
  cr_assert_eq(distro_comm_local_group(1, &r->comm), DISTRO_OK);
  cr_assert_eq(distro_optim_create(opt, r->comm, &r->o), DISTRO_OK, "%s", distro_last_error());
  tu_rng rng = {seed};
  for (int t = 0; t < NT; t++) {
    const int64_t n = numel(t);
    r->p[t] = malloc(sizeof(float) * (size_t)n);
    r->g[t] = malloc(sizeof(float) * (size_t)n);
    cr_assert(r->p[t] && r->g[t]);
    for (int64_t i = 0; i < n; i++) {
      r->p[t][i] = (float)tu_normal(&rng);
      r->g[t][i] = (float)tu_normal(&rng);
    }
    char name[16];
    snprintf(name, sizeof name, "t%d", t);
    cr_assert_eq(distro_optim_add_param(r->o, name, r->p[t], r->g[t], ndims[t], shapes[t]), DISTRO_OK, "%s",
                 distro_last_error());
  }
}

static void release(one_rank *r) {
  distro_optim_free(r->o);
  distro_comm_free(r->comm);
  for (int t = 0; t < NT; t++) {
    free(r->p[t]);
    free(r->g[t]);
  }
}

static distro_options demo_options(distro_update u) {
  distro_options opt = distro_options_default(DISTRO_ALG_DEMO);
  opt.update = u;
  return opt;
}

/* The counter is live: the whole-tensor GEMM DCT (SparseLoCo's, outside
 * the DeMo step) goes through it. Without this the next tests could pass
 * with an interposer that never fires. */
Test(threads, blas_counter_sees_the_gemm_dct) {
  distro__tiling t;
  cr_assert_eq(distro__tiling_init(&t, 2, sh0, 32, 8), DISTRO_OK);
  distro__dct_plan plan;
  cr_assert_eq(distro__dct_plan_init(&plan, &t, DISTRO__DCT_GEMM), DISTRO_OK);
  const size_t n = (size_t)(sh0[0] * sh0[1]);
  float *x = calloc(n, sizeof(float)), *c = calloc(n, sizeof(float)), *s = calloc(n, sizeof(float));
  cr_assert(x && c && s);
  const long before = blas_calls;
  distro__dct_encode_tiles(&plan, x, c, s);
  cr_assert_gt(blas_calls, before, "the interposed cblas_sgemm was not called by the GEMM DCT");
  distro__dct_plan_destroy(&plan);
  free(x);
  free(c);
  free(s);
}

Test(threads, steps_call_no_blas) {
  const uint64_t seed = tu_seed();
  const distro_options opts[] = {demo_options(DISTRO_UPDATE_SIGN), demo_options(DISTRO_UPDATE_ADAMW),
                                 distro_options_default(DISTRO_ALG_ADAMW)};
  const char *labels[] = {"DeMo sign", "DisTrO-AdamW", "AdamW baseline"};
  for (int k = 0; k < 3; k++) {
    one_rank r;
    build(&r, &opts[k], seed + (uint64_t)k);
    const long before = blas_calls;
    const int blas_threads = openblas_get_num_threads();
    for (int s = 0; s < 3; s++) cr_assert_eq(distro_optim_step(r.o, 1e-3f, NULL), DISTRO_OK, "%s", distro_last_error());
    cr_assert_eq(blas_calls, before, "%s: %ld BLAS calls in 3 steps", labels[k], blas_calls - before);
    cr_assert_eq(openblas_get_num_threads(), blas_threads, "%s changed OpenBLAS's thread count", labels[k]);
    release(&r);
  }
}

/* options.threads = 1 steps with one OpenMP thread, gives the same bits as
 * the caller's default, and leaves the caller's thread count as it was. */
Test(threads, threads_option_restores_callers_count) {
  const uint64_t seed = tu_seed();
  omp_set_num_threads(2);
  one_rank a, b;
  distro_options one = demo_options(DISTRO_UPDATE_ADAMW);
  one.threads = 1;
  build(&a, &one, seed);
  const distro_options dflt = demo_options(DISTRO_UPDATE_ADAMW);
  build(&b, &dflt, seed);
  for (int s = 0; s < 3; s++) {
    cr_assert_eq(distro_optim_step(a.o, 1e-3f, NULL), DISTRO_OK, "%s", distro_last_error());
    cr_assert_eq(omp_get_max_threads(), 2, "step %d: the caller's OpenMP thread count became %d", s,
                 omp_get_max_threads());
    cr_assert_eq(distro_optim_step(b.o, 1e-3f, NULL), DISTRO_OK, "%s", distro_last_error());
  }
  for (int t = 0; t < NT; t++)
    cr_assert(!memcmp(a.p[t], b.p[t], sizeof(float) * (size_t)numel(t)), "tensor %d: threads 1 and 2 differ", t);
  release(&a);
  release(&b);

  distro_options bad = demo_options(DISTRO_UPDATE_SIGN);
  bad.threads = -1;
  distro_comm *c;
  distro_optim *o = NULL;
  cr_assert_eq(distro_comm_local_group(1, &c), DISTRO_OK);
  cr_assert_eq(distro_optim_create(&bad, c, &o), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "threads"), "message does not name the field: %s", distro_last_error());
  cr_assert_null(o);
  distro_comm_free(c);
}
