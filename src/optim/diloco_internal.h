/* Internal: DiLoCo outer-loop state shared by diloco.c and diloco_io.c. */
#ifndef DISTRO_OPTIM_DILOCO_INTERNAL_H
#define DISTRO_OPTIM_DILOCO_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <distro/diloco.h>

#include "optim/fragment.h"

/* Outer payload: header | encoded pieces of the fragment | CRC32C of all
 * before. Integers little-endian.
 *   0 u32 magic "DLC1"   4 u16 version   6 u16 codec    8 u32 learner
 *  12 u32 fragment      16 u64 round (inner steps completed at the send)
 *  24 u64 tokens (the learner's, since the fragment's last send)
 *  32 u64 steps (since the fragment's last send)   40 u64 elements
 *  48 u32 flags (bit 0: abort, no data)            52 u32 codec block */
#define DISTRO__DLC_MAGIC 0x31434c44u
#define DISTRO__DLC_VERSION 1
#define DISTRO__DLC_HEADER 56
#define DISTRO__DLC_FLAG_ABORT 1u

typedef struct distro__diloco_hint {
  char *name;
  int layer;
  unsigned flags;
} distro__diloco_hint;

/* The exchange started last and not yet applied (at most one: tau < H/P). */
typedef struct distro__diloco_pending {
  int active;
  int frag;
  int64_t sent_at, apply_at;
  uint64_t tokens_sent, steps_sent; /* this rank's counters at the send */
} distro__diloco_pending;

struct distro_diloco {
  distro_diloco_options opt;
  distro_optim *inner;
  distro_comm *outer;
  int M, learner;              /* outer size and rank */
  distro__diloco_hint *hints;
  int nhints, hints_cap;

  /* Frozen at prepare (first step, load or query). */
  int ready;
  int nt;                      /* tensors of the inner optimizer */
  int *layer;                  /* nt */
  unsigned *tflags;            /* nt */
  int64_t max_block;           /* effective */
  distro__fragments frags;
  int64_t *offset;             /* P: first step of fragment p's schedule, floor(p H / P) */
  int64_t *piece_elem;         /* npieces: element offset within its fragment */
  size_t *piece_byte;          /* npieces: byte offset within the payload */
  size_t *payload;             /* P: payload bytes */
  size_t max_payload;
  int64_t max_frag;
  float **global, **mom;       /* P arrays of numel[p]: global copy, outer momentum */
  uint8_t *send, *recv;        /* max_payload, M * max_payload */
  float *acc, *dec;            /* max_frag each */
  double *w, *nrm;             /* M: merge weights, radial norms */
  float *coef;                 /* 2M: merge coefficients (outer_merge.h) */
  uint64_t *tokbuf;            /* 4 per inner rank: token agreement */

  /* Progress. */
  int global_init;             /* global copy set (from the parameters or a load) */
  int verified;                /* learners agreed (first step after prepare/load) */
  int64_t t;                   /* inner steps completed */
  uint64_t *tok, *steps;       /* P: this rank's tokens and steps since the last send */
  uint64_t peak_sent, total_sent;
  distro__diloco_pending pending;
  /* Exchange in progress: which fragment and round (read by the worker). */
  int x_frag;
  int64_t x_round;

  /* Progress thread. */
  int th_started, th_stop, job_posted, job_done;
  distro_status job_st;
  char job_msg[512];
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

/* Layout and buffers (local, idempotent). */
distro_status distro__diloco_prepare(distro_diloco *d);
/* Waits for an exchange running on the progress thread; returns its status
 * (DISTRO_OK when nothing was running). The pending record is kept. */
distro_status distro__diloco_wait(distro_diloco *d, double *waited);
/* Hashes used by the learner agreement and stored in the state file. */
uint64_t distro__diloco_options_hash(const distro_diloco *d);
uint64_t distro__diloco_list_hash(const distro_diloco *d);

#endif
