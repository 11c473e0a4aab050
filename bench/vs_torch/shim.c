/* A thin C front for bench/vs_torch/vs_torch.py: the Python side owns the
 * tensors (torch's own storage) and times the calls; this file is what a C
 * trainer would write, built against the installed library with nothing but
 * `pkg-config --cflags --libs distro`. */
#include <stdio.h>

#include <distro/distro.h>

/* algo 0: DeMo sign update, 1: DisTrO-AdamW, 2: the AdamW baseline. One
 * in-process rank, `threads` OpenMP threads. NULL on failure (message on
 * stderr). */
void *shim_create(int algo, int chunk, int topk, int values, int threads, float wd) {
  distro_comm *c = NULL;
  distro_optim *o = NULL;
  distro_options opt = distro_options_default(algo == 2 ? DISTRO_ALG_ADAMW : DISTRO_ALG_DEMO);
  if (algo == 1) opt.update = DISTRO_UPDATE_ADAMW;
  if (algo != 2) {
    opt.chunk = chunk;
    opt.topk = topk;
    opt.values = (distro_values)values;
  }
  opt.threads = threads;
  opt.weight_decay = wd;
  if (distro_comm_local_group(1, &c) != DISTRO_OK || distro_optim_create(&opt, c, &o) != DISTRO_OK) {
    fprintf(stderr, "shim: %s\n", distro_last_error());
    distro_comm_free(c);
    return NULL;
  }
  return o; /* the comm lives as long as the process */
}

int shim_add(void *o, const char *name, float *p, const float *g, int ndim, const int64_t *shape) {
  distro_status s = distro_optim_add_param(o, name, p, g, ndim, shape);
  if (s != DISTRO_OK) fprintf(stderr, "shim: %s\n", distro_last_error());
  return s;
}

int shim_step(void *o, float lr) {
  distro_status s = distro_optim_step(o, lr, NULL);
  if (s != DISTRO_OK) fprintf(stderr, "shim: %s\n", distro_last_error());
  return s;
}
