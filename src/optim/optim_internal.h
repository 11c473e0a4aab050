/* Internal: optimizer state shared by the DeMo and AdamW step files. */
#ifndef DISTRO_OPTIM_INTERNAL_H
#define DISTRO_OPTIM_INTERNAL_H

#include <stdint.h>
#include <distro/optim.h>

#include "common/atomic_file.h"
#include "compress/chunk.h"
#include "compress/dct.h"
#include "compress/wire.h"
#include "compress/wire2.h"

#define DISTRO__MAX_NDIM 8


typedef struct {
  double transform, select, decode;
} distro__tile_clock;

/* Where one payload exchange lands: payload.c writes it, the apply phase
 * reads the optimizer's own set. The blocking step exchanges into that set;
 * the overlapped one into a second set (overlap.c), swapped in when the
 * exchange has completed. */
typedef struct distro__xset {
  uint8_t *recv;        /* world slots of `slot` bytes */
  size_t *sizes;        /* per rank: received payload bytes */
  uint32_t *dec_idx;    /* world x total_sel decoded indices */
  float *dec_val;       /* world x total_sel decoded values */
  uint8_t *dropped;     /* per rank: payload skipped */
  uint32_t **idx_ptrs;  /* per tensor, for the codec API */
  float **val_ptrs;
} distro__xset;

typedef struct distro__overlap distro__overlap;

typedef struct distro__param {
  char *name;
  float *param;
  const float *grad;
  int ndim;
  int64_t shape[DISTRO__MAX_NDIM];
  int64_t numel;
  distro__tiling tiling;
  distro__dct_plan plan;
  float *mom, *mom_next; /* DeMo momentum in the DCT domain; next is staged until commit.
                            On the CPU stored tile by tile: tile c's h x w coefficients
                            are contiguous at c*h*w (row-major inside the tile), so the
                            step streams it instead of striding a tensor row per tile
                            row; the state file keeps the tensor's layout (state_io.c). */
  float *m, *v;          /* AdamW moments (DisTrO-AdamW: v only, of this rank's own gradient) */
  float *v_next;         /* DisTrO-AdamW with overlap: v staged by the compress
                            phase until the step commits (the gradient is gone
                            by then); NULL otherwise */
  uint32_t *idx;         /* this step's selection (DeMo) */
  float *val;
  float *base;           /* look-ahead overlap: the agreed parameters (equal on
                            every rank); the caller's buffer holds them plus
                            this rank's provisional step. NULL otherwise */
} distro__param;

struct distro_optim {
  distro_options opt;
  distro_comm *comm;
  distro__param *params;
  int nparams, cap;
  int ready;           /* state allocated; tensor list frozen */
  int mom_tiled;       /* mom is tile by tile (the CPU step; the GPU keeps the tensor's layout) */
  int verified;        /* tensor lists agreed across ranks */
  int64_t step;        /* completed steps */
  int64_t max_numel;
  int64_t total_numel;
  distro__tiling *tilings; /* copy of each param's tiling, for the wire */
  distro__wire_layout layout;     /* wire v1 */
  distro__wire2_tensor *w2;       /* wire v2: tilings + ENUM tables */
  distro__enum_table *etabs;      /* one per distinct (chunk elements, k) */
  int n_etabs;
  size_t slot;                    /* largest payload: send size (v1) or bound (v2) */
  size_t *sizes;                  /* per rank: received payload bytes */
  uint8_t *send, *recv;           /* recv: world slots of `slot` bytes */
  int64_t total_sel;              /* kept coefficients per rank, all tensors */
  int64_t *sel_off;               /* per tensor: offset into a rank's selection */
  uint32_t *dec_idx;              /* world x total_sel decoded indices */
  float *dec_val;                 /* world x total_sel decoded values */
  uint32_t **idx_ptrs;            /* per tensor, for the codec API */
  float **val_ptrs;
  uint8_t *dropped;               /* per rank: payload skipped this step */
  /* The tile loops of the DeMo step (demo.c): */
  int64_t *tile_base;             /* nparams + 1: each tensor's first tile in the global order */
  int nws;                        /* threads the step may use: one workspace each */
  int64_t ws_tile;                /* elements of the largest tile */
  size_t ws_bytes;                /* bytes of one workspace */
  uint8_t *ws;                    /* nws workspaces */
  distro__tile_clock *ws_clock;   /* per thread: where a phase's time went */
  float *flat;                  /* AdamW baseline: all gradients + 1 flag */
  distro__overlap *ov;          /* options.overlap: the background exchange (overlap.c) */
};

int distro__uses_adam(const distro_options *o);
distro_status distro__options_check(const distro_options *o);

/* Allocates state once (before the first step or a load). */
distro_status distro__optim_prepare(distro_optim *o);
/* Collective: agrees on the tensor list and on every rank having prepared
 * its state (first step only). */
distro_status distro__optim_verify(distro_optim *o, int local_ok);
/* Index of the first tensor with a non-finite gradient, or -1. */
int distro__first_nonfinite_grad(const distro_optim *o);

/* p <- p(1 - lr wd); m, v <- moments of q; p <- p - lr mhat / (sqrt(vhat) + eps).
 * `t` is the 1-based step for bias correction. Element-wise: deterministic. */
void distro__adamw_update(float *p, float *m, float *v, const float *q, int64_t n, float q_scale,
                          const distro_options *o, float lr, int64_t t);

distro_status distro__demo_step(distro_optim *o, float lr, distro_step_stats *s);
/* The DeMo step's phases (demo.c), for callers that run them apart: compress
 * every tile into the staged momentum and encode this rank's payload
 * (returns its size; 0 with the error set on an internal failure); then,
 * after distro__payload_exchange succeeded, commit the staged momentum and
 * apply the aggregate (cannot fail). */
size_t distro__demo_compress(distro_optim *o, float lr, distro_step_stats *s);
/* The staged state (momentum; with overlap DisTrO-AdamW's moments) becomes
 * current: the step's exchange succeeded. */
void distro__demo_commit(distro_optim *o);
/* The apply phase. agg: apply the aggregate decoded into the optimizer's
 * own set with lr_agg (the step's own lr; with overlap the lr of the step
 * that sent it), to the caller's parameters or, with look-ahead, to the
 * agreed ones (base). With look-ahead it then sets the caller's parameters
 * to base - ahead sign(inverse DCT of this rank's own selection), or to base
 * when ahead is 0. */
void distro__demo_apply(distro_optim *o, int agg, float lr_agg, int64_t t_agg, float ahead, distro_step_stats *s);
/* Bytes of one thread's workspace of the DeMo step for tiles of up to
 * max_tile elements. */
size_t distro__demo_ws_bytes(int64_t max_tile);

/* Payload handling of the DeMo step (payload.c). */
distro_status distro__payload_prepare(distro_optim *o);
void distro__payload_destroy(distro_optim *o);
/* Encodes this rank's selection, or an abort notice when bad_tensor >= 0;
 * returns the payload size (0: encoding failed, which is a bug). */
size_t distro__payload_encode(distro_optim *o, int bad_tensor);
/* A rank that failed locally before its payload was ready (the GPU step's
 * CUDA, cuBLAS or cuFFT errors) still joins this step's exchange, with an
 * abort payload carrying `why`, so every rank fails the step with an error
 * naming it instead of waiting for the missing payload. The caller reports
 * its own error afterwards (distro_last_error is overwritten). */
void distro__payload_join_failed(distro_optim *o, distro_status why, distro_step_stats *s);
/* Exchanges, validates and decodes every rank's payload into dec_idx /
 * dec_val; applies the robust-aggregation options. Changes no state but
 * the receive buffers. */
distro_status distro__payload_exchange(distro_optim *o, size_t size, distro_step_stats *s);
/* The same into `x`, over `comm`, expecting payloads stamped `step`. Reads
 * `o` only (its send buffer, layout and options), so a helper thread can
 * run it while the caller applies the previous aggregate. */
distro_status distro__payload_exchange_into(const distro_optim *o, distro_comm *comm, int64_t step,
                                            distro__xset *x, size_t size, distro_step_stats *s);
/* A second exchange set shaped like the optimizer's (overlap.c); free
 * accepts a zeroed set. */
distro_status distro__xset_alloc(const distro_optim *o, distro__xset *x);
void distro__xset_free(distro__xset *x);
/* The optimizer's own set, as an xset (pointers into it). */
distro__xset distro__xset_own(const distro_optim *o);

/* The one-step-stale step (overlap.c): apply the aggregate of the previous
 * step, compress this one and start its exchange on a helper thread. */
distro_status distro__overlap_init(distro_optim *o);   /* local: buffers, thread */
distro_status distro__overlap_attach(distro_optim *o); /* collective: the private comm */
distro_status distro__overlap_step(distro_optim *o, float lr, distro_step_stats *s);
/* Waits for the exchange in flight, if any, and applies it. */
distro_status distro__overlap_flush(distro_optim *o, distro_step_stats *s);
int distro__overlap_pending(const distro_optim *o);
void distro__overlap_free(distro_optim *o);
/* DisTrO-AdamW's step per element, in units of lr, once the second moment
 * has seen enough steps: p -= DISTRO__ADAMW_SIGN_STEP r_t lr sign(Q), where
 * r_t is RAdam's variance rectification of the second moment at step t
 * (distro__adamw_step_scale; docs/design.md "The step": with r_t the full
 * lr is the step at every size measured, no constant between sizes). */
#define DISTRO__ADAMW_SIGN_STEP 1.0f

/* DISTRO__ADAMW_SIGN_STEP times r_t for the aggregate of step t (1-based):
 * 0 while the second moment's estimate has too few samples for its variance
 * to be defined (t <= 4 at beta2 0.95), rising to 1 as t grows (r_t 0.48 at
 * t = 15, 0.87 at 50, 0.98 at 100 for beta2 0.95). Computed with IEEE
 * multiplies, divides and a square root only, so every rank and device gets
 * the same bits. */
double distro__adamw_step_scale(double beta2, int64_t t);

/* Look-ahead overlap: this rank's provisional step while its exchange is in
 * flight, as a fraction of the update's own step (sign: lr; DisTrO-AdamW:
 * DISTRO__ADAMW_SIGN_STEP lr). Chosen on the demo model (docs/design.md
 * "Overlap"): sign 0.5 / 1.0 / 1.5 gave 2.7007 / 2.6144 / 2.7653 (seed 1);
 * DisTrO-AdamW at 1.0 lost 2.0% to its blocking step over seeds 1-3, at 0.75
 * 0.16% (1.05% over six seeds). */
#define DISTRO__AHEAD_SIGN 1.0f
#define DISTRO__AHEAD_ADAMW 0.75f

/* Clip each peer's values per tensor to a multiple of the median norm. */
int distro__robust_clip(float *const *vals, const uint8_t *dropped, int world, int64_t count, float multiple);
distro_status distro__adamw_step(distro_optim *o, float lr, distro_step_stats *s);

double distro__now(void);

/* State files (state_io.c): one tensor's entry, shared by the optimizer and
 * the DiLoCo state. */
/* A tensor's state arrays in state-file order: DeMo's momentum, then AdamW's
 * m (the baseline only) and v. Returns how many (<= 3); the CUDA optimizer
 * copies its device arrays in the same order. */
typedef enum { DISTRO__STATE_MOM, DISTRO__STATE_M, DISTRO__STATE_V } distro__state_array;
int distro__state_arrays(const distro_options *o, distro__state_array out[3]);
void distro__state_put_tensor(distro__afile *w, const distro__param *p);
distro_status distro__state_check_tensor(distro__rfile *r, const distro__param *p, int i);

#endif
