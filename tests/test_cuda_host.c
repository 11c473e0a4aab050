/* The CUDA step's arithmetic (src/cuda/step_math.h) compiled as C and run on
 * the CPU, no GPU needed: the factored tile DCT against a float64 direct sum
 * and bit for bit against src/compress/dct.c; the selection against
 * topk.c; and whole DeMo / DisTrO-AdamW steps, three ranks, every value
 * codec, chunk 32 and 64, odd tile edges, bit for bit against the CPU
 * optimizer. Built with -ffp-contract=off, as the library is (tests/cuda_host.cmake). */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>

#include "comm/comm_internal.h"
#include "compress/chunk.h"
#include "compress/dct.h"
#include "compress/topk.h"
#include "cuda/step_math.h"
#include "cuda_emu.h"
#include "optim/optim_internal.h"
#include "optim/step_rule.h"
#include "testutil.h"

static double basis64(int64_t n, int64_t i, int64_t k) {
  double ck = k == 0 ? sqrt(1.0 / (double)n) : sqrt(2.0 / (double)n);
  return ck * cos(M_PI * (2.0 * (double)i + 1.0) * (double)k / (2.0 * (double)n));
}

/* A float64 DCT of the h x w array in (row stride ld) as two passes over
 * float64 bases: out[b][d] = sum_i Bh[i][b] sum_j in[i][j] Bw[j][d]
 * (inverse: out[i][j] = sum_b Bh[i][b] sum_d in[b][d] Bw[j][d]). */
static void ref_dct(const float *in, int ld, int h, int w, int inverse, double *out) {
  double *bh = malloc(sizeof(double) * (size_t)(h * h)), *bw = malloc(sizeof(double) * (size_t)(w * w));
  double *mid = calloc((size_t)(h * w), sizeof(double));
  for (int i = 0; i < h; i++)
    for (int b = 0; b < h; b++) bh[i * h + b] = basis64(h, i, b);
  for (int j = 0; j < w; j++)
    for (int d = 0; d < w; d++) bw[j * w + d] = basis64(w, j, d);
  for (int r = 0; r < h; r++) /* along the width */
    for (int q = 0; q < w; q++) {
      double acc = 0;
      for (int t = 0; t < w; t++) acc += (double)in[r * ld + t] * (inverse ? bw[q * w + t] : bw[t * w + q]);
      mid[r * w + q] = acc;
    }
  for (int r = 0; r < h; r++) /* along the height */
    for (int q = 0; q < w; q++) {
      double acc = 0;
      for (int t = 0; t < h; t++) acc += mid[t * w + q] * (inverse ? bh[r * h + t] : bh[t * h + r]);
      out[r * w + q] = acc;
    }
  free(bh), free(bw), free(mid);
}

static void plan_for(tile_plan *tp, int h, int w) {
  const int64_t shape[2] = {h, w};
  cr_assert_eq(distro__tiling_init(&tp->t, 2, shape, 64, 1), DISTRO_OK);
  cr_assert(tp->t.h == h && tp->t.w == w, "tile %lldx%lld for %dx%d", (long long)tp->t.h, (long long)tp->t.w, h, w);
  cr_assert_eq(distro__dct_plan_init(&tp->p, &tp->t, DISTRO__DCT_FAST), DISTRO_OK);
  distro__hd_dct_from_plan(&tp->p, &tp->D);
}

static const int shapes[][2] = {{32, 32}, {64, 64}, {32, 64}, {64, 32}, {1, 32}, {1, 64}, {32, 1}, {64, 1},
                                {7, 64},  {64, 7},  {3, 5},   {1, 1},   {6, 40}, {40, 6}, {16, 48}, {48, 16},
                                {5, 33},  {1, 13},  {13, 1},  {2, 2},   {8, 8},  {64, 40}, {4, 32}, {33, 5}};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

/* Row b of the h x w tile's positions, in the order of pos (stable). */
static void bucket_rows(const uint32_t *pos, int npos, int h, int w, uint32_t *rowstart, uint32_t *bucket) {
  memset(rowstart, 0, sizeof(uint32_t) * (size_t)(h + 1));
  for (int q = 0; q < npos; q++) rowstart[pos[q] / (uint32_t)w + 1]++;
  for (int b = 0; b < h; b++) rowstart[b + 1] += rowstart[b];
  uint32_t *fill = calloc((size_t)h, sizeof *fill);
  for (int q = 0; q < npos; q++) {
    const uint32_t b = pos[q] / (uint32_t)w;
    bucket[rowstart[b] + fill[b]++] = pos[q];
  }
  free(fill);
}

Test(cuda_host, tile_dct_matches_cpu_and_float64) {
  tu_rng rng = {tu_seed()};
  for (int s = 0; s < NSHAPES; s++) {
    const int h = shapes[s][0], w = shapes[s][1], e = h * w, ldx = w + 3;
    tile_plan tp;
    plan_for(&tp, h, w);
    float *x = malloc(sizeof(float) * (size_t)(h * ldx)), *cpu = malloc(sizeof(float) * (size_t)e);
    float *gpu = malloc(sizeof(float) * (size_t)e), *cwork = malloc(sizeof(float) * (size_t)distro__dct_tile_work(&tp.p));
    float *work = malloc(sizeof(float) * (size_t)distro__hd_tile_work(h, w));
    float *xc = malloc(sizeof(float) * (size_t)(h * ldx)), *xg = malloc(sizeof(float) * (size_t)(h * ldx));
    float *in = malloc(sizeof(float) * (size_t)e);
    double *ref = malloc(sizeof(double) * (size_t)e);
    uint32_t *pos = malloc(sizeof(uint32_t) * (size_t)e), *bucket = malloc(sizeof(uint32_t) * (size_t)e);
    uint32_t *rowstart = malloc(sizeof(uint32_t) * (size_t)(h + 1));
    for (int rep = 0; rep < 3; rep++) {
      tu_fill_normal(&rng, x, (size_t)(h * ldx), 1.0f + (float)rep * 100.0f);
      /* forward */
      distro__dct_tile_forward(&tp.p, x, ldx, cpu, cwork);
      memset(gpu, 0xff, sizeof(float) * (size_t)e);
      distro__hd_tile_forward(&tp.D, x, ldx, gpu, w, work, 0, 1);
      int64_t at = -1;
      cr_assert(same_bits(cpu, gpu, e, &at), "forward %dx%d: element %lld: cpu %a, shared %a", h, w, (long long)at,
                (double)cpu[at], (double)gpu[at]);
      double scale = 0;
      for (int i = 0; i < h; i++)
        for (int j = 0; j < w; j++) scale += (double)x[i * ldx + j] * x[i * ldx + j];
      scale = sqrt(scale);
      ref_dct(x, ldx, h, w, 0, ref);
      for (int q = 0; q < e; q++)
        cr_assert(fabs(gpu[q] - ref[q]) <= 1e-5 * scale + 1e-30, "forward %dx%d (%d,%d): %g vs float64 %g", h, w,
                  q / w, q % w, (double)gpu[q], ref[q]);
      /* dense inverse of the coefficients */
      distro__dct_tile_inverse(&tp.p, gpu, xc, ldx, cwork);
      distro__hd_tile_inverse(&tp.D, gpu, xg, ldx, work, 0, 1);
      for (int i = 0; i < h; i++)
        for (int j = 0; j < w; j++) {
          cr_assert(memcmp(&xc[i * ldx + j], &xg[i * ldx + j], sizeof(float)) == 0, "inverse %dx%d (%d,%d)", h, w, i,
                    j);
          cr_assert(fabs(xg[i * ldx + j] - x[i * ldx + j]) <= 1e-5 * scale, "round trip %dx%d (%d,%d): %g vs %g", h, w,
                    i, j, (double)xg[i * ldx + j], (double)x[i * ldx + j]);
        }
      /* sparse inverse: a few positions (sparse path) and many (dense fallback), shuffled */
      for (int pass = 0; pass < 2; pass++) {
        int npos = pass == 0 ? (e < 4 ? 1 : e / 4) : e / 2 + 1;
        if (npos > e) npos = e;
        for (int i = 0; i < e; i++) pos[i] = (uint32_t)i;
        for (int i = e - 1; i > 0; i--) {
          const int j = (int)(tu_next(&rng) % (uint64_t)(i + 1));
          const uint32_t tmp = pos[i];
          pos[i] = pos[j];
          pos[j] = tmp;
        }
        memset(in, 0, sizeof(float) * (size_t)e);
        for (int q = 0; q < npos; q++) in[pos[q]] = (float)tu_normal(&rng);
        bucket_rows(pos, npos, h, w, rowstart, bucket);
        distro__dct_tile_inverse_sparse(&tp.p, in, pos, npos, xc, ldx, cwork);
        distro__hd_tile_inverse_sparse(&tp.D, in, rowstart, bucket, npos, xg, ldx, work, 0, 1);
        double norm = 0;
        for (int q = 0; q < e; q++) norm += (double)in[q] * in[q];
        norm = sqrt(norm);
        ref_dct(in, w, h, w, 1, ref);
        for (int i = 0; i < h; i++)
          for (int j = 0; j < w; j++) {
            cr_assert(memcmp(&xc[i * ldx + j], &xg[i * ldx + j], sizeof(float)) == 0,
                      "sparse inverse %dx%d npos %d (%d,%d): %a vs %a", h, w, npos, i, j, (double)xc[i * ldx + j],
                      (double)xg[i * ldx + j]);
            cr_assert(fabs(xg[i * ldx + j] - ref[i * w + j]) <= 1e-5 * norm + 1e-30,
                      "sparse inverse %dx%d (%d,%d): %g vs float64 %g", h, w, i, j, (double)xg[i * ldx + j],
                      ref[i * w + j]);
          }
      }
    }
    free(x), free(cpu), free(gpu), free(cwork), free(work), free(xc), free(xg), free(in), free(ref), free(pos), free(bucket);
    free(rowstart);
    distro__dct_plan_destroy(&tp.p);
  }
}

Test(cuda_host, selection_matches_cpu_topk) {
  tu_rng rng = {tu_seed()};
  const int ns[] = {1, 5, 32, 40, 1024, 4096, 33 * 5};
  for (unsigned a = 0; a < sizeof ns / sizeof ns[0]; a++) {
    const int n = ns[a];
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    float *cv = malloc(sizeof(float) * (size_t)n), *gv = malloc(sizeof(float) * (size_t)n);
    uint32_t *ci = malloc(sizeof(uint32_t) * (size_t)n), *gi = malloc(sizeof(uint32_t) * (size_t)n);
    uint32_t *mag = malloc(sizeof(uint32_t) * (size_t)n);
    uint64_t *cand = malloc(sizeof(uint64_t) * (size_t)(2 * n + 16));
    int hist[256];
    for (int rep = 0; rep < 6; rep++) {
      for (int i = 0; i < n; i++) {
        double v = tu_normal(&rng);
        if (rep % 3 == 1) v = (double)(int)(v * 3.0); /* many ties, +0 and -0 */
        if (rep % 3 == 2) v = ldexp(v, (int)(tu_next(&rng) % 200) - 100);
        x[i] = (float)v;
      }
      const int ks[] = {1, 2, n / 3, n / 2, n - 1, n};
      for (unsigned b = 0; b < sizeof ks / sizeof ks[0]; b++) {
        const int k = ks[b] < 1 ? 1 : ks[b];
        distro__topk_chunk(x, n, 1, n, k, ci, cv, mag, cand);
        memcpy(y, x, sizeof(float) * (size_t)n);
        distro__hd_select(y, n, k, gi, gv, hist);
        for (int j = 0; j < k; j++) {
          cr_assert_eq(ci[j], gi[j], "n %d k %d rep %d: index #%d: cpu %u gpu %u", n, k, rep, j, ci[j], gi[j]);
          cr_assert(memcmp(&cv[j], &gv[j], sizeof(float)) == 0, "n %d k %d: value #%d", n, k, j);
          cr_assert(y[gi[j]] == 0.0f, "selected entry not zeroed");
        }
        int zeros = 0;
        for (int i = 0; i < n; i++) zeros += y[i] == 0.0f && x[i] != 0.0f;
        cr_assert(zeros <= k, "more than k entries zeroed");
      }
    }
    free(x), free(y), free(cv), free(gv), free(ci), free(gi), free(mag), free(cand);
  }
}

Test(cuda_host, adamw_baseline_element_matches_cpu) {
  tu_rng rng = {tu_seed()};
  enum { N = 5000 };
  float *p = malloc(sizeof(float) * N), *m = malloc(sizeof(float) * N), *v = malloc(sizeof(float) * N);
  float *q = malloc(sizeof(float) * N), *p2 = malloc(sizeof(float) * N), *m2 = malloc(sizeof(float) * N);
  float *v2 = malloc(sizeof(float) * N);
  tu_fill_normal(&rng, p, N, 1.0f);
  tu_fill_normal(&rng, m, N, 0.1f);
  tu_fill_normal(&rng, q, N, 3.0f);
  for (int i = 0; i < N; i++) v[i] = m[i] * m[i];
  memcpy(p2, p, sizeof(float) * N), memcpy(m2, m, sizeof(float) * N), memcpy(v2, v, sizeof(float) * N);
  distro_options o = distro_options_default(DISTRO_ALG_ADAMW);
  const float lr = 3e-4f, qs = 1.0f / 3.0f;
  const int64_t t = 7;
  distro__adamw_update(p, m, v, q, N, qs, &o, lr, t);
  const float c1 = (float)(1.0 - pow((double)o.beta1, (double)t)), c2 = (float)(1.0 - pow((double)o.beta2, (double)t));
  for (int i = 0; i < N; i++)
    distro__hd_adamw(&p2[i], &m2[i], &v2[i], q[i], qs, o.beta1, o.beta2, o.eps, lr, 1.0f - lr * o.weight_decay, c1, c2);
  int64_t at = -1;
  cr_assert(same_bits(p, p2, N, &at) && same_bits(m, m2, N, &at) && same_bits(v, v2, N, &at), "element %lld",
            (long long)at);
  free(p), free(m), free(v), free(q), free(p2), free(m2), free(v2);
}

/* ---- whole steps ------------------------------------------------------------- */

#define WORLD 3
#define STEPS 6 /* DisTrO-AdamW's rectified step is 0 for steps 1-4 (beta2 0.95) */
static const int64_t tshapes[][3] = {{2, 96, 40}, {2, 7, 64}, {1, 130, 0}, {3, 3, 5}, {2, 64, 64}, {2, 128, 96}, {2, 65, 33}};
#define NT (int)(sizeof tshapes / sizeof tshapes[0])

typedef struct {
  distro_comm *cpu_comm, *emu_comm;
  distro_options opt;
  int rank;
  char why[512];
} rank_job;

static void *run_rank(void *arg) {
  rank_job *J = arg;
  tu_rng rng = {0x1234567ull + (uint64_t)J->rank * 7919u};
  distro_optim *cpu = NULL, *hopt = NULL;
  emu E;
  memset(&E, 0, sizeof E);
  float *cparam[NT], *eparam[NT], *grad[NT];
#define FAIL(...)                                         \
  do {                                                    \
    snprintf(J->why, sizeof J->why, __VA_ARGS__);         \
    return NULL;                                          \
  } while (0)
  if (distro_optim_create(&J->opt, J->cpu_comm, &cpu) != DISTRO_OK ||
      distro_optim_create(&J->opt, J->emu_comm, &hopt) != DISTRO_OK)
    FAIL("create: %s", distro_last_error());
  if (emu_add_tensors(cpu, hopt, NT, tshapes, 0xabcdefull, cparam, eparam, grad) != 0)
    FAIL("add_param: %s", distro_last_error());
  if (distro__optim_prepare(hopt) != DISTRO_OK || distro__optim_verify(hopt, 1) != DISTRO_OK)
    FAIL("prepare: %s", distro_last_error());
  if (emu_init(&E, hopt, eparam, grad, 0) != 0) FAIL("emu_init: %s", distro_last_error());
  for (int step = 0; step < STEPS; step++) {
    for (int i = 0; i < NT; i++) tu_fill_normal(&rng, grad[i], (size_t)emu_numel(tshapes[i]), 1.0f + (float)step);
    const float lr = 0.01f / (float)(step + 1);
    if (distro_optim_step(cpu, lr, NULL) != DISTRO_OK) FAIL("cpu step %d: %s", step, distro_last_error());
    if (emu_step(&E, lr) != DISTRO_OK) FAIL("emulated step %d: %s", step, distro_last_error());
    for (int i = 0; i < NT; i++) {
      int64_t at = -1;
      if (!same_bits(cparam[i], eparam[i], emu_numel(tshapes[i]), &at))
        FAIL("rank %d step %d tensor %d (tile %lldx%lld): element %lld: cpu %a, gpu arithmetic %a", J->rank, step, i,
             (long long)hopt->tilings[i].h, (long long)hopt->tilings[i].w, (long long)at, (double)cparam[i][at],
             (double)eparam[i][at]);
    }
  }
  emu_release(&E, cpu, hopt, NT, cparam, eparam, grad);
  return NULL;
#undef FAIL
}

/* Runs fn(&jobs[r]) for every rank on its own thread and waits for all. */
static void run_ranks(void *(*fn)(void *), void *jobs, size_t job_size) {
  cr_assert_eq(emu_run_ranks(WORLD, fn, jobs, job_size), 0, "cannot start the rank threads");
}

static void run_config(distro_update update, distro_values values, int wire, int chunk) {
  distro_comm *cc[WORLD], *ec[WORLD];
  cr_assert_eq(emu_comm_groups(WORLD, cc, ec), 0);
  rank_job jobs[WORLD];
  for (int r = 0; r < WORLD; r++) {
    memset(&jobs[r], 0, sizeof jobs[r]);
    jobs[r].cpu_comm = cc[r];
    jobs[r].emu_comm = ec[r];
    jobs[r].rank = r;
    jobs[r].opt = emu_options(update, values, wire, chunk, chunk == 64 ? 48 : 7);
  }
  run_ranks(run_rank, jobs, sizeof jobs[0]);
  for (int r = 0; r < WORLD; r++) {
    cr_assert(jobs[r].why[0] == 0, "update %d values %d wire %d chunk %d: %s", (int)update, (int)values, wire, chunk,
              jobs[r].why);
    distro_comm_free(cc[r]);
    distro_comm_free(ec[r]);
  }
}

static const distro_values all_values[] = {DISTRO_VALUES_F32, DISTRO_VALUES_BF16, DISTRO_VALUES_SIGN1,
                                           DISTRO_VALUES_INT8, DISTRO_VALUES_INT4};

Test(cuda_host, demo_step_bit_identical_to_cpu, .timeout = 240) {
  for (int chunk = 32; chunk <= 64; chunk *= 2) {
    run_config(DISTRO_UPDATE_SIGN, DISTRO_VALUES_F32, 1, chunk);
    for (unsigned v = 0; v < sizeof all_values / sizeof all_values[0]; v++)
      run_config(DISTRO_UPDATE_SIGN, all_values[v], 2, chunk);
  }
}

Test(cuda_host, distro_adamw_step_bit_identical_to_cpu, .timeout = 240) {
  for (int chunk = 32; chunk <= 64; chunk *= 2) {
    run_config(DISTRO_UPDATE_ADAMW, DISTRO_VALUES_BF16, 1, chunk);
    for (unsigned v = 0; v < sizeof all_values / sizeof all_values[0]; v++)
      run_config(DISTRO_UPDATE_ADAMW, all_values[v], 2, chunk);
  }
}

/* ---- a rank that fails locally still joins the exchange ---------------------- */

typedef struct {
  distro_comm *comm;
  int rank, fail_rank, wire;
  distro_status st[2];
  char msg[2][512];
  uint64_t sent, received;
  size_t slot;
} join_job;

static void *join_rank(void *arg) {
  join_job *J = arg;
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.wire_version = J->wire;
  o.values = J->wire == 1 ? DISTRO_VALUES_F32 : DISTRO_VALUES_INT8;
  o.threads = 1;
  distro_comm_set_timeout(J->comm, 30.0);
  distro_optim *opt = NULL;
  const int64_t shape[2] = {64, 96};
  float *p = calloc(64 * 96, sizeof(float)), *g = malloc(sizeof(float) * 64 * 96);
  tu_rng rng = {99u + (uint64_t)J->rank};
  tu_fill_normal(&rng, g, 64 * 96, 1.0f);
  if (distro_optim_create(&o, J->comm, &opt) != DISTRO_OK || distro_optim_add_param(opt, "w", p, g, 2, shape) != DISTRO_OK) {
    J->st[0] = J->st[1] = DISTRO_ERR_INVALID;
    snprintf(J->msg[0], sizeof J->msg[0], "setup: %s", distro_last_error());
    return NULL;
  }
  for (int step = 0; step < 2; step++) {
    distro_step_stats s;
    memset(&s, 0, sizeof s);
    if (step == 0 && J->rank == J->fail_rank) {
      /* as the GPU step does after a CUDA error before its payload is ready */
      distro_status pst = distro__optim_prepare(opt);
      if (pst == DISTRO_OK) pst = distro__optim_verify(opt, 1);
      if (pst == DISTRO_OK) distro__payload_join_failed(opt, DISTRO_ERR_CUDA, &s);
      J->st[step] = pst == DISTRO_OK ? DISTRO_ERR_CUDA : pst;
      snprintf(J->msg[step], sizeof J->msg[step], "%s", distro_last_error());
      continue;
    }
    J->st[step] = distro_optim_step(opt, 0.01f, &s);
    snprintf(J->msg[step], sizeof J->msg[step], "%s", distro_last_error());
    if (step == 1) {
      J->sent = s.bytes_sent;
      J->received = s.bytes_received;
      J->slot = opt->slot;
    }
  }
  distro_optim_free(opt);
  free(p);
  free(g);
  return NULL;
}

/* Two steps on every rank; fail_rank (-1: none) fails its first locally. */
static void join_jobs(join_job *J, distro_comm **c, int fail_rank, int wire) {
  for (int r = 0; r < WORLD; r++) {
    memset(&J[r], 0, sizeof J[r]);
    J[r].comm = c[r];
    J[r].rank = r;
    J[r].fail_rank = fail_rank;
    J[r].wire = wire;
  }
  run_ranks(join_rank, J, sizeof J[0]);
}

Test(cuda_host, local_failure_joins_the_exchange_and_fails_every_rank, .timeout = 120) {
  for (int wire = 1; wire <= 2; wire++) {
    distro_comm *c[WORLD];
    cr_assert_eq(distro_comm_local_group(WORLD, c), DISTRO_OK);
    join_job J[WORLD];
    join_jobs(J, c, 1, wire);
    for (int r = 0; r < WORLD; r++) {
      if (r == 1) continue;
      cr_assert_eq(J[r].st[0], DISTRO_ERR_COMM, "wire v%d rank %d: the step with a failed peer gave %d (%s)", wire, r,
                   (int)J[r].st[0], J[r].msg[0]);
      cr_assert(strstr(J[r].msg[0], "rank 1") && strstr(J[r].msg[0], "failed locally") &&
                    strstr(J[r].msg[0], distro_status_string(DISTRO_ERR_CUDA)),
                "wire v%d rank %d: message '%s' names neither the rank nor the failure", wire, r, J[r].msg[0]);
    }
    /* nothing was applied anywhere, so the next step works on every rank */
    for (int r = 0; r < WORLD; r++)
      cr_assert_eq(J[r].st[1], DISTRO_OK, "wire v%d rank %d: the next step gave %d (%s)", wire, r, (int)J[r].st[1],
                   J[r].msg[1]);
    for (int r = 0; r < WORLD; r++) distro_comm_free(c[r]);
  }
}

/* ---- the step statistics of a communicator that pads (NCCL) ---------------- */

Test(cuda_host, padded_gather_statistics_count_the_padding, .timeout = 120) {
  for (int pad = 0; pad <= 1; pad++) {
    distro_comm *c[WORLD];
    cr_assert_eq(distro_comm_local_group(WORLD, c), DISTRO_OK);
    if (pad) /* the local comm's collectives, declared to pad as NCCL's does */
      for (int r = 0; r < WORLD; r++) c[r]->gatherv_pads = 1;
    join_job J[WORLD];
    join_jobs(J, c, -1, 2);
    for (int r = 0; r < WORLD; r++) {
      cr_assert_eq(J[r].st[1], DISTRO_OK, "%s", J[r].msg[1]);
      const uint64_t per = J[r].slot + sizeof(uint64_t);
      if (pad) {
        cr_assert_eq(J[r].sent, per, "padded: rank %d reports %llu bytes sent, the wire carries %llu", r,
                     (unsigned long long)J[r].sent, (unsigned long long)per);
        cr_assert_eq(J[r].received, (WORLD - 1) * per, "padded: rank %d received", r);
      } else {
        cr_assert(J[r].sent < J[r].slot, "unpadded: %llu bytes sent, slot %zu (INT8 payloads are below the bound)",
                  (unsigned long long)J[r].sent, J[r].slot);
      }
    }
    for (int r = 0; r < WORLD; r++) distro_comm_free(c[r]);
  }
}

/* ---- a non-finite momentum is refused, as on the CPU ------------------------ */

Test(cuda_host, nonfinite_momentum_and_second_moment_are_flagged) {
  tile_plan tp;
  plan_for(&tp, 32, 32);
  enum { E = 32 * 32 };
  float g[E], v[E], mom[E], next[E], work[10 * E + 64];
  uint32_t flag;
  tu_rng rng = {tu_seed()};
  for (int adam = 0; adam <= 1; adam++)
    for (int c = 0; c < 4; c++) {
      tu_fill_normal(&rng, g, E, 1.0f);
      tu_fill_normal(&rng, mom, E, 1.0f);
      for (int i = 0; i < E; i++) v[i] = 1.0f;
      if (c == 1) g[E / 3] = NAN;           /* reaches the whole tile through the DCT */
      if (c == 2 && adam) continue; /* DisTrO-AdamW's input is bounded: its momentum cannot overflow so */
      if (c == 2) { /* decay*mom + s*DCT(g) overflows */
        for (int i = 0; i < E; i++) mom[i] = 3.0e38f;
        tu_fill_normal(&rng, g, E, 1e35f);
      }
      if (c == 3) g[5] = adam ? 1e30f : INFINITY; /* adam: g^2 overflows the second moment */
      const int bad = distro__hd_compress_tile(&tp.D, g, v, NULL, adam, 0.999f, 0.5f, 1e-8f, mom, next, 32, 0.999f,
                                               adam ? 1.0f : 1e3f, work, &flag, 0, 1);
      cr_assert_eq(bad != 0, c != 0, "adam %d case %d: flag %d", adam, c, bad);
      if (c == 0)
        for (int i = 0; i < E; i++) cr_assert(isfinite(next[i]), "finite case produced a non-finite momentum");
    }
  distro__dct_plan_destroy(&tp.p);
}
