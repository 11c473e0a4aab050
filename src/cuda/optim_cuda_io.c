/* The GPU optimizer's state files (include/distro/cuda.h): the CPU
 * optimizer's file format, written and read through the host optimizer,
 * with the device arrays copied through host buffers. */
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include <distro/cuda.h>

#include "common/error.h"
#include "cuda/cuda_internal.h"
#include "cuda/optim_state.h"
#include "optim/optim_internal.h"

/* The state arrays of a tensor, device and host, in the order of the state
 * file (distro__state_arrays). */
static int state_arrays(const distro_options *opt, cuda_param *p, distro__param *hp, float **dev[3], float **host[3]) {
  distro__state_array kinds[3];
  const int n = distro__state_arrays(opt, kinds);
  for (int a = 0; a < n; a++) {
    dev[a] = kinds[a] == DISTRO__STATE_MOM ? &p->mom : kinds[a] == DISTRO__STATE_M ? &p->m : &p->v;
    host[a] = kinds[a] == DISTRO__STATE_MOM ? &hp->mom : kinds[a] == DISTRO__STATE_M ? &hp->m : &hp->v;
  }
  return n;
}

/* The host optimizer's state slots are never used on the GPU path; save and
 * load point them at host copies for the CPU's file code and empty them
 * again. */
static void drop_host_arrays(distro_cuda_optim *o) {
  distro_optim *h = o->host;
  for (int i = 0; i < h->nparams; i++) {
    float **dev[3], **host[3];
    const int na = state_arrays(&h->opt, &o->params[i], &h->params[i], dev, host);
    for (int a = 0; a < na; a++) {
      free(*host[a]);
      *host[a] = NULL;
    }
  }
}

distro_status distro_cuda_optim_save(const distro_cuda_optim *co, const char *path) {
  distro_status st = DISTRO_OK;
  DISTRO__NONNULL("distro_cuda_optim_save", co);
  DISTRO__NONNULL("distro_cuda_optim_save", path);
  if (distro__overlap_pending(((const distro_cuda_optim *)co)->host))
    return distro__fail(DISTRO_ERR_INVALID, "distro_cuda_optim_save: an exchange is in flight (options.overlap); call "
                                            "distro_cuda_optim_flush first");
  if (!*path) return distro__fail(DISTRO_ERR_INVALID, "distro_cuda_optim_save: argument 'path' is empty");
  distro_cuda_optim *o = (distro_cuda_optim *)co; /* prepare allocates lazily; no observable change */
  distro_optim *h = o->host;
  DISTRO_CHECK(distro__cuda_optim_prepare(o));
  for (int i = 0; i < h->nparams; i++) {
    float **dev[3], **host[3];
    const int na = state_arrays(&h->opt, &o->params[i], &h->params[i], dev, host);
    const size_t bytes = sizeof(float) * (size_t)h->params[i].numel;
    for (int a = 0; a < na; a++) {
      *host[a] = malloc(bytes ? bytes : 1);
      if (!*host[a]) DISTRO_FAIL(DISTRO_ERR_NOMEM, "distro_cuda_optim_save: out of memory for '%s'", h->params[i].name);
      /* After whatever the stream still runs (the last update). */
      DISTRO_CUDA_TRY(cudaMemcpyAsync(*host[a], *dev[a], bytes, cudaMemcpyDeviceToHost, o->stream));
    }
  }
  DISTRO_CUDA_TRY(cudaStreamSynchronize(o->stream));
  st = distro_optim_save(h, path); /* the CPU file format, written atomically */
fail:
  drop_host_arrays(o);
  return st;
}

distro_status distro_cuda_optim_load(distro_cuda_optim *o, const char *path) {
  distro_status st = DISTRO_OK;
  float **fresh = NULL;
  int nfresh = 0;
  DISTRO__NONNULL("distro_cuda_optim_load", o);
  DISTRO__NONNULL("distro_cuda_optim_load", path);
  if (distro__overlap_pending(((distro_cuda_optim *)o)->host))
    return distro__fail(DISTRO_ERR_INVALID, "distro_cuda_optim_load: an exchange is in flight (options.overlap); call "
                                            "distro_cuda_optim_flush first");
  distro_optim *h = o->host;
  const int64_t old_step = h->step;
  const distro__ramp old_ramp = h->ramp;
  const double old_spread = h->spread;
  DISTRO_CHECK(distro__cuda_optim_prepare(o));
  /* Everything is verified into host arrays first (the CPU loader leaves the
   * host optimizer untouched on failure), then copied into fresh device
   * buffers, which replace the old ones only when all uploads succeeded. */
  DISTRO_CHECK(distro_optim_load(h, path));
  fresh = calloc((size_t)h->nparams * 3, sizeof *fresh);
  if (!fresh) DISTRO_FAIL(DISTRO_ERR_NOMEM, "distro_cuda_optim_load: out of memory");
  for (int i = 0; i < h->nparams; i++) {
    float **dev[3], **host[3];
    const int na = state_arrays(&h->opt, &o->params[i], &h->params[i], dev, host);
    const size_t bytes = sizeof(float) * (size_t)h->params[i].numel;
    for (int a = 0; a < na; a++) {
      DISTRO_CUDA_TRY(cudaMalloc((void **)&fresh[nfresh], bytes ? bytes : 1));
      nfresh++;
      DISTRO_CUDA_TRY(cudaMemcpyAsync(fresh[nfresh - 1], *host[a], bytes, cudaMemcpyHostToDevice, o->stream));
    }
  }
  DISTRO_CUDA_TRY(cudaStreamSynchronize(o->stream));
  for (int i = 0, n = 0; i < h->nparams; i++) {
    float **dev[3], **host[3];
    const int na = state_arrays(&h->opt, &o->params[i], &h->params[i], dev, host);
    for (int a = 0; a < na; a++, n++) {
      cudaFree(*dev[a]);
      *dev[a] = fresh[n];
      fresh[n] = NULL;
    }
  }
  free(fresh);
  drop_host_arrays(o);
  return DISTRO_OK;
fail:
  for (int i = 0; i < nfresh; i++) cudaFree(fresh[i]);
  free(fresh);
  drop_host_arrays(o);
  h->step = old_step;
  h->ramp = old_ramp;
  h->spread = old_spread;
  return st;
}
