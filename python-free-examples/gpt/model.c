/* Byte-level GPT: parameters, forward and backward (see model.h).
 *
 * Layer functions follow llm.c's train_gpt2.c. Matrix products go through
 * CBLAS; the rest is plain loops parallelised with OpenMP over rows. Each
 * output element is computed by one thread in a fixed order, so results do
 * not depend on the thread count; reductions over rows (bias and LayerNorm
 * gradients) are split over channels for the same reason. */
#include "model.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tgmath.h> /* exp/log/sqrt/tanh follow `real` */

#include "rng.h"

#ifdef GPT_DOUBLE
#define gemm cblas_dgemm
#else
#define gemm cblas_sgemm
#endif

#define LN_EPS ((real)1e-5)
#define CBLK 64 /* channels per thread in per-channel reductions */

/* ------------------------------------------------------------------------ */
/* Parameters                                                                 */

const char *gpt_config_problem(const gpt_config *c) {
  if (c->context < 1) return "context must be >= 1";
  if (c->layers < 1) return "layers must be >= 1";
  if (c->dim < 1) return "dim must be >= 1";
  if (c->heads < 1) return "heads must be >= 1";
  if (c->dim % c->heads) return "dim must be a multiple of heads";
  if ((int64_t)c->dim * c->layers > 1 << 24 || c->context > 1 << 16) return "model too large";
  return "";
}

static void add_tensor(gpt_model *m, const char *name, int ndim, int64_t rows, int64_t cols) {
  gpt_tensor *t = &m->tensors[m->ntensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->shape[0] = rows;
  t->shape[1] = ndim == 2 ? cols : 1;
  t->numel = (size_t)(rows * t->shape[1]);
  t->offset = m->nparams;
  m->nparams += t->numel;
}

/* The tensor table, in buffer order. Matrices are (out, in), so DeMo's chunked
 * DCT tiles them as 2-D. */
static void build_table(gpt_model *m) {
  const gpt_config *c = &m->cfg;
  const int64_t C = c->dim, V = GPT_VOCAB;
  char nm[40];
  add_tensor(m, "wte", 2, V, C);
  add_tensor(m, "wpe", 2, c->context, C);
  for (int l = 0; l < c->layers; l++) {
#define T2(suffix, r, k) (snprintf(nm, sizeof nm, "h%d.%s", l, suffix), add_tensor(m, nm, 2, r, k))
#define T1(suffix, n) (snprintf(nm, sizeof nm, "h%d.%s", l, suffix), add_tensor(m, nm, 1, n, 1))
    T1("ln1.w", C);
    T1("ln1.b", C);
    T2("attn.qkv.w", 3 * C, C);
    T1("attn.qkv.b", 3 * C);
    T2("attn.proj.w", C, C);
    T1("attn.proj.b", C);
    T1("ln2.w", C);
    T1("ln2.b", C);
    T2("mlp.fc.w", 4 * C, C);
    T1("mlp.fc.b", 4 * C);
    T2("mlp.proj.w", C, 4 * C);
    T1("mlp.proj.b", C);
#undef T1
#undef T2
  }
  add_tensor(m, "lnf.w", 1, C, 1);
  add_tensor(m, "lnf.b", 1, C, 1);
  if (!c->tied) add_tensor(m, "head", 2, V, C);
}

/* Views of a flat buffer laid out like the table. */
static void bind(const gpt_model *m, real *base, gpt_weights *w) {
  const gpt_tensor *t = m->tensors;
  int i = 0;
  w->wte = base + t[i++].offset;
  w->wpe = base + t[i++].offset;
  for (int l = 0; l < m->cfg.layers; l++) {
    gpt_block *b = &w->blocks[l];
    real **slots[12] = {&b->ln1w, &b->ln1b, &b->qkvw, &b->qkvb, &b->projw, &b->projb,
                        &b->ln2w, &b->ln2b, &b->fcw,  &b->fcb,  &b->fc2w,  &b->fc2b};
    for (int s = 0; s < 12; s++) *slots[s] = base + t[i++].offset;
  }
  w->lnfw = base + t[i++].offset;
  w->lnfb = base + t[i++].offset;
  w->head = m->cfg.tied ? w->wte : base + t[i++].offset;
}

/* Activation arrays, in the order of gpt_acts; sizes for B rows of T. */
#define NACTS 22
static void act_sizes(const gpt_config *c, size_t B, size_t T, size_t s[NACTS]) {
  const size_t L = (size_t)c->layers, C = (size_t)c->dim, NH = (size_t)c->heads, V = GPT_VOCAB;
  size_t i = 0;
  s[i++] = B * T * C;           /* encoded */
  s[i++] = L * B * T * C;       /* ln1 */
  s[i++] = L * B * T;           /* ln1_mean */
  s[i++] = L * B * T;           /* ln1_rstd */
  s[i++] = L * B * T * 3 * C;   /* qkv */
  s[i++] = L * B * T * C;       /* atty */
  s[i++] = L * B * NH * T * T;  /* att */
  s[i++] = L * B * T * C;       /* attproj */
  s[i++] = L * B * T * C;       /* res2 */
  s[i++] = L * B * T * C;       /* ln2 */
  s[i++] = L * B * T;           /* ln2_mean */
  s[i++] = L * B * T;           /* ln2_rstd */
  s[i++] = L * B * T * 4 * C;   /* fch */
  s[i++] = L * B * T * 4 * C;   /* fch_gelu */
  s[i++] = L * B * T * C;       /* fcproj */
  s[i++] = L * B * T * C;       /* res3 */
  s[i++] = B * T * C;           /* lnf */
  s[i++] = B * T;               /* lnf_mean */
  s[i++] = B * T;               /* lnf_rstd */
  s[i++] = B * T * V;           /* logits */
  s[i++] = B * T * V;           /* probs */
  s[i++] = B * T;               /* losses */
}

/* Points the gpt_acts fields (22 real* in declaration order) into memory. */
static void bind_acts(gpt_acts *a, real *memory, const size_t s[NACTS]) {
  real **f[NACTS] = {&a->encoded, &a->ln1,   &a->ln1_mean, &a->ln1_rstd, &a->qkv,      &a->atty,
                     &a->att,     &a->attproj, &a->res2,   &a->ln2,      &a->ln2_mean, &a->ln2_rstd,
                     &a->fch,     &a->fch_gelu, &a->fcproj, &a->res3,    &a->lnf,      &a->lnf_mean,
                     &a->lnf_rstd, &a->logits, &a->probs,  &a->losses};
  for (int i = 0; i < NACTS; i++) {
    *f[i] = memory;
    memory += s[i];
  }
}

static void init_weights(gpt_model *m, uint64_t seed) {
  /* GPT-2: N(0, 0.02) for embeddings and matrices, the two projections that
   * write into the residual stream scaled by 1/sqrt(2L); LayerNorm gains 1,
   * biases 0. One stream per tensor, so the init of a tensor does not depend
   * on the sizes of the ones before it. */
  const real std = (real)0.02, proj_std = (real)(0.02 / sqrt(2.0 * m->cfg.layers));
  for (int i = 0; i < m->ntensors; i++) {
    const gpt_tensor *t = &m->tensors[i];
    real *p = m->params + t->offset;
    const char *dot = strrchr(t->name, '.');
    if (t->ndim == 1) {
      const int gain = dot && !strcmp(dot, ".w"); /* ln*.w */
      for (size_t j = 0; j < t->numel; j++) p[j] = gain ? (real)1 : (real)0;
      continue;
    }
    const real s = strstr(t->name, "proj.w") ? proj_std : std;
    gpt_rng r = rng_make(seed, (uint64_t)i);
    for (size_t j = 0; j < t->numel; j++) p[j] = s * (real)rng_normal(&r);
  }
}

int gpt_init(gpt_model *m, const gpt_config *c, int max_batch, uint64_t seed) {
  memset(m, 0, sizeof *m);
  m->cfg = *c;
  m->max_batch = max_batch;
  m->tensors = calloc((size_t)(3 + 12 * c->layers + 3), sizeof *m->tensors);
  m->w.blocks = calloc((size_t)c->layers, sizeof(gpt_block));
  m->g.blocks = calloc((size_t)c->layers, sizeof(gpt_block));
  if (!m->tensors || !m->w.blocks || !m->g.blocks) goto oom;
  build_table(m);
  m->params = calloc(m->nparams, sizeof(real));
  m->grads = calloc(m->nparams, sizeof(real));
  size_t s[NACTS], total = 0;
  act_sizes(c, (size_t)max_batch, (size_t)c->context, s);
  for (int i = 0; i < NACTS; i++) total += s[i];
  m->acts_memory = malloc(total * sizeof(real));
  m->dacts_memory = calloc(total, sizeof(real));
  if (!m->params || !m->grads || !m->acts_memory || !m->dacts_memory) goto oom;
  bind(m, m->params, &m->w);
  bind(m, m->grads, &m->g);
  init_weights(m, seed);
  return 0;
oom:
  gpt_free(m);
  return -1;
}

void gpt_free(gpt_model *m) {
  free(m->tensors);
  free(m->w.blocks);
  free(m->g.blocks);
  free(m->params);
  free(m->grads);
  free(m->acts_memory);
  free(m->dacts_memory);
  memset(m, 0, sizeof *m);
}

void gpt_zero_grad(gpt_model *m) { memset(m->grads, 0, m->nparams * sizeof(real)); }

uint64_t gpt_param_checksum(const gpt_model *m) {
  const unsigned char *p = (const unsigned char *)m->params;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < m->nparams * sizeof(real); i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

/* ------------------------------------------------------------------------ */
/* Forward layers                                                             */

static void encoder_forward(real *out, const uint8_t *inp, const real *wte, const real *wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T; bt++) {
    const real *we = wte + (size_t)inp[bt] * C, *pe = wpe + (size_t)(bt % T) * C;
    real *o = out + (size_t)bt * C;
    for (int i = 0; i < C; i++) o[i] = we[i] + pe[i];
  }
}

static void layernorm_forward(real *out, real *mean, real *rstd, const real *inp, const real *w, const real *b,
                              int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const real *x = inp + (size_t)n * C;
    real m = 0, v = 0;
#pragma omp simd reduction(+ : m)
    for (int i = 0; i < C; i++) m += x[i];
    m /= C;
#pragma omp simd reduction(+ : v)
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    v /= C;
    real s = 1 / sqrt(v + LN_EPS);
    real *o = out + (size_t)n * C;
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

/* Rows [n0, n1) of N for this OpenMP thread. The matrix products are split
 * over output rows between the threads, each calling a single-threaded BLAS
 * (OpenBLAS's own threads are off: see train.c). */
static void thread_rows(int N, int *n0, int *n1) {
  const int nt = omp_get_num_threads(), id = omp_get_thread_num();
  *n0 = (int)((int64_t)N * id / nt);
  *n1 = (int)((int64_t)N * (id + 1) / nt);
}

/* out (N, OC) = inp (N, C) . w (OC, C)^T + bias (OC). */
static void matmul_forward(real *out, const real *inp, const real *w, const real *bias, int N, int C, int OC) {
#pragma omp parallel
  {
    int n0, n1;
    thread_rows(N, &n0, &n1);
    if (bias)
      for (int n = n0; n < n1; n++) memcpy(out + (size_t)n * OC, bias, sizeof(real) * (size_t)OC);
    if (n1 > n0)
      gemm(CblasRowMajor, CblasNoTrans, CblasTrans, n1 - n0, OC, C, 1, inp + (size_t)n0 * C, C, w, C, bias ? 1 : 0,
           out + (size_t)n0 * OC, OC);
  }
}

/* Causal multi-head attention, per (batch, head) with matrix products:
 * scores = q k^T / sqrt(hs) (the upper triangle is computed, then masked),
 * att = softmax over t2 <= t, out = att v. qkv (B,T,3C) holds q, k, v side
 * by side; att (B,NH,T,T) keeps the weights; out is (B,T,C). */
static void attention_forward(real *out, real *att, const real *qkv, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const real scale = 1 / sqrt((real)hs);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const real *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
      real *a = att + (size_t)(b * NH + h) * T * T;
      gemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0, a, T);
      for (int t = 0; t < T; t++) {
        real *r = a + (size_t)t * T, maxv = r[0], sum = 0;
        for (int t2 = 1; t2 <= t; t2++) maxv = r[t2] > maxv ? r[t2] : maxv;
        for (int t2 = 0; t2 <= t; t2++) {
          r[t2] = exp(r[t2] - maxv);
          sum += r[t2];
        }
        for (int t2 = 0; t2 <= t; t2++) r[t2] /= sum;
        for (int t2 = t + 1; t2 < T; t2++) r[t2] = 0;
      }
      gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1, a, T, v, C3, 0, out + (size_t)b * T * C + h * hs,
           C);
    }
}

#define GELU_K ((real)0.7978845608028654) /* sqrt(2/pi) */

/* tanh for GELU. libm's tanhf is a scalar call and was a fifth of the step;
 * in float this rational approximation (Eigen's fast tanh: |error| < 4e-7)
 * vectorises. The float64 build keeps libm's, so the gradient check sees the
 * exact function. */
static inline real gelu_tanh(real x) {
#ifdef GPT_DOUBLE
  return tanh(x);
#else
  const float c = 7.90531110763549805f;
  const float xc = x > c ? c : x < -c ? -c : x, x2 = xc * xc;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 - 8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return fabsf(x) < 0.0004f ? x : xc * p / q;
#endif
}

/* GELU, tanh approximation (GPT-2). */
static void gelu_forward(real *out, const real *inp, size_t N) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; i++) {
    real x = inp[i];
    out[i] = (real)0.5 * x * (1 + gelu_tanh(GELU_K * (x + (real)0.044715 * x * x * x)));
  }
}

static void residual_forward(real *out, const real *a, const real *b, size_t N) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

static void softmax_forward(real *probs, const real *logits, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const real *l = logits + (size_t)n * V;
    real *p = probs + (size_t)n * V;
    real maxv = l[0], sum = 0;
    for (int i = 1; i < V; i++)
      if (l[i] > maxv) maxv = l[i];
    for (int i = 0; i < V; i++) {
      p[i] = exp(l[i] - maxv);
      sum += p[i];
    }
    for (int i = 0; i < V; i++) p[i] /= sum;
  }
}

static void crossentropy_forward(real *losses, const real *probs, const uint8_t *targets, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) losses[n] = -log(probs[(size_t)n * V + targets[n]]);
}

/* ------------------------------------------------------------------------ */
/* Backward layers (each accumulates into its input gradients)                */

static void encoder_backward(real *dwte, real *dwpe, const real *dout, const uint8_t *inp, int B, int T, int C) {
  /* Serial: rows of dwte repeat across positions. It is B*T*C adds. */
  for (int bt = 0; bt < B * T; bt++) {
    const real *d = dout + (size_t)bt * C;
    real *we = dwte + (size_t)inp[bt] * C, *pe = dwpe + (size_t)(bt % T) * C;
    for (int i = 0; i < C; i++) {
      we[i] += d[i];
      pe[i] += d[i];
    }
  }
}

static void layernorm_backward(real *dinp, real *dw, real *db, const real *dout, const real *inp, const real *w,
                               const real *mean, const real *rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const real *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
    real *di = dinp + (size_t)n * C;
    const real m = mean[n], s = rstd[n];
    real dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int i = 0; i < C; i++) {
      real norm = (x[i] - m) * s, dnorm = w[i] * d[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int i = 0; i < C; i++) {
      real norm = (x[i] - m) * s, dnorm = w[i] * d[i];
      di[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
  /* Gain and bias: each thread owns a block of channels and sums the rows
   * in order (contiguous along channels, so it vectorises). */
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += CBLK) {
    const int c1 = c0 + CBLK < C ? c0 + CBLK : C;
    for (int n = 0; n < N; n++) {
      const real *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
      const real m = mean[n], s = rstd[n];
      for (int i = c0; i < c1; i++) {
        dw[i] += (x[i] - m) * s * d[i];
        db[i] += d[i];
      }
    }
  }
}

/* Gradients of out = inp . w^T + bias: dinp split over its rows, dw and
 * dbias over theirs (output channels), so no two threads write one value. */
static void matmul_backward(real *dinp, real *dw, real *dbias, const real *dout, const real *inp, const real *w,
                            int N, int C, int OC) {
#pragma omp parallel
  {
    int n0, n1, o0, o1;
    thread_rows(N, &n0, &n1);
    thread_rows(OC, &o0, &o1);
    if (n1 > n0)
      gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n1 - n0, C, OC, 1, dout + (size_t)n0 * OC, OC, w, C, 1,
           dinp + (size_t)n0 * C, C);
    if (o1 > o0)
      gemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, N, 1, dout + o0, OC, inp, C, 1, dw + (size_t)o0 * C,
           C);
    if (dbias)
      for (int n = 0; n < N; n++) {
        const real *d = dout + (size_t)n * OC;
        for (int o = o0; o < o1; o++) dbias[o] += d[o];
      }
  }
}

/* Backward of attention_forward for each (batch, head); datt (B,NH,T,T) is
 * scratch for the gradient of the weights and then of the scores. */
static void attention_backward(real *dqkv, real *datt, const real *dout, const real *qkv, const real *att, int B,
                               int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const real scale = 1 / sqrt((real)hs);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const size_t off = (size_t)b * T * C3 + h * hs;
      const real *q = qkv + off, *k = q + C, *v = q + 2 * C;
      real *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
      const real *a = att + (size_t)(b * NH + h) * T * T, *d = dout + (size_t)b * T * C + h * hs;
      real *da = datt + (size_t)(b * NH + h) * T * T;
      /* out = att v */
      gemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1, d, C, v, C3, 0, da, T);
      gemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1, a, T, d, C, 1, dv, C3);
      /* softmax (and the score scale): dscore = a * (datt - sum(a * datt)) * scale */
      for (int t = 0; t < T; t++) {
        const real *r = a + (size_t)t * T;
        real *dr = da + (size_t)t * T, dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int t2 = 0; t2 <= t; t2++) dot += r[t2] * dr[t2];
        for (int t2 = 0; t2 <= t; t2++) dr[t2] = r[t2] * (dr[t2] - dot) * scale;
        for (int t2 = t + 1; t2 < T; t2++) dr[t2] = 0;
      }
      /* scores = q k^T */
      gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1, da, T, k, C3, 1, dq, C3);
      gemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1, da, T, q, C3, 1, dk, C3);
    }
}

static void gelu_backward(real *dinp, const real *inp, const real *dout, size_t N) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; i++) {
    real x = inp[i], u = GELU_K * (x + (real)0.044715 * x * x * x);
    real th = gelu_tanh(u), sech2 = 1 - th * th;
    real grad = (real)0.5 * (1 + th) + (real)0.5 * x * sech2 * GELU_K * (1 + 3 * (real)0.044715 * x * x);
    dinp[i] += grad * dout[i];
  }
}

static void residual_backward(real *da, real *db, const real *dout, size_t N) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

/* d(mean loss)/d(logits) = (probs - onehot) / N. */
static void crossentropy_softmax_backward(real *dlogits, const real *probs, const uint8_t *targets, int N, int V) {
  const real dloss = (real)1 / N;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const real *p = probs + (size_t)n * V;
    real *d = dlogits + (size_t)n * V;
    for (int i = 0; i < V; i++) d[i] = (p[i] - (i == targets[n])) * dloss;
  }
}

/* ------------------------------------------------------------------------ */
/* The model                                                                  */

/* Per-layer slice l of a (L, B, T, width) activation. */
#define LAYER(arr, width) ((arr) + (size_t)l * BT * (width))

real gpt_forward(gpt_model *m, const uint8_t *inputs, const uint8_t *targets, int B, int T) {
  const int L = m->cfg.layers, C = m->cfg.dim, NH = m->cfg.heads, V = GPT_VOCAB;
  const size_t BT = (size_t)B * T;
  const gpt_weights *w = &m->w;
  gpt_acts *a = &m->a;
  size_t s[NACTS];
  act_sizes(&m->cfg, (size_t)B, (size_t)T, s);
  bind_acts(a, m->acts_memory, s);
  m->B = B;
  m->T = T;
  m->inputs = inputs;
  m->targets = targets;

  encoder_forward(a->encoded, inputs, w->wte, w->wpe, B, T, C);
  for (int l = 0; l < L; l++) {
    const gpt_block *p = &w->blocks[l];
    const real *x = l == 0 ? a->encoded : LAYER(a->res3, C) - BT * C;
    real *ln1 = LAYER(a->ln1, C), *qkv = LAYER(a->qkv, 3 * C), *atty = LAYER(a->atty, C);
    real *att = a->att + (size_t)l * BT * NH * T, *attproj = LAYER(a->attproj, C), *res2 = LAYER(a->res2, C);
    real *ln2 = LAYER(a->ln2, C), *fch = LAYER(a->fch, 4 * C), *fch_gelu = LAYER(a->fch_gelu, 4 * C);
    real *fcproj = LAYER(a->fcproj, C), *res3 = LAYER(a->res3, C);
    layernorm_forward(ln1, LAYER(a->ln1_mean, 1), LAYER(a->ln1_rstd, 1), x, p->ln1w, p->ln1b, (int)BT, C);
    matmul_forward(qkv, ln1, p->qkvw, p->qkvb, (int)BT, C, 3 * C);
    attention_forward(atty, att, qkv, B, T, C, NH);
    matmul_forward(attproj, atty, p->projw, p->projb, (int)BT, C, C);
    residual_forward(res2, x, attproj, BT * C);
    layernorm_forward(ln2, LAYER(a->ln2_mean, 1), LAYER(a->ln2_rstd, 1), res2, p->ln2w, p->ln2b, (int)BT, C);
    matmul_forward(fch, ln2, p->fcw, p->fcb, (int)BT, C, 4 * C);
    gelu_forward(fch_gelu, fch, BT * 4 * C);
    matmul_forward(fcproj, fch_gelu, p->fc2w, p->fc2b, (int)BT, 4 * C, C);
    residual_forward(res3, res2, fcproj, BT * C);
  }
  const real *last = a->res3 + (size_t)(L - 1) * BT * C;
  layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, last, w->lnfw, w->lnfb, (int)BT, C);
  matmul_forward(a->logits, a->lnf, w->head, NULL, (int)BT, C, V);
  softmax_forward(a->probs, a->logits, (int)BT, V);
  if (!targets) {
    m->loss = 0;
    return 0;
  }
  crossentropy_forward(a->losses, a->probs, targets, (int)BT, V);
  m->loss = (real)(gpt_loss_sum(m) / (double)BT);
  return m->loss;
}

double gpt_loss_sum(const gpt_model *m) {
  double s = 0;
  for (size_t i = 0; i < (size_t)m->B * m->T; i++) s += m->a.losses[i];
  return s;
}

void gpt_backward(gpt_model *m) { gpt_backward_hooked(m, NULL, NULL); }

void gpt_backward_hooked(gpt_model *m, gpt_grads_ready_fn ready, void *ctx) {
  const int L = m->cfg.layers, C = m->cfg.dim, NH = m->cfg.heads, V = GPT_VOCAB, B = m->B, T = m->T;
  const size_t BT = (size_t)B * T;
  const gpt_weights *w = &m->w, *g = &m->g;
  const gpt_acts *a = &m->a;
  gpt_acts *d = &m->da;
  size_t s[NACTS], total = 0;
  act_sizes(&m->cfg, (size_t)B, (size_t)T, s);
  for (int i = 0; i < NACTS; i++) total += s[i];
  bind_acts(d, m->dacts_memory, s);
  memset(m->dacts_memory, 0, total * sizeof(real)); /* the layers accumulate */

  crossentropy_softmax_backward(d->logits, a->probs, m->targets, (int)BT, V);
  matmul_backward(d->lnf, g->head, NULL, d->logits, a->lnf, w->head, (int)BT, C, V);
  const real *last = a->res3 + (size_t)(L - 1) * BT * C;
  real *dlast = d->res3 + (size_t)(L - 1) * BT * C;
  layernorm_backward(dlast, g->lnfw, g->lnfb, d->lnf, last, w->lnfw, a->lnf_mean, a->lnf_rstd, (int)BT, C);
  /* The table: wte, wpe, 12 per block, lnf.w, lnf.b, [head]. The tied
   * head's gradient is final only after the encoder's. */
  const int per_block = 12, after_blocks = 2 + per_block * L;
  if (ready) ready(ctx, after_blocks, m->cfg.tied ? 2 : 3);

  for (int l = L - 1; l >= 0; l--) {
    const gpt_block *p = &w->blocks[l], *gp = &g->blocks[l];
    const real *x = l == 0 ? a->encoded : LAYER(a->res3, C) - BT * C;
    real *dx = l == 0 ? d->encoded : LAYER(d->res3, C) - BT * C;
    const real *ln1 = LAYER(a->ln1, C), *qkv = LAYER(a->qkv, 3 * C), *atty = LAYER(a->atty, C);
    const real *att = a->att + (size_t)l * BT * NH * T, *res2 = LAYER(a->res2, C), *ln2 = LAYER(a->ln2, C);
    const real *fch = LAYER(a->fch, 4 * C), *fch_gelu = LAYER(a->fch_gelu, 4 * C);
    real *dln1 = LAYER(d->ln1, C), *dqkv = LAYER(d->qkv, 3 * C), *datty = LAYER(d->atty, C);
    real *dattproj = LAYER(d->attproj, C), *dres2 = LAYER(d->res2, C), *dln2 = LAYER(d->ln2, C);
    real *dfch = LAYER(d->fch, 4 * C), *dfch_gelu = LAYER(d->fch_gelu, 4 * C), *dfcproj = LAYER(d->fcproj, C);
    const real *dres3 = LAYER(d->res3, C);

    residual_backward(dres2, dfcproj, dres3, BT * C);
    matmul_backward(dfch_gelu, gp->fc2w, gp->fc2b, dfcproj, fch_gelu, p->fc2w, (int)BT, 4 * C, C);
    gelu_backward(dfch, fch, dfch_gelu, BT * 4 * C);
    matmul_backward(dln2, gp->fcw, gp->fcb, dfch, ln2, p->fcw, (int)BT, C, 4 * C);
    layernorm_backward(dres2, gp->ln2w, gp->ln2b, dln2, res2, p->ln2w, LAYER(a->ln2_mean, 1),
                       LAYER(a->ln2_rstd, 1), (int)BT, C);
    residual_backward(dx, dattproj, dres2, BT * C);
    matmul_backward(datty, gp->projw, gp->projb, dattproj, atty, p->projw, (int)BT, C, C);
    attention_backward(dqkv, d->att + (size_t)l * BT * NH * T, datty, qkv, att, B, T, C, NH);
    matmul_backward(dln1, gp->qkvw, gp->qkvb, dqkv, ln1, p->qkvw, (int)BT, C, 3 * C);
    layernorm_backward(dx, gp->ln1w, gp->ln1b, dln1, x, p->ln1w, LAYER(a->ln1_mean, 1), LAYER(a->ln1_rstd, 1),
                       (int)BT, C);
    if (ready) ready(ctx, 2 + per_block * l, per_block);
  }
  encoder_backward(g->wte, g->wpe, d->encoded, m->inputs, B, T, C);
  if (ready) ready(ctx, 0, 2);
}
