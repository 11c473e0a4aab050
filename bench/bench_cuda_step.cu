// bench_cuda_step: the DeMo step on the GPU for the 1.2B Llama-2 shape set,
// phases timed by the library (CUDA events for device work, the host clock
// for encode/exchange/decode), the memory floor measured in the same run
// with a large device-to-device copy, and the bytes each phase moves.
//
//   bench_cuda_step [--layers N] [--steps N] [--warmup N] [--chunk N]
//                   [--topk N] [--wire 1|2] [--values f32|bf16|int8] [--local]
//                   [--dct exact|gemm|fft|auto]
//
// --dct picks the chunked DCT (distro_cuda_optim_set_dct; exact, the
// default, rounds as the CPU); the run prints a BENCH_DCT line (method,
// chunk, transform and decode phase medians in ms) and a BENCH_CONFIG line
// (the options actually used) that bench/gpu-check.sh reads.
//
// Ends with a table between "== table" and "== end" (bench/gpu-check.sh
// quotes it).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include <distro/cuda.h>
#include <distro/distro.h>

extern "C" {
#include "shapes.h"
}

#define CK(call)                                                                                    \
  do {                                                                                              \
    cudaError_t e_ = (call);                                                                        \
    if (e_ != cudaSuccess) {                                                                        \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));        \
      exit(1);                                                                                      \
    }                                                                                               \
  } while (0)
#define DK(call)                                                                                    \
  do {                                                                                              \
    distro_status s_ = (call);                                                                      \
    if (s_ != DISTRO_OK) {                                                                          \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, distro_last_error());           \
      exit(1);                                                                                      \
    }                                                                                               \
  } while (0)

// Normal-ish values from a counter hash (Irwin-Hall of 4 uniforms).
__global__ void fill(float *x, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint64_t z = seed + (uint64_t)i * 0x9e3779b97f4a7c15ULL;
    float s = 0;
    for (int k = 0; k < 4; k++) {
      z ^= z >> 30;
      z *= 0xbf58476d1ce4e5b9ULL;
      z ^= z >> 27;
      z *= 0x94d049bb133111ebULL;
      z ^= z >> 31;
      s += (float)(z >> 40) * (1.0f / 16777216.0f);
    }
    x[i] = (s - 2.0f) * 1.7320508f * scale;
  }
}

// Best device-to-device copy bandwidth (bytes read + written per second).
static double copy_bandwidth(size_t bytes, cudaStream_t s) {
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemsetAsync(a, 1, bytes, s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int r = 0; r < 8; r++) {
    CK(cudaEventRecord(e0, s));
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r > 0) best = std::min(best, ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * (double)bytes / (best * 1e-3);
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int main(int argc, char **argv) {
  int layers = 0, steps = 10, warmup = 3, use_local = 0;
  distro_cuda_dct dct = DISTRO_CUDA_DCT_EXACT;
  const char *dct_name = "exact";
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : "0";
    if (!strcmp(a, "--layers")) layers = atoi(v), i++;
    else if (!strcmp(a, "--steps")) steps = atoi(v), i++;
    else if (!strcmp(a, "--warmup")) warmup = atoi(v), i++;
    else if (!strcmp(a, "--chunk")) o.chunk = atoi(v), i++;
    else if (!strcmp(a, "--topk")) o.topk = atoi(v), i++;
    else if (!strcmp(a, "--wire")) o.wire_version = atoi(v), i++;
    else if (!strcmp(a, "--local")) use_local = 1;
    else if (!strcmp(a, "--values") && (!strcmp(v, "f32") || !strcmp(v, "bf16") || !strcmp(v, "int8"))) {
      o.values = !strcmp(v, "f32") ? DISTRO_VALUES_F32 : !strcmp(v, "bf16") ? DISTRO_VALUES_BF16 : DISTRO_VALUES_INT8;
      i++;
    }
    else if (!strcmp(a, "--dct") && (!strcmp(v, "exact") || !strcmp(v, "gemm") || !strcmp(v, "fft") || !strcmp(v, "auto"))) {
      dct_name = v;
      dct = !strcmp(v, "fft")    ? DISTRO_CUDA_DCT_FFT
            : !strcmp(v, "auto") ? DISTRO_CUDA_DCT_AUTO
            : !strcmp(v, "gemm") ? DISTRO_CUDA_DCT_GEMM
                                 : DISTRO_CUDA_DCT_EXACT;
      i++;
    }
    else {
      fprintf(stderr, "usage: %s [--layers N] [--steps N] [--warmup N] [--chunk N] [--topk N] [--wire 1|2] [--values f32|bf16|int8] [--local] [--dct exact|gemm|fft|auto]\n",
              argv[0]);
      return 2;
    }
  }
  bench_model m;
  if (bench_model_llama_1b2(&m, layers) != 0) return 1;
  bench_model_print(&m, stdout);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));

  const double bw_before = copy_bandwidth((size_t)2 << 30, s);
  const int64_t n = m.nparams;
  float *p, *g;
  CK(cudaMalloc((void **)&p, sizeof(float) * n));
  CK(cudaMalloc((void **)&g, sizeof(float) * n));
  fill<<<4096, 256, 0, s>>>(p, n, 1, 0.02f);
  CK(cudaGetLastError());

  distro_comm *comm = NULL;
  const char *comm_name = "local";
#ifdef DISTRO_WITH_NCCL
  ncclComm_t nccl = NULL;
  if (!use_local) {
    int dev = 0;
    if (ncclCommInitAll(&nccl, 1, &dev) == ncclSuccess && distro_comm_nccl(nccl, s, &comm) == DISTRO_OK)
      comm_name = "nccl";
  }
#endif
  if (!comm) DK(distro_comm_local_group(1, &comm));
  distro_cuda_optim *opt;
  DK(distro_cuda_optim_create(&o, comm, s, &opt));
  DK(distro_cuda_optim_set_dct(opt, dct));
  for (int i = 0; i < m.ntensors; i++)
    DK(distro_cuda_optim_add_param(opt, m.t[i].name, p + m.t[i].offset, g + m.t[i].offset, m.t[i].ndim,
                                   m.t[i].shape));
  uint64_t bound = 0;
  DK(distro_payload_bytes(&o, m.ntensors, m.ndims, m.shapes, &bound));
  const char *values_name = o.values == DISTRO_VALUES_F32 ? "f32" : o.values == DISTRO_VALUES_BF16 ? "bf16" : "int8";
  printf("options: chunk %d, topk %d, wire v%d, %s values, sign update, DCT %s; comm %s (1 rank)\n", o.chunk, o.topk,
         o.wire_version, values_name, dct_name, comm_name);
  printf("BENCH_CONFIG chunk=%d topk=%d values=%s wire=v%d dct=%s\n", o.chunk, o.topk, values_name, o.wire_version,
         dct_name);

  std::vector<double> tr, tk, ex, de, tot, co;
  uint64_t sent = 0;
  for (int it = 0; it < warmup + steps; it++) {
    fill<<<4096, 256, 0, s>>>(g, n, 1000 + (uint64_t)it, 1.0f);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    distro_step_stats st;
    DK(distro_cuda_optim_step(opt, 1e-4f, &st));
    if (it < warmup) continue;
    tr.push_back(st.seconds_transform);
    tk.push_back(st.seconds_topk);
    ex.push_back(st.seconds_exchange);
    de.push_back(st.seconds_decode);
    tot.push_back(st.seconds_total);
    co.push_back(st.seconds_codec);
    sent = st.bytes_sent;
  }
  const double bw_after = copy_bandwidth((size_t)2 << 30, s);
  const double bw = std::max(bw_before, bw_after);

  // Bytes per parameter each phase moves as implemented (fp32), GEMM / FFT:
  //   transform: column GEMM 8, row GEMM 8, momentum 12
  //   top-k:     read 4 (+ the selection)
  //   decode:    aggregate 16 (zero coef+count, divide pass), inverse GEMMs 16,
  //              sign update 12
  // exact (one block per tile; its work memory counted as on-chip):
  //   transform: read the gradient and the momentum, write it: 12
  //   decode:    read and write the parameters: 8 (+ the selections)
  // The step's floor: read the gradient, read and write the momentum and the
  // parameters: 20 bytes per parameter.
  const double N = (double)n, sel = 8.0 * (double)n * o.topk / (double)(o.chunk * o.chunk);
  const int exact = dct == DISTRO_CUDA_DCT_EXACT;
  const double b_tr = (exact ? 12 : 28) * N, b_tk = 4 * N + sel, b_de = (exact ? 8 : 44) * N + sel, floor_b = 20 * N;
  const double t_tr = median(tr), t_tk = median(tk), t_ex = median(ex), t_de = median(de), t_tot = median(tot),
               t_co = median(co);
  const double floor_t = floor_b / bw;
  printf("copy bandwidth: %.0f GB/s before, %.0f GB/s after (read + write)\n", bw_before / 1e9, bw_after / 1e9);
  printf("payload: %llu bytes sent per step (bound %llu)\n", (unsigned long long)sent, (unsigned long long)bound);
  printf("\n== table\n");
  printf("%-34s %10s %10s %10s\n", "phase (median of steps)", "ms", "GB moved", "GB/s");
  printf("%-34s %10.2f %10.2f %10.0f\n", "transform (fwd DCT + momentum)", t_tr * 1e3, b_tr / 1e9, b_tr / t_tr / 1e9);
  printf("%-34s %10.2f %10.2f %10.0f\n", "top-k + D2H + host encode", t_tk * 1e3, b_tk / 1e9, b_tk / t_tk / 1e9);
  printf("%-34s %10.2f %10s %10s\n", "exchange", t_ex * 1e3, "-", "-");
  printf("%-34s %10.2f %10.2f %10.0f\n", "decode (+ aggregate, inv DCT, upd)", t_de * 1e3, b_de / 1e9,
         b_de / t_de / 1e9);
  printf("%-34s %10.2f %10s %10s\n", "  of which host codec (enc + dec)", t_co * 1e3, "-", "-");
  printf("%-34s %10.2f %10.2f %10.0f\n", "step total", t_tot * 1e3, (b_tr + b_tk + b_de) / 1e9,
         (b_tr + b_tk + b_de) / t_tot / 1e9);
  printf("%-34s %10.2f %10.2f %10.0f\n", "memory floor (20 B/param)", floor_t * 1e3, floor_b / 1e9, bw / 1e9);
  printf("step / floor: %.2fx (target <= 2x)\n", t_tot / floor_t);
  printf("BENCH_STEP_MS %.3f\n", t_tot * 1e3);
  printf("BENCH_DCT %s %d %.3f %.3f\n", dct_name, o.chunk, t_tr * 1e3, t_de * 1e3);
  printf("== end\n");

  distro_cuda_optim_free(opt);
  distro_comm_free(comm);
#ifdef DISTRO_WITH_NCCL
  if (nccl) ncclCommDestroy(nccl);
#endif
  cudaFree(p);
  cudaFree(g);
  cudaStreamDestroy(s);
  bench_model_free(&m);
  return 0;
}
