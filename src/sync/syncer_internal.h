/* Internal: syncer state shared by syncer.c (lifecycle, queries),
 * serve.c (event loop, rounds, merges) and checkpoint.c. */
#ifndef DISTRO_SYNC_SYNCER_INTERNAL_H
#define DISTRO_SYNC_SYNCER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "sync/sync_internal.h"

#define DISTRO__SY_MAX_LEARNERS 256

typedef struct sy_learner {
  int alive;
  int ready;               /* holds a consistent copy (serves peers) */
  uint8_t rid[256];        /* ZeroMQ routing id of its connection */
  size_t rid_n;
  double last_seen;
  double step_s;           /* its moving average of the step time */
  char endpoint[256];      /* where it serves its state */
  char pubkey[41];         /* its CURVE public key (Z85) for peers, "" without CURVE */
  uint64_t reports, merged;
} sy_learner;

typedef struct sy_report {
  int learner;
  uint64_t round, base;
  double tokens, steps;
  uint8_t *enc;            /* encoded outer gradient (layout.frag_bytes[p]) */
  int late;                /* arrived after its round closed */
} sy_report;

typedef struct sy_hist {
  uint64_t version;
  int valid;
  float *data;
} sy_hist;

typedef struct sy_fragment {
  float *global, *mom;
  uint64_t version;        /* merges applied (or adopted from a learner's upload) */
  uint64_t round;          /* last round opened */
  sy_hist *hist;           /* max_staleness previous versions, slot version % S */
  /* The round in progress. */
  int open;
  double t_open, t_quorum, grace;
  uint8_t asked[DISTRO__SY_MAX_LEARNERS];
  sy_report *rep;          /* this round's reports and late ones of earlier rounds */
  int nrep, cap;
} sy_fragment;

struct distro_syncer {
  distro_syncer_options opt;
  char *ckpt_path;
  char endpoint[512];
  void *ctx, *router, *zap;
  int curve;
  uint8_t *allowed;        /* nallowed x 32-byte public keys */
  int nallowed;
  atomic_int stop;
  pthread_mutex_t mu;      /* guards what the query functions read */
  int mu_init;
  distro_sync_merge_fn merge_fn;
  void *merge_ctx;

  uint64_t epoch;
  int have_layout, initialized;
  int seeder;              /* learner asked to seed, -1 none */
  distro__sy_layout L;
  sy_fragment *frag;
  int64_t maxf;
  float *scratch;          /* 4 x maxf */
  float **deltas;          /* decoded reports of the round being merged */
  int deltas_cap;
  sy_learner *learners[DISTRO__SY_MAX_LEARNERS];

  /* Schedule and moving averages. */
  int next_p;
  double next_open;
  double ema_quorum, ema_sync;
  int ema_n;

  /* Counters. */
  uint64_t merges, merges_here, rejected, reports, checkpoints;
  int live_now;
  double merge_s_max, merge_s_sum;
};

void distro__syncer_log(distro_syncer *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
distro_status distro__syncer_alloc_state(distro_syncer *s);
/* Checkpoint (checkpoint.c): save under s->mu; load at create. */
distro_status distro__syncer_ckpt_save(distro_syncer *s);
distro_status distro__syncer_ckpt_load(distro_syncer *s, int *found);

#endif
