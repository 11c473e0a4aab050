/* Bad inputs to the CUDA optimizer and the NCCL comm get the CPU optimizer's
 * errors. None of these calls reaches the GPU, so this test runs everywhere. */
#include <math.h>
#include <string.h>

#include <distro/cuda.h>
#include <distro/distro.h>

#include "cuda_test.h"

static distro_status cpu_create(const distro_options *o, distro_comm *c) {
  distro_optim *x = NULL;
  distro_status st = distro_optim_create(o, c, &x);
  distro_optim_free(x);
  return st;
}

static distro_status gpu_create(const distro_options *o, distro_comm *c) {
  distro_cuda_optim *x = NULL;
  distro_status st = distro_cuda_optim_create(o, c, 0, &x);
  distro_cuda_optim_free(x);
  return st;
}

int main(void) {
  distro_comm *comm = NULL;
  distro_comm_local_group(1, &comm);
  distro_options ok = distro_options_default(DISTRO_ALG_DEMO);

  /* create */
  distro_cuda_optim *o = (distro_cuda_optim *)&ok;
  CT_CHECK(distro_cuda_optim_create(&ok, comm, 0, NULL) == DISTRO_ERR_INVALID, "NULL out");
  CT_CHECK(distro_cuda_optim_create(NULL, comm, 0, &o) == DISTRO_ERR_INVALID && o == NULL, "NULL options");
  CT_CHECK(gpu_create(&ok, NULL) == cpu_create(&ok, NULL), "NULL comm");
  distro_options bad[6];
  for (int i = 0; i < 6; i++) bad[i] = ok;
  bad[0].version = 99;
  bad[1].topk = 0;
  bad[2].chunk = 0;
  bad[3].compression_decay = 1.0f;
  bad[4].values = DISTRO_VALUES_INT8;
  bad[4].wire_version = 1;
  bad[5].lr = NAN;
  for (int i = 0; i < 6; i++) {
    distro_status c = cpu_create(&bad[i], comm);
    char cmsg[512];
    snprintf(cmsg, sizeof cmsg, "%s", distro_last_error());
    distro_status g = gpu_create(&bad[i], comm);
    CT_CHECK(c != DISTRO_OK && g == c, "bad options #%d: cpu %d gpu %d", i, (int)c, (int)g);
    CT_CHECK(strcmp(cmsg, distro_last_error()) == 0, "bad options #%d: '%s' vs '%s'", i, cmsg, distro_last_error());
  }
  distro_options adam = distro_options_default(DISTRO_ALG_ADAMW);
  CT_CHECK(gpu_create(&adam, comm) == DISTRO_OK, "AdamW baseline on the GPU: %s", distro_last_error());
  /* overlap: both modes run on the GPU; look-ahead needs the exact DCT, and
   * the step says so before any device work */
  distro_options ov = ok;
  ov.overlap = DISTRO_OVERLAP_STALE;
  CT_CHECK(gpu_create(&ov, comm) == DISTRO_OK, "stale overlap on the GPU: %s", distro_last_error());
  ov.overlap = DISTRO_OVERLAP_LOOKAHEAD;
  CT_CHECK(gpu_create(&ov, comm) == DISTRO_OK, "look-ahead on the GPU: %s", distro_last_error());
  {
    distro_cuda_optim *la = NULL;
    float d[4];
    const int64_t sh[2] = {2, 2};
    CT_CHECK(distro_cuda_optim_create(&ov, comm, 0, &la) == DISTRO_OK, "create (look-ahead)");
    CT_CHECK(distro_cuda_optim_set_dct(la, DISTRO_CUDA_DCT_GEMM) == DISTRO_OK, "set_dct");
    CT_CHECK(distro_cuda_optim_add_param(la, "w", d, d + 2, 2, sh) == DISTRO_OK, "add_param");
    CT_CHECK(distro_cuda_optim_step(la, 0.1f, NULL) == DISTRO_ERR_UNSUPPORTED &&
                 strstr(distro_last_error(), "LOOKAHEAD") && strstr(distro_last_error(), "DISTRO_CUDA_DCT_EXACT"),
             "look-ahead with cuBLAS: '%s'", distro_last_error());
    distro_cuda_optim_free(la);
  }
  CT_CHECK(distro_cuda_optim_flush(NULL, NULL) == DISTRO_ERR_INVALID, "flush NULL");
  /* The CPU optimizer's only: the gradient-ready exchange and the clip
   * inside the step, refused by name at create. */
  {
    distro_options cpu_only = ok;
    cpu_only.overlap = DISTRO_OVERLAP_BACKWARD;
    CT_CHECK(gpu_create(&cpu_only, comm) == DISTRO_ERR_UNSUPPORTED && strstr(distro_last_error(), "BACKWARD"),
             "BACKWARD on the GPU: '%s'", distro_last_error());
    cpu_only = ok;
    cpu_only.clip_norm = 1.0f;
    CT_CHECK(cpu_create(&cpu_only, comm) == DISTRO_OK, "clip_norm on the CPU: %s", distro_last_error());
    CT_CHECK(gpu_create(&cpu_only, comm) == DISTRO_ERR_UNSUPPORTED && strstr(distro_last_error(), "clip_norm"),
             "clip_norm on the GPU: '%s'", distro_last_error());
  }

  /* add_param: same checks as the CPU optimizer, with dummy pointers (never
   * dereferenced before the first step) */
  distro_optim *cpu = NULL;
  distro_cuda_optim *gpu = NULL;
  CT_CHECK(distro_optim_create(&ok, comm, &cpu) == DISTRO_OK, "cpu create");
  CT_CHECK(distro_cuda_optim_create(&ok, comm, 0, &gpu) == DISTRO_OK, "gpu create");
  float dummy[4];
  int64_t shape[3] = {4, 0, 3}, good[2] = {2, 2};
  struct {
    const char *name;
    float *p;
    int ndim;
    const int64_t *shape;
  } cases[] = {
      {NULL, dummy, 2, good}, {"a", NULL, 2, good}, {"a", dummy, 0, good}, {"a", dummy, 9, good},
      {"a", dummy, 3, shape}, {"", dummy, 2, good}, {"a", dummy, 2, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    distro_status c = distro_optim_add_param(cpu, cases[i].name, cases[i].p, dummy, cases[i].ndim, cases[i].shape);
    distro_status g = distro_cuda_optim_add_param(gpu, cases[i].name, cases[i].p, dummy, cases[i].ndim, cases[i].shape);
    CT_CHECK(c != DISTRO_OK && c == g, "add_param case %zu: cpu %d gpu %d", i, (int)c, (int)g);
  }
  CT_CHECK(distro_cuda_optim_add_param(NULL, "a", dummy, dummy, 2, good) == DISTRO_ERR_INVALID, "NULL optimizer");
  CT_CHECK(distro_cuda_optim_add_param_bf16(gpu, "a", NULL, dummy, dummy, 2, good) == DISTRO_ERR_INVALID, "NULL bf16");
  CT_CHECK(distro_cuda_optim_add_param(gpu, "a", dummy, dummy, 2, good) == DISTRO_OK, "first add");
  CT_CHECK(distro_optim_add_param(cpu, "a", dummy, dummy, 2, good) == DISTRO_OK, "first add (cpu)");
  distro_status c = distro_optim_add_param(cpu, "a", dummy, dummy, 2, good);
  distro_status g = distro_cuda_optim_add_param(gpu, "a", dummy, dummy, 2, good);
  CT_CHECK(c == DISTRO_ERR_INVALID && g == c, "duplicate name: cpu %d gpu %d", (int)c, (int)g);

  /* DCT method: before the state exists only */
  CT_CHECK(distro_cuda_optim_set_dct(NULL, DISTRO_CUDA_DCT_FFT) == DISTRO_ERR_INVALID, "set_dct: NULL");
  CT_CHECK(distro_cuda_optim_set_dct(gpu, (distro_cuda_dct)7) == DISTRO_ERR_INVALID, "set_dct: bad method");
  CT_CHECK(distro_cuda_optim_set_dct(gpu, DISTRO_CUDA_DCT_AUTO) == DISTRO_OK, "set_dct auto: %s", distro_last_error());
  CT_CHECK(distro_cuda_optim_set_dct(gpu, DISTRO_CUDA_DCT_GEMM) == DISTRO_OK, "set_dct gemm: %s", distro_last_error());
  CT_CHECK(distro_cuda_optim_set_dct(gpu, DISTRO_CUDA_DCT_EXACT) == DISTRO_OK, "set_dct exact: %s", distro_last_error());

  /* A NULL gradient: accepted at add_param (lazily allocated gradients, as
   * the CPU optimizer), refused by the step before any device work (so this
   * runs without a GPU), until set_grad hands one over; set_grad has the CPU
   * optimizer's checks. */
  {
    distro_cuda_optim *lazy = NULL;
    distro_optim *lazy_cpu = NULL;
    float g1[4], g2[4], pw[4], pb[4];
    CT_CHECK(distro_cuda_optim_create(&ok, comm, 0, &lazy) == DISTRO_OK, "create (lazy)");
    CT_CHECK(distro_optim_create(&ok, comm, &lazy_cpu) == DISTRO_OK, "create (lazy cpu)");
    CT_CHECK(distro_cuda_optim_add_param(lazy, "w", pw, NULL, 2, good) == DISTRO_OK, "NULL grad at add_param: %s",
             distro_last_error());
    CT_CHECK(distro_cuda_optim_add_param(lazy, "b", pb, g2, 2, good) == DISTRO_OK, "add b");
    CT_CHECK(distro_cuda_optim_step(lazy, 0.1f, NULL) == DISTRO_ERR_INVALID, "step with a NULL grad: want INVALID");
    CT_CHECK(strstr(distro_last_error(), "'w'") && strstr(distro_last_error(), "distro_cuda_optim_set_grad"),
             "the error names the tensor and set_grad: '%s'", distro_last_error());
    CT_CHECK(distro_optim_add_param(lazy_cpu, "w", pw, NULL, 2, good) == DISTRO_OK, "cpu add");
    CT_CHECK(distro_optim_add_param(lazy_cpu, "b", pb, g2, 2, good) == DISTRO_OK, "cpu add b");
    struct {
      distro_cuda_optim *o;
      const char *name;
      const float *grad;
    } sg[] = {{NULL, "w", g1}, {lazy, NULL, g1}, {lazy, "w", NULL}, {lazy, "nope", g1}, {lazy, "w", g2 + 1}};
    for (size_t i = 0; i < sizeof sg / sizeof sg[0]; i++) {
      distro_status gs = distro_cuda_optim_set_grad(sg[i].o, sg[i].name, sg[i].grad);
      char gmsg[512];
      snprintf(gmsg, sizeof gmsg, "%s", distro_last_error());
      distro_status cs = sg[i].o ? distro_optim_set_grad(lazy_cpu, sg[i].name, sg[i].grad) : DISTRO_ERR_INVALID;
      CT_CHECK(gs == DISTRO_ERR_INVALID && cs == gs, "set_grad case %zu: gpu %d cpu %d (%s)", i, (int)gs, (int)cs,
               gmsg);
    }
    CT_CHECK(distro_cuda_optim_set_grad(lazy, "w", g1) == DISTRO_OK, "set_grad: %s", distro_last_error());
    distro_cuda_optim_free(lazy);
    distro_optim_free(lazy_cpu);
  }

  /* save / load: argument checks */
  CT_CHECK(distro_cuda_optim_save(NULL, "x") == DISTRO_ERR_INVALID, "save: NULL optimizer");
  CT_CHECK(distro_cuda_optim_save(gpu, NULL) == DISTRO_ERR_INVALID, "save: NULL path");
  CT_CHECK(distro_cuda_optim_save(gpu, "") == DISTRO_ERR_INVALID, "save: empty path");
  CT_CHECK(distro_cuda_optim_load(NULL, "x") == DISTRO_ERR_INVALID, "load: NULL optimizer");
  CT_CHECK(distro_cuda_optim_load(gpu, NULL) == DISTRO_ERR_INVALID, "load: NULL path");

  /* step */
  CT_CHECK(distro_cuda_optim_step(NULL, 0.1f, NULL) == DISTRO_ERR_INVALID, "NULL optimizer");
  CT_CHECK(distro_cuda_optim_step(gpu, NAN, NULL) == DISTRO_ERR_INVALID, "NaN lr");
  CT_CHECK(distro_cuda_optim_step(gpu, -1.0f, NULL) == DISTRO_ERR_INVALID, "negative lr");
  distro_cuda_optim *empty = NULL;
  CT_CHECK(distro_cuda_optim_create(&ok, comm, 0, &empty) == DISTRO_OK, "create");
  CT_CHECK(distro_cuda_optim_step(empty, 0.1f, NULL) == DISTRO_ERR_INVALID, "no tensors");
  CT_CHECK(distro_cuda_optim_flush(empty, NULL) == DISTRO_OK, "flush with nothing in flight");
  distro_cuda_optim_free(empty);
  distro_cuda_optim_free(gpu);
  distro_cuda_optim_free(NULL);
  distro_optim_free(cpu);

#ifdef DISTRO_WITH_NCCL
  distro_comm *nc = (distro_comm *)&ok;
  CT_CHECK(distro_comm_nccl(NULL, 0, &nc) == DISTRO_ERR_INVALID && nc == NULL, "NULL nccl comm");
  CT_CHECK(distro_comm_nccl(NULL, 0, NULL) == DISTRO_ERR_INVALID, "NULL out");
#endif
  distro_comm_free(comm);
  return ct_finish("test_cuda_api");
}
