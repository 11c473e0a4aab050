/* The AdamW all-reduce baseline on the GPU (include/distro/cuda.h): the
 * same step as the CPU's distro__adamw_step, behind the GPU optimizer's
 * object (optim_state.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "comm/comm_internal.h"
#include "cuda/cuda_internal.h"
#include "cuda/optim_state.h"
#include "optim/optim_internal.h"

/* The baseline's flag slot: 1 per rank with a non-finite gradient, this
 * much per rank that failed locally (exact in float below 2^24). */
#define LOCAL_FAULT_FLAG 65536.0f

/* A local failure before the all-reduce: join it from host memory with a
 * zero gradient and the fault flag, so every rank fails this step. */
distro_status distro__cuda_adamw_join_failed(distro_cuda_optim *o, distro_status why) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", distro_last_error());
  const int64_t n = o->host->total_numel;
  float *buf = calloc((size_t)n + 1, sizeof *buf);
  const int have = buf != NULL;
  if (have) {
    buf[n] = LOCAL_FAULT_FLAG;
    (void)o->host->comm->ops->allreduce_sum(o->host->comm, buf, (size_t)n + 1);
    free(buf);
  }
  return distro__fail(why, "%s%s", msg, have ? "" : " (and no memory to join the all-reduce: other ranks may wait)");
}

/* The AdamW all-reduce baseline, as distro__adamw_step: flatten the
 * gradients with a flag slot (1 when this rank's gradient is not finite), one
 * all-reduce (NCCL on the device buffer; a CPU comm through pinned host
 * memory), fail on every rank when any flag is set or the sum overflowed,
 * else the AdamW kernel on sum/world. Nothing changes before the checks. */
distro_status distro__cuda_adamw_step(distro_cuda_optim *o, float lr, distro_step_stats *s, int want_stats) {
  distro_status st = DISTRO_OK;
  distro_optim *h = o->host;
  distro_comm *comm = h->comm;
  cudaStream_t S = o->stream;
  const int world = comm->size, np = h->nparams;
  const int64_t n = h->total_numel;
  const size_t flat = sizeof(float) * (size_t)(n + 1);
  float flag = 0;
  int joined = 0; /* past the all-reduce: a failure no longer leaves a peer waiting */

  DISTRO_CUDA_TRY(cudaEventRecord(o->ev[EV_START], S));
  DISTRO_CUDA_TRY(cudaMemsetAsync(o->d_flags, 0, sizeof(int) * (size_t)(np + 1), S));
  int64_t off = 0;
  for (int i = 0; i < np; i++) {
    const int64_t ni = h->params[i].numel;
    DISTRO_CUDA_TRY(distro__cuda_nonfinite(S, o->params[i].grad, ni, o->d_flags, i));
    DISTRO_CUDA_TRY(cudaMemcpyAsync(o->d_flat + off, o->params[i].grad, sizeof(float) * (size_t)ni,
                                    cudaMemcpyDeviceToDevice, S));
    off += ni;
  }
  DISTRO_CUDA_TRY(distro__cuda_flag_slot(S, o->d_flags, np, o->d_flat + n));
  DISTRO_CUDA_TRY(cudaMemcpyAsync(o->h_flags, o->d_flags, sizeof(int) * (size_t)np, cudaMemcpyDeviceToHost, S));
  if (!o->nccl) DISTRO_CUDA_TRY(cudaMemcpyAsync(o->h_flat, o->d_flat, flat, cudaMemcpyDeviceToHost, S));
  DISTRO_CUDA_TRY(cudaEventRecord(o->ev[EV_FORWARD], S));
  DISTRO_CUDA_TRY(cudaStreamSynchronize(S));

  double t0 = distro__now();
  joined = 1;
  if (o->nccl) {
    DISTRO_CHECK(comm->ops->allreduce_sum(comm, o->d_flat, (size_t)n + 1)); /* waits for the comm's stream */
  } else {
    DISTRO_CHECK(comm->ops->allreduce_sum(comm, o->h_flat, (size_t)n + 1));
    DISTRO_CUDA_TRY(cudaMemcpyAsync(o->d_flat, o->h_flat, flat, cudaMemcpyHostToDevice, S));
  }
  s->seconds_exchange += distro__now() - t0;
  uint64_t ring = world > 1 ? (uint64_t)(2.0 * (double)(world - 1) / (double)world * 4.0 * (double)n) : 0;
  s->bytes_sent = s->bytes_received = ring;
  if (o->nccl) {
    DISTRO_CUDA_TRY(cudaMemcpyAsync(&flag, o->d_flat + n, sizeof flag, cudaMemcpyDeviceToHost, S));
    DISTRO_CUDA_TRY(cudaStreamSynchronize(S));
  } else {
    flag = o->h_flat[n];
  }
  if (flag >= LOCAL_FAULT_FLAG)
    DISTRO_FAIL(DISTRO_ERR_COMM, "%d rank(s) failed locally (CUDA) before the all-reduce; nothing was applied",
                (int)(flag / LOCAL_FAULT_FLAG));
  if (flag != 0.0f) {
    int bad = -1;
    for (int i = 0; i < np && bad < 0; i++)
      if (o->h_flags[i]) bad = i;
    if (bad >= 0)
      DISTRO_FAIL(DISTRO_ERR_NONFINITE, "non-finite gradient in tensor '%s'; nothing was applied",
                  h->params[bad].name);
    DISTRO_FAIL(DISTRO_ERR_NONFINITE, "%g rank(s) reported a non-finite gradient; nothing was applied",
                (double)flag);
  }
  /* The sum is the same on every rank, so so is this verdict. */
  DISTRO_CUDA_TRY(distro__cuda_nonfinite(S, o->d_flat, n, o->d_flags, np));
  DISTRO_CUDA_TRY(cudaMemcpyAsync(o->h_flags + np, o->d_flags + np, sizeof(int), cudaMemcpyDeviceToHost, S));
  DISTRO_CUDA_TRY(cudaStreamSynchronize(S));
  if (o->h_flags[np]) DISTRO_FAIL(DISTRO_ERR_NONFINITE, "the summed gradient overflowed; nothing was applied");

  DISTRO_CUDA_TRY(cudaEventRecord(o->ev[EV_UPLOADED], S));
  const float shrink = 1.0f - lr * h->opt.weight_decay;
  const int64_t t = h->step + 1;
  const float c1 = (float)(1.0 - pow((double)h->opt.beta1, (double)t));
  const float c2 = (float)(1.0 - pow((double)h->opt.beta2, (double)t));
  off = 0;
  for (int i = 0; i < np; i++) {
    cuda_param *p = &o->params[i];
    const int64_t ni = h->params[i].numel;
    DISTRO_CUDA_TRY(distro__cuda_adamw_update(S, p->param, p->m, p->v, o->d_flat + off, ni, 1.0f / (float)world,
                                              h->opt.beta1, h->opt.beta2, h->opt.eps, lr, shrink, c1, c2));
    if (p->bf16) DISTRO_CUDA_TRY(distro__cuda_to_bf16(S, p->param, p->bf16, ni));
    off += ni;
  }
  DISTRO_CUDA_TRY(cudaEventRecord(o->ev[EV_DONE], S));
  /* An error of the update kernels is this step's. */
  if (cudaStreamSynchronize(S) != cudaSuccess || cudaGetLastError() != cudaSuccess) {
    o->broken = 1;
    DISTRO_FAIL(DISTRO_ERR_CUDA, "the AdamW update failed on the device: %s; the parameters and moments are undefined",
                cudaGetErrorString(cudaGetLastError()));
  }
  if (want_stats) {
    s->seconds_transform += distro__cuda_elapsed(o->ev[EV_START], o->ev[EV_FORWARD]); /* flatten + checks */
    s->seconds_decode += distro__cuda_elapsed(o->ev[EV_UPLOADED], o->ev[EV_DONE]);    /* the update */
  }
  return DISTRO_OK;
fail:
  if (!joined && st == DISTRO_ERR_CUDA) return distro__cuda_adamw_join_failed(o, st);
  return st;
}
