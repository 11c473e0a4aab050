/* The DeMo step (docs/algorithms.md section 1), momentum kept in the DCT domain,
 * one tile at a time.
 *
 * The transform is orthonormal, so decay*DCT(d) + s*DCT(g) = DCT(decay*d +
 * s*g), and removing the sent coefficients from DCT(d) is the reference's
 * "decode own payload and subtract". Each step then costs one forward DCT (of
 * the gradient) and one inverse (of the aggregate) instead of three.
 *
 * Every phase is one parallel loop over the tiles of all tensors, and a
 * tile's data stays in cache from the load to the store: the forward
 * transform, the momentum blend, the selection and the removal of what was
 * selected touch the gradient and the momentum once; the aggregation, the
 * inverse transform and the update touch the parameters once. Work per tile
 * is independent (no sums across tiles), so the result does not depend on
 * the thread count. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/clones.h"
#include "common/error.h"
#include "compress/topk.h"
#include "optim/optim_internal.h"
#include "optim/step_rule.h"

/* A thread's scratch for one tile (distro__demo_prepare sizes it). */
typedef struct {
  float *dct;   /* the DCT's work */
  float *a, *b; /* tiles */
  uint16_t *cnt;
  uint32_t *mag;
  uint64_t *cand;
  double t_transform, t_select, t_decode; /* seconds this thread spent */
} tile_ws;

static tile_ws workspace(const distro_optim *o, int thread) {
  const int64_t e = o->ws_tile;
  uint8_t *base = o->ws + (size_t)thread * o->ws_bytes;
  tile_ws w = {0};
  w.dct = (float *)base;
  w.a = w.dct + 7 * e;
  w.b = w.a + e;
  w.cand = (uint64_t *)(w.b + e);
  w.mag = (uint32_t *)(w.cand + e + 8);
  w.cnt = (uint16_t *)(w.mag + e);
  return w;
}

size_t distro__demo_ws_bytes(int64_t max_tile) {
  /* 9 float tiles (7 for the DCT), then u64 (8 more for the selection's
   * whole-vector stores), u32 and u16 per element; every part stays 8-byte
   * aligned. */
  const size_t e = (size_t)max_tile;
  return (9 * e * sizeof(float) + (e + 8) * sizeof(uint64_t) + e * (sizeof(uint32_t) + sizeof(uint16_t)) + 63) /
         64 * 64;
}

/* Tensor of global tile g, and the tile's number inside it. */
static int tile_tensor(const distro_optim *o, int64_t g, int64_t *c) {
  int lo = 0, hi = o->nparams - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (o->tile_base[mid] <= g) lo = mid;
    else hi = mid - 1;
  }
  *c = g - o->tile_base[lo];
  return lo;
}

/* Asks for tile g's rows of the arrays in `what` ahead of their use: the
 * rows of a tile lie a tensor row apart, a pattern the hardware prefetchers
 * pick up late. (The momentum, stored tile by tile, streams without help.) */
enum { PF_GRAD = 1, PF_PARAM = 2, PF_ADAM = 4 };
static void prefetch_tile(const distro_optim *o, int64_t g, int what) {
  if (g >= o->tile_base[o->nparams]) return;
  int64_t ch;
  const int i = tile_tensor(o, g, &ch);
  const distro__tiling *t = &o->tilings[i];
  const distro__param *p = &o->params[i];
  const int64_t off = (ch / t->tiles_c) * t->h * t->cols + (ch % t->tiles_c) * t->w;
  for (int64_t r = 0; r < t->h; r++)
    for (int64_t d = 0; d < t->w; d += 16) {
      const int64_t at = off + r * t->cols + d;
      if (what & PF_GRAD) __builtin_prefetch(p->grad + at, 0, 3);
      if (what & PF_PARAM) __builtin_prefetch(p->param + at, 1, 3);
      if (what & PF_ADAM) __builtin_prefetch(p->v + at, 1, 3);
    }
}

/* The in-tile clocks only apportion a phase's wall time between the stats'
 * buckets (account()), so any steady tick works; the x86 time-stamp counter
 * costs a few cycles where clock_gettime costs tens of nanoseconds, which
 * added up to about 2% of a step at four readings per tile. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <x86intrin.h> /* __rdtsc, _mm_stream_ps, _mm_sfence */
static inline double ticks(void) { return (double)__rdtsc(); }
#else
static inline double ticks(void) { return distro__now(); }
#endif

static double seconds_between(double *t) {
  const double now = ticks(), d = now - *t;
  *t = now;
  return d;
}

/* ---- phase 1: compress ----------------------------------------------------
 *
 * DisTrO-AdamW's input is this rank's gradient normalized by its own AdamW
 * second moment (docs/design.md): u = g / (sqrt(vhat') + eps), with v' =
 * b2 v + (1 - b2) g^2 the moment it has after this step (not stored: the
 * step may still fail). With overlap the gradient is gone when the step
 * commits, so v' is staged in v_next; otherwise the apply phase recomputes
 * it (no staging memory). There is no first moment: the compressed momentum
 * is the update's momentum. */
static inline float second_moment(float v, float g, float b2) { return b2 * v + (1.0f - b2) * g * g; }

/* u = g / (sqrt(v' / c2) + eps) over an h x w tile (g, v and vn at row
 * stride ld, u contiguous), v' staged in vn when given; nonzero if a v' is
 * Inf or NaN. */
DISTRO__CLONES
static uint32_t adam_rows(float *restrict u, const float *restrict g, const float *restrict v, float *restrict vn,
                          int64_t ld, int64_t h, int64_t w, float gs, float b2, float c2, float eps) {
  uint32_t bad = 0;
  for (int64_t b = 0; b < h; b++)
    for (int64_t d = 0; d < w; d++) {
      const float gj = g[b * ld + d] * gs; /* gs: the clip (1: none, exact) */
      const float vj = second_moment(v[b * ld + d], gj, b2);
      u[b * w + d] = gj / (sqrtf(vj / c2) + eps);
      uint32_t bits;
      memcpy(&bits, &vj, sizeof bits);
      bad |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u); /* Inf or NaN; vectorizes */
      if (vn) vn[b * ld + d] = vj;
    }
  return bad;
}

/* v = b2 v + (1 - b2) (gs g)^2 over an h x w tile (row stride ld). */
DISTRO__CLONES
static void moment_rows(float *restrict v, const float *restrict g, int64_t ld, int64_t h, int64_t w, float gs,
                        float b2) {
  for (int64_t b = 0; b < h; b++)
    for (int64_t d = 0; d < w; d++) v[b * ld + d] = second_moment(v[b * ld + d], g[b * ld + d] * gs, b2);
}

/* x = gs g over an h x w tile (g at row stride ld, x contiguous): the
 * clipped gradient the sign update compresses. */
DISTRO__CLONES
static void scale_rows(float *restrict x, const float *restrict g, int64_t ld, int64_t h, int64_t w, float gs) {
  for (int64_t b = 0; b < h; b++)
    for (int64_t d = 0; d < w; d++) x[b * w + d] = g[b * ld + d] * gs;
}

static int adam_tile(const distro_optim *o, const distro__param *p, int64_t off, float c2, float *u) {
  const distro__tiling *t = &p->tiling;
  return !adam_rows(u, p->grad + off, p->v + off, p->v_next ? p->v_next + off : NULL, t->cols, t->h, t->w,
                    p->gscale, o->opt.beta2, c2, o->opt.eps);
}

/* f = decay*mom + s*f over a tile's n coefficients (the momentum is stored
 * tile by tile); nonzero if a result is Inf or NaN. The element-wise loops
 * are compiled per instruction set too, a whole tile per call: rows are
 * only 32-64 floats, a few vector operations against a call's cost. */
DISTRO__CLONES
static uint32_t blend_tile(float *restrict f, const float *restrict mom, float decay, float s, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    const float v = decay * mom[i] + s * f[i];
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    f[i] = v;
    bad |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u); /* Inf or NaN; vectorizes */
  }
  return bad;
}

/* dst = src (n floats), bypassing the caches where dst allows: the staged
 * momentum is not read again this step, and a plain store would first read
 * every line it writes. */
static void stream_tile(float *restrict dst, const float *restrict src, int64_t n) {
#if defined(__x86_64__) && defined(__SSE__)
  if (((uintptr_t)dst & 15) == 0 && n % 4 == 0) {
    for (int64_t i = 0; i < n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
    return;
  }
#endif
  memcpy(dst, src, sizeof(float) * (size_t)n);
}

/* p = p shrink - step sign(q) over an h x w tile (p at row stride ld). */
DISTRO__CLONES
static void sign_tile(float *restrict p, int64_t ld, const float *restrict q, float shrink, float step, int64_t h,
                      int64_t w) {
  for (int64_t b = 0; b < h; b++)
    for (int64_t d = 0; d < w; d++)
      p[b * ld + d] = p[b * ld + d] * shrink - step * (float)((q[b * w + d] > 0) - (q[b * w + d] < 0));
}

/* Tile c of tensor i: mom_next = decay*mom + s*DCT(x), select, remove the
 * selection. x is the gradient (sign update) or DisTrO-AdamW's normalized
 * gradient. Returns 0 if mom_next is not finite: a NaN or Inf in the
 * gradient reaches every coefficient of its tile through the transform, so
 * this check replaces a scan of the gradient (and also catches a momentum
 * that overflowed). */
static int compress_tile(distro_optim *o, int i, int64_t c, float s, float c2, tile_ws *ws) {
  distro__param *p = &o->params[i];
  const distro__tiling *t = &p->tiling;
  const int64_t h = t->h, w = t->w, k = t->k, cols = t->cols;
  const int64_t off = (c / t->tiles_c) * h * cols + (c % t->tiles_c) * w;
  double clock = ticks();
  const float *x = p->grad + off;
  int64_t ld = cols;
  if (o->opt.update == DISTRO_UPDATE_ADAMW) {
    if (!adam_tile(o, p, off, c2, ws->b)) return 0;
    x = ws->b;
    ld = w;
  } else if (p->gscale != 1.0f) {
    scale_rows(ws->b, x, ld, h, w, p->gscale);
    x = ws->b;
    ld = w;
  }
  distro__dct_tile_forward(&p->plan, x, ld, ws->a, ws->dct);
  /* The new momentum is built in the tile buffer: selected and zeroed
   * there, then streamed to its place (stored tile by tile). */
  const int64_t moff = c * h * w;
  const uint32_t bad = blend_tile(ws->a, p->mom + moff, o->opt.compression_decay, s, h * w);
  ws->t_transform += seconds_between(&clock);
  if (bad) return 0;
  uint32_t *idx = p->idx + c * k;
  distro__topk_chunk(ws->a, w, h, w, k, idx, p->val + c * k, ws->mag, ws->cand);
  for (int64_t j = 0; j < k; j++) ws->a[idx[j]] = 0.0f;
  stream_tile(p->mom_next + moff, ws->a, h * w);
  ws->t_select += seconds_between(&clock);
  return 1;
}

/* ---- phase 3: apply --------------------------------------------------------*/

/* Aggregates every rank's decoded selection for tile c of tensor i into
 * coef (h x w, row-major): per coefficient the mean over the ranks that
 * selected it, summed in rank order; dropped ranks are skipped. The
 * distinct selected positions go to pos in the order first seen (rank, then
 * payload order); returns their count. cnt is all zero on entry and on
 * return. */
static int64_t aggregate_tile(const distro_optim *o, int i, int64_t c, float *coef, uint16_t *cnt, uint32_t *pos) {
  const distro__tiling *t = &o->tilings[i];
  const int64_t k = t->k;
  memset(coef, 0, sizeof(float) * (size_t)t->chunk_elems);
  for (int r = 0; r < o->comm->size; r++) {
    if (o->dropped[r]) continue;
    const size_t base = distro__sel_at(o, r, i, c);
    const uint32_t *ri = o->dec_idx + base;
    const float *rv = o->dec_val + base;
    for (int64_t j = 0; j < k; j++) {
      coef[ri[j]] += rv[j];
      cnt[ri[j]]++;
    }
  }
  /* Divide each selected coefficient once (the first visit clears cnt). */
  int64_t npos = 0;
  for (int r = 0; r < o->comm->size; r++) {
    if (o->dropped[r]) continue;
    const uint32_t *ri = o->dec_idx + distro__sel_at(o, r, i, c);
    for (int64_t j = 0; j < k; j++) {
      if (!cnt[ri[j]]) continue;
      if (cnt[ri[j]] > 1) coef[ri[j]] /= (float)cnt[ri[j]];
      cnt[ri[j]] = 0;
      pos[npos++] = ri[j];
    }
  }
  return npos;
}

/* Tile c of tensor i: Q = inverse DCT of the aggregate; p = p (1 - lr wd)
 * - step sign(Q), then, unless it was staged, DisTrO-AdamW's second moment
 * for this step. With look-ahead, p is the agreed copy (base). */
static void apply_tile(distro_optim *o, int i, int64_t c, float lr, float step, tile_ws *ws) {
  distro__param *p = &o->params[i];
  const distro__tiling *t = &p->tiling;
  const int64_t h = t->h, w = t->w, cols = t->cols;
  const int64_t off = (c / t->tiles_c) * h * cols + (c % t->tiles_c) * w;
  double clock = ticks();
  const int64_t npos = aggregate_tile(o, i, c, ws->a, ws->cnt, ws->mag);
  ws->t_decode += seconds_between(&clock);
  distro__dct_tile_inverse_sparse(&p->plan, ws->a, ws->mag, npos, ws->b, w, ws->dct);
  ws->t_transform += seconds_between(&clock);
  const float shrink = 1.0f - lr * o->opt.weight_decay;
  float *agreed = p->base ? p->base : p->param;
  sign_tile(agreed + off, cols, ws->b, shrink, step, h, w);
  if (o->opt.update == DISTRO_UPDATE_ADAMW && !p->v_next) /* the moment, unless committed already */
    moment_rows(p->v + off, p->grad + off, cols, h, w, p->gscale, o->opt.beta2);
  ws->t_decode += seconds_between(&clock);
}

/* p = base - step sign(q) over an h x w tile (p and base at row stride ld). */
DISTRO__CLONES
static void ahead_tile_rows(float *restrict p, const float *restrict base, int64_t ld, const float *restrict q,
                            float step, int64_t h, int64_t w) {
  for (int64_t b = 0; b < h; b++)
    for (int64_t d = 0; d < w; d++)
      p[b * ld + d] = base[b * ld + d] - step * (float)((q[b * w + d] > 0) - (q[b * w + d] < 0));
}

/* Look-ahead, tile c of tensor i: the caller's parameters become the agreed
 * ones minus `ahead` sign(this rank's whole momentum of this step), the
 * residual plus its selection before quantization (the inverse DCT of its
 * DCT): an estimate of the update still in flight that also holds what was
 * not sent; with ahead 0 exactly the agreed ones. */
static void ahead_tile(distro_optim *o, int i, int64_t c, float ahead, tile_ws *ws) {
  distro__param *p = &o->params[i];
  const distro__tiling *t = &p->tiling;
  const int64_t h = t->h, w = t->w, k = t->k, cols = t->cols;
  const int64_t off = (c / t->tiles_c) * h * cols + (c % t->tiles_c) * w;
  if (ahead == 0.0f) {
    for (int64_t b = 0; b < h; b++)
      memcpy(p->param + off + b * cols, p->base + off + b * cols, sizeof(float) * (size_t)w);
    return;
  }
  double clock = ticks();
  memcpy(ws->a, p->mom_next + c * h * w, sizeof(float) * (size_t)(h * w));
  for (int64_t j = 0; j < k; j++) ws->a[p->idx[c * k + j]] = p->val[c * k + j];
  distro__dct_tile_inverse(&p->plan, ws->a, ws->b, w, ws->dct);
  ws->t_transform += seconds_between(&clock);
  ahead_tile_rows(p->param + off, p->base + off, cols, ws->b, ahead, h, w);
  ws->t_decode += seconds_between(&clock);
}

/* Splits a phase's wall time between the stats' buckets in the proportion
 * the threads spent in them. */
static void account(const distro_optim *o, int nt, double wall, distro_step_stats *s) {
  double tr = 0, se = 0, de = 0;
  for (int th = 0; th < nt; th++) {
    tr += o->ws_clock[th].transform;
    se += o->ws_clock[th].select;
    de += o->ws_clock[th].decode;
  }
  const double all = tr + se + de;
  if (all <= 0) return;
  s->seconds_transform += wall * tr / all;
  s->seconds_topk += wall * se / all;
  s->seconds_decode += wall * de / all;
}

/* The caller's thread count, capped at the workspaces we have. */
static int step_threads(const distro_optim *o) {
  return o->nws < omp_get_max_threads() ? o->nws : omp_get_max_threads();
}

/* The compress of tensors [first, first + count) alone, unencoded: returns
 * the first whose state is not finite, or -1. */
static int compress_tensors(distro_optim *o, float lr, int first, int count, distro_step_stats *s) {
  const int sign_update = o->opt.update == DISTRO_UPDATE_SIGN, nt = step_threads(o);
  const int64_t g0 = o->tile_base[first], g1 = o->tile_base[first + count];
  /* The sign variant folds lr into the momentum (the reference's choice);
   * DisTrO-AdamW accumulates its normalized gradient. */
  const float scale = sign_update ? lr : 1.0f;
  /* DisTrO-AdamW's bias correction of the second moment, once per step. */
  const float c2 = (float)(1.0 - pow((double)o->opt.beta2, (double)(o->step + 1)));
  int64_t bad_tile = INT64_MAX;
  memset(o->ws_clock, 0, sizeof *o->ws_clock * (size_t)nt);
  const double t0 = distro__now();
#pragma omp parallel num_threads(nt) reduction(min : bad_tile)
  {
    const int th = omp_get_thread_num();
    tile_ws ws = workspace(o, th);
#pragma omp for schedule(dynamic, 16)
    for (int64_t g = g0; g < g1; g++) {
      int64_t c;
      const int i = tile_tensor(o, g, &c);
      if (g + 1 < g1) prefetch_tile(o, g + 1, PF_GRAD | (sign_update ? 0 : PF_ADAM));
      if (!compress_tile(o, i, c, scale, c2, &ws) && g < bad_tile) bad_tile = g;
    }
#if defined(__x86_64__) && defined(__SSE__)
    _mm_sfence(); /* the streamed momentum (stream_tile) is ordered before the region ends */
#endif
    o->ws_clock[th] = (distro__tile_clock){ws.t_transform, ws.t_select, ws.t_decode};
  }
  account(o, nt, distro__now() - t0, s);
  int bad = -1;
  if (bad_tile != INT64_MAX) {
    int64_t c;
    bad = tile_tensor(o, bad_tile, &c);
  }
  return bad;
}

size_t distro__demo_compress_bucket(distro_optim *o, int b, float lr, distro_step_stats *s) {
  const distro__bucket *k = &o->buckets[b];
  const int bad = compress_tensors(o, lr, k->first, k->count, s);
  const double t0 = distro__now();
  const size_t size = distro__payload_encode_bucket(o, b, bad);
  const double dt = distro__now() - t0; /* the encode: selection and codec both */
  s->seconds_topk += dt;
  s->seconds_codec += dt;
  return size;
}

size_t distro__demo_compress(distro_optim *o, float lr, distro_step_stats *s) {
  const size_t size = distro__demo_compress_bucket(o, 0, lr, s); /* one bucket: every tensor */
  if (size == 0) distro__fail(DISTRO_ERR_PAYLOAD, "internal error: the payload did not fit its bound");
  return size;
}

static void swap(float **a, float **b) {
  float *t = *a;
  *a = *b;
  *b = t;
}

void distro__demo_commit(distro_optim *o) {
  o->spread = distro__step_spread(o);
  for (int i = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    swap(&p->mom, &p->mom_next);
    if (p->v_next) swap(&p->v, &p->v_next);
  }
}

void distro__demo_apply(distro_optim *o, int agg, float lr, int64_t t, float ahead, distro_step_stats *s) {
  const int sign_update = o->opt.update == DISTRO_UPDATE_SIGN, nt = step_threads(o);
  const int lookahead = o->opt.overlap == DISTRO_OVERLAP_LOOKAHEAD;
  const int64_t ntiles = o->tile_base[o->nparams];
  /* Every rank applies the same aggregate: each element moves by the sign
   * of Q, lr for DeMo and for DisTrO-AdamW the rectified step, grown with
   * the aggregate's spread (t: the step the aggregate belongs to; the
   * spread was taken when it was committed). */
  const float step =
      sign_update || !agg ? lr : distro__adamw_sign_step(o->opt.beta2, t, lr, &o->ramp, distro__step_growth(o));
  memset(o->ws_clock, 0, sizeof *o->ws_clock * (size_t)nt);
  const double t0 = distro__now();
#pragma omp parallel num_threads(nt)
  {
    const int th = omp_get_thread_num();
    tile_ws ws = workspace(o, th);
#pragma omp for schedule(dynamic, 16)
    for (int64_t g = 0; g < ntiles; g++) {
      int64_t c;
      const int i = tile_tensor(o, g, &c);
      /* DisTrO-AdamW reads g and v here unless v' was staged (overlap). */
      prefetch_tile(o, g + 1, PF_PARAM | (sign_update || o->ov ? 0 : PF_GRAD | PF_ADAM));
      if (agg) apply_tile(o, i, c, lr, step, &ws);
      if (lookahead) ahead_tile(o, i, c, ahead, &ws);
    }
    o->ws_clock[th] = (distro__tile_clock){ws.t_transform, ws.t_select, ws.t_decode};
  }
  account(o, nt, distro__now() - t0, s);
}

distro_status distro__demo_step(distro_optim *o, float lr, distro_step_stats *s) {
  distro_status st = DISTRO_OK;
  /* 1. Compress every tile into the staged momentum; encode. */
  const size_t size = distro__demo_compress(o, lr, s);
  if (size == 0) return DISTRO_ERR_PAYLOAD;
  /* 2. Exchange, then validate and decode everything before applying. */
  DISTRO_CHECK(distro__payload_exchange(o, size, s));
  /* 3. Commit: nothing here can fail. */
  distro__demo_commit(o);
  distro__demo_apply(o, 1, lr, o->step + 1, 0.0f, s);
  return DISTRO_OK;
fail:
  return st;
}
