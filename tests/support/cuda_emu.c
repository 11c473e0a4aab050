/* The GPU step emulated on the CPU (see cuda_emu.h). Built with
 * -ffp-contract=off, as the library is (tests/cuda_host.cmake). */
#include "cuda_emu.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/error.h"
#include "optim/step_rule.h"
#include "testutil.h"

int same_bits(const float *a, const float *b, int64_t n, int64_t *at) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      *at = i;
      return 0;
    }
  return 1;
}

int64_t emu_numel(const int64_t *sh) {
  int64_t n = 1;
  for (int d = 1; d <= sh[0]; d++) n *= sh[d];
  return n;
}

int emu_add_tensors(distro_optim *cpu, distro_optim *hopt, int nt, const int64_t (*shapes)[3], uint64_t seed,
                    float **cparam, float **eparam, float **grad) {
  char name[16];
  for (int i = 0; i < nt; i++) cparam[i] = eparam[i] = grad[i] = NULL;
  for (int i = 0; i < nt; i++) {
    const int64_t n = emu_numel(shapes[i]);
    cparam[i] = malloc(sizeof(float) * (size_t)n);
    eparam[i] = malloc(sizeof(float) * (size_t)n);
    grad[i] = calloc((size_t)n, sizeof(float));
    if (!cparam[i] || !eparam[i] || !grad[i]) return -1;
    tu_rng prng = {seed + (uint64_t)i}; /* the same parameters on every rank */
    tu_fill_normal(&prng, cparam[i], (size_t)n, 0.5f);
    memcpy(eparam[i], cparam[i], sizeof(float) * (size_t)n);
    snprintf(name, sizeof name, "t%d", i);
    if ((cpu &&
         distro_optim_add_param(cpu, name, cparam[i], grad[i], (int)shapes[i][0], shapes[i] + 1) != DISTRO_OK) ||
        distro_optim_add_param(hopt, name, eparam[i], grad[i], (int)shapes[i][0], shapes[i] + 1) != DISTRO_OK)
      return -1;
  }
  return 0;
}

void emu_free_tensors(int nt, float **cparam, float **eparam, float **grad) {
  for (int i = 0; i < nt; i++) free(cparam[i]), free(eparam[i]), free(grad[i]);
}

void emu_release(emu *E, distro_optim *cpu, distro_optim *hopt, int nt, float **cparam, float **eparam, float **grad) {
  emu_free_tensors(nt, cparam, eparam, grad);
  emu_free(E);
  distro_optim_free(cpu);
  distro_optim_free(hopt);
}

int emu_run_ranks(int world, void *(*fn)(void *), void *jobs, size_t job_size) {
  pthread_t th[64];
  int started = 0, rc = 0;
  for (; started < world && started < 64; started++)
    if (pthread_create(&th[started], NULL, fn, (char *)jobs + (size_t)started * job_size) != 0) {
      rc = -1;
      break;
    }
  for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
  return started == world ? rc : -1;
}

int emu_comm_groups(int world, distro_comm **cpu, distro_comm **gpu) {
  if (distro_comm_local_group(world, cpu) != DISTRO_OK) return -1;
  if (distro_comm_local_group(world, gpu) != DISTRO_OK) {
    for (int r = 0; r < world; r++) distro_comm_free(cpu[r]);
    return -1;
  }
  return 0;
}

distro_options emu_options(distro_update update, distro_values values, int wire, int chunk, int topk) {
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.update = update;
  o.values = values;
  o.wire_version = wire;
  o.chunk = chunk;
  o.topk = topk;
  o.weight_decay = 0.1f;
  o.threads = 1;
  return o;
}

static float **floats_per_tensor(const distro_optim *h) {
  float **a = calloc((size_t)h->nparams, sizeof *a);
  for (int i = 0; a && i < h->nparams; i++) {
    a[i] = calloc((size_t)h->params[i].numel, sizeof(float));
    if (!a[i]) return NULL;
  }
  return a;
}

int emu_init(emu *E, distro_optim *h, float **param, float **grad, int stage) {
  memset(E, 0, sizeof *E);
  E->h = h;
  E->nt = h->nparams;
  E->param = param;
  E->grad = grad;
  E->mom = floats_per_tensor(h);
  E->next = floats_per_tensor(h);
  E->v = floats_per_tensor(h);
  if (stage && h->opt.update == DISTRO_UPDATE_ADAMW) E->vnext = floats_per_tensor(h);
  if (stage && h->opt.overlap == DISTRO_OVERLAP_LOOKAHEAD && !(E->base = floats_per_tensor(h))) return -1;
  E->tp = calloc((size_t)h->nparams, sizeof *E->tp);
  if (!E->mom || !E->next || !E->v || !E->tp || (stage && h->opt.update == DISTRO_UPDATE_ADAMW && !E->vnext)) return -1;
  int64_t maxe = 1, hmax = 1;
  for (int i = 0; i < h->nparams; i++) {
    const distro__tiling *t = &h->tilings[i];
    if (t->chunk_elems > maxe) maxe = t->chunk_elems;
    if (t->h > hmax) hmax = t->h;
    E->tp[i].t = *t;
    if (distro__dct_plan_init(&E->tp[i].p, t, DISTRO__DCT_FAST) != DISTRO_OK) return -1;
    distro__hd_dct_from_plan(&E->tp[i].p, &E->tp[i].D);
  }
  E->work = malloc(sizeof(float) * (size_t)(10 * maxe + 64));
  E->iwork = malloc(sizeof(uint32_t) * (size_t)(3 * maxe + hmax + 8));
  E->tile = malloc(sizeof(float) * (size_t)maxe);
  return E->work && E->iwork && E->tile ? 0 : -1;
}

void emu_free(emu *E) {
  for (int i = 0; i < E->nt; i++) {
    if (E->mom) free(E->mom[i]);
    if (E->next) free(E->next[i]);
    if (E->v) free(E->v[i]);
    if (E->vnext) free(E->vnext[i]);
    if (E->base) free(E->base[i]);
    if (E->tp) distro__dct_plan_destroy(&E->tp[i].p);
  }
  free(E->mom), free(E->next), free(E->v), free(E->vnext), free(E->base), free(E->tp);
  free(E->work), free(E->iwork), free(E->tile);
  memset(E, 0, sizeof *E);
}

static int64_t tile_off(const distro__tiling *t, int64_t c) {
  return (c / t->tiles_c) * t->h * t->cols + (c % t->tiles_c) * t->w;
}

distro_status emu_compress(emu *E, float lr, int *bad) {
  distro_optim *h = E->h;
  const int sign = h->opt.update == DISTRO_UPDATE_SIGN, adam = !sign;
  const float s = sign ? lr : 1.0f, decay = h->opt.compression_decay;
  const float c2 = (float)(1.0 - pow((double)h->opt.beta2, (double)(h->step + 1)));
  int hist[256];
  uint32_t flag;
  *bad = -1;
  for (int i = 0; i < h->nparams; i++) {
    const distro__tiling *t = &h->tilings[i];
    for (int64_t c = 0; c < t->nchunks; c++) {
      const int64_t off = tile_off(t, c);
      if (distro__hd_compress_tile(&E->tp[i].D, E->grad[i] + off, adam ? E->v[i] + off : NULL,
                                   E->vnext ? E->vnext[i] + off : NULL, adam, h->opt.beta2, c2,
                                   h->opt.eps, E->mom[i] + off, E->next[i] + off, t->cols, decay, s, E->work, &flag, 0,
                                   1) &&
          *bad < 0)
        *bad = i;
      /* the selection, on a contiguous copy of the tile (topk.cu reads it in place) */
      for (int64_t b = 0; b < t->h; b++)
        memcpy(E->tile + b * t->w, E->next[i] + off + b * t->cols, sizeof(float) * (size_t)t->w);
      distro__hd_select(E->tile, (int)t->chunk_elems, (int)t->k, h->params[i].idx + c * t->k,
                        h->params[i].val + c * t->k, hist);
      for (int64_t b = 0; b < t->h; b++)
        memcpy(E->next[i] + off + b * t->cols, E->tile + b * t->w, sizeof(float) * (size_t)t->w);
    }
  }
  return DISTRO_OK;
}

distro_status emu_apply(emu *E, float lr) {
  distro_optim *h = E->h;
  const int sign = h->opt.update == DISTRO_UPDATE_SIGN, adam = !sign;
  h->spread = distro__step_spread(h); /* as optim_cuda.c's demo_apply */
  const float step = sign ? lr : distro__adamw_sign_step(h->opt.beta2, h->step + 1, lr, &h->ramp, distro__step_growth(h)),
              shrink = 1.0f - lr * h->opt.weight_decay;
  for (int i = 0; i < h->nparams; i++) {
    const distro__tiling *t = &h->tilings[i];
    const int commit_v = adam && !E->vnext; /* overlap: v' was staged by the compress */
    if (E->vnext) {
      float *sw = E->v[i];
      E->v[i] = E->vnext[i];
      E->vnext[i] = sw;
    }
    float *tmp = E->mom[i];
    E->mom[i] = E->next[i];
    E->next[i] = tmp;
    for (int64_t c = 0; c < t->nchunks; c++) {
      const int64_t off = tile_off(t, c);
      const size_t sel = (size_t)h->sel_off[i] + (size_t)(c * t->k);
      distro__hd_apply_tile(&E->tp[i].D, h->dec_idx + sel, h->dec_val + sel, h->total_sel, h->dropped, h->comm->size,
                            (int)t->k, (E->base ? E->base[i] : E->param[i]) + off, E->grad[i] + off,
                            commit_v ? E->v[i] + off : NULL, commit_v, h->opt.beta2, t->cols, shrink, step, E->work,
                            E->iwork, 0, 1);
    }
  }
  return DISTRO_OK;
}

distro_status emu_ahead(emu *E, float a) {
  distro_optim *h = E->h;
  for (int i = 0; i < h->nparams; i++) {
    const distro__tiling *t = &h->tilings[i];
    for (int64_t c = 0; c < t->nchunks; c++) {
      const int64_t off = tile_off(t, c);
      distro__hd_ahead_tile(&E->tp[i].D, E->next[i] + off, h->params[i].idx + c * t->k, h->params[i].val + c * t->k,
                            (int)t->k, E->base[i] + off, E->param[i] + off, t->cols, a, E->work, 0, 1);
    }
  }
  return DISTRO_OK;
}

distro_status emu_agree(emu *E) {
  for (int i = 0; i < E->nt; i++) memcpy(E->base[i], E->param[i], sizeof(float) * (size_t)E->h->params[i].numel);
  return DISTRO_OK;
}

static distro_status emu_step_inner(emu *E, float lr) {
  distro_optim *h = E->h;
  int bad = -1;
  distro_status r = emu_compress(E, lr, &bad);
  if (r != DISTRO_OK) return r;
  distro_step_stats st;
  memset(&st, 0, sizeof st);
  const size_t size = distro__payload_encode(h, bad);
  if (size == 0) return DISTRO_ERR_PAYLOAD;
  r = distro__payload_exchange(h, size, &st);
  if (r != DISTRO_OK) return r;
  return emu_apply(E, lr);
}

distro_status emu_step(emu *E, float lr) {
  distro_optim *h = E->h;
  const distro__ramp ramp = h->ramp; /* as distro_cuda_optim_step: observed, restored on failure */
  distro__ramp_observe(&h->ramp, lr);
  const distro_status r = emu_step_inner(E, lr);
  if (r == DISTRO_OK) h->step++;
  else h->ramp = ramp;
  return r;
}
