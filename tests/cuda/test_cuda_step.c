/* Whole multi-step runs, several ranks in one process (threads, one stream
 * each, one GPU): GPU ranks stay bit-identical; a job mixing CPU and GPU
 * ranks works (each decodes the other's payloads) and, with the default
 * (exact) DCT method, stays bit-identical; with cuBLAS / cuFFT it agrees
 * within float32 rounding; the AdamW all-reduce baseline on GPU ranks equals the CPU
 * baseline; a non-finite gradient fails the step everywhere and changes
 * nothing; bf16 parameters follow their fp32 master; with the stale
 * and the look-ahead overlap, GPU ranks equal CPU ranks bit for bit. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <distro/cuda.h>
#include <distro/distro.h>

#include "testutil.h"

#include "cuda_test.h"
#include "cuda_tensors.h"

enum { CPU, GPU, GPU_BF16 };
#define MAXW 3
#define STEPS 7 /* DisTrO-AdamW's rectified step is 0 for steps 1-4 */

typedef struct {
  distro_options opt;
  int world;
  int kind[MAXW];
  int nan_rank, nan_step; /* -1: none */
  distro_cuda_dct dct;     /* GPU ranks' DCT method */
  uint64_t seed;
  float *out[MAXW][NT];      /* final parameters per rank */
  uint16_t *out_bf16[MAXW][NT];
  distro_status status[MAXW][STEPS];
  float *before_nan[MAXW][NT];
  int moved[MAXW]; /* parameters changed by the failed step */
} job;

static void fill(uint64_t seed, float *x, int64_t n, float scale) {
  tu_rng r = {seed};
  tu_fill_normal(&r, x, (size_t)n, scale);
}

static distro_status rank_fn(distro_comm *comm, int rank, void *arg) {
  job *j = arg;
  const int kind = j->kind[rank];
  float *hp[NT], *hg[NT], *dp[NT] = {0}, *dg[NT] = {0};
  uint16_t *db[NT] = {0};
  distro_optim *cpu = NULL;
  distro_cuda_optim *gpu = NULL;
  cudaStream_t s = 0;
  distro_status st = DISTRO_OK;
  if (kind != CPU) CT_CUDA(cudaStreamCreate(&s));
  st = kind == CPU ? distro_optim_create(&j->opt, comm, &cpu) : distro_cuda_optim_create(&j->opt, comm, s, &gpu);
  CT_CHECK(st == DISTRO_OK, "create: %s", distro_last_error());
  if (gpu) CT_CHECK(distro_cuda_optim_set_dct(gpu, j->dct) == DISTRO_OK, "set_dct: %s", distro_last_error());
  for (int i = 0; i < NT; i++) {
    const int64_t n = numel(i);
    hp[i] = malloc(sizeof(float) * n);
    hg[i] = malloc(sizeof(float) * n);
    fill(j->seed + 1000 + i, hp[i], n, 0.5f); /* same start on every rank */
    if (kind == CPU) {
      st = distro_optim_add_param(cpu, names[i], hp[i], hg[i], ndims[i], shapes[i]);
    } else {
      CT_CUDA(cudaMalloc((void **)&dp[i], sizeof(float) * n));
      CT_CUDA(cudaMalloc((void **)&dg[i], sizeof(float) * n));
      CT_CUDA(cudaMemcpy(dp[i], hp[i], sizeof(float) * n, cudaMemcpyHostToDevice));
      if (kind == GPU_BF16) {
        CT_CUDA(cudaMalloc((void **)&db[i], sizeof(uint16_t) * n));
        st = distro_cuda_optim_add_param_bf16(gpu, names[i], db[i], dp[i], dg[i], ndims[i], shapes[i]);
      } else {
        st = distro_cuda_optim_add_param(gpu, names[i], dp[i], dg[i], ndims[i], shapes[i]);
      }
    }
    CT_CHECK(st == DISTRO_OK, "add_param: %s", distro_last_error());
  }
  for (int step = 0; step < STEPS; step++) {
    for (int i = 0; i < NT; i++) {
      const int64_t n = numel(i);
      fill(j->seed + 77 * (uint64_t)step + 7919 * (uint64_t)rank + (uint64_t)i, hg[i], n, 1.0f);
      if (rank == j->nan_rank && step == j->nan_step && i == 1) hg[i][n / 2] = NAN;
      if (kind != CPU) CT_CUDA(cudaMemcpyAsync(dg[i], hg[i], sizeof(float) * n, cudaMemcpyHostToDevice, s));
      if (step == j->nan_step) {
        j->before_nan[rank][i] = malloc(sizeof(float) * n);
        if (kind == CPU)
          memcpy(j->before_nan[rank][i], hp[i], sizeof(float) * n);
        else
          CT_CUDA(cudaMemcpy(j->before_nan[rank][i], dp[i], sizeof(float) * n, cudaMemcpyDeviceToHost));
      }
    }
    distro_step_stats stats;
    j->status[rank][step] = kind == CPU ? distro_optim_step(cpu, 0.01f, &stats) : distro_cuda_optim_step(gpu, 0.01f, &stats);
    if (step == j->nan_step)
      for (int i = 0; i < NT; i++) {
        const int64_t n = numel(i);
        float *now = malloc(sizeof(float) * n);
        if (kind == CPU)
          memcpy(now, hp[i], sizeof(float) * n);
        else
          CT_CUDA(cudaMemcpy(now, dp[i], sizeof(float) * n, cudaMemcpyDeviceToHost));
        j->moved[rank] |= memcmp(now, j->before_nan[rank][i], sizeof(float) * n) != 0;
        free(now);
      }
  }
  if (j->opt.overlap) { /* the exchange in flight lands before the parameters are read */
    st = kind == CPU ? distro_optim_flush(cpu, NULL) : distro_cuda_optim_flush(gpu, NULL);
    CT_CHECK(st == DISTRO_OK, "flush: %s", distro_last_error());
  }
  for (int i = 0; i < NT; i++) {
    const int64_t n = numel(i);
    j->out[rank][i] = malloc(sizeof(float) * n);
    if (kind == CPU) {
      memcpy(j->out[rank][i], hp[i], sizeof(float) * n);
    } else {
      CT_CUDA(cudaStreamSynchronize(s));
      CT_CUDA(cudaMemcpy(j->out[rank][i], dp[i], sizeof(float) * n, cudaMemcpyDeviceToHost));
      if (db[i]) {
        j->out_bf16[rank][i] = malloc(sizeof(uint16_t) * n);
        CT_CUDA(cudaMemcpy(j->out_bf16[rank][i], db[i], sizeof(uint16_t) * n, cudaMemcpyDeviceToHost));
      }
    }
    free(hp[i]);
    free(hg[i]);
    cudaFree(dp[i]);
    cudaFree(dg[i]);
    cudaFree(db[i]);
  }
  distro_optim_free(cpu);
  distro_cuda_optim_free(gpu);
  if (s) cudaStreamDestroy(s);
  return DISTRO_OK;
}

static void run(job *j) {
  j->seed = ct_seed_used;
  CT_CHECK(distro_comm_run_local(j->world, rank_fn, j) == DISTRO_OK, "run_local: %s", distro_last_error());
}

static void release(job *j) {
  for (int r = 0; r < MAXW; r++)
    for (int i = 0; i < NT; i++) {
      free(j->out[r][i]);
      free(j->out_bf16[r][i]);
      free(j->before_nan[r][i]);
    }
}

static job make(distro_options o, int world, int k0, int k1, int k2) {
  job j;
  memset(&j, 0, sizeof j);
  j.opt = o;
  j.world = world;
  j.kind[0] = k0;
  j.kind[1] = k1;
  j.kind[2] = k2;
  j.nan_rank = j.nan_step = -1;
  j.dct = DISTRO_CUDA_DCT_EXACT;
  return j;
}

static int all_ok(const job *j) {
  for (int r = 0; r < j->world; r++)
    for (int s = 0; s < STEPS; s++)
      if (j->status[r][s] != DISTRO_OK) return 0;
  return 1;
}

/* Fraction of elements whose difference exceeds float32 rounding. */
static double far_fraction(const job *j, int a, int b) {
  int64_t far = 0, total = 0;
  for (int i = 0; i < NT; i++)
    for (int64_t e = 0; e < numel(i); e++, total++)
      far += fabsf(j->out[a][i][e] - j->out[b][i][e]) > 1e-5f * (1.0f + fabsf(j->out[b][i][e]));
  return (double)far / (double)total;
}

static int identical(const job *j, int a, int b) {
  for (int i = 0; i < NT; i++)
    if (memcmp(j->out[a][i], j->out[b][i], sizeof(float) * numel(i))) return 0;
  return 1;
}

int main(void) {
  ct_require_gpu("test_cuda_step");
  ct_seed_used = tu_seed();
  distro_options variants[8];
  variants[0] = distro_options_default(DISTRO_ALG_DEMO); /* wire v2, F32, sign */
  variants[1] = variants[0];
  variants[1].wire_version = 1;
  variants[1].values = DISTRO_VALUES_BF16;
  variants[2] = variants[0];
  variants[2].values = DISTRO_VALUES_SIGN1;
  variants[2].chunk = 16;
  variants[2].topk = 4;
  variants[3] = variants[0];
  variants[3].update = DISTRO_UPDATE_ADAMW;
  variants[3].values = DISTRO_VALUES_INT8;
  /* the stale and look-ahead overlaps: GPU ranks follow the CPU's */
  variants[4] = variants[0];
  variants[4].overlap = DISTRO_OVERLAP_STALE;
  variants[5] = variants[3];
  variants[5].overlap = DISTRO_OVERLAP_STALE;
  variants[6] = variants[4];
  variants[6].overlap = DISTRO_OVERLAP_LOOKAHEAD;
  variants[7] = variants[5];
  variants[7].overlap = DISTRO_OVERLAP_LOOKAHEAD;
  for (int v = 0; v < 8; v++) {
    job g = make(variants[v], 3, GPU, GPU, GPU);
    run(&g);
    CT_CHECK(all_ok(&g), "variant %d: GPU job failed", v);
    CT_CHECK(identical(&g, 0, 1) && identical(&g, 0, 2), "variant %d: GPU ranks differ", v);
    job m = make(variants[v], 3, CPU, GPU, CPU);
    run(&m);
    CT_CHECK(all_ok(&m), "variant %d: mixed CPU/GPU job failed", v);
    CT_CHECK(identical(&m, 0, 2), "variant %d: CPU ranks differ", v);
    CT_CHECK(identical(&m, 1, 0), "variant %d: the GPU rank is not bit-identical to the CPU ranks", v);
    CT_CHECK(identical(&g, 0, 1) && identical(&g, 0, 2), "variant %d: GPU ranks differ", v);
    printf("variant %d: GPU vs CPU rank %s\n", v, identical(&m, 1, 0) ? "bit-identical" : "DIFFER");
    release(&g);
    release(&m);
  }
  /* The cuBLAS GEMM and cuFFT options (sign and AdamW updates): GPU ranks of
   * one model stay bit-identical, CPU ranks agree within rounding only. */
  const distro_cuda_dct options[2] = {DISTRO_CUDA_DCT_GEMM, DISTRO_CUDA_DCT_FFT};
  for (int d = 0; d < 2; d++)
    for (int v = 0; v < 4; v += 3) {
      const char *dn = d ? "cuFFT" : "GEMM";
      job g = make(variants[v], 3, GPU, GPU, GPU);
      g.dct = options[d];
      run(&g);
      CT_CHECK(all_ok(&g), "variant %d, %s DCT: GPU job failed", v, dn);
      CT_CHECK(identical(&g, 0, 1) && identical(&g, 0, 2), "variant %d, %s DCT: GPU ranks differ", v, dn);
      job m = make(variants[v], 3, CPU, GPU, CPU);
      m.dct = options[d];
      run(&m);
      CT_CHECK(all_ok(&m), "variant %d, %s DCT: mixed CPU/GPU job failed", v, dn);
      double f = far_fraction(&m, 1, 0);
      CT_CHECK(f < 2e-3, "variant %d, %s DCT: %.4f%% of GPU parameters differ from the CPU rank's", v, dn, 100 * f);
      printf("variant %d, %s DCT: GPU vs CPU rank: %.4f%% of elements beyond 1e-5 relative\n", v, dn, 100 * f);
      release(&g);
      release(&m);
    }
  /* The AdamW all-reduce baseline: GPU ranks bit-identical; a GPU rank in a
   * job with CPU ranks (CPU comm, staged through the host) gets the same sum,
   * and the update kernel rounds as the C code, so it matches bit for bit. */
  distro_options adam = distro_options_default(DISTRO_ALG_ADAMW);
  adam.weight_decay = 0.1f;
  {
    job g = make(adam, 3, GPU, GPU, GPU);
    run(&g);
    CT_CHECK(all_ok(&g), "AdamW baseline: GPU job failed");
    CT_CHECK(identical(&g, 0, 1) && identical(&g, 0, 2), "AdamW baseline: GPU ranks differ");
    job m = make(adam, 3, CPU, GPU, CPU);
    run(&m);
    CT_CHECK(all_ok(&m), "AdamW baseline: mixed CPU/GPU job failed");
    double f = far_fraction(&m, 1, 0);
    CT_CHECK(identical(&m, 1, 0), "AdamW baseline: GPU rank not bit-identical to the CPU rank");
    printf("AdamW baseline: GPU vs CPU rank %s (%.4f%% beyond 1e-5 relative)\n",
           identical(&m, 1, 0) ? "bit-identical" : "differ", 100 * f);
    /* The all-GPU job saw the same gradients as the CPU ranks of the mixed one. */
    double fg = 0;
    for (int i = 0; i < NT; i++)
      for (int64_t e = 0; e < numel(i); e++)
        fg = fmax(fg, fabs((double)g.out[0][i][e] - (double)m.out[0][i][e]) / (1.0 + fabs((double)m.out[0][i][e])));
    CT_CHECK(fg < 1e-5, "AdamW baseline: all-GPU job vs CPU ranks: max relative difference %g", fg);
    printf("AdamW baseline: all-GPU job vs the CPU ranks: max relative difference %g\n", fg);
    release(&g);
    release(&m);
    for (int k = 0; k < 2; k++) {
      job n = make(adam, 2, k ? GPU : CPU, GPU, CPU);
      n.nan_rank = k ? 0 : 1; /* the NaN on a GPU rank; its peer is a CPU rank, then a GPU rank */
      n.nan_step = 2;
      run(&n);
      for (int r = 0; r < 2; r++) {
        CT_CHECK(n.status[r][2] == DISTRO_ERR_NONFINITE, "AdamW baseline job %d rank %d: step with a NaN gave %d", k,
                 r, (int)n.status[r][2]);
        CT_CHECK(!n.moved[r], "AdamW baseline job %d rank %d: the failed step changed parameters", k, r);
        CT_CHECK(n.status[r][3] == DISTRO_OK, "AdamW baseline job %d rank %d: the next step gave %d", k, r,
                 (int)n.status[r][3]);
      }
      if (k) CT_CHECK(identical(&n, 0, 1), "AdamW baseline: GPU ranks differ after a failed step");
      release(&n);
    }
  }
  /* A NaN gradient on a GPU rank: every rank fails that step, nothing moves,
   * and the next step works. */
  job n = make(variants[0], 2, CPU, GPU, CPU);
  n.nan_rank = 1;
  n.nan_step = 2;
  run(&n);
  for (int r = 0; r < 2; r++) {
    CT_CHECK(n.status[r][2] == DISTRO_ERR_NONFINITE, "rank %d: step with a NaN gave %d", r, (int)n.status[r][2]);
    CT_CHECK(!n.moved[r], "rank %d: the failed step changed parameters", r);
    CT_CHECK(n.status[r][3] == DISTRO_OK, "rank %d: the step after the NaN gave %d", r, (int)n.status[r][3]);
  }
  release(&n);
  /* bf16 parameters: the master follows the fp32 run bit for bit. */
  job b = make(variants[0], 2, GPU, GPU_BF16, CPU);
  run(&b);
  CT_CHECK(all_ok(&b) && identical(&b, 0, 1), "bf16 master differs from the fp32 rank");
  for (int i = 0; i < NT && b.out_bf16[1][i]; i++)
    for (int64_t e = 0; e < numel(i); e++) {
      float f = b.out[1][i][e];
      uint32_t u;
      memcpy(&u, &f, 4);
      uint16_t want = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      if (b.out_bf16[1][i][e] != want) {
        CT_CHECK(0, "bf16 copy of '%s'[%lld] is %04x, want %04x", names[i], (long long)e, b.out_bf16[1][i][e], want);
        break;
      }
    }
  release(&b);
  return ct_finish("test_cuda_step");
}
