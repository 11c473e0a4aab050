/* Decoupled DiLoCo syncer math without sockets: token weights, mean/token/
 * radial merges and the Nesterov outer step against float64 references,
 * the message header (round trip, every corrupted byte rejected), and the
 * fixed point of token-weighted merging of INT4 outer gradients on a
 * synthetic quadratic where plain averaging is biased. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef DISTRO_WITH_SYNC
#include "compress/outer_codec.h"
#include "optim/outer_merge.h"
#include "sync/sync_internal.h"
#include "testutil.h"

static distro__sy_layout two_tensors(int P, distro_outer_codec c, unsigned flag1) {
  distro__sy_layout L;
  const int64_t numel[2] = {300, 77};
  const unsigned flags[2] = {0, flag1};
  cr_assert_eq(distro__sy_layout_build(&L, 2, numel, flags, 42, P, DISTRO_FRAG_SEQUENTIAL, 0, c, 64), DISTRO_OK, "%s",
               distro_last_error());
  return L;
}

/* The shared merge with its scratch, and the outer step committed the way
 * the syncer commits it (nothing written on overflow). */
static void merge(const distro__sy_layout *L, int p, distro_merge mode, int n, const float *const *delta,
                  const double *w, float *out) {
  float coef[2 * 8];
  double nrm[8];
  cr_assert_leq(n, 8);
  distro__sy_merge(L, p, mode, n, delta, w, out, coef, nrm);
}

static distro_status outer_step(float *th, float *m, const float *g, int64_t n, float lr, float mu, int nesterov,
                                float *sg, float *sm) {
  if (!distro__outer_step(th, m, g, n, lr, mu, nesterov, sg, sm)) return DISTRO_ERR_PAYLOAD;
  memcpy(th, sg, sizeof(float) * (size_t)n);
  memcpy(m, sm, sizeof(float) * (size_t)n);
  return DISTRO_OK;
}

/* The one mapping from the syncer's error codes to distro_status. */
Test(sync_math, error_codes_map_to_status) {
  const struct {
    int code;
    distro_status st;
  } want[] = {{DISTRO_SYNC_E_NONE, DISTRO_OK},           {DISTRO_SYNC_E_MALFORMED, DISTRO_ERR_PAYLOAD},
              {DISTRO_SYNC_E_CRC, DISTRO_ERR_PAYLOAD},    {DISTRO_SYNC_E_PROTOCOL, DISTRO_ERR_INVALID},
              {DISTRO_SYNC_E_UNKNOWN, DISTRO_ERR_INVALID}, {DISTRO_SYNC_E_SIGNATURE, DISTRO_ERR_SHAPE},
              {DISTRO_SYNC_E_STALE, DISTRO_ERR_INVALID},   {DISTRO_SYNC_E_PAYLOAD, DISTRO_ERR_PAYLOAD},
              {DISTRO_SYNC_E_NOT_READY, DISTRO_ERR_TIMEOUT}, {DISTRO_SYNC_E_ROUND, DISTRO_ERR_INVALID},
              {DISTRO_SYNC_E_REFUSED, DISTRO_ERR_INVALID}, {99, DISTRO_ERR_INVALID}};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    cr_assert_eq(distro_sync_error_status(want[i].code), want[i].st, "code %d (%s): %s, want %s", want[i].code,
                 distro_sync_error_name(want[i].code), distro_status_string(distro_sync_error_status(want[i].code)),
                 distro_status_string(want[i].st));
}

Test(sync_math, token_weights_match_float64) {
  const double tok[3] = {1000, 500, 0}, stp[3] = {10, 10, 4};
  double w[3];
  distro__outer_weights(DISTRO_MERGE_TOKENS, 3, tok, stp, w);
  const double r[3] = {1e5, 2.5e4, 0};
  for (int i = 0; i < 3; i++) cr_assert(fabs(w[i] - r[i] / 1.25e5) < 1e-15, "w[%d] = %g", i, w[i]);
  /* A learner that ran twice the steps for the same tokens (smaller batches) weighs half. */
  const double tok2[2] = {1000, 1000}, stp2[2] = {10, 20};
  distro__outer_weights(DISTRO_MERGE_RADIAL_TOKENS, 2, tok2, stp2, w);
  cr_assert(fabs(w[0] - 2.0 / 3) < 1e-15 && fabs(w[1] - 1.0 / 3) < 1e-15);
  const double z[2] = {0, 0};
  distro__outer_weights(DISTRO_MERGE_TOKENS, 2, z, stp2, w);
  cr_assert(w[0] == 0.5 && w[1] == 0.5, "all-zero weights fall back to uniform");
  distro__outer_weights(DISTRO_MERGE_MEAN, 2, tok2, stp2, w);
  cr_assert(w[0] == 0.5 && w[1] == 0.5);
}

static void ref_merge(const distro__sy_layout *L, int p, int radial, int n, float *const *d, const double *w,
                      double *out) {
  const distro__fragments *f = &L->frags;
  for (int g0 = f->start[p]; g0 < f->start[p + 1];) {
    int g1 = g0 + 1;
    while (g1 < f->start[p + 1] && f->pieces[g1].tensor == f->pieces[g0].tensor) g1++;
    const int64_t e0 = L->piece_elem[g0], e1 = g1 < f->start[p + 1] ? L->piece_elem[g1] : f->numel[p];
    const int plain = !radial || (L->tflags[f->pieces[g0].tensor] & DISTRO_DILOCO_PLAIN_MERGE);
    double R = 0, nr[8];
    for (int r = 0; r < n; r++) {
      double s = 0;
      for (int64_t j = e0; j < e1; j++) s += (double)d[r][j] * d[r][j];
      nr[r] = sqrt(s);
      R += w[r] * nr[r];
    }
    for (int64_t j = e0; j < e1; j++) {
      out[j] = 0;
      for (int r = 0; r < n; r++) out[j] += (plain ? w[r] : w[r] / nr[r]) * d[r][j];
    }
    if (!plain) {
      double u = 0;
      for (int64_t j = e0; j < e1; j++) u += out[j] * out[j];
      u = sqrt(u);
      for (int64_t j = e0; j < e1; j++) out[j] *= R / u;
    }
    g0 = g1;
  }
}

Test(sync_math, merges_match_float64_reference) {
  tu_rng rng = {tu_seed()};
  for (int P = 1; P <= 2; P++)
    for (int mode = 0; mode < 4; mode++) {
      distro__sy_layout L = two_tensors(P, DISTRO_OUTER_F32, DISTRO_DILOCO_PLAIN_MERGE);
      for (int p = 0; p < P; p++) {
        const int64_t n = L.frags.numel[p];
        float *d[3], *out = malloc(sizeof(float) * (size_t)n);
        double *ref = malloc(sizeof(double) * (size_t)n), w[3];
        const double tok[3] = {900, 300, 600}, stp[3] = {9, 3, 12};
        for (int r = 0; r < 3; r++) {
          d[r] = malloc(sizeof(float) * (size_t)n);
          tu_fill_normal(&rng, d[r], (size_t)n, (float)(0.5 + r));
        }
        distro__outer_weights((distro_merge)mode, 3, tok, stp, w);
        merge(&L, p, (distro_merge)mode, 3, (const float *const *)d, w, out);
        ref_merge(&L, p, mode >= 2, 3, d, w, ref);
        const long bad = tu_first_mismatch(out, ref, (size_t)n, 1e-5, 1e-5);
        cr_assert_eq(bad, -1, "P %d mode %d fragment %d element %ld: %g vs %g", P, mode, p, bad,
                     bad >= 0 ? out[bad] : 0.0, bad >= 0 ? ref[bad] : 0.0);
        for (int r = 0; r < 3; r++) free(d[r]);
        free(out);
        free(ref);
      }
      distro__sy_layout_destroy(&L);
    }
}

Test(sync_math, radial_keeps_norm_where_mean_shrinks) {
  /* Four orthogonal-ish random unit-scale deltas: the plain mean's norm is
   * about 1/2 of theirs, the radial merge keeps it. */
  tu_rng rng = {tu_seed()};
  distro__sy_layout L = two_tensors(1, DISTRO_OUTER_F32, 0);
  const int64_t n = L.frags.numel[0];
  float *d[4], *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
  double w[4] = {0.25, 0.25, 0.25, 0.25};
  for (int r = 0; r < 4; r++) {
    d[r] = malloc(sizeof(float) * (size_t)n);
    tu_fill_normal(&rng, d[r], (size_t)n, 1.0f);
  }
  merge(&L, 0, DISTRO_MERGE_MEAN, 4, (const float *const *)d, w, a);
  merge(&L, 0, DISTRO_MERGE_RADIAL, 4, (const float *const *)d, w, b);
  double na = 0, nb = 0, nd = 0;
  for (int64_t j = 0; j < 300; j++) na += a[j] * a[j], nb += b[j] * b[j], nd += d[0][j] * d[0][j];
  cr_assert(sqrt(na) < 0.65 * sqrt(nd), "mean shrinks: %g vs %g", sqrt(na), sqrt(nd));
  cr_assert(fabs(sqrt(nb) - sqrt(nd)) < 0.15 * sqrt(nd), "radial keeps the norm: %g vs %g", sqrt(nb), sqrt(nd));
  for (int r = 0; r < 4; r++) free(d[r]);
  free(a);
  free(b);
  distro__sy_layout_destroy(&L);
}

Test(sync_math, nesterov_outer_step_matches_float64) {
  const int n = 50;
  float g[50], th[50], m[50], sg[50], sm[50];
  double rth[50], rm[50];
  tu_rng rng = {tu_seed()};
  for (int i = 0; i < n; i++) th[i] = (float)tu_normal(&rng), m[i] = 0, rth[i] = th[i], rm[i] = 0;
  for (int it = 0; it < 5; it++) {
    for (int i = 0; i < n; i++) g[i] = (float)tu_normal(&rng);
    cr_assert_eq(outer_step(th, m, g, n, 0.7f, 0.9f, 1, sg, sm), DISTRO_OK);
    for (int i = 0; i < n; i++) {
      rm[i] = 0.9 * rm[i] + g[i];
      rth[i] -= 0.7 * (g[i] + 0.9 * rm[i]);
    }
  }
  cr_assert_eq(tu_first_mismatch(th, rth, n, 1e-5, 1e-5), -1);
  g[3] = 3e38f;
  th[3] = -3e38f;
  const float keep = th[0];
  cr_assert_eq(outer_step(th, m, g, n, 0.7f, 0.9f, 1, sg, sm), DISTRO_ERR_PAYLOAD);
  cr_assert(th[0] == keep, "an overflowing step writes nothing");
}

Test(sync_math, header_round_trip_and_every_corruption_rejected) {
  uint8_t payload[37], hdr[DISTRO__SY_HEADER];
  for (int i = 0; i < 37; i++) payload[i] = (uint8_t)(i * 7);
  distro__sy_msg m = {DISTRO__SY_REPORT, 3, 2, 99, 5, 4, 1000, 10, 0.0125, 37}, d;
  distro__sy_encode(&m, payload, hdr);
  char why[200];
  cr_assert_eq(distro__sy_decode(hdr, sizeof hdr, payload, 37, &d, why, sizeof why), 0, "%s", why);
  cr_assert(d.type == m.type && d.learner == 3 && d.fragment == 2 && d.epoch == 99 && d.a == 5 && d.b == 4 &&
            d.c == 1000 && d.d == 10 && d.e == 0.0125 && d.payload_bytes == 37);
  for (int i = 0; i < DISTRO__SY_HEADER; i++) {
    hdr[i] ^= 0x10;
    cr_assert_neq(distro__sy_decode(hdr, sizeof hdr, payload, 37, &d, why, sizeof why), 0, "header byte %d", i);
    hdr[i] ^= 0x10;
  }
  for (int i = 0; i < 37; i++) {
    payload[i] ^= 1;
    cr_assert_eq(distro__sy_decode(hdr, sizeof hdr, payload, 37, &d, why, sizeof why), DISTRO_SYNC_E_CRC);
    payload[i] ^= 1;
  }
  cr_assert_eq(distro__sy_decode(hdr, 71, payload, 37, &d, why, sizeof why), DISTRO_SYNC_E_MALFORMED);
  cr_assert_eq(distro__sy_decode(hdr, sizeof hdr, payload, 36, &d, why, sizeof why), DISTRO_SYNC_E_MALFORMED);
}

/* Two learners on f_m(x) = 1/2 |x - c_m|^2 (c_fast = +1, c_slow = -1); the
 * slow one does half the steps per sync (2x slower), each round of inner
 * SGD converges. The optimum of all the data processed is the token-
 * weighted mean c* = (2 c_f + c_s) / 3 = 1/3. The syncer loop below is the
 * real merge path (INT4 encode/check/decode, weights, merge, Nesterov);
 * the reference is the float64 fixed point. */
static double run_quadratic(distro_merge mode) {
  distro__sy_layout L = two_tensors(1, DISTRO_OUTER_INT4, 0);
  const int64_t n = L.frags.numel[0];
  float *G = calloc((size_t)n, 4), *mom = calloc((size_t)n, 4), *th = malloc(4 * (size_t)n), *sg = malloc(4 * (size_t)n),
        *sm = malloc(4 * (size_t)n), *out = malloc(4 * (size_t)n), *d[2];
  uint8_t *enc = malloc(L.frag_bytes[0]);
  for (int r = 0; r < 2; r++) d[r] = malloc(4 * (size_t)n);
  const double c[2] = {1, -1}, steps[2] = {24, 12};
  for (int round = 0; round < 60; round++) {
    double tok[2], stp[2], w[2];
    for (int r = 0; r < 2; r++) {
      memcpy(th, G, 4 * (size_t)n);
      for (int s = 0; s < steps[r]; s++)
        for (int64_t j = 0; j < n; j++) th[j] -= 0.5f * (th[j] - (float)c[r]);
      for (int64_t j = 0; j < n; j++) th[j] = G[j] - th[j];
      distro__outer_encode(L.codec, th, n, L.block, enc);
      cr_assert_eq(distro__outer_check(L.codec, enc, n, L.block), DISTRO_OK);
      distro__outer_decode(L.codec, enc, n, L.block, d[r]);
      tok[r] = 128 * steps[r];
      stp[r] = steps[r];
    }
    distro__outer_weights(mode, 2, tok, stp, w);
    merge(&L, 0, mode, 2, (const float *const *)d, w, out);
    cr_assert_eq(outer_step(G, mom, out, n, 0.7f, 0.5f, 1, sg, sm), DISTRO_OK);
  }
  double mean = 0;
  for (int64_t j = 0; j < n; j++) mean += G[j];
  mean /= (double)n;
  free(G), free(mom), free(th), free(sg), free(sm), free(out), free(enc), free(d[0]), free(d[1]);
  distro__sy_layout_destroy(&L);
  return mean;
}

Test(sync_math, token_weighting_recovers_quadratic_optimum) {
  /* float64 fixed point: sum_m w_m (G - c_m) = 0 with w = tokens^2/steps
   * (2:1) -> G = 1/3; plain mean -> 0. */
  const double opt = (2.0 * 1 + 1.0 * -1) / 3.0;
  const double tok = run_quadratic(DISTRO_MERGE_TOKENS), mean = run_quadratic(DISTRO_MERGE_MEAN);
  cr_log_info("token-weighted %.5f, plain mean %.5f, optimum %.5f", tok, mean, opt);
  cr_assert(fabs(tok - opt) < 0.02, "token weighting: %g vs optimum %g", tok, opt);
  cr_assert(fabs(mean - opt) > 0.3, "plain averaging should be biased: %g", mean);
}

#else
Test(sync_math, skipped) { cr_skip_test("built without libzmq (no syncer)"); }
#endif
