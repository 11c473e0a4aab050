/* NCCL communicator. Collectives run on the comm's stream and return when
 * they have finished (the ops table is blocking). Host buffers are staged
 * through one device buffer that grows as needed; device buffers are passed
 * to NCCL as they are. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef DISTRO_WITH_MPI
#include <mpi.h>
#endif
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <distro/cuda.h>

#include "comm/comm_internal.h"
#include "cuda/cuda_internal.h"

typedef struct {
  ncclComm_t nccl;
  cudaStream_t stream;
  int device;    /* the CUDA device the comm was made on: every call selects it, since a
                    duplicate runs on the overlap's helper thread */
  int owns;      /* destroy `nccl` with the comm (MPI helper, duplicates) */
  int owns_stream;
  void *stage;   /* device staging buffer */
  size_t cap;
} nccl_impl;

#define NCCL_TRY(call)                                                                                 \
  do {                                                                                                 \
    ncclResult_t r_ = (call);                                                                          \
    if (r_ != ncclSuccess) {                                                                           \
      st = distro__fail(DISTRO_ERR_COMM, "%s failed: %s", #call, ncclGetErrorString(r_));              \
      goto fail;                                                                                       \
    }                                                                                                  \
  } while (0)

static int on_device(const void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static distro_status stage(nccl_impl *m, size_t bytes, void **out) {
  distro_status st = DISTRO_OK;
  if (bytes > m->cap) {
    DISTRO_CUDA_TRY(cudaFree(m->stage));
    m->stage = NULL;
    m->cap = 0;
    DISTRO_CUDA_TRY(cudaMalloc(&m->stage, bytes));
    m->cap = bytes;
  }
  *out = m->stage;
fail:
  return st;
}

/* The comm's device on the calling thread (the overlap's helper thread
 * starts on device 0). */
static distro_status select_device(const nccl_impl *m) {
  if (cudaSetDevice(m->device) != cudaSuccess)
    return distro__fail(DISTRO_ERR_CUDA, "NCCL comm: cudaSetDevice(%d): %s", m->device,
                        cudaGetErrorString(cudaGetLastError()));
  return DISTRO_OK;
}

static distro_status nccl_allgather(distro_comm *c, const void *send, size_t bytes, void *recv) {
  distro_status st = DISTRO_OK;
  nccl_impl *m = c->impl;
  const size_t all = bytes * (size_t)c->size;
  if (bytes == 0) return DISTRO_OK;
  DISTRO_CHECK(select_device(m));
  if (on_device(send) && on_device(recv)) {
    NCCL_TRY(ncclAllGather(send, recv, bytes, ncclUint8, m->nccl, m->stream));
  } else {
    uint8_t *d;
    DISTRO_CHECK(stage(m, all + bytes, (void **)&d));
    DISTRO_CUDA_TRY(cudaMemcpyAsync(d + all, send, bytes, cudaMemcpyDefault, m->stream));
    NCCL_TRY(ncclAllGather(d + all, d, bytes, ncclUint8, m->nccl, m->stream));
    DISTRO_CUDA_TRY(cudaMemcpyAsync(recv, d, all, cudaMemcpyDefault, m->stream));
  }
  DISTRO_CUDA_TRY(cudaStreamSynchronize(m->stream));
fail:
  return st;
}

/* Sizes first, then every payload padded to `slot` bytes. */
static distro_status nccl_allgatherv(distro_comm *c, const void *send, size_t bytes, void *recv, size_t slot,
                                     size_t *sizes) {
  distro_status st = DISTRO_OK;
  nccl_impl *m = c->impl;
  const int W = c->size;
  uint64_t *all = malloc(sizeof(uint64_t) * (size_t)(W + 1));
  uint8_t *d;
  if (!all) return distro__fail(DISTRO_ERR_NOMEM, "NCCL allgatherv: out of memory");
  if (bytes > slot) DISTRO_FAIL(DISTRO_ERR_INVALID, "NCCL allgatherv: %zu bytes exceed the %zu-byte slot", bytes, slot);
  all[W] = bytes;
  DISTRO_CHECK(nccl_allgather(c, &all[W], sizeof(uint64_t), all));
  for (int r = 0; r < W; r++) {
    if (all[r] > slot)
      DISTRO_FAIL(DISTRO_ERR_COMM, "NCCL allgatherv: rank %d sent %llu bytes, more than the %zu-byte slot", r,
                  (unsigned long long)all[r], slot);
    sizes[r] = (size_t)all[r];
  }
  if (slot == 0) goto fail; /* nothing to move; st is OK */
  DISTRO_CHECK(stage(m, slot * (size_t)(W + 1), (void **)&d));
  uint8_t *mine = d + slot * (size_t)W;
  DISTRO_CUDA_TRY(cudaMemsetAsync(mine + bytes, 0, slot - bytes, m->stream));
  if (bytes) DISTRO_CUDA_TRY(cudaMemcpyAsync(mine, send, bytes, cudaMemcpyDefault, m->stream));
  NCCL_TRY(ncclAllGather(mine, d, slot, ncclUint8, m->nccl, m->stream));
  for (int r = 0; r < W; r++)
    if (sizes[r])
      DISTRO_CUDA_TRY(cudaMemcpyAsync((uint8_t *)recv + (size_t)r * slot, d + (size_t)r * slot, sizes[r], cudaMemcpyDefault,
                               m->stream));
  DISTRO_CUDA_TRY(cudaStreamSynchronize(m->stream));
fail:
  free(all);
  return st;
}

static distro_status nccl_allreduce(distro_comm *c, float *buf, size_t count) {
  distro_status st = DISTRO_OK;
  nccl_impl *m = c->impl;
  if (count == 0) return DISTRO_OK;
  DISTRO_CHECK(select_device(m));
  if (on_device(buf)) {
    NCCL_TRY(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, m->nccl, m->stream));
  } else {
    float *d;
    DISTRO_CHECK(stage(m, sizeof(float) * count, (void **)&d));
    DISTRO_CUDA_TRY(cudaMemcpyAsync(d, buf, sizeof(float) * count, cudaMemcpyDefault, m->stream));
    NCCL_TRY(ncclAllReduce(d, d, count, ncclFloat32, ncclSum, m->nccl, m->stream));
    DISTRO_CUDA_TRY(cudaMemcpyAsync(buf, d, sizeof(float) * count, cudaMemcpyDefault, m->stream));
  }
  DISTRO_CUDA_TRY(cudaStreamSynchronize(m->stream));
fail:
  return st;
}

static distro_status nccl_barrier(distro_comm *c) {
  float one = 1.0f;
  return nccl_allreduce(c, &one, 1);
}

static void nccl_destroy(distro_comm *c) {
  nccl_impl *m = c->impl;
  if (!m) return;
  (void)select_device(m);
  cudaFree(m->stage);
  if (m->owns) ncclCommDestroy(m->nccl);
  if (m->owns_stream) cudaStreamDestroy(m->stream);
  free(m);
  c->impl = NULL;
}

/* For options.overlap: a communicator of the same ranks (ncclCommSplit,
 * collective) on a stream of its own, so the background exchange neither
 * meets the caller's collectives nor queues behind the step's kernels. */
static distro_status nccl_dup(distro_comm *c, distro_comm **out) {
  distro_status st = DISTRO_OK;
  nccl_impl *m = c->impl;
  ncclComm_t nc = NULL;
  cudaStream_t s = NULL;
  *out = NULL;
  DISTRO_CHECK(select_device(m));
  NCCL_TRY(ncclCommSplit(m->nccl, 0, c->rank, &nc, NULL));
  DISTRO_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  DISTRO_CHECK(distro_comm_nccl(nc, s, out));
  ((nccl_impl *)(*out)->impl)->owns = 1;
  ((nccl_impl *)(*out)->impl)->owns_stream = 1;
  return DISTRO_OK;
fail:
  if (s) cudaStreamDestroy(s);
  if (nc) ncclCommDestroy(nc);
  return st;
}

static const distro__comm_ops nccl_ops = {
    .name = "nccl",
    .allgather = nccl_allgather,
    .allgatherv = nccl_allgatherv,
    .allreduce_sum = nccl_allreduce,
    .barrier = nccl_barrier,
    .dup = nccl_dup,
    .destroy = nccl_destroy,
};

distro_status distro_comm_nccl(ncclComm_t nccl, cudaStream_t stream, distro_comm **out) {
  distro_status st = DISTRO_OK;
  distro_comm *c = NULL;
  nccl_impl *m = NULL;
  int rank = 0, size = 0;
  if (!out) return distro__fail(DISTRO_ERR_INVALID, "distro_comm_nccl: out is NULL");
  *out = NULL;
  if (!nccl) return distro__fail(DISTRO_ERR_INVALID, "distro_comm_nccl: NCCL communicator is NULL");
  NCCL_TRY(ncclCommUserRank(nccl, &rank));
  NCCL_TRY(ncclCommCount(nccl, &size));
  c = calloc(1, sizeof *c);
  m = calloc(1, sizeof *m);
  if (!c || !m) DISTRO_FAIL(DISTRO_ERR_NOMEM, "distro_comm_nccl: out of memory");
  m->nccl = nccl;
  m->stream = stream;
  if (cudaGetDevice(&m->device) != cudaSuccess) DISTRO_FAIL(DISTRO_ERR_CUDA, "distro_comm_nccl: cudaGetDevice failed");
  c->ops = &nccl_ops;
  c->rank = rank;
  c->size = size;
  c->impl = m;
  c->gatherv_pads = 1;
  *out = c;
  return DISTRO_OK;
fail:
  free(c);
  free(m);
  return st;
}

#ifdef DISTRO_WITH_MPI
distro_status distro_comm_nccl_mpi(MPI_Comm mpi, cudaStream_t stream, distro_comm **out) {
  distro_status st = DISTRO_OK;
  struct {
    int ok;
    ncclUniqueId id;
  } msg;
  ncclComm_t nccl = NULL;
  int rank = 0, size = 0, init = 0;
  if (!out) return distro__fail(DISTRO_ERR_INVALID, "distro_comm_nccl_mpi: out is NULL");
  *out = NULL;
  if (MPI_Initialized(&init) != MPI_SUCCESS || !init)
    return distro__fail(DISTRO_ERR_INVALID, "distro_comm_nccl_mpi: MPI is not initialized");
  if (MPI_Comm_rank(mpi, &rank) != MPI_SUCCESS || MPI_Comm_size(mpi, &size) != MPI_SUCCESS)
    return distro__fail(DISTRO_ERR_COMM, "distro_comm_nccl_mpi: MPI_Comm_rank/size failed");
  /* Rank 0 always broadcasts, so a failed id reaches every rank. */
  memset(&msg, 0, sizeof msg);
  ncclResult_t idr = ncclSuccess;
  if (rank == 0) {
    idr = ncclGetUniqueId(&msg.id);
    msg.ok = idr == ncclSuccess;
  }
  if (MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, mpi) != MPI_SUCCESS)
    return distro__fail(DISTRO_ERR_COMM, "distro_comm_nccl_mpi: MPI_Bcast of the NCCL id failed");
  if (!msg.ok)
    return distro__fail(DISTRO_ERR_COMM, "distro_comm_nccl_mpi: ncclGetUniqueId failed on rank 0%s%s",
                        rank == 0 ? ": " : "", rank == 0 ? ncclGetErrorString(idr) : "");
  NCCL_TRY(ncclCommInitRank(&nccl, size, msg.id, rank));
  DISTRO_CHECK(distro_comm_nccl(nccl, stream, out));
  ((nccl_impl *)(*out)->impl)->owns = 1;
  return DISTRO_OK;
fail:
  if (nccl) ncclCommDestroy(nccl);
  return st;
}
#endif
