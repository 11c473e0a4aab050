/* The GPU step emulated on the CPU for the host tests of the CUDA backend:
 * the tile passes of src/cuda/step_math.h (compiled as C), the selection,
 * and the CPU's payload code, on top of a CPU optimizer `h` that is never
 * stepped itself, as src/cuda/optim_cuda.c uses one. */
#ifndef DISTRO_TEST_CUDA_EMU_H
#define DISTRO_TEST_CUDA_EMU_H

#include <stdint.h>

#include "compress/dct.h"
#include "cuda/step_math.h"
#include "optim/optim_internal.h"

typedef struct {
  distro__tiling t;
  distro__dct_plan p;
  distro__hd_dct D;
} tile_plan;

typedef struct {
  distro_optim *h; /* prepared and verified */
  int nt;
  float **param, **grad;      /* the caller's (borrowed) */
  float **mom, **next, **v;   /* the device state */
  float **vnext;              /* overlap, DisTrO-AdamW: the staged second moments (optim_cuda.c's v_next), else NULL */
  float **base;               /* look-ahead: the agreed parameters (optim_cuda.c's base), else NULL */
  tile_plan *tp;
  float *work, *tile;
  uint32_t *iwork;
} emu;

/* Device state for h's tensors (param/grad: h's registered buffers); stage:
 * stage the second moment as the overlapped GPU step does, and with
 * look-ahead keep the agreed parameters. 0 or -1. */
int emu_init(emu *E, distro_optim *h, float **param, float **grad, int stage);
void emu_free(emu *E);
/* demo_local: compress (momentum staged in next), select into h's
 * p->idx / p->val; *bad the first tensor with a non-finite state or -1. */
distro_status emu_compress(emu *E, float lr, int *bad);
/* demo_apply for aggregate number h->step + 1 from h's decoded set (onto
 * the agreed parameters with look-ahead). */
distro_status emu_apply(emu *E, float lr);
/* Look-ahead: demo_ahead (param = base - a sign(whole momentum); a = 0: a
 * copy) and demo_agree (base = param). */
distro_status emu_ahead(emu *E, float a);
distro_status emu_agree(emu *E);
/* The blocking step: compress, encode, exchange, apply. */
distro_status emu_step(emu *E, float lr);

int same_bits(const float *a, const float *b, int64_t n, int64_t *at);
/* The host tests' tensors: shapes[i] = {ndim, d0, d1}, named t0, t1, ...;
 * parameters drawn from `seed` (the same on every rank), copied into
 * eparam, registered with their gradient buffers on cpu (unless NULL) and
 * on hopt. cparam, eparam, grad: nt pointers each, allocated here. 0 or -1
 * (distro_last_error says why when a registration failed). */
int64_t emu_numel(const int64_t *shape);
int emu_add_tensors(distro_optim *cpu, distro_optim *hopt, int nt, const int64_t (*shapes)[3], uint64_t seed,
                    float **cparam, float **eparam, float **grad);
void emu_free_tensors(int nt, float **cparam, float **eparam, float **grad);
/* A host-test rank's teardown: the tensors, the emulated device state and
 * both optimizers (either may be NULL). */
void emu_release(emu *E, distro_optim *cpu, distro_optim *hopt, int nt, float **cparam, float **eparam, float **grad);
/* Runs fn on its own thread for each of `world` jobs (job r at jobs + r *
 * job_size) and waits for all; 0, or -1 if a thread could not start. */
int emu_run_ranks(int world, void *(*fn)(void *), void *jobs, size_t job_size);
/* Two in-process groups of `world` ranks (the CPU reference's and the
 * emulated GPU's); 0 or -1. */
int emu_comm_groups(int world, distro_comm **cpu, distro_comm **gpu);
/* The host tests' options: DeMo with this update, values, wire version,
 * chunk and top-k, weight decay 0.1, one thread. */
distro_options emu_options(distro_update update, distro_values values, int wire, int chunk, int topk);

#endif
