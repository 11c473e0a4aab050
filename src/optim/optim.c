/* Optimizer lifecycle: create, register tensors, allocate, agree on the
 * tensor list across ranks, and dispatch the step. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/error.h"
#include "common/fnv.h"
#include "optim/optim_internal.h"

distro_status distro_optim_create(const distro_options *opt, distro_comm *comm, distro_optim **out) {
  if (!out) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_create: out is NULL");
  *out = NULL;
  if (!opt) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_create: options are NULL");
  if (!comm) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_create: comm is NULL");
  distro_options taken;
  distro_status st = distro__options_take(opt, &taken);
  if (st != DISTRO_OK) return st;
  if (comm->size > 65535)
    return distro__fail(DISTRO_ERR_UNSUPPORTED, "distro_optim_create: at most 65535 ranks (got %d)", comm->size);
  distro_optim *o = calloc(1, sizeof *o);
  if (!o) return distro__fail(DISTRO_ERR_NOMEM, "distro_optim_create: out of memory");
  o->opt = taken;
  o->comm = comm;
  o->spread = 1.0;
  *out = o;
  return DISTRO_OK;
}

/* [a, a + an) and [b, b + bn) floats overlap (addresses compared as integers:
 * the buffers are unrelated objects). */
static int ranges_overlap(const float *a, int64_t an, const float *b, int64_t bn) {
  uintptr_t a0 = (uintptr_t)a, a1 = a0 + (uintptr_t)an * sizeof(float);
  uintptr_t b0 = (uintptr_t)b, b1 = b0 + (uintptr_t)bn * sizeof(float);
  return a0 < b1 && b0 < a1;
}

/* Name of a registered tensor whose gradient buffer overlaps [g, g + n). */
static const char *grad_overlap(const distro_optim *o, const float *g, int64_t n, int skip) {
  for (int i = 0; i < o->nparams; i++)
    if (i != skip && o->params[i].grad && ranges_overlap(g, n, o->params[i].grad, o->params[i].numel))
      return o->params[i].name;
  return NULL;
}

distro_status distro_optim_add_param(distro_optim *o, const char *name, float *param, const float *grad, int ndim,
                                     const int64_t *shape) {
  distro_status st = DISTRO_OK;
  char *copy = NULL;
  if (!o) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_add_param: the optimizer is NULL");
  if (!name) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_add_param: name is NULL");
  if (!param) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_add_param('%.64s'): param is NULL", name);
  if (!shape) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_add_param('%.64s'): shape is NULL", name);
  if (o->ready)
    return distro__fail(DISTRO_ERR_INVALID, "distro_optim_add_param('%.64s'): tensors are frozen after the first step or load",
                        name);
  if (!*name || strlen(name) > 255)
    return distro__fail(DISTRO_ERR_INVALID, "distro_optim_add_param: name must have 1..255 characters (got %zu)",
                        strlen(name));
  if (ndim < 1 || ndim > DISTRO__MAX_NDIM)
    return distro__fail(DISTRO_ERR_INVALID, "distro_optim_add_param('%s'): ndim %d not in [1, %d]", name, ndim,
                        DISTRO__MAX_NDIM);
  for (int i = 0; i < o->nparams; i++)
    if (!strcmp(o->params[i].name, name))
      return distro__fail(DISTRO_ERR_INVALID, "distro_optim_add_param: duplicate tensor name '%s'", name);
  distro__tiling t;
  int64_t target = o->opt.algorithm == DISTRO_ALG_DEMO ? o->opt.chunk : 1;
  int64_t topk = o->opt.algorithm == DISTRO_ALG_DEMO ? o->opt.topk : 1;
  st = distro__tiling_init(&t, ndim, shape, target, topk);
  if (st != DISTRO_OK) return distro__fail(st, "distro_optim_add_param('%s'): %s", name, distro_last_error());
  const int64_t numel = t.rows * t.cols;
  if (numel > (int64_t)(SIZE_MAX / 4 / sizeof(float)))
    return distro__fail(DISTRO_ERR_INVALID, "distro_optim_add_param('%s'): %lld elements do not fit in memory", name,
                        (long long)numel);
  for (int i = 0; i < o->nparams; i++)
    if (ranges_overlap(param, numel, o->params[i].param, o->params[i].numel))
      return distro__fail(DISTRO_ERR_INVALID, "distro_optim_add_param('%s'): param overlaps the param buffer of '%s'",
                          name, o->params[i].name);
  const char *other = grad ? grad_overlap(o, grad, numel, -1) : NULL;
  if (other)
    return distro__fail(DISTRO_ERR_INVALID, "distro_optim_add_param('%s'): grad overlaps the grad buffer of '%s'", name,
                        other);
  if (o->nparams == o->cap) {
    int cap = o->cap ? 2 * o->cap : 16;
    distro__param *p = realloc(o->params, sizeof *p * (size_t)cap);
    if (!p) return distro__fail(DISTRO_ERR_NOMEM, "distro_optim_add_param: out of memory");
    o->params = p;
    o->cap = cap;
  }
  copy = strdup(name);
  if (!copy) return distro__fail(DISTRO_ERR_NOMEM, "distro_optim_add_param: out of memory");
  distro__param *p = &o->params[o->nparams++];
  memset(p, 0, sizeof *p);
  p->name = copy;
  p->param = param;
  p->grad = grad;
  p->ndim = ndim;
  memcpy(p->shape, shape, sizeof(int64_t) * (size_t)ndim);
  p->numel = numel;
  p->tiling = t;
  p->gscale = 1.0f;
  return DISTRO_OK;
}

distro_status distro_optim_set_grad(distro_optim *o, const char *name, const float *grad) {
  if (!o) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_set_grad: the optimizer is NULL");
  if (!name) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_set_grad: name is NULL");
  if (!grad) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_set_grad('%.64s'): grad is NULL", name);
  for (int i = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    if (strcmp(p->name, name)) continue;
    const char *other = grad_overlap(o, grad, p->numel, i);
    if (other)
      return distro__fail(DISTRO_ERR_INVALID, "distro_optim_set_grad('%s'): grad overlaps the grad buffer of '%s'",
                          name, other);
    p->grad = grad;
    return DISTRO_OK;
  }
  return distro__fail(DISTRO_ERR_INVALID, "distro_optim_set_grad: no tensor named '%.64s' is registered", name);
}

static void free_state(distro_optim *o) {
  distro__overlap_free(o); /* first: its helper reads the payload buffers */
  distro__backward_free(o);
  for (int i = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    distro__dct_plan_destroy(&p->plan);
    free(p->mom);
    free(p->mom_next);
    free(p->m);
    free(p->v);
    free(p->v_next);
    free(p->idx);
    free(p->val);
    free(p->base);
    p->mom = p->mom_next = p->m = p->v = p->v_next = p->val = p->base = NULL;
    p->idx = NULL;
  }
  distro__payload_destroy(o);
  free(o->tilings);
  free(o->tile_base);
  free(o->ws);
  free(o->ws_clock);
  free(o->flat);
  o->tilings = NULL;
  o->tile_base = NULL;
  o->flat = NULL;
  o->ws = NULL;
  o->ws_clock = NULL;
}

void distro_optim_free(distro_optim *o) {
  if (!o) return;
  free_state(o);
  for (int i = 0; i < o->nparams; i++) free(o->params[i].name);
  free(o->params);
  free(o);
}

static void *zalloc_floats(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }

distro_status distro__optim_prepare(distro_optim *o) {
  distro_status st = DISTRO_OK;
  if (o->ready) return DISTRO_OK;
  if (o->nparams == 0) return distro__fail(DISTRO_ERR_INVALID, "no tensors registered (distro_optim_add_param)");
  const int demo = o->opt.algorithm == DISTRO_ALG_DEMO, adam = distro__uses_adam(&o->opt);
  o->max_numel = o->total_numel = 0;
  o->tilings = malloc(sizeof(distro__tiling) * (size_t)o->nparams);
  if (!o->tilings) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  for (int i = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    o->tilings[i] = p->tiling;
    if (p->numel > o->max_numel) o->max_numel = p->numel;
    o->total_numel += p->numel;
    if (adam) { /* the baseline keeps m and v, DisTrO-AdamW v only (demo.c) */
      p->v = zalloc_floats(p->numel);
      if (!demo) p->m = zalloc_floats(p->numel);
      if (!p->v || (!demo && !p->m)) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for AdamW moments of '%s'", p->name);
      if (demo && o->opt.overlap && o->opt.overlap != DISTRO_OVERLAP_BACKWARD) { /* staged until the exchange
                                                                                 completes (demo.c) */
        p->v_next = zalloc_floats(p->numel);
        if (!p->v_next) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for the staged AdamW moment of '%s'", p->name);
      }
    }
    if (demo) {
      const int64_t sel = p->tiling.nchunks * p->tiling.k;
      p->mom = zalloc_floats(p->numel);
      p->mom_next = zalloc_floats(p->numel);
      p->idx = malloc(sizeof(uint32_t) * (size_t)sel);
      p->val = malloc(sizeof(float) * (size_t)sel);
      if (!p->mom || !p->mom_next || !p->idx || !p->val)
        DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for the momentum of '%s'", p->name);
      if (o->opt.overlap == DISTRO_OVERLAP_LOOKAHEAD) { /* the agreed parameters (overlap.c) */
        p->base = malloc(sizeof(float) * (size_t)p->numel);
        if (!p->base) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for the agreed copy of '%s'", p->name);
      }
      DISTRO_CHECK(distro__dct_plan_init(&p->plan, &p->tiling, DISTRO__DCT_FAST));
    }
  }
  if (demo) {
    o->mom_tiled = 1;
    DISTRO_CHECK(distro__payload_prepare(o));
    /* The step's tile loops: every tensor's tiles in one global order, and
     * per thread one workspace for the largest tile (nothing is allocated
     * during a step). */
    o->tile_base = malloc(sizeof(int64_t) * (size_t)(o->nparams + 1));
    if (!o->tile_base) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
    o->tile_base[0] = 0;
    o->ws_tile = 1;
    for (int i = 0; i < o->nparams; i++) {
      o->tile_base[i + 1] = o->tile_base[i] + o->tilings[i].nchunks;
      if (o->tilings[i].chunk_elems > o->ws_tile) o->ws_tile = o->tilings[i].chunk_elems;
    }
    o->nws = o->opt.threads > 0 ? o->opt.threads : omp_get_max_threads();
    o->ws_bytes = distro__demo_ws_bytes(o->ws_tile);
    o->ws = aligned_alloc(64, o->ws_bytes * (size_t)o->nws);
    o->ws_clock = calloc((size_t)o->nws, sizeof *o->ws_clock);
    if (!o->ws || !o->ws_clock)
      DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for the step's workspaces (%d x %zu bytes)", o->nws, o->ws_bytes);
    memset(o->ws, 0, o->ws_bytes * (size_t)o->nws); /* the selection counts start (and stay) zero */
    if (o->opt.overlap == DISTRO_OVERLAP_BACKWARD) DISTRO_CHECK(distro__backward_init(o));
    else if (o->opt.overlap) DISTRO_CHECK(distro__overlap_init(o));
  } else if (o->comm->size > 1) { /* one rank updates straight from its gradients */
    o->flat = zalloc_floats(o->total_numel + 1);
    if (!o->flat) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for the all-reduce buffer");
  }
  distro__clip_init(o);
  o->ready = 1;
  return DISTRO_OK;
fail:
  free_state(o);
  return st;
}

/* ---- tensor-list agreement ------------------------------------------------ */

static uint64_t param_hash(const distro__param *p) {
  uint64_t h = DISTRO__FNV1A_INIT;
  h = distro__fnv1a(h, p->name, strlen(p->name) + 1);
  h = distro__fnv1a(h, &p->ndim, sizeof p->ndim);
  return distro__fnv1a(h, p->shape, sizeof(int64_t) * (size_t)p->ndim);
}

typedef struct {
  uint64_t ok, nparams, options_hash, list_hash, pending;
} signature;

distro_status distro__optim_verify(distro_optim *o, int local_ok) {
  distro_status st = DISTRO_OK;
  const int world = o->comm->size, rank = o->comm->rank;
  signature mine = {(uint64_t)(local_ok != 0), (uint64_t)o->nparams, DISTRO__FNV1A_INIT, DISTRO__FNV1A_INIT,
                    (uint64_t)distro__overlap_pending(o)},
            *all = NULL;
  uint64_t *hashes = NULL, *all_hashes = NULL;
  int32_t fields[7] = {(int32_t)o->opt.algorithm, (int32_t)o->opt.update, (int32_t)o->opt.values, o->opt.chunk,
                       o->opt.topk, o->opt.wire_version, o->opt.overlap};
  if (o->opt.algorithm == DISTRO_ALG_ADAMW) fields[1] = fields[2] = fields[3] = fields[4] = fields[5] = fields[6] = 0;
  mine.options_hash = distro__fnv1a(mine.options_hash, fields, sizeof fields);
  for (int i = 0; i < o->nparams; i++) {
    uint64_t h = param_hash(&o->params[i]);
    mine.list_hash = distro__fnv1a(mine.list_hash, &h, sizeof h);
  }
  all = malloc(sizeof *all * (size_t)world);
  if (!all) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  DISTRO_CHECK(o->comm->ops->allgather(o->comm, &mine, sizeof mine, all));
  uint64_t maxn = 0;
  int differ = 0;
  for (int r = 0; r < world; r++)
    if (!all[r].ok) DISTRO_FAIL(DISTRO_ERR_COMM, "rank %d could not prepare its optimizer state", r);
  for (int r = 0; r < world; r++) {
    if (all[r].options_hash != all[0].options_hash)
      DISTRO_FAIL(DISTRO_ERR_SHAPE, "rank %d uses different optimizer options (algorithm/update/values/chunk/topk/wire version/overlap) than rank 0", r);
    if (all[r].pending != all[0].pending) /* states loaded from different saves */
      DISTRO_FAIL(DISTRO_ERR_SHAPE, "rank %d %s an exchange in flight and rank 0 %s: load states saved at the same step",
                  r, all[r].pending ? "resumes with" : "resumes without", all[0].pending ? "does" : "does not");
    if (all[r].nparams != all[0].nparams || all[r].list_hash != all[0].list_hash) differ = 1;
    if (all[r].nparams > maxn) maxn = all[r].nparams;
  }
  if (!differ) {
    free(all);
    o->verified = 1;
    return DISTRO_OK;
  }
  /* Second round: per-tensor hashes, padded to the longest list, to name the
   * first tensor that differs. */
  hashes = calloc(maxn, sizeof *hashes);
  all_hashes = calloc(maxn * (size_t)world, sizeof *all_hashes);
  if (!hashes || !all_hashes) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  for (int i = 0; i < o->nparams; i++) hashes[i] = param_hash(&o->params[i]);
  DISTRO_CHECK(o->comm->ops->allgather(o->comm, hashes, sizeof *hashes * maxn, all_hashes));
  for (uint64_t i = 0; i < maxn; i++)
    for (int r = 1; r < world; r++)
      if (all_hashes[r * maxn + i] != all_hashes[i]) {
        const char *name = i < (uint64_t)o->nparams ? o->params[i].name : "(none)";
        DISTRO_FAIL(DISTRO_ERR_SHAPE,
                    "tensor lists differ across ranks: tensor #%llu (here '%s' on rank %d) differs between rank 0 and rank %d",
                    (unsigned long long)i, name, rank, r);
      }
  DISTRO_FAIL(DISTRO_ERR_SHAPE, "tensor lists differ across ranks");
fail:
  free(all);
  free(hashes);
  free(all_hashes);
  return st;
}

distro_status distro_optim_step(distro_optim *o, float lr, distro_step_stats *stats) {
  distro_status st;
  if (!o) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_step: optimizer is NULL");
  if (!(isfinite(lr) && lr >= 0)) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_step: lr %g must be finite and >= 0", (double)lr);
  double t0 = distro__now();
  distro_step_stats s;
  memset(&s, 0, sizeof s);
  /* Allocation is local, so a failure on one rank must still reach the
   * others: it travels in the signature round of the first step. */
  st = distro__optim_prepare(o);
  if (st == DISTRO_OK && !o->verified)
    for (int i = 0; i < o->nparams; i++)
      if (!o->params[i].grad) {
        st = distro__fail(DISTRO_ERR_INVALID, "tensor '%s' has no gradient buffer yet (distro_optim_set_grad)",
                          o->params[i].name);
        break;
      }
  if (!o->verified) {
    char why[512] = "";
    if (st != DISTRO_OK) snprintf(why, sizeof why, "%s", distro_last_error());
    distro_status vst = distro__optim_verify(o, st == DISTRO_OK);
    if (st != DISTRO_OK) return distro__fail(st, "%s", why);
    if (vst != DISTRO_OK) return vst;
  } else if (st != DISTRO_OK) {
    return st;
  }
  /* Overlap: the private comm of the background exchanges, made once the
   * ranks agree that all of them overlap. */
  if (o->ov) DISTRO_CHECK(distro__overlap_attach(o));
  if (o->bw) DISTRO_CHECK(distro__backward_begin(o, lr));
  /* With options.threads, the step's parallel regions use that many threads;
   * the caller's setting comes back on return. */
  const int caller_threads = omp_get_max_threads();
  if (o->opt.threads > 0) omp_set_num_threads(o->opt.threads);
  if (o->opt.clip_norm > 0) /* what was not measured when marked ready */
    for (int i = 0; i < o->nparams; i++)
      if (!distro__backward_marked(o, i)) distro__clip_measure(o, i);
  const distro__ramp ramp = o->ramp; /* restored if the step fails */
  distro__ramp_observe(&o->ramp, lr);
  if (o->ov) st = distro__overlap_step(o, lr, &s); /* counts its own steps */
  else if (o->bw) st = distro__backward_step(o, lr, &s);
  else st = o->opt.algorithm == DISTRO_ALG_DEMO ? distro__demo_step(o, lr, &s) : distro__adamw_step(o, lr, &s);
  if (o->opt.threads > 0) omp_set_num_threads(caller_threads);
  if (st != DISTRO_OK) {
    o->ramp = ramp;
    return st;
  }
  if (!o->ov) o->step++;
  if (o->opt.clip_norm > 0) distro__clip_commit(o); /* the step took this gradient */
  s.step = o->step;
  s.seconds_total = distro__now() - t0;
  if (stats) *stats = s;
  return DISTRO_OK;
fail:
  return st;
}

distro_status distro_optim_flush(distro_optim *o, distro_step_stats *stats) {
  if (!o) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_flush: optimizer is NULL");
  const double t0 = distro__now();
  distro_step_stats s;
  memset(&s, 0, sizeof s);
  distro_status st = DISTRO_OK;
  if (distro__overlap_pending(o)) {
    /* A loaded state's exchange, flushed before any step: the ranks agree
     * first, as at a first step, and the exchange needs its comm. */
    if (!o->verified) st = distro__optim_verify(o, 1);
    if (st == DISTRO_OK) st = distro__overlap_attach(o);
    if (st != DISTRO_OK) return st;
    const int caller_threads = omp_get_max_threads();
    if (o->opt.threads > 0) omp_set_num_threads(o->opt.threads);
    st = distro__overlap_flush(o, &s);
    if (o->opt.threads > 0) omp_set_num_threads(caller_threads);
  }
  if (st != DISTRO_OK) return st;
  s.step = o->step;
  s.seconds_total = distro__now() - t0;
  if (stats) *stats = s;
  return DISTRO_OK;
}

distro_status distro_optim_grad_norm(const distro_optim *o, double *norm) {
  DISTRO__NONNULL("distro_optim_grad_norm", o);
  DISTRO__NONNULL("distro_optim_grad_norm", norm);
  if (!(o->opt.clip_norm > 0))
    return distro__fail(DISTRO_ERR_INVALID, "distro_optim_grad_norm: options.clip_norm is 0, so the step does not "
                                            "measure the gradient");
  if (!o->ready || o->grad_norm < 0)
    return distro__fail(DISTRO_ERR_INVALID, "distro_optim_grad_norm: no step has completed yet");
  *norm = o->grad_norm;
  return DISTRO_OK;
}

distro_status distro_payload_bytes(const distro_options *given, int n, const int *ndims, const int64_t *const *shapes,
                                   uint64_t *bytes) {
  distro_status st = DISTRO_OK;
  distro__tiling *t = NULL;
  distro_options taken;
  const distro_options *opt = &taken;
  DISTRO__NONNULL("distro_payload_bytes", given);
  DISTRO__NONNULL("distro_payload_bytes", bytes);
  DISTRO__NONNULL("distro_payload_bytes", ndims);
  DISTRO__NONNULL("distro_payload_bytes", shapes);
  if (n < 1) return distro__fail(DISTRO_ERR_INVALID, "distro_payload_bytes: n is %d, need at least one tensor", n);
  DISTRO_CHECK(distro__options_take(given, &taken));
  if (opt->algorithm == DISTRO_ALG_ADAMW) {
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
      distro__tiling ti;
      DISTRO_CHECK(distro__tiling_init(&ti, ndims[i], shapes[i], 1, 1));
      total += (uint64_t)(ti.rows * ti.cols) * 4;
    }
    *bytes = total;
    return DISTRO_OK;
  }
  t = malloc(sizeof *t * (size_t)n);
  if (!t) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  for (int i = 0; i < n; i++) DISTRO_CHECK(distro__tiling_init(&t[i], ndims[i], shapes[i], opt->chunk, opt->topk));
  const distro__payload_format *f = distro__payload_format_of(opt->wire_version);
  if (!f) DISTRO_FAIL(DISTRO_ERR_INVALID, "wire_version %d is not known", opt->wire_version);
  DISTRO_CHECK(f->bound(t, n, opt->values, bytes));
fail:
  free(t);
  return st;
}

distro_status distro_optim_payload_bytes(const distro_optim *o, uint64_t *bytes) {
  DISTRO__NONNULL("distro_optim_payload_bytes", o);
  DISTRO__NONNULL("distro_optim_payload_bytes", bytes);
  if (o->nparams == 0) return distro__fail(DISTRO_ERR_INVALID, "no tensors registered");
  int *nd = malloc(sizeof(int) * (size_t)o->nparams);
  const int64_t **sh = malloc(sizeof(int64_t *) * (size_t)o->nparams);
  distro_status st = DISTRO_ERR_NOMEM;
  if (nd && sh) {
    for (int i = 0; i < o->nparams; i++) {
      nd[i] = o->params[i].ndim;
      sh[i] = o->params[i].shape;
    }
    st = distro_payload_bytes(&o->opt, o->nparams, nd, sh, bytes);
  } else {
    distro__fail(st, "out of memory");
  }
  free(nd);
  free(sh);
  return st;
}
