/* Sparse DiLoCo outer gradients (SparseLoCo): the compressor and the outer
 * step against an independent float64 reference (top-k of the error
 * feedback, 2-bit error within half a scale, decode order), density 1
 * against plain DiLoCo, bit-identical learners, save/load, bad options and
 * bad payloads. The codec and the payload format: test_sparseloco_codec.c. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <distro/distro.h>

#include "comm/comm_internal.h"
#include "compress/outer_sparse.h"
#include "corrupt_comm.h"
#include "optim/diloco_internal.h"
#include "testutil.h"
#include "wire_ref.h"

/* ---- runs of M learners x R ranks ----------------------------------------------- */

#define MAXL 3
#define MAXR 2
#define MAXSYNC 8
#define NT 4
static const int ndims[NT] = {2, 1, 2, 1};
static const int64_t shapes[NT][2] = {{64, 48}, {100, 1}, {33, 7}, {600, 1}};
static const char *const tnames[NT] = {"w0", "b1", "w2", "b3"};
#define TOTAL (64 * 48 + 100 + 33 * 7 + 600)
static int64_t tnumel(int i) { return shapes[i][0] * shapes[i][1]; }
static int64_t toff(int i) {
  int64_t o = 0;
  for (int k = 0; k < i; k++) o += tnumel(k);
  return o;
}
#define SGD_EPS 1e30f /* AdamW with beta1 0, no decay, eps 1e30 and lr eta*1e30 is SGD */

typedef struct run {
  int M, R, steps;
  distro_options inner;
  distro_diloco_options dl;
  float lr;
  uint64_t seed;
  int progress; /* 1: progress thread */
  /* save after step save_after, or resume from it */
  int save_after, resume;
  char dir[64];
  float *saved[MAXL][MAXR];
  /* corruption: the n-th payload exchange (1-based) */
  int corrupt_at, corrupt_nan, nan_step, nan_learner;
  /* captured by learner 0, rank 0 at each sync */
  int nsync;
  uint8_t *payload[MAXSYNC]; /* M slots of `slot` bytes */
  size_t sizes[MAXSYNC][MAXL], slot;
  /* captured per learner (rank 0) after each step */
  float *glob[MAXL][MAXSYNC + 1], *ef[MAXL][MAXSYNC + 1];
  int ef_snap; /* 1: snapshot global and e after each sync step */
  /* outputs */
  float *out[MAXL][MAXR];
  distro_status st[MAXL][MAXR][64];
  float *before_bad[MAXL], *after_bad[MAXL], *ef_before_bad[MAXL], *ef_after_bad[MAXL];
  char err[MAXL][MAXR][300];
  distro_status sync_st[MAXL][MAXR];
  distro_diloco_stats last[MAXL][MAXR];
  uint64_t sent_sum[MAXL][MAXR];
} run;

static void run_init(run *x, int M, int R, int steps) {
  memset(x, 0, sizeof *x);
  x->M = M;
  x->R = R;
  x->steps = steps;
  x->inner = distro_options_default(DISTRO_ALG_ADAMW);
  x->inner.beta1 = 0.0f;
  x->inner.weight_decay = 0.0f;
  x->inner.eps = SGD_EPS;
  x->lr = 0.02f * SGD_EPS;
  x->dl = distro_diloco_options_sparseloco();
  x->dl.H = 3;
  x->dl.sparse_chunk = 16;
  x->dl.density = 0.05f;
  x->dl.ef_beta = 0.9f;
  x->dl.outer_lr = 0.8f;
  x->seed = tu_seed();
  x->nan_learner = -1;
}

/* A fresh run with x's settings (nothing it captured). */
static void run_like(run *dst, const run *x) {
  run_init(dst, x->M, x->R, x->steps);
  dst->inner = x->inner;
  dst->dl = x->dl;
  dst->lr = x->lr;
  dst->seed = x->seed;
  dst->progress = x->progress;
}

static void run_free(run *x) {
  for (int s = 0; s < MAXSYNC; s++) free(x->payload[s]);
  for (int m = 0; m < MAXL; m++) {
    for (int r = 0; r < MAXR; r++) {
      free(x->out[m][r]);
      free(x->saved[m][r]);
    }
    for (int s = 0; s <= MAXSYNC; s++) {
      free(x->glob[m][s]);
      free(x->ef[m][s]);
    }
    free(x->before_bad[m]);
    free(x->after_bad[m]);
    free(x->ef_before_bad[m]);
    free(x->ef_after_bad[m]);
  }
}

static void grad_fill(uint64_t seed, int m, int r, int s, float *g) {
  tu_rng rng = {seed * 1000003ULL + (uint64_t)m * 7919ULL + (uint64_t)r * 104729ULL + (uint64_t)s * 15485863ULL + 1};
  tu_fill_normal(&rng, g, TOTAL, 1.0f);
}
static void init_fill(uint64_t seed, float *p) {
  tu_rng rng = {seed ^ 0x5eedULL};
  tu_fill_normal(&rng, p, TOTAL, 1.0f);
}

/* The outer comm of one rank: records learner 0's view of every exchange,
 * and corrupts the corrupt_at-th one (a flipped byte, or a NaN value
 * behind a recomputed CRC) in learner 1's slot. */
typedef struct {
  distro_comm *inner;
  run *x;
  int learner, rank, exchanges;
} hook;

static distro_status hook_allgather(distro_comm *c, const void *send, size_t bytes, void *recv) {
  hook *k = c->impl;
  return k->inner->ops->allgather(k->inner, send, bytes, recv);
}
static distro_status hook_allgatherv(distro_comm *c, const void *send, size_t bytes, void *recv, size_t slot,
                                     size_t *sizes) {
  hook *k = c->impl;
  run *x = k->x;
  distro_status st = k->inner->ops->allgatherv(k->inner, send, bytes, recv, slot, sizes);
  if (st != DISTRO_OK) return st;
  k->exchanges++;
  if (k->exchanges == x->corrupt_at && x->M > 1) {
    uint8_t *b = (uint8_t *)recv + slot;
    if (x->corrupt_nan) { /* F32 values: the first value of section 0 */
      const size_t at = DISTRO__SPARSE_HEADER + (size_t)(NT + 1) * DISTRO__SPARSE_DESC +
                        rd32(b + DISTRO__SPARSE_HEADER + 4);
      const float nan = NAN;
      memcpy(b + at, &nan, 4);
      wr32(b + sizes[1] - 4, ref_crc32c(b, sizes[1] - 4));
    } else {
      b[sizes[1] / 2] ^= 0x08;
    }
  }
  if (k->learner == 0 && k->rank == 0 && x->nsync < MAXSYNC) {
    const int s = x->nsync++;
    x->slot = slot;
    x->payload[s] = malloc(slot * (size_t)x->M);
    memcpy(x->payload[s], recv, slot * (size_t)x->M);
    for (int m = 0; m < x->M; m++) x->sizes[s][m] = sizes[m];
  }
  return st;
}
static distro_status hook_allreduce(distro_comm *c, float *b, size_t n) {
  hook *k = c->impl;
  return k->inner->ops->allreduce_sum(k->inner, b, n);
}
static distro_status hook_barrier(distro_comm *c) {
  hook *k = c->impl;
  return k->inner->ops->barrier(k->inner);
}
static const distro__comm_ops hook_ops = {.name = "hook",
                                          .allgather = hook_allgather,
                                          .allgatherv = hook_allgatherv,
                                          .allreduce_sum = hook_allreduce,
                                          .barrier = hook_barrier};

typedef struct {
  run *x;
  int m, r;
  distro_comm *inner, *outer;
} targ;

static void global_snapshot(distro_diloco *d, float *dst) {
  for (int i = 0; i < NT; i++)
    cr_assert_eq(distro_diloco_get_global(d, tnames[i], dst + toff(i), tnumel(i)), DISTRO_OK, "%s", distro_last_error());
}

static float *ef_snapshot(const distro_diloco *d) { /* P = 1: fragment 0 holds the tensors in order */
  float *e = malloc(sizeof(float) * TOTAL);
  memcpy(e, d->ef[0], sizeof(float) * TOTAL);
  return e;
}

static void *rank_main(void *arg) {
  targ *a = arg;
  run *x = a->x;
  const int m = a->m, r = a->r;
  hook k = {a->outer, x, m, r, 0};
  distro_comm wrapped = {.ops = &hook_ops, .rank = a->outer->rank, .size = a->outer->size, .impl = &k};
  float *p = malloc(sizeof(float) * TOTAL), *g = calloc(TOTAL, sizeof(float));
  distro_optim *o = NULL;
  distro_diloco *d = NULL;
  char path[128];
  distro_diloco_options dlo = x->dl;
  dlo.progress_thread = x->progress;
  distro_status st = distro_optim_create(&x->inner, a->inner, &o);
  init_fill(x->seed, p);
  for (int i = 0; i < NT && st == DISTRO_OK; i++)
    st = distro_optim_add_param(o, tnames[i], p + toff(i), g + toff(i), ndims[i], shapes[i]);
  if (st == DISTRO_OK) st = distro_diloco_create(&dlo, o, &wrapped, &d);
  int start = 0;
  if (st == DISTRO_OK && x->resume) {
    snprintf(path, sizeof path, "%s/inner-%d-%d.bin", x->dir, m, r);
    st = distro_optim_load(o, path);
    snprintf(path, sizeof path, "%s/outer-%d-%d.bin", x->dir, m, r);
    if (st == DISTRO_OK) st = distro_diloco_load(d, path);
    memcpy(p, x->saved[m][r], sizeof(float) * TOTAL);
    start = x->save_after;
  }
  cr_assert_eq(st, DISTRO_OK, "setup: %s", distro_last_error());
  int syncs = 0;
  for (int s = start; s < x->steps; s++) {
    grad_fill(x->seed, m, r, s, g);
    if (s + 1 == x->nan_step && m == x->nan_learner) p[7] = NAN;
    const int bad_next = x->corrupt_at > 0 && syncs + 1 == x->corrupt_at && (s + 1) % x->dl.H == 0;
    if ((bad_next || (s + 1 == x->nan_step && x->nan_learner >= 0)) && r == 0) {
      x->before_bad[m] = malloc(sizeof(float) * TOTAL);
      global_snapshot(d, x->before_bad[m]);
      x->ef_before_bad[m] = ef_snapshot(d);
    }
    distro_diloco_stats ds;
    st = distro_diloco_step(d, x->lr, 64, &ds);
    x->st[m][r][s] = st;
    x->sent_sum[m][r] += ds.outer_bytes_sent;
    x->last[m][r] = ds;
    if (st != DISTRO_OK && !x->err[m][r][0]) snprintf(x->err[m][r], sizeof x->err[m][r], "step %d: %s", s + 1, distro_last_error());
    if (ds.fragment_sent >= 0) syncs++;
    if (x->before_bad[m] && !x->after_bad[m] && ds.fragment_sent >= 0 && r == 0) {
      x->after_bad[m] = malloc(sizeof(float) * TOTAL);
      global_snapshot(d, x->after_bad[m]);
      x->ef_after_bad[m] = ef_snapshot(d);
    }
    if (x->ef_snap && r == 0 && ds.fragment_sent >= 0 && syncs <= MAXSYNC) {
      x->glob[m][syncs] = malloc(sizeof(float) * TOTAL);
      global_snapshot(d, x->glob[m][syncs]);
      x->ef[m][syncs] = ef_snapshot(d);
    }
    if (s + 1 == x->save_after && !x->resume) {
      snprintf(path, sizeof path, "%s/inner-%d-%d.bin", x->dir, m, r);
      cr_assert_eq(distro_optim_save(o, path), DISTRO_OK, "%s", distro_last_error());
      snprintf(path, sizeof path, "%s/outer-%d-%d.bin", x->dir, m, r);
      cr_assert_eq(distro_diloco_save(d, path), DISTRO_OK, "%s", distro_last_error());
      x->saved[m][r] = malloc(sizeof(float) * TOTAL);
      memcpy(x->saved[m][r], p, sizeof(float) * TOTAL);
    }
  }
  x->sync_st[m][r] = distro_diloco_sync_all(d, NULL);
  if (x->sync_st[m][r] != DISTRO_OK && !x->err[m][r][0])
    snprintf(x->err[m][r], sizeof x->err[m][r], "sync_all: %s", distro_last_error());
  x->out[m][r] = malloc(sizeof(float) * TOTAL);
  memcpy(x->out[m][r], p, sizeof(float) * TOTAL);
  distro_diloco_free(d);
  distro_optim_free(o);
  free(p);
  free(g);
  return NULL;
}

static void run_exec(run *x) {
  distro_comm *inner[MAXL][MAXR], *outer[MAXR][MAXL];
  pthread_t th[MAXL][MAXR];
  targ args[MAXL][MAXR];
  for (int m = 0; m < x->M; m++) cr_assert_eq(distro_comm_local_group(x->R, inner[m]), DISTRO_OK);
  for (int r = 0; r < x->R; r++) cr_assert_eq(distro_comm_local_group(x->M, outer[r]), DISTRO_OK);
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++) {
      args[m][r] = (targ){x, m, r, inner[m][r], outer[r][m]};
      cr_assert_eq(pthread_create(&th[m][r], NULL, rank_main, &args[m][r]), 0);
    }
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++) pthread_join(th[m][r], NULL);
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++) {
      distro_comm_free(inner[m][r]);
      distro_comm_free(outer[r][m]);
    }
}

static void expect_ok(const run *x, const char *what) {
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++) {
      cr_assert_eq(x->err[m][r][0], 0, "%s: learner %d rank %d: %s (DISTRO_TEST_SEED=%llu)", what, m, r, x->err[m][r],
                   (unsigned long long)x->seed);
    }
}

static void expect_identical(const run *x, const run *y, const char *what) {
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++)
      cr_assert_eq(memcmp(x->out[m][r], y->out[m][r], sizeof(float) * TOTAL), 0,
                   "%s: learner %d rank %d differs (DISTRO_TEST_SEED=%llu)", what, m, r, (unsigned long long)x->seed);
}

/* ---- the float64 reference of the compressor and the outer step ---------------- */

/* Chunk geometry of the test tensors at edge 16, stated independently of the
 * library: matrices in h x w tiles, vectors in runs of 256 and the rest. */
typedef struct {
  int tensor;
  int64_t first; /* tensor-relative element of in-chunk index 0 (vectors) or tile origin */
  int h, w, cols; /* 2-D: tile h x w in a tensor of `cols` columns; 1-D: h 1, w the run, cols 0 */
  int k;
} ref_chunk;

static int ref_chunks(ref_chunk *c, double density) {
  int n = 0;
  const int tiles[NT][2] = {{16, 16}, {0, 0}, {11, 7}, {0, 0}};
  for (int t = 0; t < NT; t++) {
    if (ndims[t] == 2) {
      const int h = tiles[t][0], w = tiles[t][1], R = (int)shapes[t][0], C = (int)shapes[t][1];
      for (int tr = 0; tr < R / h; tr++)
        for (int tc = 0; tc < C / w; tc++) c[n++] = (ref_chunk){t, (int64_t)tr * h * C + tc * w, h, w, C, 0};
    } else {
      for (int64_t at = 0; at < tnumel(t); at += 256) {
        const int len = (int)(tnumel(t) - at < 256 ? tnumel(t) - at : 256);
        c[n++] = (ref_chunk){t, at, 1, len, 0, 0};
      }
    }
  }
  for (int i = 0; i < n; i++) {
    const int64_t e = (int64_t)c[i].h * c[i].w;
    int64_t k = (int64_t)floor(density * (double)e + 0.5);
    c[i].k = (int)(k < 1 ? 1 : k > e ? e : k);
  }
  return n;
}

/* Global element index of in-chunk index i. */
static int64_t ref_elem(const ref_chunk *c, int64_t i) {
  if (c->cols == 0) return toff(c->tensor) + c->first + i;
  return toff(c->tensor) + c->first + (i / c->w) * c->cols + i % c->w;
}

/* Orthonormal DCT-II basis value F[i][k] of length n. */
static double dct_f(int n, int i, int k) {
  const double ck = k == 0 ? sqrt(1.0 / n) : sqrt(2.0 / n);
  return ck * cos(M_PI * (2.0 * i + 1.0) * k / (2.0 * n));
}

/* In the reference, e lives per chunk in "coefficient order" (the in-chunk
 * index): the tile's DCT when dct and 2-D, else the values. */
static void ref_transform(const ref_chunk *c, const double *x, double *coef, int dct) {
  const int64_t n = (int64_t)c->h * c->w;
  for (int64_t i = 0; i < n; i++) {
    if (!dct || c->cols == 0) {
      coef[i] = x[ref_elem(c, i)];
      continue;
    }
    const int b = (int)(i / c->w), dd = (int)(i % c->w);
    double s = 0;
    for (int y = 0; y < c->h; y++)
      for (int z = 0; z < c->w; z++) s += x[ref_elem(c, (int64_t)y * c->w + z)] * dct_f(c->h, y, b) * dct_f(c->w, z, dd);
    coef[i] = s;
  }
}
static void ref_inverse_add(const ref_chunk *c, const double *coef, double scale, double *x, int dct) {
  const int64_t n = (int64_t)c->h * c->w;
  for (int64_t i = 0; i < n; i++) {
    if (!dct || c->cols == 0) {
      x[ref_elem(c, i)] += scale * coef[i];
      continue;
    }
    const int y = (int)(i / c->w), z = (int)(i % c->w);
    double s = 0;
    for (int b = 0; b < c->h; b++)
      for (int dd = 0; dd < c->w; dd++) s += coef[b * c->w + dd] * dct_f(c->h, y, b) * dct_f(c->w, z, dd);
    x[ref_elem(c, i)] += scale * s;
  }
}

/* The library's sections, for decoding the captured payloads (their
 * geometry is checked against ref_chunks). */
static int lib_sections(distro__sparse_section *s, distro__enum_table *et, double density) {
  int n = 0;
  int64_t elem = 0;
  for (int t = 0; t < NT; t++) {
    distro__tiling v[2];
    int matrix;
    const int64_t sh[2] = {shapes[t][0], shapes[t][1]};
    const int nv = distro__sparse_views(ndims[t], sh, 0, tnumel(t), 16, density, v, &matrix);
    for (int i = 0; i < nv; i++, n++) {
      distro__enum_table_init(&et[n], v[i].chunk_elems, v[i].k);
      s[n] = (distro__sparse_section){elem, v[i].rows * v[i].cols, t, v[i], 0, et[n].c ? &et[n] : NULL, 0};
      elem += s[n].count;
    }
  }
  distro__sparse_layout(s, n);
  return n;
}

/* Checks the run x (P 1, tau 0, alpha 0, M learners of one rank, no outer
 * momentum) sync by sync: each learner's selection is the top-k of the
 * reference e in every chunk (up to float ties), its 2-bit values are on the
 * levels of a scale s in [amax/2, amax/2 (1 + 2^-7)] within s/2 of e, e
 * loses exactly what was sent, the library's e and global copy follow the
 * float64 reference, and (without the DCT) the global copy is bit for bit
 * the float32 sum of the decoded values in learner order. */
static void check_against_reference(const run *x, int dct, const char *what) {
  const int M = x->M;
  const double beta = x->dl.ef_beta, olr = x->dl.outer_lr, eta = (double)x->lr / SGD_EPS;
  static ref_chunk ch[64];
  const int nch = ref_chunks(ch, x->dl.density);
  distro__sparse_section sec[8];
  distro__enum_table et[8];
  const int nsec = lib_sections(sec, et, x->dl.density);
  /* The library's chunks, in payload order, are the reference's. */
  int at = 0;
  for (int i = 0; i < nsec; i++)
    for (int64_t c = 0; c < sec[i].t.nchunks; c++, at++)
      cr_assert(at < nch && sec[i].t.chunk_elems == (int64_t)ch[at].h * ch[at].w && sec[i].t.k == ch[at].k,
                "%s: chunk %d geometry differs from the reference's", what, at);
  cr_assert_eq(at, nch);
  const int64_t nsel = sec[nsec - 1].sel + sec[nsec - 1].t.nchunks * sec[nsec - 1].t.k;
  double *glob = malloc(sizeof(double) * TOTAL), *th = malloc(sizeof(double) * TOTAL * (size_t)M);
  double *e = calloc((size_t)M * TOTAL, sizeof(double)); /* per learner, chunk-major in coefficient order */
  double *delta = malloc(sizeof(double) * TOTAL), *coef = malloc(sizeof(double) * 4096);
  double *upd = malloc(sizeof(double) * TOTAL);
  uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)nsel * (size_t)M);
  float *val = malloc(sizeof(float) * (size_t)nsel * (size_t)M), *f = malloc(sizeof(float) * TOTAL), *g = f;
  init_fill(x->seed, f);
  for (int j = 0; j < TOTAL; j++) glob[j] = f[j];
  for (int m = 0; m < M; m++)
    for (int j = 0; j < TOTAL; j++) th[(size_t)m * TOTAL + j] = glob[j];
  int sync = 0;
  for (int t = 1; t <= x->steps; t++) {
    for (int m = 0; m < M; m++) {
      grad_fill(x->seed, m, 0, t - 1, g);
      for (int j = 0; j < TOTAL; j++) th[(size_t)m * TOTAL + j] -= eta * g[j];
    }
    if (t % x->dl.H) continue;
    cr_assert(sync < x->nsync, "%s: fewer exchanges than syncs", what);
    /* Decode every learner's payload (the format is tested above). */
    distro__sparse_head want = {{DISTRO__SPARSE_VERSION, (unsigned)x->dl.sparse_values, 0, 0, (uint64_t)t, 0, 0,
                                 TOTAL, dct ? DISTRO__DLC_FLAG_DCT : 0u, 16},
                                x->dl.density};
    for (int m = 0; m < M; m++) {
      distro__dlc_head got;
      int bad;
      cr_assert_eq(distro__sparse_decode(x->payload[sync] + (size_t)m * x->slot, x->sizes[sync][m], m, sec, nsec, &want,
                                         &got, &bad, idx + (size_t)m * nsel, val + (size_t)m * nsel),
                   DISTRO_OK, "%s: sync %d learner %d: %s", what, sync, m, distro_last_error());
    }
    for (int j = 0; j < TOTAL; j++) upd[j] = 0;
    for (int m = 0; m < M; m++) {
      double *em = e + (size_t)m * TOTAL;
      for (int j = 0; j < TOTAL; j++) delta[j] = glob[j] - th[(size_t)m * TOTAL + j];
      int64_t off = 0, s0 = 0;
      for (int c = 0; c < nch; c++) {
        const int64_t n = (int64_t)ch[c].h * ch[c].w, k = ch[c].k;
        double *ec = em + off;
        ref_transform(&ch[c], delta, coef, dct);
        double emax = 0;
        for (int64_t i = 0; i < n; i++) {
          ec[i] = beta * ec[i] + coef[i];
          emax = fmax(emax, fabs(ec[i]));
        }
        const uint32_t *ci = idx + (size_t)m * nsel + s0;
        const float *cv = val + (size_t)m * nsel + s0;
        /* Top-k: no unselected |e| above a selected one, up to float drift. */
        const double tol = 1e-5 * emax + 1e-12;
        double sel_min = INFINITY, amax = 0;
        static char in[4096];
        memset(in, 0, sizeof in);
        for (int64_t j = 0; j < k; j++) {
          in[ci[j]] = 1;
          sel_min = fmin(sel_min, fabs(ec[ci[j]]));
          amax = fmax(amax, fabs(ec[ci[j]]));
        }
        for (int64_t i = 0; i < n; i++)
          cr_assert(in[i] || fabs(ec[i]) <= sel_min + tol,
                    "%s: sync %d learner %d chunk %d: index %lld (|e| %g) left out, a smaller one (%g) sent (seed %llu)",
                    what, sync, m, c, (long long)i, fabs(ec[i]), sel_min, (unsigned long long)x->seed);
        /* 2-bit values: the levels (q + 1/2) s of one scale, within s/2. */
        if (x->dl.sparse_values == DISTRO_VALUES_INT2) {
          double s = 0;
          for (int64_t j = 0; j < k; j++) s = fmax(s, fabs((double)cv[j]) / 1.5);
          cr_assert(s >= amax / 2 * (1 - 1e-5) - 1e-12 && s <= amax / 2 * (1 + ldexp(1, -7)) * (1 + 1e-5) + 1e-12,
                    "%s: sync %d learner %d chunk %d: scale %g for amax %g", what, sync, m, c, s, amax);
          for (int64_t j = 0; j < k; j++) {
            const double v = cv[j];
            cr_assert(fabs(fabs(v) - 0.5 * s) <= 1e-6 * s || fabs(fabs(v) - 1.5 * s) <= 1e-6 * s,
                      "%s: value %g is not a level of scale %g", what, v, s);
            cr_assert(fabs(v - ec[ci[j]]) <= s / 2 * (1 + 1e-5) + tol,
                      "%s: sync %d learner %d chunk %d: %g sent for %g, more than s/2 = %g away (seed %llu)", what,
                      sync, m, c, v, ec[ci[j]], s / 2, (unsigned long long)x->seed);
          }
        } else {
          for (int64_t j = 0; j < k; j++)
            cr_assert(fabs(cv[j] - ec[ci[j]]) <= tol, "%s: exact values expected", what);
        }
        /* What was sent leaves e; the mean of the sends is the update. */
        for (int64_t i = 0; i < n; i++) coef[i] = 0;
        for (int64_t j = 0; j < k; j++) {
          ec[ci[j]] -= cv[j];
          coef[ci[j]] = cv[j];
        }
        ref_inverse_add(&ch[c], coef, 1.0 / M, upd, dct);
        off += n;
        s0 += k;
      }
    }
    sync++;
    for (int j = 0; j < TOTAL; j++) glob[j] -= olr * upd[j];
    for (int m = 0; m < M; m++)
      for (int j = 0; j < TOTAL; j++) th[(size_t)m * TOTAL + j] = glob[j];
    /* The library's global copy and e against the reference. */
    for (int m = 0; m < M && x->glob[m][sync]; m++) {
      const long bad = tu_first_mismatch(x->glob[m][sync], glob, TOTAL, 1e-5, 1e-5);
      cr_assert_eq(bad, -1, "%s: sync %d learner %d global element %ld: %.9g vs float64 %.12g (seed %llu)", what, sync,
                   m, bad, bad >= 0 ? x->glob[m][sync][bad] : 0.0, bad >= 0 ? glob[bad] : 0.0,
                   (unsigned long long)x->seed);
      /* e: the library stores each section in its layout; map through the chunks. */
      int64_t off = 0;
      for (int c = 0; c < nch; c++) {
        const int64_t n = (int64_t)ch[c].h * ch[c].w;
        for (int64_t i = 0; i < n; i++) {
          const double want_e = e[(size_t)m * TOTAL + off + i];
          const float got_e = x->ef[m][sync][ref_elem(&ch[c], i)];
          cr_assert(fabs(got_e - want_e) <= 2e-5 * (1 + fabs(want_e)),
                    "%s: sync %d learner %d chunk %d e[%lld] = %.9g, float64 %.12g (seed %llu)", what, sync, m, c,
                    (long long)i, got_e, want_e, (unsigned long long)x->seed);
        }
        off += n;
      }
    }
    /* Decode order: without the DCT, each global element is the previous
     * one minus lr times the float32 sum, in learner order from 0, of
     * (1/M) * the decoded values at that position. */
    if (!dct && sync >= 2 && x->glob[0][sync - 1]) {
      float *acc = calloc(TOTAL, sizeof(float));
      const float w = (float)(1.0 / M);
      for (int m = 0; m < M; m++) {
        int64_t s0 = 0;
        for (int c = 0; c < nch; c++) {
          for (int64_t j = 0; j < ch[c].k; j++) {
            const int64_t el = ref_elem(&ch[c], idx[(size_t)m * nsel + s0 + j]);
            acc[el] += w * val[(size_t)m * nsel + s0 + j];
          }
          s0 += ch[c].k;
        }
      }
      for (int j = 0; j < TOTAL; j++) {
        const float want_g = x->glob[0][sync - 1][j] - x->dl.outer_lr * acc[j];
        cr_assert_eq(memcmp(&want_g, &x->glob[0][sync][j], 4), 0,
                     "%s: sync %d element %d: %.9g, the float32 learner-order sum gives %.9g", what, sync, j,
                     x->glob[0][sync][j], want_g);
      }
      free(acc);
    }
  }
  for (int i = 0; i < nsec; i++) distro__enum_table_destroy(&et[i]);
  free(glob);
  free(th);
  free(e);
  free(delta);
  free(coef);
  free(upd);
  free(idx);
  free(val);
  free(f);
}

Test(sparseloco, compressor_and_outer_step_match_float64, .timeout = 120) {
  const distro_values vals[2] = {DISTRO_VALUES_INT2, DISTRO_VALUES_F32};
  for (int dct = 0; dct < 2; dct++)
    for (int v = 0; v < 3; v++) {
      run x;
      run_init(&x, 3, 1, 12);
      x.dl.sparse_dct = dct;
      x.dl.sparse_values = vals[v % 2];
      if (v == 2) x.dl.density = 0.5f; /* positions sent by all three learners: the order of the sum shows */
      x.ef_snap = 1;
      run_exec(&x);
      char what[64];
      snprintf(what, sizeof what, "%s values, density %g, DCT %s", vals[v % 2] == DISTRO_VALUES_INT2 ? "int2" : "f32",
               (double)x.dl.density, dct ? "on" : "off");
      expect_ok(&x, what);
      cr_assert_eq(x.nsync, 4, "%s: %d exchanges", what, x.nsync);
      check_against_reference(&x, dct, what);
      run_free(&x);
    }
}

/* Density 1, f32 values and beta 0 send all of delta exactly: plain DiLoCo
 * with the same outer lr and no momentum, bit for bit, with fragments and
 * overlap too. */
Test(sparseloco, density_one_is_plain_diloco, .timeout = 60) {
  const int cfg[3][3] = {{1, 0, 0}, {2, 1, 0}, {3, 1, 1}}; /* P, tau, progress thread */
  for (int c = 0; c < 3; c++) {
    run sp, dn;
    run_init(&sp, 3, 1, 13);
    sp.dl.H = 6;
    sp.dl.fragments = cfg[c][0];
    sp.dl.overlap = cfg[c][1];
    sp.progress = cfg[c][2];
    sp.dl.density = 1.0f;
    sp.dl.sparse_values = DISTRO_VALUES_F32;
    sp.dl.ef_beta = 0.0f;
    sp.dl.outer_lr = 0.7f;
    sp.dl.merge = DISTRO_MERGE_TOKENS;
    run_like(&dn, &sp);
    dn.dl.compressor = DISTRO_OUTER_DENSE;
    dn.dl.codec = DISTRO_OUTER_F32;
    run_exec(&sp);
    run_exec(&dn);
    expect_ok(&sp, "sparse");
    expect_ok(&dn, "dense");
    expect_identical(&sp, &dn, "density 1 vs plain DiLoCo");
    run_free(&sp);
    run_free(&dn);
  }
}

/* Learners with two ranks each, fragments, overlap, the DCT: every rank of
 * every learner ends with the same bits, with or without the progress
 * thread; and the payloads are a small fraction of dense f32 ones. */
Test(sparseloco, learners_bit_identical, .timeout = 60) {
  run a, b;
  run_init(&a, 3, 2, 14);
  a.dl.H = 4;
  a.dl.fragments = 2;
  a.dl.overlap = 1;
  a.dl.sparse_dct = 1;
  a.dl.density = 0.02f;
  a.dl.merge = DISTRO_MERGE_RADIAL;
  run_like(&b, &a);
  b.progress = 1;
  run_exec(&a);
  run_exec(&b);
  expect_ok(&a, "blocking");
  expect_ok(&b, "progress thread");
  for (int m = 0; m < a.M; m++)
    for (int r = 0; r < a.R; r++)
      cr_assert_eq(memcmp(a.out[m][r], a.out[0][0], sizeof(float) * TOTAL), 0, "learner %d rank %d differs", m, r);
  expect_identical(&a, &b, "progress thread vs blocking");
  /* 7 exchanges of half the model in the steps (fragment 0 at 4, 8, 12;
   * fragment 1 at 2, 6, 10, 14): under a tenth of dense f32 payloads. */
  const uint64_t dense_f32 = 7 * 4 * (uint64_t)TOTAL / 2;
  cr_assert(a.sent_sum[0][0] > 0 && a.sent_sum[0][0] < dense_f32 / 10,
            "sparse payloads %llu bytes in all, dense f32 would be %llu", (unsigned long long)a.sent_sum[0][0],
            (unsigned long long)dense_f32);
  run_free(&a);
  run_free(&b);
}

/* Saved mid-window and between an exchange's start and its application,
 * the run continues bit for bit: e, the global copy and the pending
 * exchange are in the state. */
Test(sparseloco, save_load_continues_identically, .timeout = 60) {
  run full, first, second;
  run_init(&full, 2, 2, 15);
  full.dl.H = 6;
  full.dl.fragments = 2;
  full.dl.overlap = 1;
  full.dl.sparse_dct = 1;
  run_exec(&full);
  expect_ok(&full, "uninterrupted");
  run_like(&first, &full);
  first.save_after = 7; /* fragment 0 left at 6, fragment 1 started at 3 and 9: step 7 is mid-window */
  snprintf(first.dir, sizeof first.dir, "/tmp/distro_splc_XXXXXX");
  cr_assert_not_null(mkdtemp(first.dir));
  first.steps = 7;
  run_exec(&first);
  expect_ok(&first, "first half");
  run_like(&second, &full);
  memcpy(second.dir, first.dir, sizeof second.dir);
  memcpy(second.saved, first.saved, sizeof second.saved);
  second.save_after = 7;
  second.resume = 1;
  run_exec(&second);
  expect_ok(&second, "resumed");
  expect_identical(&full, &second, "save/load mid-run");
  /* A pending exchange too: saved at 10, one step after fragment 1 started at 9 (tau 1). */
  run third, fourth;
  run_like(&third, &full);
  memcpy(third.dir, first.dir, sizeof third.dir);
  third.save_after = 9;
  third.steps = 9;
  run_exec(&third);
  expect_ok(&third, "first half, saved with an exchange pending");
  run_like(&fourth, &full);
  memcpy(fourth.dir, first.dir, sizeof fourth.dir);
  fourth.resume = 1;
  fourth.save_after = 9;
  memcpy(fourth.saved, third.saved, sizeof fourth.saved);
  run_exec(&fourth);
  expect_ok(&fourth, "resumed with an exchange pending");
  expect_identical(&full, &fourth, "save/load with an exchange pending");
  /* A dense run refuses the sparse state, and the other way round. */
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_optim *o;
  distro_diloco *d;
  static float p[TOTAL], g[TOTAL];
  cr_assert_eq(distro_optim_create(&full.inner, c[0], &o), DISTRO_OK);
  for (int i = 0; i < NT; i++)
    cr_assert_eq(distro_optim_add_param(o, tnames[i], p + toff(i), g + toff(i), ndims[i], shapes[i]), DISTRO_OK);
  distro_diloco_options dense = full.dl;
  dense.compressor = DISTRO_OUTER_DENSE;
  cr_assert_eq(distro_diloco_create(&dense, o, c[0], &d), DISTRO_OK);
  char path[160];
  snprintf(path, sizeof path, "%s/outer-0-0.bin", first.dir);
  cr_assert_eq(distro_diloco_load(d, path), DISTRO_ERR_SHAPE);
  cr_assert(strstr(distro_last_error(), "sparse") != NULL, "%s", distro_last_error());
  snprintf(path, sizeof path, "%s/dense.bin", first.dir);
  cr_assert_eq(distro_diloco_save(d, path), DISTRO_OK, "%s", distro_last_error());
  distro_diloco_free(d);
  distro_diloco_options other = full.dl;
  cr_assert_eq(distro_diloco_create(&other, o, c[0], &d), DISTRO_OK);
  cr_assert_eq(distro_diloco_load(d, path), DISTRO_ERR_SHAPE);
  snprintf(path, sizeof path, "%s/outer-0-0.bin", first.dir);
  distro_diloco_free(d);
  other.ef_beta = 0.5f; /* a sparse state from other sparse settings */
  cr_assert_eq(distro_diloco_create(&other, o, c[0], &d), DISTRO_OK);
  cr_assert_eq(distro_diloco_load(d, path), DISTRO_ERR_SHAPE);
  cr_assert(strstr(distro_last_error(), "ef_beta") != NULL, "%s", distro_last_error());
  distro_diloco_free(d);
  distro_optim_free(o);
  distro_comm_free(c[0]);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", first.dir);
  cr_assert_eq(system(cmd), 0);
  run_free(&first); /* owns saved[] */
  memset(second.saved, 0, sizeof second.saved);
  run_free(&second);
  run_free(&third);
  memset(fourth.saved, 0, sizeof fourth.saved);
  run_free(&fourth);
  run_free(&full);
}

/* ---- bad options and bad payloads ----------------------------------------------- */

static distro_status try_create(distro_diloco_options o) {
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_options io = distro_options_default(DISTRO_ALG_ADAMW);
  distro_optim *opt = NULL;
  cr_assert_eq(distro_optim_create(&io, c[0], &opt), DISTRO_OK);
  distro_diloco *d = (distro_diloco *)0x1;
  distro_status st = distro_diloco_create(&o, opt, c[0], &d);
  if (st != DISTRO_OK) cr_assert_null(d);
  distro_diloco_free(d);
  distro_optim_free(opt);
  distro_comm_free(c[0]);
  return st;
}

Test(sparseloco, bad_options_name_the_reason) {
  const distro_diloco_options def = distro_diloco_options_sparseloco();
  cr_assert_eq(def.compressor, DISTRO_OUTER_SPARSE);
  cr_assert_eq(def.outer_momentum, 0.0f, "no outer momentum by default");
  distro_diloco_options o;
#define BAD(field, value, word)                                                                                  \
  do {                                                                                                           \
    o = def;                                                                                                     \
    o.field = value;                                                                                             \
    cr_assert_eq(try_create(o), DISTRO_ERR_INVALID, #field " = " #value " accepted");                           \
    cr_assert(strstr(distro_last_error(), word) != NULL, "%s: %s", #field, distro_last_error());                 \
  } while (0)
  BAD(density, 0.0f, "density");
  BAD(density, -0.5f, "density");
  BAD(density, 1.01f, "density");
  BAD(density, NAN, "density");
  BAD(ef_beta, 1.0f, "ef_beta");
  BAD(ef_beta, -0.1f, "ef_beta");
  BAD(ef_beta, NAN, "ef_beta");
  BAD(sparse_values, (distro_values)17, "codec");
  BAD(sparse_values, DISTRO_VALUES_SIGN1, "SIGN1");
  BAD(compressor, (distro_outer_compressor)5, "compressor");
  BAD(sparse_chunk, 0, "sparse_chunk");
  BAD(sparse_chunk, 257, "sparse_chunk");
  BAD(sparse_dct, 2, "sparse_dct");
  BAD(version, 1, "version");
  o = def;
  o.density = 1.0f;
  o.ef_beta = 0.0f;
  cr_assert_eq(try_create(o), DISTRO_OK, "the closed ends are allowed");
  /* The DeMo step does not take INT2 values. */
  distro_options io = distro_options_default(DISTRO_ALG_DEMO);
  io.values = DISTRO_VALUES_INT2;
  distro_comm *c[1];
  distro_optim *opt = NULL;
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  cr_assert_eq(distro_optim_create(&io, c[0], &opt), DISTRO_ERR_INVALID);
  distro_comm_free(c[0]);
}

/* A damaged payload (a flipped byte, or a NaN behind a valid CRC), or a
 * learner whose outer gradient is not finite: DISTRO_ERR_PAYLOAD on every
 * learner, the global copy and e untouched, and the next exchange works. */
Test(sparseloco, bad_payloads_change_nothing, .timeout = 60) {
  for (int kind = 0; kind < 3; kind++) {
    run x;
    run_init(&x, 3, 1, kind == 2 ? 6 : 12);
    if (kind < 2) {
      x.corrupt_at = 2; /* the exchange at step 6 */
      x.corrupt_nan = kind == 1;
      if (x.corrupt_nan) x.dl.sparse_values = DISTRO_VALUES_F32;
    } else {
      x.nan_step = 6;
      x.nan_learner = 2;
    }
    run_exec(&x);
    for (int m = 0; m < x.M; m++) {
      for (int s = 0; s < x.steps; s++) {
        const distro_status want = s == 5 ? DISTRO_ERR_PAYLOAD : DISTRO_OK;
        cr_assert_eq(x.st[m][0][s], want, "kind %d learner %d step %d: status %d (%s)", kind, m, s + 1, x.st[m][0][s],
                     x.err[m][0]);
      }
      cr_assert(strstr(x.err[m][0], kind == 0 ? "checksum" : kind == 1 ? "non-finite" : "not finite") != NULL,
                "kind %d: %s", kind, x.err[m][0]);
      cr_assert_not_null(x.before_bad[m]);
      cr_assert_not_null(x.after_bad[m]);
      cr_assert_eq(memcmp(x.before_bad[m], x.after_bad[m], sizeof(float) * TOTAL), 0,
                   "kind %d learner %d: the global copy moved", kind, m);
      cr_assert_eq(memcmp(x.ef_before_bad[m], x.ef_after_bad[m], sizeof(float) * TOTAL), 0,
                   "kind %d learner %d: e moved", kind, m);
      if (kind < 2) { /* the exchanges at 9 and 12 worked: learners identical at the end */
        cr_assert_eq(x.sync_st[m][0], DISTRO_OK);
        cr_assert_eq(memcmp(x.out[m][0], x.out[0][0], sizeof(float) * TOTAL), 0, "kind %d learner %d differs", kind, m);
      }
    }
    run_free(&x);
  }
}
