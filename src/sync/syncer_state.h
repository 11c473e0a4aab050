/* Internal: the syncer's state, shared by syncer.c (lifecycle, queries),
 * serve.c (messages from learners), rounds.c (schedule, rounds, merges,
 * liveness), bounds.c and checkpoint.c, and the helpers every one of them
 * uses on it (syncer_state.c). */
#ifndef DISTRO_SYNC_SYNCER_STATE_H
#define DISTRO_SYNC_SYNCER_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "sync/sync_internal.h"

#define DISTRO__SY_MAX_LEARNERS 256
#define DISTRO__SY_NORM_HIST 16

/* What bounds a learner's claimed steps for one fragment (bounds.c): its
 * last accepted report of the fragment, and for the last few versions sent
 * to it, where a report based on that version can start counting. */
#define DISTRO__SY_ANCHORS 4
typedef struct sy_anchor {
  uint64_t version;
  double t, hb;            /* t < 0: unknown (no time bound) */
  int valid;
} sy_anchor;
typedef struct sy_window {
  double rep_t, rep_hb;    /* its last accepted report of the fragment: received when, its step counter then */
  int rep_ok;
  sy_anchor anc[DISTRO__SY_ANCHORS];
  int next;
} sy_window;

typedef struct sy_learner {
  int alive;
  int ready;               /* holds a consistent copy (serves peers) */
  int rejoined;            /* said hello with its state (may UPLOAD newer fragments) */
  uint8_t rid[256];        /* ZeroMQ routing id of its connection */
  size_t rid_n;
  double last_seen;
  double last_fetch;       /* its last FETCH answered */
  double step_s;           /* its moving average of the step time */
  char endpoint[256];      /* where it serves its state */
  char pubkey[41];         /* its CURVE public key (Z85), "" without CURVE; the connection's own key */
  uint64_t reports, merged;
  /* Accountability (bounds.c). */
  uint64_t clipped, refused, capped, quarantines;
  int strikes;             /* out-of-bound reports minus in-bound ones (>= 0) */
  double quarantined_until; /* its reports are refused and it is not asked until then */
  double tokens_per_step;  /* fixed for the job: declared at HELLO, else by its first accepted report (0: none) */
  int tps_declared;        /* tokens_per_step came from a HELLO */
  uint64_t hb_steps;       /* its heartbeat step counter (this connection) */
  double t_start;          /* its process said hello (b = 0) then; < 0: not known (it rejoined with its state) */
  double step_min;         /* the fastest step time it claimed since then (0: none) */
  sy_window *win;          /* per fragment (P), from its first report (NULL: none yet) */
  double share, share_max; /* weight share in its last merge, and the largest */
} sy_learner;

typedef struct sy_report {
  int learner;
  uint64_t round, base;
  double tokens, steps;
  double max_steps;        /* the most steps it may claim (bounds.c, at arrival) */
  double max_by_time;      /* the elapsed time's part of that bound (INFINITY: none) */
  uint8_t *enc;            /* encoded outer gradient (layout.frag_bytes[p]) */
  int late;                /* arrived after its round closed (or its round was abandoned) */
} sy_report;

typedef struct sy_hist {
  uint64_t version;
  int valid;
  float *data;
} sy_hist;

/* SHA-256 of a fragment's values at one version, computed when a joiner
 * needs it (WELCOME) and kept until the version moves on. */
typedef struct sy_digest {
  uint64_t version;
  int valid;
  uint8_t hash[32];
} sy_digest;

typedef struct sy_fragment {
  float *global, *mom;
  uint64_t version;        /* merges applied (or adopted from a learner's upload) */
  uint64_t round;          /* last round opened */
  sy_hist *hist;           /* max_staleness previous versions, slot version % S */
  sy_digest digest[2];     /* of the current and the previous version */
  /* The round in progress. */
  int open;
  double t_open, t_quorum, grace, deadline;
  uint8_t asked[DISTRO__SY_MAX_LEARNERS];
  sy_report *rep;          /* this round's reports and late ones of earlier rounds */
  int nrep, cap;
  double norm_hist[DISTRO__SY_NORM_HIST]; /* norms of recently merged reports (after clipping) */
  int norm_n, norm_next;
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
  int provisional;         /* the layout came from a HELLO whose learner has not seeded yet */
  int seeder;              /* learner asked to seed, -1 none */
  double t_seed_asked;
  distro__sy_layout L;
  sy_fragment *frag;
  float *scratch;          /* 3 x L.maxf */
  float **deltas;          /* decoded reports of the round being merged */
  int deltas_cap;
  sy_learner *learners[DISTRO__SY_MAX_LEARNERS];

  /* Schedule and moving averages. */
  int next_p;
  double next_open;
  double ema_quorum, ema_sync;
  int ema_n;
  double next_hb;
  double t_progress;       /* last merge, or when learners became live with none */
  double next_stall_log;
  double fetch_tokens, fetch_t; /* rate limit of FETCH answers */
  double log_t;            /* rate limit of reject log lines */
  int log_n;
  uint64_t log_dropped;

  /* Counters. */
  uint64_t merges, merges_here, rejected, reports, checkpoints, abandoned;
  uint64_t clipped, refused, capped, steps_skipped, quarantines;
  int live_now;
  double merge_s_max, merge_s_sum;
};

/* A line to the log callback, if any. */
void distro__syncer_log(distro_syncer *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The fragments' state once the layout is known; on failure nothing is
 * left allocated. */
distro_status distro__syncer_alloc_state(distro_syncer *s);
/* Drops the fragments' state and the layout (a provisional layout whose
 * seeder went away). */
void distro__syncer_free_state(distro_syncer *s);
/* Sends m (stamped with the syncer's epoch) and its payload to learner l. */
void distro__syncer_send_to(distro_syncer *s, const sy_learner *l, distro__sy_msg *m, const void *payload);
/* Live learners (ready_only: those that serve their state). */
int distro__syncer_count_live(distro_syncer *s, int ready_only);
/* Fragment F's values at version v, if still kept; else NULL. */
const float *distro__syncer_history(const distro_syncer *s, const sy_fragment *F, uint64_t v);

#endif
