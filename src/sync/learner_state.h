/* Internal: the learner's state, shared by learner.c (API, training
 * thread), learner_bg.c (background thread: every socket, the join, the
 * state endpoint) and learner_dp.c (data-parallel ranks), and the helpers
 * every one of them uses on it (learner_state.c). */
#ifndef DISTRO_SYNC_LEARNER_STATE_H
#define DISTRO_SYNC_LEARNER_STATE_H

#include <pthread.h>
#include <stdint.h>

#include "sync/sync_internal.h"

#define NPEND 8

enum { J_IDLE, J_HELLO, J_SEEDING, J_PEER, J_FETCH, J_DONE, J_FAILED };

typedef struct ln_out {
  distro__sy_msg m;
  uint8_t *payload;
  uint64_t step;            /* a REPORT's: the step it was made at (the HEARTBEAT sent before it) */
  struct ln_out *next;
} ln_out;

typedef struct ln_tensor {
  char *name;
  float *param;
  int64_t numel;
  unsigned flags;
} ln_tensor;

/* Tests and attack tools only (the library never sets one): rewrites a
 * report before it is encoded. delta = base - theta of fragment p (n
 * floats, fragment-major), base the global copy it was last set from;
 * tokens and steps are what the report claims. */
typedef void (*distro__ln_report_hook)(void *ctx, int p, float *delta, const float *base, int64_t n, uint64_t *tokens,
                                       uint64_t *steps);

typedef struct ln_pend {
  uint64_t round;
  double sec;
} ln_pend;

struct distro_learner {
  distro_learner_options opt;
  char *s_syncer, *s_serve, *s_server_key, *s_keypair, *s_allowed;
  uint8_t *allowed;         /* keys allowed to pull this learner's state (nallowed x 32), from curve_allowed */
  int nallowed;
  ln_tensor *t;
  int nt, cap;
  int64_t total;            /* parameters registered */
  float **tp;
  uint64_t signature;

  /* Shared with the background thread (mu). */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int have_layout;
  distro__sy_layout L;
  int tau;
  float *incoming;          /* latest global copy received, fragment-major */
  uint64_t *in_version;
  uint8_t *in_new;
  uint64_t *in_newest;      /* newest of this learner's rounds merged (+1), from FRAGMENT */
  uint64_t *req_round;      /* REQUEST waiting to be answered, 0 none */
  uint64_t *rej_round;      /* a REPORT rejected (stale, round, payload), 0 none */
  ln_out *out_head, *out_tail;
  int join_state, join_source;
  distro_status join_st;
  char join_msg[DISTRO__SY_MAX_ERROR + 64];
  int stop;
  uint64_t errors, rejoins, bytes_up, bytes_down, forged;
  int last_error, connected;
  double hb_step_s;
  int64_t hb_steps;
  double t_last_merge;      /* a merged fragment (or the join) last arrived */

  /* Training thread only. */
  int started;
  float *base;              /* global copy the parameters were last set from */
  uint64_t *version;
  float *snap;              /* parameters at the last report (keep_local) */
  float *scratch;
  double *tok, *stp, *sec, *rep_tok, *rep_stp;
  int64_t *rep_t;
  int *rep_pending;
  ln_pend *pend;            /* P x NPEND */
  int *npend;
  double useful, wasted;
  double last_call, step_ema;
  int64_t tstep;
  uint64_t reports, applies;

  pthread_t th;
  int th_started, mu_init;

  /* Data-parallel learner (opt.comm): rank 0 talks to the syncer. */
  distro_comm *comm;
  int rank, nranks;
  int fr;                   /* fragmenting and max_block from WELCOME (to lay out the other ranks) */
  int64_t maxb;
  uint64_t tokens;          /* counted since start, all ranks */
  int tps_warned;           /* logged a step over opt.tokens_per_step */
  uint64_t *ctl;            /* control block broadcast by rank 0 every step */
  size_t ctl_words;
  float *stage;             /* the applied fragments' values, packed */
  uint8_t *bc_tmp;          /* size x DISTRO__LN_BCAST_SLOT bytes for the chunked broadcast */
  distro_learner_stats mirror; /* ranks > 0: rank 0's stats of the last step */

  distro__ln_report_hook report_hook; /* NULL: reports are what the learner computed */
  void *report_hook_ctx;
};

/* Installs a report hook (before distro_learner_start; NULL removes it). */
void distro__learner_set_report_hook(distro_learner *l, distro__ln_report_hook fn, void *ctx);

/* A line to the log callback, if any, headed with the learner's id. */
void distro__ln_log(distro_learner *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Per-fragment buffers once the layout is known (under mu). */
distro_status distro__ln_alloc_buffers(distro_learner *l);
void distro__ln_free_buffers(distro_learner *l);

#endif
