/* Internal: DiLoCo outer-loop state shared by diloco.c and diloco_io.c. */
#ifndef DISTRO_OPTIM_DILOCO_INTERNAL_H
#define DISTRO_OPTIM_DILOCO_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <distro/diloco.h>

#include "compress/dct.h"
#include "compress/outer_codec.h"
#include "compress/outer_sparse.h"
#include "optim/fragment.h"

/* Outer payloads: compress/outer_codec.h (header, dense pieces) and
 * compress/outer_sparse.h (sparse sections). */

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

  /* Sparse outer gradients (diloco_sparse.c), frozen at prepare. */
  distro__sparse_section *sec; /* every fragment's sections, fragment-major */
  int *sec_start;              /* P + 1: fragment p is sec[sec_start[p] .. sec_start[p+1]) */
  distro__dct_plan *plans;     /* per section; set up where sec[i].dct */
  distro__enum_table *etabs;   /* one per distinct (chunk elements, k) */
  int n_etabs;
  int64_t max_sel, max_sec;    /* most selected entries of a fragment; largest section */
  float **ef;                  /* P arrays of numel[p]: error feedback e (DCT sections: coefficients) */
  float *ef_next;              /* max_frag: e after the send in flight, kept if its exchange succeeds */
  float *tx_coef, *tx_scr;     /* the send's DCT (main thread): max_sec; dct_nwork x dct_stride work */
  float *rx_coef, *rx_scr;     /* the same for the merge's inverse DCT (exchange) */
  int64_t dct_stride;          /* floats of FAST DCT work per thread (the largest tile's) */
  int dct_nwork;               /* threads the DCT of a section may use (set at prepare) */
  uint32_t *sel_idx;           /* max_sel: this learner's selection */
  float *sel_val;
  uint32_t *dec_idx;           /* M * max_sel: every learner's decoded selection */
  float *dec_val;
  size_t *sizes;               /* M: received payload sizes */
  size_t send_size;            /* this learner's payload in flight */
  uint64_t x_recv_bytes;       /* the other learners' payload bytes of the last exchange */

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
/* Outer step of fragment p on the merged outer gradient in acc (dec is
 * scratch); replaces the global copy and momentum only if all is finite. */
distro_status distro__diloco_outer_step(distro_diloco *d, int p);

/* Sparse outer gradients (diloco_sparse.c). */
distro_status distro__sparse_options_check(const distro_diloco_options *o);
/* Sections, tables, buffers, error feedback; sets payload[] and max_payload
 * to the bounds. Only with compressor SPARSE. */
distro_status distro__sparse_prepare(distro_diloco *d);
void distro__sparse_free(distro_diloco *d); /* idempotent */
/* Error feedback and selection of fragment p from delta (finite unless
 * `bad`), encoded into d->send; returns its size. */
size_t distro__sparse_send(distro_diloco *d, int p, const float *delta, int bad, uint64_t tokens);
/* The exchange of d->x_frag: all-gather, validate and merge into d->acc;
 * changes no state. After the outer step succeeded, commit takes what this
 * learner sent (as everyone decoded it) out of its error feedback. */
distro_status distro__sparse_exchange(distro_diloco *d);
void distro__sparse_commit(distro_diloco *d);

/* The agreement (diloco_agree.c): collective over the inner comm, then the
 * outer comm; every rank takes part carrying its local failure, and all
 * return the same status. Sets d->verified on success. */
distro_status distro__diloco_verify(distro_diloco *d, distro_status local);

#endif
