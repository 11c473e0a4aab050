/* step_checksum [mode...]: a few steps of each optimizer through the public
 * API, with in-process ranks on threads, on synthetic data that involves no
 * BLAS (a quadratic loss towards hashed targets plus hashed noise per step,
 * learner, rank and element). Prints one line per mode,
 *   <mode> <16 hex digits>
 * the FNV-1a hash of rank 0's final parameters, after checking that every
 * rank (of every learner) ends with the same bits. The first line names
 * OpenBLAS's kernels. tests/blas_kernels.cmake runs it under several
 * OPENBLAS_CORETYPE settings and requires the same checksums: the update a
 * rank applies must not depend on which kernels its CPU gets.
 * Modes: demo-sign, distro-adamw, diloco, sparseloco, sparseloco-dct (all by
 * default). Exit 0, or 1 on a failure (printed on stderr). */
#include <cblas.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>

#define NT 3
static const char *const names[NT] = {"w0", "b1", "w2"};
static const int ndims[NT] = {2, 1, 2};
static const int64_t shapes[NT][2] = {{192, 256}, {256, 0}, {96, 80}};
#define TOTAL (192 * 256 + 256 + 96 * 80)
#define MAXW 4 /* threads of one run: learners x ranks */

static int64_t numel(int t) { return ndims[t] == 2 ? shapes[t][0] * shapes[t][1] : shapes[t][0]; }
static int64_t offset(int t) {
  int64_t o = 0;
  for (int k = 0; k < t; k++) o += numel(k);
  return o;
}

static uint64_t mix(uint64_t x) { /* splitmix64's finalizer */
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
/* A float in [-1, 1) from the hash of (a, b, c, i): exact, no libm. */
static float unit(uint64_t a, uint64_t b, uint64_t c, uint64_t i) {
  const uint64_t h = mix(mix(mix(mix(a) ^ b) ^ c) ^ i);
  return (float)(int32_t)(uint32_t)(h >> 40 << 8) * (1.0f / 2147483648.0f);
}

typedef enum { DEMO_SIGN, DISTRO_ADAMW, DILOCO, SPARSELOCO, SPARSELOCO_DCT, NMODES } mode;
static const char *const mode_names[NMODES] = {"demo-sign", "distro-adamw", "diloco", "sparseloco", "sparseloco-dct"};

typedef struct {
  mode m;
  int learners, ranks, steps;
  float lr;
  distro_options inner;
  distro_diloco_options dl;
  float *out[MAXW];
  char err[MAXW][320];
} run;

typedef struct {
  run *x;
  int learner, rank;
  distro_comm *inner, *outer; /* outer: NULL for DeMo */
} rank_arg;

/* Quadratic loss 0.5 |p - target|^2 plus noise: g = p - target + noise/2. */
static void gradient(const float *p, float *g, int step, int learner, int rank) {
  for (int64_t i = 0; i < TOTAL; i++) {
    const float target = unit(1, 0, 0, (uint64_t)i);
    g[i] = (p[i] - target) + 0.5f * unit(2 + (uint64_t)step, (uint64_t)learner, (uint64_t)rank, (uint64_t)i);
  }
}

static void *rank_main(void *arg) {
  rank_arg *a = arg;
  run *x = a->x;
  const int w = a->learner * x->ranks + a->rank;
  char *err = x->err[w];
  float *p = malloc(sizeof(float) * TOTAL), *g = calloc(TOTAL, sizeof(float));
  distro_optim *o = NULL;
  distro_diloco *d = NULL;
  distro_status st = p && g ? DISTRO_OK : DISTRO_ERR_NOMEM;
  if (st == DISTRO_OK) {
    for (int64_t i = 0; i < TOTAL; i++) p[i] = unit(0, 0, 0, (uint64_t)i); /* the same on every rank */
    st = distro_optim_create(&x->inner, a->inner, &o);
  }
  for (int t = 0; t < NT && st == DISTRO_OK; t++)
    st = distro_optim_add_param(o, names[t], p + offset(t), g + offset(t), ndims[t], shapes[t]);
  if (st == DISTRO_OK && a->outer) st = distro_diloco_create(&x->dl, o, a->outer, &d);
  for (int s = 0; s < x->steps && st == DISTRO_OK; s++) {
    gradient(p, g, s, a->learner, a->rank);
    st = d ? distro_diloco_step(d, x->lr, 64, NULL) : distro_optim_step(o, x->lr, NULL);
    if (st != DISTRO_OK) snprintf(err, sizeof x->err[w], "step %d: %s", s + 1, distro_last_error());
  }
  if (st == DISTRO_OK && d && (st = distro_diloco_sync_all(d, NULL)) != DISTRO_OK)
    snprintf(err, sizeof x->err[w], "sync_all: %s", distro_last_error());
  if (st != DISTRO_OK && !err[0]) snprintf(err, sizeof x->err[w], "setup: %s", distro_last_error());
  if (st == DISTRO_OK) {
    x->out[w] = p;
    p = NULL;
  }
  distro_diloco_free(d);
  distro_optim_free(o);
  free(p);
  free(g);
  return NULL;
}

static void setup(run *x, mode m) {
  memset(x, 0, sizeof *x);
  x->m = m;
  x->learners = 1;
  x->ranks = 2;
  x->steps = 6;
  if (m == DEMO_SIGN || m == DISTRO_ADAMW) {
    x->inner = distro_options_default(DISTRO_ALG_DEMO);
    if (m == DISTRO_ADAMW) x->inner.update = DISTRO_UPDATE_ADAMW;
    x->lr = m == DISTRO_ADAMW ? 3e-3f : 1e-2f;
    x->inner.lr = x->lr;
    return;
  }
  /* DiLoCo: 2 learners of 2 ranks each, AdamW inside, 3 outer syncs. */
  x->learners = 2;
  x->steps = 9;
  x->lr = 3e-3f;
  x->inner = distro_options_default(DISTRO_ALG_ADAMW);
  x->inner.lr = x->lr;
  x->dl = m == DILOCO ? distro_diloco_options_default() : distro_diloco_options_sparseloco();
  x->dl.H = 3;
  if (m == SPARSELOCO_DCT) x->dl.sparse_dct = 1; /* 192x256: 64x64 tiles; 96x80: 48x40 */
}

/* 0, or -1 with a message on stderr. */
static int execute(run *x, uint64_t *sum) {
  const int L = x->learners, R = x->ranks, W = L * R;
  distro_comm *inner[MAXW] = {0}, *outer[MAXW] = {0}; /* inner[l*R + r]; outer[r*L + l] */
  pthread_t th[MAXW];
  rank_arg args[MAXW];
  int fail = 0;
  for (int l = 0; l < L && !fail; l++) fail = distro_comm_local_group(R, inner + l * R) != DISTRO_OK;
  for (int r = 0; r < R && !fail && L > 1; r++) fail = distro_comm_local_group(L, outer + r * L) != DISTRO_OK;
  if (fail) {
    fprintf(stderr, "%s: comm setup: %s\n", mode_names[x->m], distro_last_error());
    return -1;
  }
  for (int l = 0; l < L; l++)
    for (int r = 0; r < R; r++) {
      args[l * R + r] = (rank_arg){x, l, r, inner[l * R + r], L > 1 ? outer[r * L + l] : NULL};
      if (pthread_create(&th[l * R + r], NULL, rank_main, &args[l * R + r]) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        exit(1); /* the started ranks would wait forever */
      }
    }
  for (int w = 0; w < W; w++) pthread_join(th[w], NULL);
  for (int w = 0; w < W; w++) {
    distro_comm_free(inner[w]);
    distro_comm_free(outer[w]);
  }
  for (int w = 0; w < W; w++)
    if (!x->out[w]) {
      fprintf(stderr, "%s: learner %d rank %d: %s\n", mode_names[x->m], w / R, w % R, x->err[w]);
      fail = 1;
    }
  for (int w = 1; w < W && !fail; w++)
    if (memcmp(x->out[w], x->out[0], sizeof(float) * TOTAL) != 0) {
      fprintf(stderr, "%s: learner %d rank %d ends with other parameters than rank 0\n", mode_names[x->m], w / R,
              w % R);
      fail = 1;
    }
  if (!fail) {
    const unsigned char *b = (const unsigned char *)x->out[0];
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < sizeof(float) * TOTAL; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    *sum = h;
    float moved = 0.0f; /* the run did train: rank 0 left its start */
    for (int64_t i = 0; i < TOTAL; i++) {
      const float dv = x->out[0][i] - unit(0, 0, 0, (uint64_t)i);
      moved = dv > moved ? dv : -dv > moved ? -dv : moved;
    }
    if (!(moved > 0.0f)) {
      fprintf(stderr, "%s: the parameters did not move\n", mode_names[x->m]);
      fail = 1;
    }
  }
  for (int w = 0; w < W; w++) free(x->out[w]);
  return fail ? -1 : 0;
}

int main(int argc, char **argv) {
  int want[NMODES] = {0}, any = 0;
  for (int i = 1; i < argc; i++) {
    int m = 0;
    while (m < NMODES && strcmp(argv[i], mode_names[m])) m++;
    if (m == NMODES) {
      fprintf(stderr, "%s: unknown mode '%s' (demo-sign, distro-adamw, diloco, sparseloco, sparseloco-dct)\n", argv[0],
              argv[i]);
      return 2;
    }
    want[m] = any = 1;
  }
  const char *core = openblas_get_corename();
  printf("openblas %s\n", core ? core : "unknown");
  int rc = 0;
  for (int m = 0; m < NMODES; m++) {
    if (any && !want[m]) continue;
    run x;
    uint64_t sum = 0;
    setup(&x, (mode)m);
    if (execute(&x, &sum) != 0) {
      rc = 1;
      continue;
    }
    printf("%s %016llx\n", mode_names[m], (unsigned long long)sum);
    fflush(stdout);
  }
  return rc;
}
