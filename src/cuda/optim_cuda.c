/* The DeMo step on the GPU (include/distro/cuda.h).
 *
 * A CPU optimizer object (never stepped itself) holds the options, the tensor
 * list and the payload machinery, so argument checks, the tensor-list
 * agreement, the wire formats, validation, dropping and clipping are the CPU
 * path's own code. The device holds the momentum (DCT domain), the
 * selection and the update; per step the selection goes to the host (pinned)
 * and every rank's decoded selection comes back. Save and load are
 * optim_cuda_io.c, the AdamW all-reduce baseline adamw_cuda.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <distro/cuda.h>

#include "comm/comm_internal.h"
#include "cuda/cuda_internal.h"
#include "cuda/optim_state.h"
#include "optim/optim_internal.h"
#include "optim/step_rule.h"

/* Blocks per multiprocessor of the tile kernels, each with a slice of global
 * work memory (a build-time knob for measuring: bench/gpu-sweep-blocks.sh). */
#ifndef DISTRO__CUDA_BLOCKS_PER_SM
#define DISTRO__CUDA_BLOCKS_PER_SM 4
#endif

distro_status distro_cuda_optim_create(const distro_options *opt, distro_comm *comm, cudaStream_t stream,
                                       distro_cuda_optim **out) {
  distro_status st = DISTRO_OK;
  distro_optim *host = NULL;
  if (!out) return distro__fail(DISTRO_ERR_INVALID, "distro_cuda_optim_create: out is NULL");
  *out = NULL;
  DISTRO_CHECK(distro_optim_create(opt, comm, &host));
  if (host->opt.overlap == DISTRO_OVERLAP_BACKWARD)
    DISTRO_FAIL(DISTRO_ERR_UNSUPPORTED, "distro_cuda_optim_create: options.overlap = DISTRO_OVERLAP_BACKWARD is "
                                        "the CPU optimizer's only (the GPU step has no per-bucket compress)");
  if (host->opt.clip_norm > 0)
    DISTRO_FAIL(DISTRO_ERR_UNSUPPORTED, "distro_cuda_optim_create: options.clip_norm is the CPU optimizer's only "
                                        "(the GPU step reads the gradient unscaled); clip on the device before the "
                                        "step and leave clip_norm 0");
  distro_cuda_optim *o = calloc(1, sizeof *o);
  if (!o) DISTRO_FAIL(DISTRO_ERR_NOMEM, "distro_cuda_optim_create: out of memory");
  o->host = host;
  o->stream = stream;
  o->dct_method = DISTRO_CUDA_DCT_EXACT;
  o->nccl = strcmp(host->comm->ops->name, "nccl") == 0;
  *out = o;
  return DISTRO_OK;
fail:
  distro_optim_free(host);
  return st;
}

static distro_status add(distro_cuda_optim *o, const char *name, void *bf16, float *param, const float *grad, int ndim,
                         const int64_t *shape) {
  distro_status st = DISTRO_OK;
  DISTRO__NONNULL("distro_cuda_optim_add_param", o);
  if (o->cap == o->host->nparams) {
    int cap = o->cap ? 2 * o->cap : 16;
    cuda_param *p = realloc(o->params, sizeof *p * (size_t)cap);
    if (!p) return distro__fail(DISTRO_ERR_NOMEM, "distro_cuda_optim_add_param: out of memory");
    o->params = p;
    o->cap = cap;
  }
  DISTRO_CHECK(distro_optim_add_param(o->host, name, param, grad, ndim, shape));
  cuda_param *p = &o->params[o->host->nparams - 1];
  memset(p, 0, sizeof *p);
  p->param = param;
  p->grad = grad;
  p->bf16 = bf16;
  return DISTRO_OK;
fail:
  return st;
}

distro_status distro_cuda_optim_add_param(distro_cuda_optim *o, const char *name, float *param, const float *grad,
                                          int ndim, const int64_t *shape) {
  return add(o, name, NULL, param, grad, ndim, shape);
}

distro_status distro_cuda_optim_add_param_bf16(distro_cuda_optim *o, const char *name, void *param_bf16, float *master,
                                               const float *grad, int ndim, const int64_t *shape) {
  DISTRO__NONNULL("distro_cuda_optim_add_param_bf16", param_bf16);
  return add(o, name, param_bf16, master, grad, ndim, shape);
}

distro_status distro_cuda_optim_set_grad(distro_cuda_optim *o, const char *name, const float *grad) {
  if (!o) return distro__fail(DISTRO_ERR_INVALID, "distro_cuda_optim_set_grad: the optimizer is NULL");
  /* The CPU optimizer's checks (NULL, unknown name, overlapping buffers). */
  distro_status st = distro_optim_set_grad(o->host, name, grad);
  if (st != DISTRO_OK) return st;
  for (int i = 0; i < o->host->nparams; i++)
    if (strcmp(o->host->params[i].name, name) == 0) o->params[i].grad = grad;
  return DISTRO_OK;
}

distro_status distro_cuda_optim_set_dct(distro_cuda_optim *o, distro_cuda_dct method) {
  if (!o) return distro__fail(DISTRO_ERR_INVALID, "distro_cuda_optim_set_dct: optimizer is NULL");
  if (method != DISTRO_CUDA_DCT_GEMM && method != DISTRO_CUDA_DCT_FFT && method != DISTRO_CUDA_DCT_AUTO &&
      method != DISTRO_CUDA_DCT_EXACT)
    return distro__fail(DISTRO_ERR_INVALID, "distro_cuda_optim_set_dct: unknown method %d", (int)method);
  if (o->ready)
    return distro__fail(DISTRO_ERR_INVALID,
                        "distro_cuda_optim_set_dct: the device state exists already (call it before the first step)");
  o->dct_method = method;
  return DISTRO_OK;
}

/* ---- state ------------------------------------------------------------------ */

static void free_device_state(distro_cuda_optim *o) {
  distro_optim *h = o->host;
  for (int i = 0; i < h->nparams; i++) {
    cuda_param *p = &o->params[i];
    cudaFree(p->mom);
    cudaFree(p->mom_next);
    cudaFree(p->m);
    cudaFree(p->v);
    cudaFree(p->v_next);
    cudaFree(p->base);
    p->mom = p->mom_next = p->m = p->v = p->v_next = p->base = NULL;
    distro__cuda_fft_destroy(&p->fft);
    p->use_fft = 0;
    h->params[i].idx = NULL; /* they pointed into h_sel_idx / h_sel_val */
    h->params[i].val = NULL;
  }
  for (int b = 0; b < o->nshapes; b++) cudaFree(o->shapes[b].blob);
  free(o->shapes);
  o->shapes = NULL;
  o->nshapes = 0;
  cudaFree(o->tile_work);
  cudaFree(o->tile_iwork);
  o->tile_work = NULL;
  o->tile_iwork = NULL;
  for (int b = 0; b < o->nbases; b++) cudaFree(o->bases[b].basis);
  free(o->bases);
  o->bases = NULL;
  o->nbases = 0;
  if (o->dec_registered) {
    cudaHostUnregister(h->dec_idx);
    cudaHostUnregister(h->dec_val);
    o->dec_registered = 0;
  }
  if (o->io_registered) {
    cudaHostUnregister(h->send);
    cudaHostUnregister(h->recv);
    o->io_registered = 0;
  }
  cudaFree(o->d_sel_idx);
  cudaFree(o->d_sel_val);
  cudaFreeHost(o->h_sel_idx);
  cudaFreeHost(o->h_sel_val);
  cudaFree(o->d_dec_idx);
  cudaFree(o->d_dec_val);
  cudaFree(o->d_dropped);
  cudaFree(o->d_flags);
  cudaFreeHost(o->h_flags);
  cudaFree(o->d_flat);
  cudaFreeHost(o->h_flat);
  cudaFree(o->fft_work);
  cudaFree(o->fft_cbuf);
  o->fft_work = o->fft_cbuf = NULL;
  o->d_flat = o->h_flat = NULL;
  cudaFree(o->scratch_a);
  cudaFree(o->scratch_b);
  cudaFree(o->d_u);
  o->d_u = NULL;
  cudaFree(o->counts);
  o->d_sel_idx = o->h_sel_idx = o->d_dec_idx = NULL;
  o->d_sel_val = o->h_sel_val = o->d_dec_val = o->scratch_a = o->scratch_b = NULL;
  o->d_dropped = NULL;
  o->d_flags = o->h_flags = o->counts = NULL;
  if (o->have_events)
    for (int e = 0; e < EV_COUNT; e++) cudaEventDestroy(o->ev[e]);
  o->have_events = 0;
  if (o->blas) cublasDestroy(o->blas);
  o->blas = NULL;
  distro__payload_destroy(h);
  free(h->tilings);
  h->tilings = NULL;
}

void distro_cuda_optim_free(distro_cuda_optim *o) {
  if (!o) return;
  distro__overlap_free(o->host); /* first: its helper reads the payload buffers */
  free_device_state(o);
  distro_optim_free(o->host);
  free(o->params);
  free(o);
}

static distro_status basis_for(distro_cuda_optim *o, int64_t n, const float **out) {
  distro_status st = DISTRO_OK;
  for (int b = 0; b < o->nbases; b++)
    if (o->bases[b].n == n) {
      *out = o->bases[b].basis;
      return DISTRO_OK;
    }
  basis_entry *nb = realloc(o->bases, sizeof *nb * (size_t)(o->nbases + 1));
  if (!nb) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  o->bases = nb;
  DISTRO_CHECK(distro__cuda_basis(n, &nb[o->nbases].basis));
  nb[o->nbases].n = n;
  *out = nb[o->nbases++].basis;
fail:
  return st;
}

/* The exact method's tables for the tiling's tile shape, shared by every
 * tensor of that shape. */
static distro_status shape_for(distro_cuda_optim *o, const distro__tiling *t, int *out) {
  distro_status st = DISTRO_OK;
  for (int b = 0; b < o->nshapes; b++)
    if (o->shapes[b].h == t->h && o->shapes[b].w == t->w) {
      *out = b;
      return DISTRO_OK;
    }
  hd_shape *ns = realloc(o->shapes, sizeof *ns * (size_t)(o->nshapes + 1));
  if (!ns) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  o->shapes = ns;
  DISTRO_CHECK(distro__cuda_tile_tables(t, &ns[o->nshapes].blob, &ns[o->nshapes].dev));
  ns[o->nshapes].h = (int)t->h;
  ns[o->nshapes].w = (int)t->w;
  *out = o->nshapes++;
fail:
  return st;
}

static distro_status zeroed(void **p, size_t bytes) {
  distro_status st = DISTRO_OK;
  DISTRO_CUDA_TRY(cudaMalloc(p, bytes ? bytes : 1));
  DISTRO_CUDA_TRY(cudaMemset(*p, 0, bytes ? bytes : 1));
fail:
  return st;
}

distro_status distro__cuda_optim_prepare(distro_cuda_optim *o) {
  distro_status st = DISTRO_OK;
  distro_optim *h = o->host;
  if (o->ready) return DISTRO_OK;
  if (h->nparams == 0) return distro__fail(DISTRO_ERR_INVALID, "no tensors registered (distro_cuda_optim_add_param)");
  /* Before any device work, so that this check runs anywhere. */
  for (int i = 0; i < h->nparams; i++)
    if (!o->params[i].grad)
      return distro__fail(DISTRO_ERR_INVALID, "tensor '%s' has no gradient buffer yet (distro_cuda_optim_set_grad)",
                          h->params[i].name);
  const int adam = distro__uses_adam(&h->opt), world = h->comm->size, demo = h->opt.algorithm == DISTRO_ALG_DEMO;
  const int exact = o->dct_method == DISTRO_CUDA_DCT_EXACT;
  if (demo && !exact && h->opt.overlap == DISTRO_OVERLAP_LOOKAHEAD)
    return distro__fail(DISTRO_ERR_UNSUPPORTED, "options.overlap = DISTRO_OVERLAP_LOOKAHEAD on the GPU needs the "
                                                "exact DCT method (DISTRO_CUDA_DCT_EXACT, the default)");
  if (demo && !exact) {
    DISTRO_CUBLAS_TRY(cublasCreate(&o->blas));
    DISTRO_CUBLAS_TRY(cublasSetStream(o->blas, o->stream));
    DISTRO_CUBLAS_TRY(cublasSetMathMode(o->blas, CUBLAS_DEFAULT_MATH));
  }
  for (int e = 0; e < EV_COUNT; e++) {
    DISTRO_CUDA_TRY(cudaEventCreate(&o->ev[e]));
    o->have_events = e + 1 == EV_COUNT;
  }
  size_t fft_work = 0;
  int64_t fft_cbuf = 0, max_tile = 0, max_h = 1;
  h->max_numel = h->total_numel = 0;
  h->tilings = malloc(sizeof(distro__tiling) * (size_t)h->nparams);
  if (!h->tilings) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  for (int i = 0; i < h->nparams; i++) {
    distro__param *hp = &h->params[i];
    cuda_param *p = &o->params[i];
    const size_t bytes = sizeof(float) * (size_t)hp->numel;
    h->tilings[i] = hp->tiling;
    if (hp->numel > h->max_numel) h->max_numel = hp->numel;
    h->total_numel += hp->numel;
    if (adam) { /* DisTrO-AdamW keeps the second moment only */
      if (!demo) DISTRO_CHECK(zeroed((void **)&p->m, bytes));
      DISTRO_CHECK(zeroed((void **)&p->v, bytes));
    }
    p->shape = -1;
    if (!demo) continue;
    DISTRO_CHECK(zeroed((void **)&p->mom, bytes));
    DISTRO_CHECK(zeroed((void **)&p->mom_next, bytes));
    /* Overlap: the second moment v' staged by the compress, committed by the
     * apply of the next call (as on the CPU: the caller's buffer holds the
     * next gradient by then). */
    if (adam && h->opt.overlap) DISTRO_CHECK(zeroed((void **)&p->v_next, bytes));
    /* Look-ahead: the agreed parameters; the caller's run ahead of them. */
    if (h->opt.overlap == DISTRO_OVERLAP_LOOKAHEAD) DISTRO_CHECK(zeroed((void **)&p->base, bytes));
    if (exact) {
      if (hp->tiling.chunk_elems > max_tile) max_tile = hp->tiling.chunk_elems;
      if (hp->tiling.h > max_h) max_h = hp->tiling.h;
      DISTRO_CHECK(shape_for(o, &hp->tiling, &p->shape));
      continue;
    }
    DISTRO_CHECK(distro__cuda_dct_check(&hp->tiling));
    p->dct.t = hp->tiling;
    DISTRO_CHECK(basis_for(o, hp->tiling.h, &p->dct.fh));
    DISTRO_CHECK(basis_for(o, hp->tiling.w, &p->dct.fw));
    const int64_t edge = hp->tiling.h > hp->tiling.w ? hp->tiling.h : hp->tiling.w;
    if (hp->tiling.chunk_elems > 1 && (o->dct_method == DISTRO_CUDA_DCT_FFT ||
                                       (o->dct_method == DISTRO_CUDA_DCT_AUTO && edge >= DISTRO_CUDA_FFT_MIN_EDGE))) {
      DISTRO_CHECK(distro__cuda_fft_init(&p->fft, &hp->tiling, &fft_work));
      p->use_fft = 1;
      const int64_t c = distro__cuda_fft_cbuf(&hp->tiling);
      if (c > fft_cbuf) fft_cbuf = c;
    }
  }
  if (max_tile > 0) {
    /* A few blocks per multiprocessor, each with its slice of work memory. */
    int dev = 0, sms = 0;
    DISTRO_CUDA_TRY(cudaGetDevice(&dev));
    DISTRO_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    o->max_blocks = DISTRO__CUDA_BLOCKS_PER_SM * (sms > 0 ? sms : 1);
    /* distro__hd_tile_work / _iwork of the largest tile, bounded by max_tile and max_h */
    DISTRO_CUDA_TRY(cudaMalloc((void **)&o->tile_work,
                               sizeof(float) * (size_t)o->max_blocks * (size_t)(10 * max_tile + 64)));
    DISTRO_CUDA_TRY(cudaMalloc((void **)&o->tile_iwork,
                               sizeof(uint32_t) * (size_t)o->max_blocks * (size_t)(3 * max_tile + max_h + 8)));
  }
  if (fft_cbuf > 0) {
    DISTRO_CUDA_TRY(cudaMalloc(&o->fft_work, fft_work ? fft_work : 1));
    DISTRO_CUDA_TRY(cudaMalloc(&o->fft_cbuf, sizeof(cufftComplex) * (size_t)fft_cbuf));
    for (int i = 0; i < h->nparams; i++)
      if (o->params[i].use_fft) DISTRO_CHECK(distro__cuda_fft_set_work(&o->params[i].fft, o->fft_work));
  }
  DISTRO_CUDA_TRY(cudaMalloc((void **)&o->d_flags, sizeof(int) * (size_t)(h->nparams + 1)));
  DISTRO_CUDA_TRY(cudaMallocHost((void **)&o->h_flags, sizeof(int) * (size_t)(h->nparams + 1)));
  if (!demo) {
    /* The all-reduce baseline: one flat buffer (gradients + the flag slot). */
    const size_t flat = sizeof(float) * (size_t)(h->total_numel + 1);
    DISTRO_CUDA_TRY(cudaMalloc((void **)&o->d_flat, flat));
    if (!o->nccl) DISTRO_CUDA_TRY(cudaMallocHost((void **)&o->h_flat, flat));
    h->ready = 1;
    o->ready = 1;
    return DISTRO_OK;
  }
  DISTRO_CHECK(distro__payload_prepare(h));
  const size_t sel = (size_t)h->total_sel, all = sel * (size_t)world;
  DISTRO_CUDA_TRY(cudaMalloc((void **)&o->d_sel_idx, sizeof(uint32_t) * (sel ? sel : 1)));
  DISTRO_CUDA_TRY(cudaMalloc((void **)&o->d_sel_val, sizeof(float) * (sel ? sel : 1)));
  DISTRO_CUDA_TRY(cudaMallocHost((void **)&o->h_sel_idx, sizeof(uint32_t) * (sel ? sel : 1)));
  DISTRO_CUDA_TRY(cudaMallocHost((void **)&o->h_sel_val, sizeof(float) * (sel ? sel : 1)));
  DISTRO_CUDA_TRY(cudaMalloc((void **)&o->d_dec_idx, sizeof(uint32_t) * (all ? all : 1)));
  DISTRO_CUDA_TRY(cudaMalloc((void **)&o->d_dec_val, sizeof(float) * (all ? all : 1)));
  DISTRO_CUDA_TRY(cudaMalloc((void **)&o->d_dropped, (size_t)world));
  DISTRO_CUDA_TRY(cudaMalloc((void **)&o->scratch_a, sizeof(float) * (size_t)h->max_numel));
  DISTRO_CUDA_TRY(cudaMalloc((void **)&o->scratch_b, sizeof(float) * (size_t)h->max_numel));
  DISTRO_CUDA_TRY(cudaMalloc((void **)&o->counts, sizeof(int) * (size_t)h->max_numel));
  if (h->opt.update == DISTRO_UPDATE_ADAMW)
    DISTRO_CUDA_TRY(cudaMalloc((void **)&o->d_u, sizeof(float) * (size_t)h->max_numel));
  if (h->opt.overlap) DISTRO_CHECK(distro__overlap_init(h)); /* the helper thread and its second exchange set */
  /* Page-locking the decoded arrays only speeds up their upload (not with
   * overlap: its exchange sets swap, and the registered one would move). */
  if (all && !h->opt.overlap &&
      cudaHostRegister(h->dec_idx, sizeof(uint32_t) * all, cudaHostRegisterDefault) == cudaSuccess) {
    if (cudaHostRegister(h->dec_val, sizeof(float) * all, cudaHostRegisterDefault) == cudaSuccess)
      o->dec_registered = 1;
    else
      cudaHostUnregister(h->dec_idx);
  }
  /* So are the payload buffers over NCCL, which copies them to and from the
   * device every step (tens of MB at a 1B-parameter size). */
  if (o->nccl && !h->opt.overlap && h->slot &&
      cudaHostRegister(h->send, h->slot, cudaHostRegisterDefault) == cudaSuccess) {
    if (cudaHostRegister(h->recv, h->slot * (size_t)world, cudaHostRegisterDefault) == cudaSuccess)
      o->io_registered = 1;
    else
      cudaHostUnregister(h->send);
  }
  (void)cudaGetLastError(); /* a refused registration is not an error */
  for (int i = 0; i < h->nparams; i++) {
    h->params[i].idx = o->h_sel_idx + h->sel_off[i];
    h->params[i].val = o->h_sel_val + h->sel_off[i];
  }
  h->ready = 1; /* freezes the tensor list */
  o->ready = 1;
  return DISTRO_OK;
fail:
  free_device_state(o);
  return st;
}

/* ---- the step --------------------------------------------------------------- */

/* Phases 1 and 2 of the DeMo step, everything before the exchange: the
 * tensors' DCTs, the momentum (staged), the selection, and its copy to the
 * host; *bad is the first tensor whose momentum (or second moment) is not
 * finite. Changes nothing the caller sees: the momentum is staged. */
static distro_status demo_local(distro_cuda_optim *o, float lr, int *bad) {
  distro_status st = DISTRO_OK;
  distro_optim *h = o->host;
  cudaStream_t S = o->stream;
  const int sign_update = h->opt.update == DISTRO_UPDATE_SIGN;
  const float scale = sign_update ? lr : 1.0f, decay = h->opt.compression_decay;
  const size_t sel = (size_t)h->total_sel;
  const int64_t t = h->step + 1;
  const float c2 = (float)(1.0 - pow((double)h->opt.beta2, (double)t));

  DISTRO_CUDA_TRY(cudaEventRecord(o->ev[EV_START], S));
  DISTRO_CUDA_TRY(cudaMemsetAsync(o->d_flags, 0, sizeof(int) * (size_t)h->nparams, S));
  for (int i = 0; i < h->nparams; i++) {
    cuda_param *p = &o->params[i];
    const int64_t n = h->params[i].numel;
    if (p->shape >= 0) { /* the exact method: demo.c's arithmetic, tile by tile */
      DISTRO_CUDA_TRY(distro__cuda_compress_tiles(S, &o->shapes[p->shape].dev, &h->tilings[i], p->grad, p->v,
                                                  p->v_next, !sign_update, h->opt.beta2, c2, h->opt.eps, p->mom,
                                                  p->mom_next,
                                                  decay, scale, o->tile_work, o->max_blocks, o->d_flags, i));
      continue;
    }
    const float *x = p->grad; /* DisTrO-AdamW: the normalized gradient (demo.c) */
    if (!sign_update) {
      DISTRO_CUDA_TRY(
          distro__cuda_adam_input(S, p->grad, p->v, p->v_next, o->d_u, n, h->opt.beta2, h->opt.eps, c2, o->d_flags, i));
      x = o->d_u;
    }
    if (p->use_fft)
      DISTRO_CHECK(distro__cuda_fft_encode(&p->fft, S, x, p->mom_next, o->scratch_a, o->fft_cbuf));
    else
      DISTRO_CHECK(distro__cuda_dct_encode(o->blas, S, &p->dct, x, p->mom_next, o->scratch_a));
    /* flags a non-finite momentum, as the CPU's blend does (a non-finite
     * gradient reaches its tile's coefficients through the transform) */
    DISTRO_CUDA_TRY(distro__cuda_momentum(S, p->mom_next, p->mom, decay, scale, n, o->d_flags, i));
  }
  DISTRO_CUDA_TRY(cudaEventRecord(o->ev[EV_FORWARD], S));
  /* Top-k per chunk; what is selected leaves the staged momentum. */
  for (int i = 0; i < h->nparams; i++)
    DISTRO_CUDA_TRY(distro__cuda_topk(S, &h->tilings[i], o->params[i].mom_next, o->d_sel_idx + h->sel_off[i],
                                      o->d_sel_val + h->sel_off[i]));
  DISTRO_CUDA_TRY(cudaMemcpyAsync(o->h_sel_idx, o->d_sel_idx, sizeof(uint32_t) * sel, cudaMemcpyDeviceToHost, S));
  DISTRO_CUDA_TRY(cudaMemcpyAsync(o->h_sel_val, o->d_sel_val, sizeof(float) * sel, cudaMemcpyDeviceToHost, S));
  DISTRO_CUDA_TRY(cudaMemcpyAsync(o->h_flags, o->d_flags, sizeof(int) * (size_t)h->nparams, cudaMemcpyDeviceToHost, S));
  DISTRO_CUDA_TRY(cudaEventRecord(o->ev[EV_SELECTED], S));
  DISTRO_CUDA_TRY(cudaStreamSynchronize(S));
  *bad = -1;
  for (int i = 0; i < h->nparams && *bad < 0; i++)
    if (o->h_flags[i]) *bad = i;
  return DISTRO_OK;
fail:
  return st;
}

/* Phase 4, after a successful exchange: upload every rank's selection,
 * aggregate, inverse DCT and update (DisTrO-AdamW's second moment from the
 * gradient the aggregate's step compressed: the staged one with overlap);
 * waits for the device, so an error of the update kernels is this step's. */
static distro_status demo_apply(distro_cuda_optim *o, float lr) {
  distro_status st = DISTRO_OK;
  distro_optim *h = o->host;
  cudaStream_t S = o->stream;
  const int sign_update = h->opt.update == DISTRO_UPDATE_SIGN, world = h->comm->size;
  const size_t sel = (size_t)h->total_sel;
  DISTRO_CUDA_TRY(cudaMemcpyAsync(o->d_dec_idx, h->dec_idx, sizeof(uint32_t) * sel * (size_t)world,
                                  cudaMemcpyHostToDevice, S));
  DISTRO_CUDA_TRY(cudaMemcpyAsync(o->d_dec_val, h->dec_val, sizeof(float) * sel * (size_t)world,
                                  cudaMemcpyHostToDevice, S));
  DISTRO_CUDA_TRY(cudaMemcpyAsync(o->d_dropped, h->dropped, (size_t)world, cudaMemcpyHostToDevice, S));
  DISTRO_CUDA_TRY(cudaEventRecord(o->ev[EV_UPLOADED], S));
  const float shrink = 1.0f - lr * h->opt.weight_decay;
  /* demo.c: DisTrO-AdamW's rectified step for this step's aggregate, grown
   * with its spread (counted on the host from the decoded selections and
   * kept for the look-ahead's next provisional step, as demo_commit does) */
  h->spread = distro__step_spread(h);
  const float step =
      sign_update ? lr : distro__adamw_sign_step(h->opt.beta2, h->step + 1, lr, &h->ramp, distro__step_growth(h));
  for (int i = 0; i < h->nparams; i++) {
    cuda_param *p = &o->params[i];
    const int64_t n = h->params[i].numel;
    /* DisTrO-AdamW's second moment: the staged v' (overlap), or v' from the gradient */
    const int commit_v = !sign_update && !p->v_next;
    if (p->v_next) {
      float *sw = p->v;
      p->v = p->v_next;
      p->v_next = sw;
    }
    float *q = p->mom; /* the old momentum buffer holds the inverse (GEMM / FFT) */
    p->mom = p->mom_next;
    p->mom_next = q;
    if (p->shape >= 0) {
      DISTRO_CUDA_TRY(distro__cuda_apply_tiles(S, &o->shapes[p->shape].dev, &h->tilings[i], o->d_dec_idx + h->sel_off[i],
                                               o->d_dec_val + h->sel_off[i], h->total_sel, o->d_dropped, world,
                                               p->base ? p->base : p->param, p->grad, p->v, commit_v, h->opt.beta2,
                                               shrink, step, o->tile_work, o->tile_iwork, o->max_blocks));
    } else {
      DISTRO_CUDA_TRY(distro__cuda_aggregate(S, &h->tilings[i], o->d_dec_idx + h->sel_off[i],
                                             o->d_dec_val + h->sel_off[i], h->total_sel, o->d_dropped, world,
                                             o->scratch_a, o->counts));
      if (p->use_fft)
        DISTRO_CHECK(distro__cuda_fft_decode(&p->fft, S, o->scratch_a, q, o->scratch_b, o->fft_cbuf));
      else
        DISTRO_CHECK(distro__cuda_dct_decode(o->blas, S, &p->dct, o->scratch_a, q, o->scratch_b));
      DISTRO_CUDA_TRY(distro__cuda_sign_update(S, p->param, q, step, shrink, n));
      if (commit_v) DISTRO_CUDA_TRY(distro__cuda_adam_commit(S, p->v, p->grad, n, h->opt.beta2));
    }
    /* the bf16 copy (with look-ahead: after the provisional step, demo_ahead) */
    if (p->bf16 && !p->base) DISTRO_CUDA_TRY(distro__cuda_to_bf16(S, p->param, p->bf16, n));
  }
  DISTRO_CUDA_TRY(cudaEventRecord(o->ev[EV_DONE], S));
  DISTRO_CUDA_TRY(cudaStreamSynchronize(S));
  DISTRO_CUDA_TRY(cudaGetLastError());
  return DISTRO_OK;
fail:
  return st;
}

/* Look-ahead (demo.c ahead_tile): the caller's parameters become the agreed
 * ones minus a sign(this rank's whole momentum of the step just
 * compressed), or with a = 0 the agreed ones; then the bf16 copies. */
static distro_status demo_ahead(distro_cuda_optim *o, float a) {
  distro_status st = DISTRO_OK;
  distro_optim *h = o->host;
  cudaStream_t S = o->stream;
  for (int i = 0; i < h->nparams; i++) {
    cuda_param *p = &o->params[i];
    DISTRO_CUDA_TRY(distro__cuda_ahead_tiles(S, &o->shapes[p->shape].dev, &h->tilings[i], p->mom_next,
                                             o->d_sel_idx + h->sel_off[i], o->d_sel_val + h->sel_off[i], p->base,
                                             p->param, a, o->tile_work, o->max_blocks));
    if (p->bf16) DISTRO_CUDA_TRY(distro__cuda_to_bf16(S, p->param, p->bf16, h->params[i].numel));
  }
  DISTRO_CUDA_TRY(cudaStreamSynchronize(S));
  DISTRO_CUDA_TRY(cudaGetLastError());
  return DISTRO_OK;
fail:
  return st;
}

/* Look-ahead with nothing in flight: the agreed parameters are the caller's. */
static distro_status demo_agree(distro_cuda_optim *o) {
  distro_status st = DISTRO_OK;
  distro_optim *h = o->host;
  for (int i = 0; i < h->nparams; i++)
    DISTRO_CUDA_TRY(cudaMemcpyAsync(o->params[i].base, o->params[i].param, sizeof(float) * (size_t)h->params[i].numel,
                                    cudaMemcpyDeviceToDevice, o->stream));
  return DISTRO_OK;
fail:
  return st;
}

/* A local failure before the exchange: join it with an abort payload so
 * that every rank fails this step (none waits for us), then report ours. */
static distro_status demo_join_failed(distro_cuda_optim *o, distro_status why, distro_step_stats *s) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", distro_last_error());
  distro__payload_join_failed(o->host, why, s);
  return distro__fail(why, "%s", msg);
}

static distro_status demo_step(distro_cuda_optim *o, float lr, distro_step_stats *s, int want_stats) {
  distro_status st = DISTRO_OK;
  distro_optim *h = o->host;
  int bad = -1;
  st = demo_local(o, lr, &bad);
  if (st != DISTRO_OK) return demo_join_failed(o, st, s);
  /* Encode, exchange, validate and decode: the CPU path's code. */
  double t0 = distro__now();
  size_t size = distro__payload_encode(h, bad);
  const double encode = distro__now() - t0;
  s->seconds_topk += encode;
  s->seconds_codec += encode;
  if (size == 0) {
    distro__fail(DISTRO_ERR_PAYLOAD, "internal error: the payload did not fit its bound");
    return demo_join_failed(o, DISTRO_ERR_PAYLOAD, s);
  }
  DISTRO_CHECK(distro__payload_exchange(h, size, s));
  st = demo_apply(o, lr);
  if (st != DISTRO_OK) {
    o->broken = 1;
    return st;
  }
  if (want_stats) {
    s->seconds_transform += distro__cuda_elapsed(o->ev[EV_START], o->ev[EV_FORWARD]);
    s->seconds_topk += distro__cuda_elapsed(o->ev[EV_FORWARD], o->ev[EV_SELECTED]);
    s->seconds_decode += distro__cuda_elapsed(o->ev[EV_UPLOADED], o->ev[EV_DONE]); /* the inverse DCT counts here */
  }
  return DISTRO_OK;
fail:
  return st;
}

/* Overlap (overlap.c's distro__overlap_ext_step drives these): the apply of the
 * previous call's aggregate, then this call's compress; with look-ahead the
 * provisional step after the hand-over. */
static distro_status ov_apply(void *ctx, float lr) {
  distro_cuda_optim *o = ctx;
  distro_status st = demo_apply(o, lr);
  if (st != DISTRO_OK) o->broken = 1;
  return st;
}

static distro_status ov_compress(void *ctx, float lr, int *bad) { return demo_local(ctx, lr, bad); }

static distro_status ov_ahead(void *ctx, float a) {
  distro_cuda_optim *o = ctx;
  distro_status st = demo_ahead(o, a);
  if (st != DISTRO_OK) o->broken = 1;
  return st;
}

static distro_status ov_agree(void *ctx) { return demo_agree(ctx); }

/* The callbacks of overlap.c's driver (look-ahead adds ahead and agree). */
static distro__overlap_ext_ops ov_ops(distro_cuda_optim *o) {
  const int ahead = o->host->opt.overlap == DISTRO_OVERLAP_LOOKAHEAD;
  return (distro__overlap_ext_ops){o, ov_apply, ov_compress, ahead ? ov_ahead : NULL, ahead ? ov_agree : NULL};
}

static distro_status overlap_step(distro_cuda_optim *o, float lr, distro_step_stats *s, int want_stats) {
  const distro__overlap_ext_ops ops = ov_ops(o);
  const int applies = distro__overlap_pending(o->host);
  distro_status st = distro__overlap_ext_step(o->host, &ops, lr, s);
  if (st != DISTRO_OK) return st;
  if (want_stats) {
    s->seconds_transform += distro__cuda_elapsed(o->ev[EV_START], o->ev[EV_FORWARD]);
    s->seconds_topk += distro__cuda_elapsed(o->ev[EV_FORWARD], o->ev[EV_SELECTED]);
    if (applies) s->seconds_decode += distro__cuda_elapsed(o->ev[EV_UPLOADED], o->ev[EV_DONE]);
  }
  return DISTRO_OK;
}

distro_status distro_cuda_optim_flush(distro_cuda_optim *o, distro_step_stats *stats) {
  DISTRO__NONNULL("distro_cuda_optim_flush", o);
  const double t0 = distro__now();
  distro_step_stats s;
  memset(&s, 0, sizeof s);
  if (o->broken) return distro__fail(DISTRO_ERR_CUDA, "distro_cuda_optim_flush: an earlier step failed on the device");
  if (distro__overlap_pending(o->host)) {
    const distro__overlap_ext_ops ops = ov_ops(o);
    distro_status st = distro__overlap_ext_flush(o->host, &ops, &s);
    if (st != DISTRO_OK) return st;
  }
  s.step = o->host->step;
  s.seconds_total = distro__now() - t0;
  if (stats) *stats = s;
  return DISTRO_OK;
}

distro_status distro_cuda_optim_step(distro_cuda_optim *o, float lr, distro_step_stats *stats) {
  distro_status st;
  if (!o) return distro__fail(DISTRO_ERR_INVALID, "distro_cuda_optim_step: optimizer is NULL");
  if (!(isfinite(lr) && lr >= 0))
    return distro__fail(DISTRO_ERR_INVALID, "distro_optim_step: lr %g must be finite and >= 0", (double)lr);
  distro_optim *h = o->host;
  double t0 = distro__now();
  distro_step_stats s;
  memset(&s, 0, sizeof s);
  /* As the CPU step: a local preparation failure reaches the other ranks
   * through the first step's signature round. */
  st = distro__cuda_optim_prepare(o);
  if (!h->verified) {
    char why[512] = "";
    if (st != DISTRO_OK) snprintf(why, sizeof why, "%s", distro_last_error());
    distro_status vst = distro__optim_verify(h, st == DISTRO_OK);
    if (st != DISTRO_OK) return distro__fail(st, "%s", why);
    if (vst != DISTRO_OK) return vst;
  } else if (st != DISTRO_OK) {
    return st;
  }
  /* Overlap: the private comm of the background exchanges, once the ranks
   * agree that all of them overlap (a comm without dup is refused here). */
  if (h->ov && (st = distro__overlap_attach(h)) != DISTRO_OK) return st;
  if (o->broken) { /* still join the collective, so that the other ranks fail too */
    distro__fail(DISTRO_ERR_CUDA, "an earlier step failed on the device after its exchange; this optimizer's device "
                                  "state is undefined (load a saved state into a new optimizer)");
    if (h->ov) return distro__overlap_ext_fail(h, DISTRO_ERR_CUDA);
    return h->opt.algorithm == DISTRO_ALG_DEMO ? demo_join_failed(o, DISTRO_ERR_CUDA, &s)
                                               : distro__cuda_adamw_join_failed(o, DISTRO_ERR_CUDA);
  }
  const distro__ramp ramp = h->ramp; /* restored if the step fails */
  distro__ramp_observe(&h->ramp, lr);
  if (h->ov) {
    st = overlap_step(o, lr, &s, stats != NULL); /* counts its own steps */
  } else {
    st = h->opt.algorithm == DISTRO_ALG_DEMO ? demo_step(o, lr, &s, stats != NULL)
                                             : distro__cuda_adamw_step(o, lr, &s, stats != NULL);
    if (st == DISTRO_OK) h->step++;
  }
  if (st != DISTRO_OK) {
    h->ramp = ramp;
    return st;
  }
  s.step = h->step;
  s.seconds_total = distro__now() - t0;
  if (stats) *stats = s;
  return DISTRO_OK;
}
