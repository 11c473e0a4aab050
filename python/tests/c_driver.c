/* The C side of the package's bit-identity test: runs the library's
 * optimizer on in-process ranks (distro_comm_run_local) with the inputs the
 * Python test wrote, and writes every rank's final parameters. Built
 * against the installed library with `pkg-config --cflags --libs distro`.
 *
 *   c_driver IN OUT
 * IN (little-endian): int32 alg (0 DeMo sign, 1 DisTrO-AdamW, 2 AdamW),
 *   int32 world, steps, ntensors, chunk, topk, threads, overlap (a
 *   distro_overlap; flushed after the last step); float beta1, beta2,
 *   eps, weight_decay; float lr[steps]; per tensor int32 ndim, int64
 *   shape[ndim]; per tensor its initial float parameters; then for each
 *   step, rank and tensor the float gradient.
 * OUT: for each rank, each tensor's float parameters. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>

typedef struct {
  int32_t alg, world, steps, nt, chunk, topk, threads, overlap;
  float beta1, beta2, eps, wd;
  float *lr;
  int32_t *ndim;
  int64_t **shape;
  int64_t *numel;
  float **init;  /* [t] */
  float **grads; /* [(step*world + rank)*nt + t] */
  float **out;   /* [rank*nt + t] */
} job;

static int rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n ? 0 : -1; }

static distro_status rank_fn(distro_comm *c, int rank, void *arg) {
  job *j = arg;
  distro_options o = distro_options_default(j->alg == 2 ? DISTRO_ALG_ADAMW : DISTRO_ALG_DEMO);
  if (j->alg == 1) o.update = DISTRO_UPDATE_ADAMW;
  o.beta1 = j->beta1;
  o.beta2 = j->beta2;
  o.eps = j->eps;
  o.weight_decay = j->wd;
  o.chunk = j->chunk;
  o.topk = j->topk;
  o.threads = j->threads;
  o.overlap = j->overlap;
  distro_optim *opt = NULL;
  distro_status st = distro_optim_create(&o, c, &opt);
  float **g = calloc((size_t)j->nt, sizeof *g);
  for (int t = 0; t < j->nt && st == DISTRO_OK; t++) {
    char name[32];
    snprintf(name, sizeof name, "g0.p%d", t);
    float *p = j->out[rank * j->nt + t];
    memcpy(p, j->init[t], (size_t)j->numel[t] * sizeof *p);
    g[t] = malloc((size_t)j->numel[t] * sizeof *p);
    st = distro_optim_add_param(opt, name, p, g[t], j->ndim[t], j->shape[t]);
  }
  for (int s = 0; s < j->steps && st == DISTRO_OK; s++) {
    for (int t = 0; t < j->nt; t++)
      memcpy(g[t], j->grads[((size_t)s * j->world + rank) * j->nt + t], (size_t)j->numel[t] * sizeof(float));
    st = distro_optim_step(opt, j->lr[s], NULL);
  }
  if (st == DISTRO_OK) st = distro_optim_flush(opt, NULL);
  for (int t = 0; t < j->nt; t++) free(g[t]);
  free(g);
  distro_optim_free(opt);
  return st;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: c_driver IN OUT\n");
    return 2;
  }
  FILE *f = fopen(argv[1], "rb");
  job j = {0};
  if (!f || rd(f, &j.alg, 8 * 4) || rd(f, &j.beta1, 4 * 4) || j.nt < 1 || j.world < 1 || j.steps < 1) {
    fprintf(stderr, "c_driver: cannot read %s\n", argv[1]);
    return 1;
  }
  j.lr = malloc((size_t)j.steps * 4);
  j.ndim = calloc((size_t)j.nt, 4);
  j.shape = calloc((size_t)j.nt, sizeof *j.shape);
  j.numel = calloc((size_t)j.nt, sizeof *j.numel);
  j.init = calloc((size_t)j.nt, sizeof *j.init);
  j.grads = calloc((size_t)j.steps * j.world * j.nt, sizeof *j.grads);
  j.out = calloc((size_t)j.world * j.nt, sizeof *j.out);
  int bad = rd(f, j.lr, (size_t)j.steps * 4);
  for (int t = 0; t < j.nt && !bad; t++) {
    bad = rd(f, &j.ndim[t], 4) || j.ndim[t] < 1 || j.ndim[t] > 8;
    if (bad) break;
    j.shape[t] = malloc(8 * (size_t)j.ndim[t]);
    bad = rd(f, j.shape[t], 8 * (size_t)j.ndim[t]);
    j.numel[t] = 1;
    for (int d = 0; d < j.ndim[t] && !bad; d++) j.numel[t] *= j.shape[t][d];
  }
  for (int t = 0; t < j.nt && !bad; t++) {
    j.init[t] = malloc((size_t)j.numel[t] * 4);
    bad = rd(f, j.init[t], (size_t)j.numel[t] * 4);
  }
  for (int s = 0; s < j.steps && !bad; s++)
    for (int r = 0; r < j.world && !bad; r++)
      for (int t = 0; t < j.nt && !bad; t++) {
        float **gp = &j.grads[((size_t)s * j.world + r) * j.nt + t];
        *gp = malloc((size_t)j.numel[t] * 4);
        bad = rd(f, *gp, (size_t)j.numel[t] * 4);
      }
  fclose(f);
  if (bad) {
    fprintf(stderr, "c_driver: %s is short or malformed\n", argv[1]);
    return 1;
  }
  for (int r = 0; r < j.world; r++)
    for (int t = 0; t < j.nt; t++) j.out[r * j.nt + t] = malloc((size_t)j.numel[t] * 4);
  distro_status st = distro_comm_run_local(j.world, rank_fn, &j);
  if (st != DISTRO_OK) {
    fprintf(stderr, "c_driver: %s\n", distro_last_error());
    return 1;
  }
  FILE *o = fopen(argv[2], "wb");
  for (int r = 0; r < j.world && o; r++)
    for (int t = 0; t < j.nt; t++) fwrite(j.out[r * j.nt + t], 4, (size_t)j.numel[t], o);
  if (!o || fclose(o) != 0) {
    fprintf(stderr, "c_driver: cannot write %s\n", argv[2]);
    return 1;
  }
  return 0; /* the process exits: the OS takes the buffers back */
}
