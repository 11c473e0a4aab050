/* The NCCL communicator (one rank: NCCL does not put two ranks on one GPU):
 * collectives on host and device buffers, and the CUDA optimizer (DeMo and
 * the AdamW all-reduce baseline) over it gives the same bits as over an
 * in-process comm. */
#include <stdint.h>
#include <string.h>

#include <nccl.h>

#include <distro/cuda.h>
#include <distro/distro.h>

#include "testutil.h"

#include "cuda_test.h"

static void steps(distro_comm *comm, cudaStream_t s, distro_algorithm alg, distro_overlap ov, float *out,
                  int64_t n) {
  tu_rng r = {ct_seed_used};
  float *h = malloc(sizeof(float) * n), *dp, *dg;
  int64_t shape[2] = {64, n / 64};
  CT_CUDA(cudaMalloc((void **)&dp, sizeof(float) * n));
  CT_CUDA(cudaMalloc((void **)&dg, sizeof(float) * n));
  tu_fill_normal(&r, h, (size_t)n, 1.0f);
  CT_CUDA(cudaMemcpy(dp, h, sizeof(float) * n, cudaMemcpyHostToDevice));
  distro_options o = distro_options_default(alg);
  o.overlap = ov;
  distro_cuda_optim *opt = NULL;
  CT_CHECK(distro_cuda_optim_create(&o, comm, s, &opt) == DISTRO_OK, "create");
  CT_CHECK(distro_cuda_optim_add_param(opt, "w", dp, dg, 2, shape) == DISTRO_OK, "add");
  for (int k = 0; k < 3; k++) {
    tu_fill_normal(&r, h, (size_t)n, 1.0f);
    CT_CUDA(cudaMemcpyAsync(dg, h, sizeof(float) * n, cudaMemcpyHostToDevice, s));
    distro_status st = distro_cuda_optim_step(opt, 0.01f, NULL);
    CT_CHECK(st == DISTRO_OK, "step %d: %s", k, distro_last_error());
  }
  CT_CHECK(distro_cuda_optim_flush(opt, NULL) == DISTRO_OK, "flush: %s", distro_last_error());
  CT_CUDA(cudaStreamSynchronize(s));
  CT_CUDA(cudaMemcpy(out, dp, sizeof(float) * n, cudaMemcpyDeviceToHost));
  distro_cuda_optim_free(opt);
  cudaFree(dp);
  cudaFree(dg);
  free(h);
}

int main(void) {
  ct_require_gpu("test_cuda_nccl");
  ct_seed_used = tu_seed();
  ncclComm_t nccl;
  int dev = 0;
  ncclResult_t nr = ncclCommInitAll(&nccl, 1, &dev);
  if (nr != ncclSuccess) {
    fprintf(stderr, "FAIL: ncclCommInitAll: %s\n", ncclGetErrorString(nr));
    return 1;
  }
  cudaStream_t s;
  CT_CUDA(cudaStreamCreate(&s));
  distro_comm *c = NULL;
  CT_CHECK(distro_comm_nccl(nccl, s, &c) == DISTRO_OK, "comm: %s", distro_last_error());
  CT_CHECK(distro_comm_rank(c) == 0 && distro_comm_size(c) == 1, "rank/size");
  /* host buffers */
  char send[13] = "hello, nccl!", recv[13] = {0};
  CT_CHECK(distro_comm_allgather(c, send, sizeof send, recv) == DISTRO_OK && !memcmp(send, recv, sizeof send),
           "host allgather");
  float x[5] = {1, 2, 3, 4, 5};
  CT_CHECK(distro_comm_allreduce_sum(c, x, 5) == DISTRO_OK && x[4] == 5.0f, "host allreduce");
  CT_CHECK(distro_comm_barrier(c) == DISTRO_OK, "barrier");
  /* device buffers */
  float *d;
  CT_CUDA(cudaMalloc((void **)&d, sizeof x * 2));
  CT_CUDA(cudaMemcpy(d, x, sizeof x, cudaMemcpyHostToDevice));
  CT_CHECK(distro_comm_allgather(c, d, sizeof x, d + 5) == DISTRO_OK, "device allgather");
  CT_CHECK(distro_comm_allreduce_sum(c, d, 10) == DISTRO_OK, "device allreduce");
  float y[10];
  CT_CUDA(cudaMemcpy(y, d, sizeof y, cudaMemcpyDeviceToHost));
  CT_CHECK(!memcmp(y, x, sizeof x) && !memcmp(y + 5, x, sizeof x), "device results");
  cudaFree(d);
  /* the optimizer over NCCL vs over an in-process comm (wire v2: allgatherv) */
  const int64_t n = 64 * 96;
  float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
  distro_comm *local = NULL;
  distro_comm_local_group(1, &local);
  /* DeMo, and the AdamW baseline (its all-reduce on the device buffer) */
  const distro_algorithm algs[2] = {DISTRO_ALG_DEMO, DISTRO_ALG_ADAMW};
  for (int k = 0; k < 2; k++) {
    steps(c, s, algs[k], DISTRO_OVERLAP_OFF, a, n);
    steps(local, s, algs[k], DISTRO_OVERLAP_OFF, b, n);
    CT_CHECK(!memcmp(a, b, sizeof(float) * n), "%s: NCCL and local comms gave different parameters",
             k ? "AdamW baseline" : "DeMo");
  }
  /* both overlap modes: the background exchange on a split NCCL comm and a
   * stream of its own, against the same over an in-process comm */
  const distro_overlap ovs[2] = {DISTRO_OVERLAP_STALE, DISTRO_OVERLAP_LOOKAHEAD};
  for (int k = 0; k < 2; k++) {
    steps(c, s, DISTRO_ALG_DEMO, ovs[k], a, n);
    steps(local, s, DISTRO_ALG_DEMO, ovs[k], b, n);
    CT_CHECK(!memcmp(a, b, sizeof(float) * n), "overlap %d: NCCL and local comms gave different parameters",
             (int)ovs[k]);
  }
  distro_comm_free(local);
  distro_comm_free(c);
  ncclCommDestroy(nccl);
  cudaStreamDestroy(s);
  free(a);
  free(b);
  return ct_finish("test_cuda_nccl");
}
