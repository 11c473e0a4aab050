/* Sparse DiLoCo outer gradients (SparseLoCo; docs/diloco.md): per learner an
 * error-feedback buffer e <- beta*e + delta, each chunk's top-k of e (of its
 * DCT, optionally) sent with a value codec, what was sent (decoded) removed
 * from e, and the outer step on the merge of the decoded sparse updates.
 * The payload format is compress/outer_sparse.h. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/error.h"
#include "compress/topk.h"
#include "optim/diloco_internal.h"
#include "optim/optim_internal.h"
#include "optim/outer_merge.h"

#define PAR_MIN 32768

distro_status distro__sparse_options_check(const distro_diloco_options *o) {
  if (o->compressor != DISTRO_OUTER_DENSE && o->compressor != DISTRO_OUTER_SPARSE)
    return distro__fail(DISTRO_ERR_INVALID, "diloco: unknown outer compressor %d", (int)o->compressor);
  if (!(o->density > 0.0f && o->density <= 1.0f))
    return distro__fail(DISTRO_ERR_INVALID, "diloco: density must be in (0, 1] (got %g)", (double)o->density);
  if (o->sparse_chunk < 1 || o->sparse_chunk > DISTRO__SPARSE_MAX_EDGE)
    return distro__fail(DISTRO_ERR_INVALID, "diloco: sparse_chunk must be in [1, %d] (got %d)", DISTRO__SPARSE_MAX_EDGE,
                        o->sparse_chunk);
  if (o->sparse_dct != 0 && o->sparse_dct != 1)
    return distro__fail(DISTRO_ERR_INVALID, "diloco: sparse_dct must be 0 or 1 (got %d)", o->sparse_dct);
  if (!(o->ef_beta >= 0.0f && o->ef_beta < 1.0f))
    return distro__fail(DISTRO_ERR_INVALID, "diloco: ef_beta must be in [0, 1) (got %g)", (double)o->ef_beta);
  switch (o->sparse_values) {
    case DISTRO_VALUES_F32:
    case DISTRO_VALUES_BF16:
    case DISTRO_VALUES_INT8:
    case DISTRO_VALUES_INT4:
    case DISTRO_VALUES_INT2: return DISTRO_OK;
    case DISTRO_VALUES_SIGN1:
      return distro__fail(DISTRO_ERR_INVALID, "diloco: sparse_values SIGN1 carries no magnitude; use INT2 or wider");
  }
  return distro__fail(DISTRO_ERR_INVALID, "diloco: unknown sparse_values codec %d", (int)o->sparse_values);
}

void distro__sparse_free(distro_diloco *d) {
  if (d->plans)
    for (int i = 0; d->sec_start && i < d->sec_start[d->frags.nfrag]; i++) distro__dct_plan_destroy(&d->plans[i]);
  for (int e = 0; e < d->n_etabs; e++) distro__enum_table_destroy(&d->etabs[e]);
  if (d->ef)
    for (int p = 0; p < d->frags.nfrag; p++) free(d->ef[p]);
  free(d->ef);
  free(d->plans);
  free(d->etabs);
  free(d->sec);
  free(d->sec_start);
  free(d->ef_next);
  free(d->tx_coef);
  free(d->tx_scr);
  free(d->rx_coef);
  free(d->rx_scr);
  free(d->sel_idx);
  free(d->sel_val);
  free(d->dec_idx);
  free(d->dec_val);
  free(d->sizes);
  d->ef = NULL;
  d->plans = NULL;
  d->etabs = NULL;
  d->n_etabs = 0;
  d->sec = NULL;
  d->sec_start = NULL;
  d->ef_next = d->tx_coef = d->tx_scr = d->rx_coef = d->rx_scr = d->sel_val = d->dec_val = NULL;
  d->sel_idx = d->dec_idx = NULL;
  d->sizes = NULL;
}

/* Tensors with the same chunk size and k share one ENUM table (NULL when
 * ENUM cannot code them). The table array never moves: room for all. */
static const distro__enum_table *enum_table(distro_diloco *d, const distro__tiling *t) {
  int e = 0;
  while (e < d->n_etabs && !(d->etabs[e].n == t->chunk_elems && d->etabs[e].k == t->k)) e++;
  if (e == d->n_etabs) distro__enum_table_init(&d->etabs[d->n_etabs++], t->chunk_elems, t->k);
  return d->etabs[e].c ? &d->etabs[e] : NULL;
}

distro_status distro__sparse_prepare(distro_diloco *d) {
  distro_status st = DISTRO_OK;
  const distro__fragments *f = &d->frags;
  const distro_diloco_options *o = &d->opt;
  const int P = f->nfrag, M = d->M;
  d->sec = calloc(2 * (size_t)f->npieces, sizeof *d->sec);
  d->sec_start = calloc((size_t)P + 1, sizeof *d->sec_start);
  d->etabs = calloc(2 * (size_t)f->npieces, sizeof *d->etabs);
  d->ef = calloc((size_t)P, sizeof *d->ef);
  if (!d->sec || !d->sec_start || !d->etabs || !d->ef) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  int ns = 0, any_dct = 0;
  d->max_payload = d->max_sel = d->max_sec = 0;
  for (int p = 0; p < P; p++) {
    d->sec_start[p] = ns;
    for (int q = f->start[p]; q < f->start[p + 1]; q++) {
      const distro__piece *pc = &f->pieces[q];
      const distro__param *prm = &d->inner->params[pc->tensor];
      distro__tiling t[2];
      int matrix = 0;
      const int nv = distro__sparse_views(prm->ndim, prm->shape, pc->offset, pc->count, o->sparse_chunk, o->density,
                                          t, &matrix);
      if (nv < 0) DISTRO_FAIL(DISTRO_ERR_INVALID, "diloco: cannot chunk tensor '%s' for sparse outer gradients", prm->name);
      int64_t at = d->piece_elem[q];
      for (int v = 0; v < nv; v++) {
        distro__sparse_section *s = &d->sec[ns++];
        s->elem = at;
        s->count = t[v].rows * t[v].cols;
        s->piece = q;
        s->t = t[v];
        s->dct = o->sparse_dct && matrix;
        s->et = enum_table(d, &t[v]);
        any_dct |= s->dct;
        at += s->count;
        if (s->count > d->max_sec) d->max_sec = s->count;
        if (distro__sparse_bound(s, 1, o->sparse_values) > UINT32_MAX)
          DISTRO_FAIL(DISTRO_ERR_INVALID, "diloco: tensor '%s' is too large for one sparse payload section", prm->name);
      }
    }
    d->sec_start[p + 1] = ns;
    const int64_t sel = distro__sparse_layout(d->sec + d->sec_start[p], ns - d->sec_start[p]);
    if (sel > d->max_sel) d->max_sel = sel;
    d->payload[p] = (size_t)distro__sparse_bound(d->sec + d->sec_start[p], ns - d->sec_start[p], o->sparse_values);
    if (d->payload[p] > d->max_payload) d->max_payload = d->payload[p];
    if (!(d->ef[p] = calloc((size_t)f->numel[p], sizeof(float)))) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for e");
  }
  d->plans = calloc((size_t)ns + 1, sizeof *d->plans);
  if (!d->plans) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  /* FAST, never GEMM: every learner decodes every payload itself, and
   * OpenBLAS's kernels (chosen per CPU model) round differently; FAST rounds
   * the same on every CPU, for any tile shape (and thread count). Its work
   * is allocated here: one per thread, for as many threads as fit in the
   * largest section's floats (the GEMM's scratch was that size). */
  d->dct_stride = 1;
  for (int i = 0; i < ns; i++)
    if (d->sec[i].dct) {
      DISTRO_CHECK(distro__dct_plan_init(&d->plans[i], &d->sec[i].t, DISTRO__DCT_FAST));
      const int64_t w = distro__dct_tiles_work(&d->plans[i]);
      if (w > d->dct_stride) d->dct_stride = w;
    }
  const int64_t fit = d->max_sec / d->dct_stride, threads = omp_get_max_threads();
  d->dct_nwork = !any_dct || fit < 1 ? 1 : (int)(fit < threads ? fit : threads);
  const size_t sec_floats = any_dct ? (size_t)d->max_sec : 1;
  const size_t work_floats = any_dct ? (size_t)d->dct_stride * (size_t)d->dct_nwork : 1;
  d->ef_next = malloc(sizeof(float) * (size_t)d->max_frag);
  d->tx_coef = malloc(sizeof(float) * sec_floats);
  d->tx_scr = malloc(sizeof(float) * work_floats);
  d->rx_coef = malloc(sizeof(float) * sec_floats);
  d->rx_scr = malloc(sizeof(float) * work_floats);
  d->sel_idx = malloc(sizeof(uint32_t) * (size_t)d->max_sel);
  d->sel_val = malloc(sizeof(float) * (size_t)d->max_sel);
  d->dec_idx = malloc(sizeof(uint32_t) * (size_t)d->max_sel * (size_t)M);
  d->dec_val = malloc(sizeof(float) * (size_t)d->max_sel * (size_t)M);
  d->sizes = calloc((size_t)M, sizeof *d->sizes);
  if (!d->ef_next || !d->tx_coef || !d->tx_scr || !d->rx_coef || !d->rx_scr || !d->sel_idx || !d->sel_val ||
      !d->dec_idx || !d->dec_val || !d->sizes)
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for sparse outer buffers");
  return DISTRO_OK;
fail:
  return st; /* the caller frees the whole layout */
}

static distro__sparse_head make_head(const distro_diloco *d, int p, uint64_t round, int flags) {
  const distro_diloco_options *o = &d->opt;
  distro__sparse_head h;
  h.dlc = (distro__dlc_head){DISTRO__SPARSE_VERSION, (unsigned)o->sparse_values, (uint32_t)d->learner, (uint32_t)p,
                             round, 0, 0, (uint64_t)d->frags.numel[p],
                             (uint32_t)flags | (o->sparse_dct ? DISTRO__DLC_FLAG_DCT : 0u), (uint32_t)o->sparse_chunk};
  h.density = o->density;
  return h;
}

size_t distro__sparse_send(distro_diloco *d, int p, const float *delta, int bad, uint64_t tokens) {
  const distro__sparse_section *s = d->sec + d->sec_start[p];
  const int n = d->sec_start[p + 1] - d->sec_start[p];
  const float beta = d->opt.ef_beta;
  const float *e = d->ef[p];
  float *en = d->ef_next;
  /* e' = beta e + delta (DCT sections: + DCT(delta)); e itself changes only
   * when the exchange succeeds. */
  for (int i = 0; i < n && !bad; i++) {
    const float *x = delta + s[i].elem;
    if (s[i].dct) {
      distro__dct_fast_tiles(&d->plans[d->sec_start[p] + i], x, d->tx_coef, 0, d->tx_scr, d->dct_stride, d->dct_nwork);
      x = d->tx_coef;
    }
    const float *ei = e + s[i].elem;
    float *ni = en + s[i].elem;
    const int64_t cnt = s[i].count;
    int nb = 0;
#pragma omp parallel for schedule(static) reduction(| : nb) if (cnt > PAR_MIN)
    for (int64_t j = 0; j < cnt; j++) {
      ni[j] = beta * ei[j] + x[j];
      nb |= !isfinite(ni[j]);
    }
    bad |= nb;
  }
  for (int i = 0; i < n && !bad; i++)
    distro__topk_tiles(&s[i].t, en + s[i].elem, d->sel_idx + s[i].sel, d->sel_val + s[i].sel);
  distro__sparse_head h = make_head(d, p, (uint64_t)d->t, bad ? DISTRO__DLC_FLAG_ABORT : 0);
  h.dlc.tokens = tokens;
  h.dlc.steps = d->steps[p];
  size_t size = distro__sparse_encode(d->send, d->max_payload, s, n, &h, d->sel_idx, d->sel_val);
  if (size == 0) { /* out of memory planning: abort (needs none) rather than leave the others waiting */
    h.dlc.flags |= DISTRO__DLC_FLAG_ABORT;
    size = distro__sparse_encode(d->send, d->max_payload, s, n, &h, NULL, NULL);
  }
  d->send_size = size;
  return size;
}

/* ---- the merge's source: every learner's decoded selection -------------------- */

typedef struct {
  distro_diloco *d;
  int p;
} sparse_source;

static void sparse_accumulate(void *ctx, int q0, int q1, const float *coef, float *out) {
  const sparse_source *ss = ctx;
  distro_diloco *d = ss->d;
  const int M = d->M;
  for (int i = d->sec_start[ss->p]; i < d->sec_start[ss->p + 1]; i++) {
    const distro__sparse_section *s = &d->sec[i];
    if (s->piece < q0 || s->piece >= q1) continue;
    const distro__tiling *t = &s->t;
    float *o = s->dct ? d->rx_coef : out + s->elem;
    memset(o, 0, sizeof(float) * (size_t)s->count);
    const int64_t k = t->k;
    /* Chunks own disjoint positions; within one, learners add in order. */
#pragma omp parallel for schedule(static) if (s->count > PAR_MIN)
    for (int64_t c = 0; c < t->nchunks; c++)
      for (int r = 0; r < M; r++) {
        const size_t at = (size_t)r * (size_t)d->max_sel + (size_t)(s->sel + c * k);
        const uint32_t *ci = d->dec_idx + at;
        const float *cv = d->dec_val + at;
        for (int64_t j = 0; j < k; j++) o[distro__tile_offset(t, c, ci[j])] += coef[r] * cv[j];
      }
    if (s->dct) distro__dct_fast_tiles(&d->plans[i], d->rx_coef, out + s->elem, 1, d->rx_scr, d->dct_stride, d->dct_nwork);
  }
}

/* The DCT is orthonormal: the coefficients' norm is the update's. */
static double sparse_norm(void *ctx, int r, int q0, int q1) {
  const sparse_source *ss = ctx;
  const distro_diloco *d = ss->d;
  double sum = 0;
  for (int i = d->sec_start[ss->p]; i < d->sec_start[ss->p + 1]; i++) {
    const distro__sparse_section *s = &d->sec[i];
    if (s->piece < q0 || s->piece >= q1) continue;
    const float *v = d->dec_val + (size_t)r * (size_t)d->max_sel + (size_t)s->sel;
    const int64_t cnt = s->t.nchunks * s->t.k;
    for (int64_t j = 0; j < cnt; j++) sum += (double)v[j] * (double)v[j];
  }
  return sqrt(sum);
}

distro_status distro__sparse_exchange(distro_diloco *d) {
  distro_status st = DISTRO_OK;
  const int p = d->x_frag, M = d->M;
  const distro__sparse_section *s = d->sec + d->sec_start[p];
  const int n = d->sec_start[p + 1] - d->sec_start[p];
  DISTRO_CHECK(d->outer->ops->allgatherv(d->outer, d->send, d->send_size, d->recv, d->max_payload, d->sizes));
  const distro__sparse_head want = make_head(d, p, (uint64_t)d->x_round, 0);
  double *tok = d->w, *steps = d->nrm; /* become the weights; nrm is free again after */
  for (int r = 0; r < M; r++) {
    distro__dlc_head got;
    int bad = -1;
    const size_t at = (size_t)r * (size_t)d->max_sel;
    st = distro__sparse_decode(d->recv + (size_t)r * d->max_payload, d->sizes[r], r, s, n, &want, &got, &bad,
                               d->dec_idx + at, d->dec_val + at);
    if (st != DISTRO_OK) {
      if (bad < 0) return st;
      char why[256];
      snprintf(why, sizeof why, "%s", distro_last_error());
      return distro__fail(st, "%s (fragment %d, tensor '%s')", why, p,
                          d->inner->params[d->frags.pieces[s[bad].piece].tensor].name);
    }
    tok[r] = (double)got.tokens;
    steps[r] = (double)got.steps;
  }
  distro__outer_weights(d->opt.merge, M, tok, steps, d->w);
  sparse_source ss = {d, p};
  const distro__outer_source src = {&ss, sparse_accumulate, sparse_norm};
  distro__outer_merge(&d->frags, d->piece_elem, d->tflags, p, d->opt.merge, M, d->w, &src, d->acc, d->coef, d->nrm);
  return DISTRO_OK;
fail:
  return st;
}

void distro__sparse_commit(distro_diloco *d) {
  const int p = d->x_frag, M = d->M;
  const distro__sparse_section *s = d->sec + d->sec_start[p];
  const int n = d->sec_start[p + 1] - d->sec_start[p];
  /* What this learner sent, as everyone decoded it, leaves its e. */
  const size_t mine = (size_t)d->learner * (size_t)d->max_sel;
  for (int i = 0; i < n; i++) {
    const distro__tiling *t = &s[i].t;
    float *e = d->ef_next + s[i].elem;
    const int64_t k = t->k;
#pragma omp parallel for schedule(static) if (s[i].count > PAR_MIN)
    for (int64_t c = 0; c < t->nchunks; c++) {
      const uint32_t *ci = d->dec_idx + mine + (size_t)(s[i].sel + c * k);
      const float *cv = d->dec_val + mine + (size_t)(s[i].sel + c * k);
      for (int64_t j = 0; j < k; j++) e[distro__tile_offset(t, c, ci[j])] -= cv[j];
    }
  }
  memcpy(d->ef[p], d->ef_next, sizeof(float) * (size_t)d->frags.numel[p]);
  uint64_t others = 0;
  for (int r = 0; r < M; r++)
    if (r != d->learner) others += d->sizes[r];
  d->x_recv_bytes = others;
}
