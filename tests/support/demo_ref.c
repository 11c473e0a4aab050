/* Float64 reference of the DeMo / DisTrO-AdamW / AdamW step (see demo_ref.h).
 * Deliberately plain: direct loops, no BLAS, no shared code with src/. */
#include "demo_ref.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>

#include "testutil.h"

typedef struct {
  int64_t n, rows, cols, tiles, tiles_per_row;
  int h, w, k;
  double *fh, *fw;      /* DCT bases, F[i*n + k] */
  double *delta;        /* world * n momenta */
  double *m1, *m2;      /* AdamW moments of the mean gradient (baseline); m2:
                           world x n, each rank's own (DisTrO-AdamW) */
  double *q;            /* last Q */
  double *mown;         /* world x n: each rank's whole momentum of the last
                           step, before its selection left it (look-ahead) */
  double *eq;           /* error bound of the last Q */
  double *eh;           /* max of eq over all steps (for the moments) */
  unsigned char *taint; /* per tile */
} dr_tensor;

struct dr_model {
  dr_config cfg;
  int world, nt;
  dr_tensor *t;
  int64_t step;
  double lr;
  double lr_hist[DR_MAX_STEPS]; /* the lr of each step, for the warm-up */
  long tainted_tiles, selections;
  /* The aggregate's spread of the last step, from the sampled tiles: the
   * distinct coefficients all ranks selected per coefficient one rank
   * selects. A tainted tile's selection may differ from the library's, so
   * it counts as anything from k to min(world k, h w) distinct. */
  int64_t sp_tile, sp_stride, sp_lo, sp_hi, sp_picks;
  double spread_lo, spread_hi;
  /* scratch, sized for the largest tile */
  double *x, *c, *tmp, *sel, *sum, *dev, *abs;
  int *cnt;
  struct dr_mag { double mag; int idx; } *mags;
};

int dr_chunk(int64_t n, int target) {
  if (n <= 0 || target <= 0) return 1;
  int64_t best = 1;
  for (int64_t d = 1; d <= target && d <= n; d++)
    if (n % d == 0) best = d;
  return (int)best;
}

void dr_dct_basis(int n, double *F) {
  const double pi = 3.14159265358979323846;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < n; k++) {
      double ck = k == 0 ? sqrt(1.0 / n) : sqrt(2.0 / n);
      F[(size_t)i * n + k] = ck * cos(pi * (2.0 * i + 1.0) * k / (2.0 * n));
    }
}

float dr_bf16(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  if ((b & 0x7f800000u) == 0x7f800000u) { /* inf/nan: truncate */
    b &= 0xffff0000u;
  } else {
    b += 0x7fffu + ((b >> 16) & 1u);
    b &= 0xffff0000u;
  }
  float y;
  memcpy(&y, &b, 4);
  return y;
}

static void free_tensor(dr_tensor *t) {
  free(t->fh); free(t->fw); free(t->delta); free(t->m1); free(t->m2);
  free(t->q); free(t->mown); free(t->eq); free(t->eh); free(t->taint);
}

void dr_free(dr_model *m) {
  if (!m) return;
  for (int i = 0; i < m->nt; i++) free_tensor(&m->t[i]);
  free(m->t); free(m->x); free(m->c); free(m->tmp); free(m->sel); free(m->sum);
  free(m->dev); free(m->abs); free(m->cnt); free(m->mags);
  free(m);
}

dr_model *dr_create(const dr_config *cfg, int world, int ntensors, const int *ndims,
                    const int64_t *const *shapes) {
  dr_model *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->cfg = *cfg;
  m->world = world;
  m->nt = ntensors;
  m->t = calloc((size_t)ntensors, sizeof *m->t);
  if (!m->t) { free(m); return NULL; }
  size_t maxtile = 1;
  for (int i = 0; i < ntensors; i++) {
    dr_tensor *t = &m->t[i];
    int nd = ndims[i];
    const int64_t *s = shapes[i];
    t->n = 1;
    for (int d = 0; d < nd; d++) t->n *= s[d];
    /* 2-D view: leading dims fold into rows; 1-D is one row */
    t->cols = s[nd - 1];
    t->rows = t->n / t->cols;
    t->w = dr_chunk(s[nd - 1], cfg->chunk);
    t->h = nd >= 2 ? dr_chunk(s[nd - 2], cfg->chunk) : 1;
    t->tiles_per_row = t->cols / t->w;
    t->tiles = (t->rows / t->h) * t->tiles_per_row;
    int hw = t->h * t->w;
    t->k = cfg->topk < hw ? cfg->topk : hw;
    if (t->k < 1) t->k = 1;
    if ((size_t)hw > maxtile) maxtile = (size_t)hw;
    size_t n = (size_t)t->n;
    t->fh = malloc(sizeof(double) * (size_t)t->h * t->h);
    t->fw = malloc(sizeof(double) * (size_t)t->w * t->w);
    t->delta = calloc(n * (size_t)world, sizeof(double));
    t->m1 = calloc(n * (size_t)world, sizeof(double));
    t->m2 = calloc(n * (size_t)world, sizeof(double));
    t->q = calloc(n, sizeof(double));
    t->mown = calloc(n * (size_t)world, sizeof(double));
    t->eq = calloc(n, sizeof(double));
    t->eh = calloc(n, sizeof(double));
    t->taint = calloc((size_t)t->tiles, 1);
    if (!t->fh || !t->fw || !t->delta || !t->m1 || !t->m2 || !t->q || !t->mown || !t->eq || !t->eh || !t->taint) {
      dr_free(m);
      return NULL;
    }
    dr_dct_basis(t->h, t->fh);
    dr_dct_basis(t->w, t->fw);
  }
  m->x = malloc(sizeof(double) * maxtile);
  m->c = malloc(sizeof(double) * maxtile);
  m->tmp = malloc(sizeof(double) * maxtile);
  m->sel = malloc(sizeof(double) * maxtile);
  m->sum = malloc(sizeof(double) * maxtile);
  m->dev = malloc(sizeof(double) * maxtile);
  m->abs = malloc(sizeof(double) * maxtile);
  m->cnt = malloc(sizeof(int) * maxtile);
  m->mags = malloc(sizeof *m->mags * maxtile);
  if (!m->x || !m->c || !m->tmp || !m->sel || !m->sum || !m->dev || !m->abs || !m->cnt || !m->mags) {
    dr_free(m);
    return NULL;
  }
  return m;
}

int64_t dr_numel(const dr_model *m, int t) { return m->t[t].n; }

void dr_geometry(const dr_model *m, int t, int *h, int *w, int64_t *tiles) {
  if (h) *h = m->t[t].h;
  if (w) *w = m->t[t].w;
  if (tiles) *tiles = m->t[t].tiles;
}

const double *dr_last_q(const dr_model *m, int t) { return m->t[t].q; }
const double *dr_last_m_own(const dr_model *m, int t, int rank) { return m->t[t].mown + (size_t)rank * (size_t)m->t[t].n; }
long dr_tainted_tiles(const dr_model *m) { return m->tainted_tiles; }
long dr_selections(const dr_model *m) { return m->selections; }

/* Offset of element (i, j) of tile ti. */
static int64_t tile_off(const dr_tensor *t, int64_t ti, int i, int j) {
  int64_t tr = ti / t->tiles_per_row, tc = ti % t->tiles_per_row;
  return (tr * t->h + i) * t->cols + tc * t->w + j;
}

static int64_t elem_tile(const dr_tensor *t, int64_t e) {
  int64_t row = e / t->cols, col = e % t->cols;
  return (row / t->h) * t->tiles_per_row + col / t->w;
}

/* C[b][d] = sum_ij X[i][j] Fh[i][b] Fw[j][d] */
int dr_elem_tainted(const dr_model *m, int t, int64_t e) { return m->t[t].taint[elem_tile(&m->t[t], e)]; }

static void dct2(const dr_tensor *t, const double *X, double *C, double *T) {
  int h = t->h, w = t->w;
  for (int b = 0; b < h; b++)
    for (int j = 0; j < w; j++) {
      double s = 0;
      for (int i = 0; i < h; i++) s += t->fh[i * h + b] * X[i * w + j];
      T[b * w + j] = s;
    }
  for (int b = 0; b < h; b++)
    for (int d = 0; d < w; d++) {
      double s = 0;
      for (int j = 0; j < w; j++) s += T[b * w + j] * t->fw[j * w + d];
      C[b * w + d] = s;
    }
}

/* X[i][j] = sum_bd Fh[i][b] C[b][d] Fw[j][d] (transpose of dct2) */
static void idct2(const dr_tensor *t, const double *C, double *X, double *T) {
  int h = t->h, w = t->w;
  for (int b = 0; b < h; b++)
    for (int j = 0; j < w; j++) {
      double s = 0;
      for (int d = 0; d < w; d++) s += C[b * w + d] * t->fw[j * w + d];
      T[b * w + j] = s;
    }
  for (int i = 0; i < h; i++)
    for (int j = 0; j < w; j++) {
      double s = 0;
      for (int b = 0; b < h; b++) s += t->fh[i * h + b] * T[b * w + j];
      X[i * w + j] = s;
    }
}

static int mag_cmp(const void *a, const void *b) {
  const struct dr_mag *x = a, *y = b;
  if (x->mag > y->mag) return -1;
  if (x->mag < y->mag) return 1;
  return (x->idx > y->idx) - (x->idx < y->idx); /* ties: lower index first */
}

/* INT8: one scale per chunk, the smallest bf16 s with 127 s >= the chunk's
 * largest |coefficient| (exact arithmetic here), each value sent as
 * s * round(c / s). */
static double int8_scale(double amax) {
  if (amax <= 0) return 0;
  int ex;
  frexp(amax / 127.0, &ex);              /* amax/127 = f 2^ex, f in [0.5, 1) */
  double ulp = ldexp(1.0, ex - 8);       /* bf16: 8 significant bits */
  double s = ceil(amax / 127.0 / ulp) * ulp;
  while (127.0 * s < amax) s += ulp;
  return s;
}

/* Value used in the aggregation for kept coefficient c (s: the chunk's
 * INT8 scale), and the largest change of that value if c moved by up to e
 * and the chunk's largest magnitude with it (rounding-boundary bound). */
static double quantize(int values, double c, double s) {
  if (values == DISTRO_VALUES_BF16) return (double)dr_bf16((float)c);
  if (values == DISTRO_VALUES_SIGN1) return c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
  if (values == DISTRO_VALUES_INT8) {
    if (s == 0) return 0;
    double q = nearbyint(c / s);
    return s * (q > 127 ? 127 : q < -127 ? -127 : q);
  }
  return c;
}

static double quant_dev(int values, double c, double e, double amax) {
  if (values == DISTRO_VALUES_BF16) return fabs(quantize(values, c + e, 0) - quantize(values, c - e, 0));
  if (values == DISTRO_VALUES_SIGN1) return fabs(c) <= e ? 2.0 : 0.0;
  if (values == DISTRO_VALUES_INT8) {
    const double sc[2] = {int8_scale(amax - e), int8_scale(amax + e)}, cc[2] = {c - e, c + e};
    double lo = INFINITY, hi = -INFINITY;
    for (int a = 0; a < 2; a++)
      for (int b = 0; b < 2; b++) {
        double v = quantize(values, cc[b], sc[a]);
        lo = fmin(lo, v);
        hi = fmax(hi, v);
      }
    return hi - lo;
  }
  return 0.0;
}

static void demo_tensor(dr_model *m, dr_tensor *t, double lr, const float *const *grads, int ti_index) {
  const dr_config *cfg = &m->cfg;
  int hw = t->h * t->w;
  size_t n = (size_t)t->n;
  /* Momentum. Sign update: delta accumulates lr * g. DisTrO-AdamW: each
   * rank updates its own second moment from its gradient and delta
   * accumulates g / (sqrt(vhat) + eps). */
  const int adam = cfg->update == DISTRO_UPDATE_ADAMW;
  const double bc2 = 1 - pow(cfg->beta2, (double)m->step);
  for (int r = 0; r < m->world; r++) {
    double *dl = t->delta + (size_t)r * n, *m2 = t->m2 + (size_t)r * n;
    const float *g = grads[(size_t)r * m->nt + ti_index];
    for (size_t e = 0; e < n; e++) {
      double x = lr * (double)g[e];
      if (adam) {
        m2[e] = cfg->beta2 * m2[e] + (1 - cfg->beta2) * (double)g[e] * g[e];
        x = g[e] / (sqrt(m2[e] / bc2) + cfg->eps);
      }
      dl[e] = cfg->decay * dl[e] + x;
    }
  }
  for (int64_t ti = 0; ti < t->tiles; ti++) {
    for (int b = 0; b < hw; b++) { m->sum[b] = 0; m->dev[b] = 0; m->abs[b] = 0; m->cnt[b] = 0; }
    for (int r = 0; r < m->world; r++) {
      double *dl = t->delta + (size_t)r * n;
      for (int i = 0; i < t->h; i++)
        for (int j = 0; j < t->w; j++) {
          m->x[i * t->w + j] = dl[tile_off(t, ti, i, j)];
          t->mown[(size_t)r * n + (size_t)tile_off(t, ti, i, j)] = m->x[i * t->w + j];
        }
      dct2(t, m->x, m->c, m->tmp);
      for (int b = 0; b < hw; b++) { m->mags[b].mag = fabs(m->c[b]); m->mags[b].idx = b; }
      qsort(m->mags, (size_t)hw, sizeof *m->mags, mag_cmp);
      double top = m->mags[0].mag, e = DR_TIE_REL * top, scale = int8_scale(top);
      m->selections++;
      if (t->k < hw && m->mags[t->k - 1].mag - m->mags[t->k].mag < e && !t->taint[ti]) {
        t->taint[ti] = 1;
        m->tainted_tiles++;
      }
      /* decode own payload (unquantized) and subtract it from delta */
      for (int b = 0; b < hw; b++) m->sel[b] = 0;
      for (int j = 0; j < t->k; j++) {
        int b = m->mags[j].idx;
        double c = m->c[b];
        m->sel[b] = c;
        m->sum[b] += quantize(cfg->values, c, scale);
        m->abs[b] += fabs(quantize(cfg->values, c, scale));
        m->cnt[b] += 1;
        m->dev[b] += quant_dev(cfg->values, c, e, top);
      }
      idct2(t, m->sel, m->x, m->tmp);
      for (int i = 0; i < t->h; i++)
        for (int j = 0; j < t->w; j++) dl[tile_off(t, ti, i, j)] -= m->x[i * t->w + j];
    }
    /* mean over the ranks that selected each coefficient. Float32 rounding
     * of the contributions (1e-5 of their magnitudes, which may cancel)
     * reaches every element of the tile through basis values <= 2/sqrt(hw). */
    double amb = 0, contrib = 0;
    for (int b = 0; b < hw; b++) {
      if (m->cnt[b]) {
        m->sel[b] = m->sum[b] / m->cnt[b];
        int fb = b / t->w, fd = b % t->w;
        double mh = fb == 0 ? sqrt(1.0 / t->h) : sqrt(2.0 / t->h);
        double mw = fd == 0 ? sqrt(1.0 / t->w) : sqrt(2.0 / t->w);
        amb += m->dev[b] / m->cnt[b] * mh * mw;
        contrib += m->abs[b] / m->cnt[b];
      } else {
        m->sel[b] = 0;
      }
    }
    if (m->sp_tile++ % m->sp_stride == 0) {
      int64_t u = 0;
      for (int b = 0; b < hw; b++) u += m->cnt[b] > 0;
      const int64_t most = (int64_t)m->world * t->k < hw ? (int64_t)m->world * t->k : hw;
      m->sp_lo += t->taint[ti] ? t->k : u;
      m->sp_hi += t->taint[ti] ? most : u;
      m->sp_picks += t->k;
    }
    idct2(t, m->sel, m->x, m->tmp);
    for (int i = 0; i < t->h; i++)
      for (int j = 0; j < t->w; j++) {
        int64_t o = tile_off(t, ti, i, j);
        t->q[o] = m->x[i * t->w + j];
        t->eq[o] = amb + DR_Q_REL * contrib * 2.0 / sqrt((double)hw);
      }
  }
}

void dr_step(dr_model *m, double lr, const float *const *grads) {
  const dr_config *cfg = &m->cfg;
  m->step++;
  m->lr = lr;
  if (m->step <= DR_MAX_STEPS) m->lr_hist[m->step - 1] = (double)(float)lr; /* the library sees floats */
  /* The spread is counted on every stride-th tile in registration order,
   * at most 4096 of them (src/optim/spread.c). */
  int64_t ntiles = 0;
  for (int i = 0; i < m->nt; i++) ntiles += m->t[i].tiles;
  m->sp_stride = ntiles > 4096 ? (ntiles + 4095) / 4096 : 1;
  m->sp_tile = m->sp_lo = m->sp_hi = m->sp_picks = 0;
  for (int i = 0; i < m->nt; i++) {
    dr_tensor *t = &m->t[i];
    size_t n = (size_t)t->n;
    if (cfg->algorithm == DISTRO_ALG_DEMO) {
      demo_tensor(m, t, lr, grads, i);
    } else { /* baseline: mean gradient */
      for (size_t e = 0; e < n; e++) {
        double s = 0;
        for (int r = 0; r < m->world; r++) s += grads[(size_t)r * m->nt + i][e];
        t->q[e] = s / m->world;
        t->eq[e] = 0;
      }
    }
    double qmax = 0;
    for (size_t e = 0; e < n; e++) qmax = fmax(qmax, fabs(t->q[e]));
    for (size_t e = 0; e < n; e++) {
      t->eq[e] += DR_Q_REL * qmax;
      t->eh[e] = fmax(t->eh[e], t->eq[e]);
    }
    if (cfg->algorithm == DISTRO_ALG_ADAMW) {
      for (size_t e = 0; e < n; e++) {
        double q = t->q[e];
        t->m1[e] = cfg->beta1 * t->m1[e] + (1 - cfg->beta1) * q;
        t->m2[e] = cfg->beta2 * t->m2[e] + (1 - cfg->beta2) * q * q;
      }
    }
  }
  m->spread_lo = m->sp_picks && m->sp_lo ? (double)m->sp_lo / (double)m->sp_picks : 1;
  m->spread_hi = m->sp_picks && m->sp_hi ? (double)m->sp_hi / (double)m->sp_picks : 1;
}

double dr_spread_scale(const dr_model *m, double s) {
  /* the calibration: two ranks' selections of 32 in 32 x 32 tiles, a union
   * of at most a sixteenth of the tiles' coefficients */
  const double cal = 2.0 * 32.0 / (32.0 * 32.0);
  double kept = 0, all = 0;
  for (int i = 0; i < m->nt; i++) {
    kept += (double)m->t[i].k * (double)m->t[i].tiles;
    all += (double)m->t[i].h * m->t[i].w * (double)m->t[i].tiles;
  }
  const double density = kept / all;
  /* as dense or denser: the defaults' growth, to s = 4 */
  if (density >= cal / 2) return s > 2 ? sqrt(fmin(s, 4) / 2) : 1;
  /* sparser: the union's share over the calibrated one, up to twice it */
  return s * density > cal ? sqrt(fmin(s * density / cal, 2)) : 1;
}

void dr_spread_counts(const dr_model *m, int64_t *lo, int64_t *hi, int64_t *picks) {
  *lo = m->sp_lo;
  *hi = m->sp_hi;
  *picks = m->sp_picks;
}

double dr_adamw_step(double beta2, int64_t t) {
  /* RAdam's rectification, from its paper's formulas: rho_inf = 2/(1-b2) - 1,
   * rho_t = rho_inf - 2 t b2^t / (1 - b2^t), r_t defined for rho_t > 4. */
  const double rinf = 2 / (1 - beta2) - 1;
  if (rinf <= 4) return 1;
  const double bt = pow(beta2, (double)t), rt = rinf - 2 * t * bt / (1 - bt);
  if (rt <= 4) return 0;
  return sqrt(((rt - 4) / (rinf - 4)) * ((rt - 2) / (rinf - 2)) * (rinf / rt));
}

double dr_warmup_of(const double *lrs, int64_t n, int64_t t) {
  /* The stretched warm-up, from the whole lr history: W is the length of
   * the run of strictly rising lrs (as floats) that opens the schedule
   * (unknown while it lasts); the step is two thirds of its size through it
   * and then grows as t / 1.5W. */
  int64_t w = 0;
  for (int64_t s = 1; s < n && !w; s++)
    if (!((float)lrs[s] > (float)lrs[s - 1])) w = s;
  if (!w || t <= w) return 2.0 / 3.0;
  return fmin(1.0, (double)t / (1.5 * (double)w));
}

double dr_warmup(const dr_model *m, int64_t t) {
  return dr_warmup_of(m->lr_hist, m->step < DR_MAX_STEPS ? m->step : DR_MAX_STEPS, t);
}

void dr_compare(const dr_model *m, int ti, const float *p0, const float *p1, dr_cmp *out) {
  const dr_config *cfg = &m->cfg;
  const dr_tensor *t = &m->t[ti];
  double lr = m->lr;
  const int sign = cfg->algorithm == DISTRO_ALG_DEMO && cfg->update == DISTRO_UPDATE_SIGN;
  const int distro_adamw = cfg->algorithm == DISTRO_ALG_DEMO && cfg->update == DISTRO_UPDATE_ADAMW;
  /* Both DeMo updates: p -= step sign(Q), step = lr (sign) or r_t w_t
   * g(s) lr (DisTrO-AdamW: r_t RAdam's rectification, w_t the stretched
   * warm-up, g(s) the growth with the aggregate's spread s, known to lie in
   * [spread_lo, spread_hi]; the library rounds the step to float32), so the
   * step lies in [step, step_hi]. */
  const double base = distro_adamw ? dr_adamw_step(cfg->beta2, m->step) * dr_warmup(m, m->step) * lr : lr,
               step = distro_adamw ? base * dr_spread_scale(m, m->spread_lo) : lr,
               step_hi = distro_adamw ? base * dr_spread_scale(m, m->spread_hi) : lr,
               stol = distro_adamw ? 1e-6 * step_hi : 0.0;
  double bc1 = 1 - pow(cfg->beta1, (double)m->step), bc2 = 1 - pow(cfg->beta2, (double)m->step);
  memset(out, 0, sizeof *out);
  out->first = -1;
  for (int64_t e = 0; e < t->n; e++) {
    if (cfg->algorithm == DISTRO_ALG_DEMO && t->taint[elem_tile(t, e)]) {
      out->tainted++;
      continue;
    }
    double a = p0[e], got = p1[e], q = t->q[e];
    double pd = a * (1 - lr * cfg->weight_decay);
    double want, tol;
    int ok;
    if (sign || distro_adamw) {
      tol = DR_P_REL * (fabs(a) + step_hi) + stol;
      /* got within tol of pd - x sgn for some x in [step, step_hi] */
#define DR_MOVED(sgn) (sgn * (pd - got) >= step - tol && sgn * (pd - got) <= step_hi + tol)
      if (fabs(q) <= t->eq[e]) { /* sign not determined by float32 */
        out->ambiguous++;
        want = pd;
        ok = fabs(got - pd) <= tol || DR_MOVED(1.0) || DR_MOVED(-1.0);
      } else {
        out->checked++;
        want = pd - step * (q > 0 ? 1.0 : -1.0);
        ok = DR_MOVED((q > 0 ? 1.0 : -1.0));
      }
#undef DR_MOVED
    } else {
      double mh = t->m1[e] / bc1, s = sqrt(t->m2[e] / bc2);
      double u = mh / (s + cfg->eps);
      /* |d mhat|, |d sqrt(vhat)| <= eh (weights sum to 1), so
         |du| <~ eh (1 + |u|) / (s + eps); doubled for safety */
      double tu = 2.0 * t->eh[e] * (1 + fabs(u)) / (s + cfg->eps);
      want = pd - lr * u;
      tol = DR_P_REL * (fabs(a) + lr * fabs(u)) + lr * tu;
      if (tu > 0.1) out->loose++; else out->checked++;
      ok = fabs(got - want) <= tol;
    }
    if (!ok) {
      if (out->first < 0) {
        out->first = (long)e;
        out->got = got;
        out->want = want;
        out->tol = tol;
        out->q = q;
      }
      out->mismatches++;
    }
  }
}

uint64_t dr_payload_min_bytes(const dr_model *m) {
  uint64_t bytes = 0, bits = 0;
  for (int i = 0; i < m->nt; i++) {
    const dr_tensor *t = &m->t[i];
    uint64_t kept = (uint64_t)t->tiles * (uint64_t)t->k;
    int hw = t->h * t->w;
    if (t->k < hw) bytes += kept * (hw <= 256 ? 1u : 2u); /* indices */
    if (m->cfg.values == DISTRO_VALUES_F32) bytes += 4 * kept;
    else if (m->cfg.values == DISTRO_VALUES_BF16) bytes += 2 * kept;
    else if (m->cfg.values == DISTRO_VALUES_INT8) bytes += kept + 2 * (uint64_t)t->tiles; /* + a scale a chunk */
    else bits += kept;
  }
  return bytes + (bits + 7) / 8;
}

/* ---- harness ------------------------------------------------------------- */

int64_t dr_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

float *dr_snap(const dr_run *x, int step, int rank, int t) {
  return x->snap[((size_t)step * x->world + rank) * x->nt + t];
}

int dr_run_prepare(dr_run *x, uint64_t seed, double gscale) {
  tu_rng rng = {seed};
  size_t cells = (size_t)x->steps * x->world * x->nt;
  x->grads = calloc(cells, sizeof(float *));
  x->snap = calloc(cells, sizeof(float *));
  x->stats = calloc((size_t)x->steps * x->world, sizeof *x->stats);
  x->lrs = calloc((size_t)x->steps, sizeof(double));
  x->final = calloc((size_t)x->world * x->nt, sizeof(float *));
  if (!x->grads || !x->snap || !x->stats || !x->lrs || !x->final) return -1;
  for (size_t i = 0; i < (size_t)x->world * x->nt; i++) {
    x->final[i] = malloc((size_t)dr_shape_numel(x->ndims[i % x->nt], x->shapes[i % x->nt]) * sizeof(float));
    if (!x->final[i]) return -1;
  }
  for (int t = 0; t < x->nt; t++) {
    size_t n = (size_t)dr_shape_numel(x->ndims[t], x->shapes[t]);
    x->init[t] = malloc(n * sizeof(float));
    if (!x->init[t]) return -1;
    tu_fill_normal(&rng, x->init[t], n, 1.0f);
  }
  for (size_t i = 0; i < cells; i++) {
    int t = (int)(i % x->nt);
    size_t n = (size_t)dr_shape_numel(x->ndims[t], x->shapes[t]);
    x->grads[i] = malloc(n * sizeof(float));
    x->snap[i] = malloc(n * sizeof(float));
    if (!x->grads[i] || !x->snap[i]) return -1;
    tu_fill_normal(&rng, x->grads[i], n, (float)gscale);
  }
  for (int s = 0; s < x->steps; s++) x->lrs[s] = x->opt.lr;
  return 0;
}

void dr_run_free(dr_run *x) {
  size_t cells = (size_t)x->steps * x->world * x->nt;
  for (size_t i = 0; x->grads && i < cells; i++) free(x->grads[i]);
  for (size_t i = 0; x->snap && i < cells; i++) free(x->snap[i]);
  for (int t = 0; t < x->nt; t++) free(x->init[t]);
  for (size_t i = 0; x->final && i < (size_t)x->world * x->nt; i++) free(x->final[i]);
  free(x->final);
  x->final = NULL;
  free(x->grads); free(x->snap); free(x->stats); free(x->lrs);
  x->grads = x->snap = NULL;
  x->stats = NULL;
  x->lrs = NULL;
}

static distro_status dr_fail(dr_run *x, int rank, const char *where, distro_status st) {
  snprintf(x->err[rank], sizeof x->err[rank], "%s: %s (%s)", where, distro_status_string(st),
           distro_last_error());
  x->rank_status[rank] = st;
  return st;
}

/* Rank thread: never asserts (Criterion asserts belong to the test thread). */
static distro_status dr_rank(distro_comm *c, int rank, void *arg) {
  dr_run *x = arg;
  if (x->omp_threads > 0) omp_set_num_threads(x->omp_threads);
  float *p[DR_MAX_TENSORS] = {0}, *g[DR_MAX_TENSORS] = {0};
  distro_optim *o = NULL;
  distro_status st = DISTRO_OK;
  char where[64];
  for (int t = 0; t < x->nt; t++) {
    size_t n = (size_t)dr_shape_numel(x->ndims[t], x->shapes[t]);
    p[t] = malloc(n * sizeof(float));
    g[t] = malloc(n * sizeof(float));
    if (!p[t] || !g[t]) { st = dr_fail(x, rank, "malloc", DISTRO_ERR_NOMEM); goto done; }
    memcpy(p[t], x->init[t], n * sizeof(float));
  }
  st = distro_optim_create(&x->opt, c, &o);
  if (st) { dr_fail(x, rank, "create", st); goto done; }
  for (int t = 0; t < x->nt; t++) {
    st = distro_optim_add_param(o, x->names[t], p[t], g[t], x->ndims[t], x->shapes[t]);
    if (st) { dr_fail(x, rank, x->names[t], st); goto done; }
  }
  if (x->load_fmt) {
    char path[512];
    snprintf(path, sizeof path, x->load_fmt, rank);
    st = distro_optim_load(o, path);
    if (st) { dr_fail(x, rank, "load", st); goto done; }
  }
  for (int s = 0; s < x->steps; s++) {
    for (int t = 0; t < x->nt; t++) {
      size_t n = (size_t)dr_shape_numel(x->ndims[t], x->shapes[t]);
      float *cell = x->grads[((size_t)s * x->world + rank) * x->nt + t];
      if (x->grad_fn) x->grad_fn(x, s, rank, t, p[t], cell); /* this rank's cell only */
      memcpy(g[t], cell, n * sizeof(float));
    }
    st = distro_optim_step(o, (float)x->lrs[s], &x->stats[(size_t)s * x->world + rank]);
    if (st) { snprintf(where, sizeof where, "step %d", s + 1); dr_fail(x, rank, where, st); goto done; }
    if (x->comm_check) { /* the caller's own collective while an exchange may be in flight */
      float v[3] = {(float)(rank + 1), 1.0f, (float)s};
      st = distro_comm_allreduce_sum(c, v, 3);
      if (st) { dr_fail(x, rank, "caller's all-reduce", st); goto done; }
      if (v[0] != (float)(x->world * (x->world + 1) / 2) || v[1] != (float)x->world || v[2] != (float)(s * x->world)) {
        st = dr_fail(x, rank, "caller's all-reduce gave wrong sums", DISTRO_ERR_COMM);
        goto done;
      }
    }
    const int save_here = x->save_fmt && s + 1 == x->save_after;
    if (save_here && x->opt.overlap && !x->save_in_flight) {
      st = distro_optim_flush(o, NULL);
      if (st) { dr_fail(x, rank, "flush before save", st); goto done; }
    }
    for (int t = 0; t < x->nt; t++) {
      size_t n = (size_t)dr_shape_numel(x->ndims[t], x->shapes[t]);
      memcpy(dr_snap(x, s, rank, t), p[t], n * sizeof(float));
    }
    if (save_here) {
      char path[512];
      snprintf(path, sizeof path, x->save_fmt, rank);
      st = distro_optim_save(o, path);
      if (st) { dr_fail(x, rank, "save", st); goto done; }
    }
  }
  if (x->flush) {
    st = distro_optim_flush(o, &x->flush_stats[rank]);
    if (st) { dr_fail(x, rank, "flush", st); goto done; }
  }
  for (int t = 0; t < x->nt; t++)
    memcpy(x->final[rank * x->nt + t], p[t], (size_t)dr_shape_numel(x->ndims[t], x->shapes[t]) * sizeof(float));
  st = distro_optim_payload_bytes(o, &x->payload[rank]);
  if (st) dr_fail(x, rank, "payload_bytes", st);
done:
  distro_optim_free(o);
  for (int t = 0; t < x->nt; t++) { free(p[t]); free(g[t]); }
  return st;
}

distro_status dr_run_exec(dr_run *x) {
  for (int r = 0; r < DR_MAX_WORLD; r++) { x->rank_status[r] = DISTRO_OK; x->err[r][0] = 0; }
  return distro_comm_run_local(x->world, dr_rank, x);
}
