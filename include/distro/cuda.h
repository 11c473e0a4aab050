/* distro: CUDA backend (only in builds with DISTRO_WITH_CUDA; not included by
 * <distro/distro.h> because it needs the CUDA and NCCL headers).
 *
 * The DeMo step on device pointers: DCT, momentum, per-chunk top-k,
 * aggregation and the update run on the caller's stream; the selected
 * coefficients cross to the host once per step, are encoded by the same wire
 * code as the CPU optimizer (v1 or v2), exchanged through any distro_comm,
 * validated and decoded on the host, and the decoded selections go back to
 * the device. With the default DCT method (DISTRO_CUDA_DCT_EXACT) every
 * operation rounds as the CPU step does, so CPU ranks and GPU ranks of any
 * generation compute the same bits (docs/cuda.md says what has been run on a
 * GPU). */
#ifndef DISTRO_CUDA_H
#define DISTRO_CUDA_H

#include <stdint.h>
#include <cuda_runtime_api.h>
#include <distro/comm.h>
#include <distro/optim.h>
#include <distro/status.h>
#ifdef DISTRO_WITH_NCCL
#include <nccl.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct distro_cuda_optim distro_cuda_optim;

/* Same options and errors as distro_optim_create. DISTRO_ALG_DEMO runs the
 * compressed step above; DISTRO_ALG_ADAMW the all-reduce baseline (gradients
 * flattened on the device, one all-reduce: NCCL on device memory, any other
 * comm through pinned host memory; then the AdamW kernel). Works on the
 * current CUDA device and on `stream` (0: the legacy default stream). `comm`
 * is borrowed. */
DISTRO_API distro_status distro_cuda_optim_create(const distro_options *o, distro_comm *comm, cudaStream_t stream,
                                                  distro_cuda_optim **out);

/* As distro_optim_add_param, with device pointers (fp32). grad may be NULL
 * until distro_cuda_optim_set_grad hands it over (lazily allocated
 * gradients); a step with a tensor still lacking one fails with
 * DISTRO_ERR_INVALID on every rank, before any device work. */
DISTRO_API distro_status distro_cuda_optim_add_param(distro_cuda_optim *o, const char *name, float *param,
                                                     const float *grad, int ndim, const int64_t *shape);

/* bf16 parameters with an fp32 master copy: the step updates `master` and
 * then writes it, rounded to nearest even, to `param_bf16` (device
 * __nv_bfloat16 / uint16 words). */
DISTRO_API distro_status distro_cuda_optim_add_param_bf16(distro_cuda_optim *o, const char *name, void *param_bf16,
                                                          float *master, const float *grad, int ndim,
                                                          const int64_t *shape);

/* As distro_optim_set_grad: the tensor's gradient (device memory) from now
 * on. Same errors (NULL, unknown name, overlapping buffers). */
DISTRO_API distro_status distro_cuda_optim_set_grad(distro_cuda_optim *o, const char *name, const float *grad);

/* How the DeMo step computes its chunked DCTs (and with it the rest of the
 * step). EXACT (the default): the CPU step's factored DCT, aggregation and
 * update in its operation order with one rounding per operation (no FMA
 * contraction), one thread block per tile: the same bits as a CPU rank and
 * as any other GPU. GEMM: two cuBLAS GEMMs per direction against the
 * orthonormal bases. FFT: cuFFT (Makhoul's method, one real FFT per tile
 * row/column) for every tensor. AUTO: cuFFT for tensors whose larger tile
 * edge is >= DISTRO_CUDA_FFT_MIN_EDGE, GEMM for the rest. GEMM, FFT and AUTO
 * agree with the CPU DCT within float32 rounding only, and their rounding
 * may differ between GPU models and library versions: where sign(Q) is
 * decided by that rounding, ranks drift apart by 2 lr per element, so use
 * them only where every rank is the same GPU and library (and never with CPU
 * ranks). Call before the first step, save or load (DISTRO_ERR_INVALID
 * afterwards). */
typedef enum {
  DISTRO_CUDA_DCT_GEMM = 0,
  DISTRO_CUDA_DCT_FFT = 1,
  DISTRO_CUDA_DCT_AUTO = 2,
  DISTRO_CUDA_DCT_EXACT = 3
} distro_cuda_dct;
#define DISTRO_CUDA_FFT_MIN_EDGE 128
DISTRO_API distro_status distro_cuda_optim_set_dct(distro_cuda_optim *o, distro_cuda_dct method);

/* One collective step, ordered on the optimizer's stream after whatever the
 * caller queued there (the gradients). It waits for the stream before the
 * exchange and again after the update, so a device error of any kernel is
 * this step's and the update has finished when the call returns.
 *
 * A CUDA, cuBLAS or cuFFT failure before the exchange still joins it (an
 * abort payload, or for the AdamW baseline a fault flag in the all-reduce),
 * so every rank fails this step with an error naming the failed rank, none
 * waits; nothing changed. A device failure after the exchange leaves this
 * rank's state undefined: the step fails, and every later step joins the
 * exchange only to fail all ranks again (DISTRO_ERR_CUDA here,
 * DISTRO_ERR_COMM elsewhere) until the job restarts from a saved state.
 * Joining needs a working communicator: an NCCL comm on a device whose
 * context is lost cannot join, and its peers wait (docs/cuda.md). */
DISTRO_API distro_status distro_cuda_optim_step(distro_cuda_optim *o, float lr, distro_step_stats *stats);

/* options.overlap (DISTRO_OVERLAP_STALE or _LOOKAHEAD; look-ahead needs the
 * exact DCT method): each step applies the previous step's aggregate,
 * compresses its own gradient and leaves its exchange running on a host
 * thread over a private duplicate of the communicator (NCCL: a split of
 * the same ranks on a stream of its own); with look-ahead the parameters
 * then take this rank's provisional step. The parameters follow the CPU's
 * overlapped step bit for bit. Flush applies the exchange in flight: before
 * evaluating, saving or loading. */
DISTRO_API distro_status distro_cuda_optim_flush(distro_cuda_optim *o, distro_step_stats *stats);

/* Optimizer state (step count, DeMo momentum, AdamW moments) in the file
 * format of distro_optim_save / distro_optim_load: a GPU state loads into a
 * CPU optimizer with the same options and tensors, and the other way round.
 * The save waits for the stream and writes atomically (temporary file,
 * fsync, rename) with a CRC32C trailer; the load verifies the whole file on
 * the host and swaps fresh device buffers in only when everything checked
 * out, so a failed load changes nothing. Both allocate the device state
 * when no step has run yet. Parameters are not part of the state. With
 * overlap, unlike the CPU optimizer's, both need the exchange flushed
 * first, and a CPU state saved with an exchange in flight does not load
 * here (DISTRO_ERR_SHAPE). */
DISTRO_API distro_status distro_cuda_optim_save(const distro_cuda_optim *o, const char *path);
DISTRO_API distro_status distro_cuda_optim_load(distro_cuda_optim *o, const char *path);

DISTRO_API void distro_cuda_optim_free(distro_cuda_optim *o); /* accepts NULL */

#ifdef DISTRO_WITH_NCCL
/* Communicator over an NCCL communicator (borrowed) and a stream. Host
 * buffers are staged through device memory; device buffers go straight to
 * NCCL. all-gather is ncclAllGather; the sum is ncclAllReduce, whose result
 * is the same on every rank (not the CPU comms' rank order). */
DISTRO_API distro_status distro_comm_nccl(ncclComm_t nccl, cudaStream_t stream, distro_comm **out);

#ifdef MPI_VERSION
/* Include <mpi.h> first. Collective over `mpi`: rank 0 creates the NCCL
 * unique id, MPI_Bcast shares it, every rank joins on its current device.
 * The NCCL communicator is owned by the returned comm. Builds with MPI only. */
DISTRO_API distro_status distro_comm_nccl_mpi(MPI_Comm mpi, cudaStream_t stream, distro_comm **out);
#endif
#endif

#ifdef __cplusplus
}
#endif
#endif
