/* Internal: the optimizer's state (struct distro_optim) and the types the
 * step's files share: a registered tensor, an exchange set, a tile clock. */
#ifndef DISTRO_OPTIM_STATE_H
#define DISTRO_OPTIM_STATE_H

#include <stddef.h>
#include <stdint.h>
#include <distro/optim.h>

#include "compress/chunk.h"
#include "compress/dct.h"
#include "compress/wire.h"
#include "compress/wire2.h"
#include "optim/step_rule.h"

#define DISTRO__MAX_NDIM 8


typedef struct {
  double transform, select, decode;
} distro__tile_clock;

/* Where one payload exchange lands: payload.c writes it, the apply phase
 * reads the optimizer's own set. The blocking step exchanges into that set;
 * the overlapped one into a second set (overlap.c), swapped in when the
 * exchange has completed. */
typedef struct distro__xset {
  uint8_t *recv;        /* per bucket, world slots of its `slot` bytes */
  size_t *sizes;        /* per bucket, per rank: received payload bytes */
  uint32_t *dec_idx;    /* world x total_sel decoded indices */
  float *dec_val;       /* world x total_sel decoded values */
  uint8_t *dropped;     /* per rank: payload skipped */
  uint32_t **idx_ptrs;  /* per tensor, for the codec API */
  float **val_ptrs;
} distro__xset;

typedef struct distro__overlap distro__overlap;
typedef struct distro__backward distro__backward;

/* A bucket: tensors [first, first + count) sent as one payload of at most
 * `slot` bytes, at `off` in the send buffer and at world * off in the receive
 * buffer. One bucket holds every tensor unless options.overlap is BACKWARD,
 * whose buckets are exchanged as backward completes them (backward.c). */
typedef struct distro__bucket {
  int first, count;
  size_t slot, off;
} distro__bucket;

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
  float gscale;          /* options.clip_norm: this step's clip of the gradient
                            (1: none), applied as the step reads it (clip.c) */
  double clip_ss;        /* options.clip_norm: this step's squared gradient norm */
  double clip_share;     /* options.clip_norm: its usual share of the whole's (an EMA) */
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
  distro__ramp ramp;   /* DisTrO-AdamW: the caller's lr schedule as seen so far (step_rule.h) */
  double grad_norm;    /* options.clip_norm: the gradient norm of the latest step, -1 before one */
  double spread;       /* the spread of the latest committed aggregate (1 before any): its step
                          and the look-ahead's next provisional step grow with it (step_rule.h) */
  int64_t max_numel;
  int64_t total_numel;
  distro__tiling *tilings; /* copy of each param's tiling, for the wire */
  const struct distro__payload_format *fmt; /* the wire version's entry, set by payload prepare */
  distro__wire_layout layout;     /* wire v1 */
  distro__wire2_tensor *w2;       /* wire v2: tilings + ENUM tables */
  distro__enum_table *etabs;      /* one per distinct (chunk elements, k) */
  int n_etabs;
  size_t slot;                    /* largest payload: send size (v1) or bound (v2); the
                                     sum of the buckets' */
  distro__bucket *buckets;        /* nbuckets, in tensor order (payload.c) */
  int nbuckets;
  size_t *sizes;                  /* per bucket, per rank: received payload bytes */
  uint8_t *send, *recv;           /* recv: each bucket's world slots */
  int64_t total_sel;              /* kept coefficients per rank, all tensors */
  int64_t *sel_off;               /* per tensor: offset into a rank's selection */
  uint32_t *dec_idx;              /* world x total_sel decoded indices */
  float *dec_val;                 /* world x total_sel decoded values */
  uint32_t **idx_ptrs;            /* per tensor, for the codec API */
  float **val_ptrs;
  uint8_t *dropped;               /* per rank: payload skipped this step */
  uint64_t *spread_bits;          /* one bit per coefficient of the largest tile, all
                                     clear between calls (spread.c) */
  /* The tile loops of the DeMo step (demo.c): */
  int64_t *tile_base;             /* nparams + 1: each tensor's first tile in the global order */
  int nws;                        /* threads the step may use: one workspace each */
  int64_t ws_tile;                /* elements of the largest tile */
  size_t ws_bytes;                /* bytes of one workspace */
  uint8_t *ws;                    /* nws workspaces */
  distro__tile_clock *ws_clock;   /* per thread: where a phase's time went */
  float *flat;                  /* AdamW baseline: all gradients + 1 flag */
  distro__overlap *ov;          /* options.overlap LOOKAHEAD or STALE: the background exchange (overlap.c) */
  distro__backward *bw;         /* options.overlap BACKWARD: the bucket exchanges (backward.c) */
};

/* Where rank r's decoded selection of tile c of tensor i starts in
 * dec_idx / dec_val. */
static inline size_t distro__sel_at(const distro_optim *o, int r, int i, int64_t c) {
  return (size_t)r * (size_t)o->total_sel + (size_t)o->sel_off[i] + (size_t)(c * o->tilings[i].k);
}

#endif
