/* Sparse DiLoCo outer gradients (SparseLoCo), part 1: the compressor and the
 * outer step against an independent float64 reference (top-k of the error
 * feedback, 2-bit error within half a scale, decode order), and density 1
 * against plain DiLoCo. Bit-identical learners, save/load, bad options and
 * bad payloads are in test_sparseloco_runs.c; the codec and the payload
 * format in test_sparseloco_codec.c. */
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
#include "optim/diloco_internal.h"
#include "sparseloco_util.h"
#include "testutil.h"
#include "wire_ref.h"

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
