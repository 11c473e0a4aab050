/* distro-demo: what `make demo` runs until the trainer example exists.
 *
 * 1. Bytes per rank per step for the parameter shapes of GPT-2 124M and the
 *    1.2B Llama-2 of the DisTrO report: DeMo at several top-k and value
 *    codecs (distro_payload_bytes), next to a dense fp32 ring all-reduce and
 *    the reference DeMo format (int64 index + f32 value), and the published
 *    figures.
 * 2. A short in-process 4-rank run on a small synthetic regression problem
 *    (2-layer MLP student, fixed random teacher, one data shard per rank)
 *    comparing DeMo (sign; f32 values at top-k 32, and 1-bit values at top-k
 *    8 as Psyche runs it), DisTrO-AdamW and AdamW with a gradient all-reduce:
 *    held-out loss as it trains and bytes sent per rank. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <distro/distro.h>

#include "shapes.h"

/* ------------------------------------------------------------------------ */
/* Part 1: bytes per step                                                     */

#define WORLD_REF 32 /* nodes in the DisTrO report */

static double mb(double bytes) { return bytes / 1e6; }

static int bytes_table(const bench_model *m, int anchors) {
  static const int topks[] = {1, 4, 8, 32};
  static const distro_values vals[] = {DISTRO_VALUES_F32, DISTRO_VALUES_BF16, DISTRO_VALUES_SIGN1};
  static const char *vname[] = {"f32", "bf16", "1-bit"};
  const double N = (double)m->nparams;
  const double ring = 2.0 * (WORLD_REF - 1) / WORLD_REF * 4.0 * N;

  printf("\n");
  bench_model_print(m, stdout);
  printf("  dense fp32 ring all-reduce, W=%d: 2(W-1)/W x 4 B x N = %.1f MB sent per rank per step\n\n", WORLD_REF,
         mb(ring));
  printf("  %4s  %10s  %13s  %6s  %13s  %11s  %11s\n", "topk", "kept", "ref format", "values", "this library",
         "less than", "less than");
  printf("  %4s  %10s  %13s  %6s  %13s  %11s  %11s\n", "", "coefs", "12B/coef, MB", "", "MB, at most",
         "all-reduce", "ref format");
  for (int i = 0; i < 4; i++) {
    distro_options o = distro_options_default(DISTRO_ALG_DEMO);
    o.topk = topks[i];
    int64_t kept = bench_kept_coefs(m, o.chunk, o.topk);
    double ref = 12.0 * (double)kept;
    for (int v = 0; v < 3; v++) {
      o.values = vals[v];
      uint64_t b = 0;
      distro_status s = distro_payload_bytes(&o, m->ntensors, m->ndims, m->shapes, &b);
      if (s != DISTRO_OK) {
        fprintf(stderr, "distro-demo: distro_payload_bytes: %s: %s\n", distro_status_string(s), distro_last_error());
        return 1;
      }
      if (v == 0)
        printf("  %4d  %10lld  %13.2f", o.topk, (long long)kept, mb(ref));
      else
        printf("  %4s  %10s  %13s", "", "", "");
      printf("  %6s  %13.3f  %10.0fx  %10.1fx\n", vname[v], mb((double)b), ring / (double)b, ref / (double)b);
    }
  }
  if (!anchors) return 0;

  /* Published figures for the 1.2B model, next to what we count. */
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  uint64_t k4s = 0, k1s = 0;
  o.values = DISTRO_VALUES_SIGN1;
  o.topk = 4;
  if (distro_payload_bytes(&o, m->ntensors, m->ndims, m->shapes, &k4s) != DISTRO_OK) return 1;
  o.topk = 1;
  if (distro_payload_bytes(&o, m->ntensors, m->ndims, m->shapes, &k1s) != DISTRO_OK) return 1;
  double r32 = 12.0 * (double)bench_kept_coefs(m, 64, 32), r1 = 12.0 * (double)bench_kept_coefs(m, 64, 1);
  printf("\n  published figures (1.2B)                      published    counted here / this library\n");
  printf("  reference int64+f32, topk 32                  ~110 MB      %.1f MB (12 B x kept coefs)\n", mb(r32));
  printf("  reference int64+f32, topk 1                   ~3.4 MB      %.2f MB (12 B x kept coefs)\n", mb(r1));
  printf("  Psyche, topk 4, u16 index + 1-bit value       ~2.4 MB      %.2f MB (this library, topk 4, 1-bit)\n",
         mb((double)k4s));
  printf("  DisTrO report, uploaded per node per step      2.8 MB      %.2f MB (topk 4, 1-bit) / %.2f MB (topk 1, 1-bit)\n",
         mb((double)k4s), mb((double)k1s));
  printf("  DisTrO report, all-reduce received per node    74.4 GB     %.1f GB (ring, W=32, sent per rank)\n",
         ring / 1e9);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Part 2: local 4-rank run                                                   */

#define WORLD 4
#define DIN 64   /* input features */
#define DH 128   /* student hidden units */
#define DT 16    /* teacher hidden units */
#define DOUT 16  /* outputs */
#define SHARD 2048
#define NEVAL 1024
#define BATCH 32
#define STEPS 200
#define LOG_EVERY 20
#define NLOG (STEPS / LOG_EVERY + 1)

/* Student parameters in one flat buffer, gradients in a second one. */
#define OFF_W1 0
#define OFF_B1 (OFF_W1 + DH * DIN)
#define OFF_W2 (OFF_B1 + DH)
#define OFF_B2 (OFF_W2 + DOUT * DH)
#define NPARAM (OFF_B2 + DOUT)

typedef struct rng {
  uint64_t s;
} rng;

static double rng_uniform(rng *r) { /* in (0, 1) */
  r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
  return ((double)(r->s >> 11) + 0.5) / 9007199254740992.0;
}

static float rng_normal(rng *r) {
  double u = rng_uniform(r), v = rng_uniform(r);
  return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Fixed teacher y = A2 tanh(A1 x); the problem every rank learns. */
typedef struct problem {
  float a1[DT * DIN], a2[DOUT * DT];
  float xs[WORLD][SHARD * DIN], ys[WORLD][SHARD * DOUT]; /* one shard per rank */
  float xe[NEVAL * DIN], ye[NEVAL * DOUT];               /* held out */
} problem;

static void teacher(const problem *p, const float *x, float *y) {
  float h[DT];
  for (int j = 0; j < DT; j++) {
    float a = 0;
    for (int i = 0; i < DIN; i++) a += p->a1[j * DIN + i] * x[i];
    h[j] = tanhf(a);
  }
  for (int o = 0; o < DOUT; o++) {
    float a = 0;
    for (int j = 0; j < DT; j++) a += p->a2[o * DT + j] * h[j];
    y[o] = a;
  }
}

static void make_problem(problem *p) {
  rng r = {12345};
  for (int i = 0; i < DT * DIN; i++) p->a1[i] = rng_normal(&r) / sqrtf(DIN);
  /* E[tanh(N(0,1))^2] ~ 0.39: scale so targets have unit variance. */
  for (int i = 0; i < DOUT * DT; i++) p->a2[i] = rng_normal(&r) / sqrtf(0.39f * DT);
  for (int w = 0; w < WORLD; w++) {
    rng rw = {1000u + (uint64_t)w};
    for (int n = 0; n < SHARD; n++) {
      for (int i = 0; i < DIN; i++) p->xs[w][n * DIN + i] = rng_normal(&rw);
      teacher(p, &p->xs[w][n * DIN], &p->ys[w][n * DOUT]);
    }
  }
  rng re = {999};
  for (int n = 0; n < NEVAL; n++) {
    for (int i = 0; i < DIN; i++) p->xe[n * DIN + i] = rng_normal(&re);
    teacher(p, &p->xe[n * DIN], &p->ye[n * DOUT]);
  }
}

/* Mean squared error over the batch and outputs; if grad is non-NULL,
 * accumulates d(loss)/d(params) into it. */
static float mlp_loss(const float *prm, const float *x, const float *y, int n, float *grad) {
  const float *w1 = prm + OFF_W1, *b1 = prm + OFF_B1, *w2 = prm + OFF_W2, *b2 = prm + OFF_B2;
  double loss = 0;
  float h[DH], dy[DOUT], dh[DH];
  for (int s = 0; s < n; s++) {
    const float *xs = x + s * DIN, *ys = y + s * DOUT;
    for (int j = 0; j < DH; j++) {
      float a = b1[j];
      for (int i = 0; i < DIN; i++) a += w1[j * DIN + i] * xs[i];
      h[j] = tanhf(a);
    }
    for (int o = 0; o < DOUT; o++) {
      float a = b2[o];
      for (int j = 0; j < DH; j++) a += w2[o * DH + j] * h[j];
      float e = a - ys[o];
      loss += (double)e * e;
      dy[o] = 2.0f * e / (float)(n * DOUT);
    }
    if (!grad) continue;
    float *gw1 = grad + OFF_W1, *gb1 = grad + OFF_B1, *gw2 = grad + OFF_W2, *gb2 = grad + OFF_B2;
    for (int j = 0; j < DH; j++) dh[j] = 0;
    for (int o = 0; o < DOUT; o++) {
      gb2[o] += dy[o];
      for (int j = 0; j < DH; j++) {
        gw2[o * DH + j] += dy[o] * h[j];
        dh[j] += w2[o * DH + j] * dy[o];
      }
    }
    for (int j = 0; j < DH; j++) {
      float d = dh[j] * (1.0f - h[j] * h[j]);
      gb1[j] += d;
      for (int i = 0; i < DIN; i++) gw1[j * DIN + i] += d * xs[i];
    }
  }
  return (float)(loss / (n * DOUT));
}

typedef struct demo_run {
  const char *label;
  distro_options o;
  const problem *p;
  float loss[NLOG];   /* held-out MSE, written by rank 0 */
  uint64_t bytes_sent; /* per rank, whole run (rank 0's count) */
  double seconds;
} demo_run;

static distro_status rank_main(distro_comm *comm, int rank, void *arg) {
  demo_run *r = arg;
  const problem *p = r->p;
  float *prm = calloc(NPARAM, sizeof *prm), *grad = calloc(NPARAM, sizeof *grad);
  distro_optim *opt = NULL;
  distro_status s = DISTRO_ERR_NOMEM;
  if (!prm || !grad) goto out;

  /* Same initialisation on every rank. */
  rng init = {777};
  for (int i = 0; i < DH * DIN; i++) prm[OFF_W1 + i] = rng_normal(&init) / sqrtf(DIN);
  for (int i = 0; i < DOUT * DH; i++) prm[OFF_W2 + i] = rng_normal(&init) / sqrtf(DH);

  s = distro_optim_create(&r->o, comm, &opt);
  if (s != DISTRO_OK) goto out;
  const int64_t sw1[2] = {DH, DIN}, sb1[1] = {DH}, sw2[2] = {DOUT, DH}, sb2[1] = {DOUT};
  if ((s = distro_optim_add_param(opt, "fc1.weight", prm + OFF_W1, grad + OFF_W1, 2, sw1)) != DISTRO_OK ||
      (s = distro_optim_add_param(opt, "fc1.bias", prm + OFF_B1, grad + OFF_B1, 1, sb1)) != DISTRO_OK ||
      (s = distro_optim_add_param(opt, "fc2.weight", prm + OFF_W2, grad + OFF_W2, 2, sw2)) != DISTRO_OK ||
      (s = distro_optim_add_param(opt, "fc2.bias", prm + OFF_B2, grad + OFF_B2, 1, sb2)) != DISTRO_OK)
    goto out;

  const float *xs = p->xs[rank], *ys = p->ys[rank];
  uint64_t sent = 0;
  for (int step = 0; step <= STEPS; step++) {
    if (step % LOG_EVERY == 0 && rank == 0) r->loss[step / LOG_EVERY] = mlp_loss(prm, p->xe, p->ye, NEVAL, NULL);
    if (step == STEPS) break;
    memset(grad, 0, NPARAM * sizeof *grad);
    int b0 = (step * BATCH) % SHARD;
    mlp_loss(prm, xs + b0 * DIN, ys + b0 * DOUT, BATCH, grad);
    /* Cosine from lr down to lr/10. */
    float lr = r->o.lr * (0.55f + 0.45f * cosf(3.14159265f * step / STEPS));
    distro_step_stats st;
    s = distro_optim_step(opt, lr, &st);
    if (s != DISTRO_OK) goto out;
    sent += st.bytes_sent;
  }
  if (rank == 0) r->bytes_sent = sent;
  s = DISTRO_OK;
out:
  if (s != DISTRO_OK)
    fprintf(stderr, "distro-demo: rank %d (%s): %s: %s\n", rank, r->label, distro_status_string(s),
            distro_last_error());
  distro_optim_free(opt);
  free(prm);
  free(grad);
  return s;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int local_run(void) {
  problem *p = malloc(sizeof *p);
  if (!p) return 1;
  make_problem(p);

  /* One lr for all: 1e-2 is near the best of each in a sweep over
   * 1e-3..1e-1 on this problem. */
  enum { NRUN = 4 };
  demo_run runs[NRUN];
  memset(runs, 0, sizeof runs);
  runs[0].label = "DeMo sign";
  runs[0].o = distro_options_default(DISTRO_ALG_DEMO);
  runs[1].label = "DeMo 1-bit k=8";
  runs[1].o = distro_options_default(DISTRO_ALG_DEMO);
  runs[1].o.values = DISTRO_VALUES_SIGN1;
  runs[1].o.topk = 8;
  runs[2].label = "DisTrO-AdamW";
  runs[2].o = distro_options_default(DISTRO_ALG_DEMO);
  runs[2].o.update = DISTRO_UPDATE_ADAMW;
  runs[3].label = "AdamW all-reduce";
  runs[3].o = distro_options_default(DISTRO_ALG_ADAMW);
  for (int i = 0; i < NRUN; i++) {
    runs[i].o.lr = 1e-2f;
    runs[i].o.weight_decay = 0.0f;
  }

  printf("\n== Local run: %d in-process ranks, %d steps ==\n", WORLD, STEPS);
  printf("Student MLP %d-%d-%d (tanh, %d parameters) learns a fixed random teacher %d-%d-%d;\n", DIN, DH, DOUT,
         NPARAM, DIN, DT, DOUT);
  printf("each rank has its own shard of %d samples, batch %d; loss = MSE on %d held-out samples\n", SHARD, BATCH,
         NEVAL);
  printf("(targets have unit variance). Cosine lr schedule to 10%%, no weight decay.\n\n");
  for (int i = 0; i < NRUN; i++) {
    runs[i].p = p;
    double t0 = now();
    distro_status s = distro_comm_run_local(WORLD, rank_main, &runs[i]);
    runs[i].seconds = now() - t0;
    if (s != DISTRO_OK) {
      fprintf(stderr, "distro-demo: %s failed: %s\n", runs[i].label, distro_status_string(s));
      free(p);
      return 1;
    }
  }

  printf("  %5s", "step");
  for (int i = 0; i < NRUN; i++) printf("  %16s", runs[i].label);
  printf("\n");
  for (int l = 0; l < NLOG; l++) {
    printf("  %5d", l * LOG_EVERY);
    for (int i = 0; i < NRUN; i++) printf("  %16.4f", runs[i].loss[l]);
    printf("\n");
  }
  printf("  %5s", "lr");
  for (int i = 0; i < NRUN; i++) printf("  %16g", runs[i].o.lr);
  printf("\n\n  %-18s %14s %14s %12s %10s\n", "", "bytes sent", "per step", "vs AdamW", "seconds");
  for (int i = 0; i < NRUN; i++)
    printf("  %-18s %14llu %14.0f %11.1fx %10.2f\n", runs[i].label, (unsigned long long)runs[i].bytes_sent,
           (double)runs[i].bytes_sent / STEPS, (double)runs[NRUN - 1].bytes_sent / (double)runs[i].bytes_sent,
           runs[i].seconds);
  printf("  (bytes sent per rank over the whole run; DeMo: its payload, AdamW: its share of a ring all-reduce)\n");
  free(p);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1) {
    const int help = strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0;
    fprintf(help ? stdout : stderr,
            "usage: distro-demo          bytes per step for GPT-2 124M and Llama 1.2B, then a short\n"
            "                            in-process 4-rank run comparing DeMo, DisTrO-AdamW and AdamW\n"
            "       distro-demo --help   this text\n");
    return help ? 0 : 2;
  }
  printf("distro %s demo\n\n", distro_version_string());
  printf("== Bytes per rank per step ==\n");
  printf("this library = distro_payload_bytes (chunk 64, headers included). The default wire v2\n");
  printf("entropy-codes indices, so its real size depends on the data and this is its upper bound\n");
  printf("(about the fixed v1 size); `distro-bench bytes` measures encoded sizes.\n");
  printf("ref format = DeMo reference: int64 index + f32 value = 12 B per kept coefficient,\n");
  printf("counted here from the shapes; all-reduce = dense fp32 ring all-reduce at W=%d.\n", WORLD_REF);
  bench_model gpt2, llama;
  if (bench_model_gpt2_124m(&gpt2, 0) || bench_model_llama_1b2(&llama, 0)) {
    fprintf(stderr, "distro-demo: out of memory\n");
    return 1;
  }
  int rc = bytes_table(&gpt2, 0) || bytes_table(&llama, 1);
  bench_model_free(&gpt2);
  bench_model_free(&llama);
  if (rc) return 1;
  fflush(stdout);
  return local_run();
}
