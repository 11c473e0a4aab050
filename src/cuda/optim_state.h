/* Internal: the GPU optimizer's state (struct distro_cuda_optim), shared by
 * optim_cuda.c (create, device state, the step), adamw_cuda.c (the AdamW
 * baseline) and optim_cuda_io.c (save, load). */
#ifndef DISTRO_CUDA_OPTIM_STATE_H
#define DISTRO_CUDA_OPTIM_STATE_H

#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <distro/cuda.h>

#include "cuda/cuda_internal.h"
#include "optim/optim_internal.h"

typedef struct {
  float *param;       /* fp32 parameters, or the master copy */
  const float *grad;
  uint16_t *bf16;     /* bf16 copy written after each update, or NULL */
  float *mom, *mom_next, *m, *v;
  float *v_next;      /* overlap, DisTrO-AdamW: v' of the step in flight, committed by its apply */
  float *base;        /* look-ahead: the agreed parameters (param runs ahead of them) */
  distro__cuda_dct dct;
  distro__cuda_fft_dct fft;
  int use_fft;        /* this tensor's DCT runs through cuFFT */
  int shape;          /* exact method: index into the shape tables, else -1 */
} cuda_param;

/* The factored DCT's tables of one tile shape on the device (one
 * allocation), and the struct of device pointers the kernels take. */
typedef struct {
  int h, w;
  float *blob;
  distro__hd_dct dev;
} hd_shape;

typedef struct {
  int64_t n;
  float *basis;
} basis_entry;

enum { EV_START, EV_FORWARD, EV_SELECTED, EV_UPLOADED, EV_DONE, EV_COUNT };

struct distro_cuda_optim {
  distro_optim *host;
  cudaStream_t stream;
  cublasHandle_t blas;
  cuda_param *params;
  int cap;
  int ready;
  basis_entry *bases;
  int nbases;
  uint32_t *d_sel_idx, *h_sel_idx; /* total_sel: this rank's selection */
  float *d_sel_val, *h_sel_val;
  uint32_t *d_dec_idx;             /* world x total_sel: decoded selections */
  float *d_dec_val;
  int dec_registered;              /* host dec arrays are page-locked */
  int io_registered;               /* the host payload buffers are page-locked (NCCL copies them) */
  uint8_t *d_dropped;
  int *d_flags, *h_flags;          /* per tensor: non-finite gradient; one more slot (AdamW: overflow) */
  float *d_flat, *h_flat;          /* AdamW baseline: all gradients + 1 flag; h_flat stages a CPU comm */
  int nccl;                        /* comm is NCCL: device buffers go to it directly */
  float *scratch_a, *scratch_b;    /* max_numel each */
  float *d_u;                      /* DisTrO-AdamW: the normalized gradient (max_numel) */
  int *counts;                     /* max_numel */
  cudaEvent_t ev[EV_COUNT];
  int have_events;
  distro_cuda_dct dct_method;      /* distro_cuda_optim_set_dct */
  void *fft_work, *fft_cbuf;       /* shared by every cuFFT tensor */
  hd_shape *shapes;                /* exact method: tables per tile shape */
  int nshapes;
  float *tile_work;                /* exact method: max_blocks slices of work */
  uint32_t *tile_iwork;
  int max_blocks;
  int broken;                      /* a step failed after its exchange: the
                                      device state is undefined */
};

/* Allocates the device state once (before the first step, a save or a
 * load); a no-op afterwards. */
distro_status distro__cuda_optim_prepare(distro_cuda_optim *o);

/* Seconds between two recorded events (0 if either is missing). */
static inline float distro__cuda_elapsed(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) ms = 0;
  return ms * 1e-3f;
}

/* The AdamW all-reduce baseline's step (adamw_cuda.c), and its join of a
 * step that failed locally so that every rank fails it. */
distro_status distro__cuda_adamw_step(distro_cuda_optim *o, float lr, distro_step_stats *s, int want_stats);
distro_status distro__cuda_adamw_join_failed(distro_cuda_optim *o, distro_status why);

#endif
