/* distro: Decoupled DiLoCo runtime (docs/algorithms.md, docs/protocol.md).
 *
 * A syncer service holds the global copy of every parameter fragment and
 * the outer optimizer state. Learners train on their own and never wait for
 * each other or for the syncer: a background thread uploads outer gradients
 * and downloads merged fragments over ZeroMQ (ROUTER on the syncer, DEALER on
 * the learners). Per fragment the syncer asks every live learner for its
 * outer gradient, waits for a quorum of K reports, spends an adaptive grace
 * window admitting stragglers, merges (token weighting, radial-directional
 * averaging), applies a Nesterov outer step and sends the new fragment back;
 * each learner applies it tau of its own steps after reporting.
 *
 * Learners that die are dropped from the quorum's denominator after a
 * timeout; a new or restarted learner joins by pulling a consistent copy of
 * the global fragments from a healthy peer, checked against the syncer's
 * SHA-256 digests. Every round closes within a bound (merged if its quorum
 * came, abandoned otherwise) and a job without merges is reported. The
 * syncer checkpoints atomically and resumes without any fragment version
 * going backwards.
 *
 * Security (docs/protocol.md, "Threat model"): without CURVE keys anyone
 * who reaches an endpoint can act as a learner, so an endpoint reachable
 * from other machines needs CURVE keys or an explicit `insecure`. A
 * learner that holds a valid key and lies in its reports is bounded by the
 * syncer (clipped reports, capped token weights, capped global steps,
 * quarantine) and, with `robust`, outvoted per element (trimmed mean or
 * median: f hostile reports of n >= 2f + 1).
 *
 * Built only when libzmq is found (DISTRO_WITH_SYNC is then defined). */
#ifndef DISTRO_SYNC_H
#define DISTRO_SYNC_H

#include <stdint.h>
#include <stddef.h>
#include <distro/status.h>
#include <distro/comm.h>
#include <distro/diloco.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reasons carried by ERROR replies (docs/protocol.md). */
typedef enum {
  DISTRO_SYNC_E_NONE = 0,
  DISTRO_SYNC_E_MALFORMED = 1, /* wrong frame count, size, magic, type or field */
  DISTRO_SYNC_E_CRC = 2,       /* CRC32C of header and payload does not match */
  DISTRO_SYNC_E_PROTOCOL = 3,  /* protocol version not spoken */
  DISTRO_SYNC_E_UNKNOWN = 4,   /* learner not joined, timed out, or id owned by another connection or key */
  DISTRO_SYNC_E_SIGNATURE = 5, /* model signature or tensor layout differs */
  DISTRO_SYNC_E_STALE = 6,     /* report based on a version more than max_staleness behind */
  DISTRO_SYNC_E_PAYLOAD = 7,   /* encoded values invalid or non-finite */
  DISTRO_SYNC_E_NOT_READY = 8, /* no global copy yet (another learner seeds it), or busy (rate limit): retry */
  DISTRO_SYNC_E_ROUND = 9,     /* report for a fragment or round that is not open */
  DISTRO_SYNC_E_REFUSED = 10   /* report out of bounds (with out_of_bound REFUSE) or its learner quarantined;
                                  HELLO declaring other tokens per step than its id's */
} distro_sync_error;

/* Static name of an error code ("malformed", "crc", ...). */
DISTRO_API const char *distro_sync_error_name(int code);
/* The distro_status a learner reports when the syncer answers with error
 * `code` (the one mapping of the two: DISTRO_SYNC_E_SIGNATURE ->
 * DISTRO_ERR_SHAPE, MALFORMED/CRC/PAYLOAD -> DISTRO_ERR_PAYLOAD, NOT_READY ->
 * DISTRO_ERR_TIMEOUT, NONE -> DISTRO_OK, the rest -> DISTRO_ERR_INVALID). */
DISTRO_API distro_status distro_sync_error_status(int code);

/* One line per event (merge timeline, rejected message, join, death). The
 * library never prints; tools pass a function that does. Called from the
 * thread that runs the syncer or the learner's background thread. */
typedef void (*distro_sync_log_fn)(void *ctx, const char *line);

/* ---------------------------------------------------------------- syncer */

/* Version 2 added the fields after log_ctx, version 3 the defences against
 * hostile learners, version 4 min_step_s; older structs are accepted (the
 * newer fields then take their defaults). */
#define DISTRO_SYNCER_OPTIONS_VERSION 4

/* The merge rule against hostile learners (docs/protocol.md, "Threat model"). */
typedef enum {
  DISTRO_SYNC_ROBUST_NONE,    /* `merge` (mean, tokens, radial, radial-tokens): one report can move it anywhere
                                 within its bounds */
  DISTRO_SYNC_ROBUST_TRIMMED, /* coordinate-wise trimmed mean: per element, the f largest and f smallest of the
                                 n reports are dropped and the rest averaged (uniform weights: tokens buy no
                                 influence). With at most f hostile reports among n >= 2f + 1, every element lies
                                 within the range of the honest reports' values */
  DISTRO_SYNC_ROBUST_MEDIAN   /* coordinate-wise median: the trimmed mean with f = floor((n - 1) / 2) */
} distro_sync_robust;

/* What happens to a report whose norm is out of bounds. */
typedef enum {
  DISTRO_SYNC_BOUND_CLIP,  /* scaled down to the bound and merged */
  DISTRO_SYNC_BOUND_REFUSE /* left out of the merge (ERROR refused) */
} distro_sync_bound;

typedef struct distro_syncer_options {
  int version;              /* DISTRO_SYNCER_OPTIONS_VERSION */
  const char *endpoint;     /* ZeroMQ bind address ("tcp://127.0.0.1:*" picks a port; ipc://...). Without
                               CURVE only a loopback, ipc or inproc address is served (unless insecure) */
  int fragments;            /* P (1) */
  distro_fragmenting fragmenting; /* BALANCED */
  int64_t max_block;        /* as in distro_diloco_options (0: auto) */
  distro_outer_codec codec; /* how learners upload outer gradients (INT4) */
  int codec_block;          /* 64 */
  distro_merge merge;       /* RADIAL_TOKENS */
  float outer_lr;           /* 0.7 */
  float outer_momentum;     /* 0.9 */
  int nesterov;             /* 1 */
  int quorum;               /* K >= 1 (1); min(K, live learners) when fewer are alive */
  double grace_gamma;       /* safety margin in [0, 1] of the grace window (0.8) */
  int overlap;              /* tau >= 0: learners apply a merged fragment tau steps after reporting (2) */
  int H;                    /* reference inner steps between two syncs of one fragment (24) */
  double interval_s;        /* > 0: fixed seconds between two fragment rounds; 0: H * step / P,
                               step the median moving average of the live learners (0) */
  int max_staleness;        /* S >= 0: a report based on a version up to S merges old is re-anchored
                               at the current copy; older ones are rejected (2) */
  double heartbeat_s;       /* 0.2 */
  double timeout_s;         /* a learner silent this long leaves the quorum (2.0) */
  const char *checkpoint;   /* file written atomically every checkpoint_every merges (NULL: none) */
  int checkpoint_every;     /* N >= 1 (10) */
  int resume;               /* 1: load `checkpoint` at create when it exists (1) */
  const char *curve_keypair; /* the syncer's key file (distro_sync_keygen, mode 0600); NULL: no CURVE */
  const char *curve_allowed; /* file of allowed learner public keys, one Z85 key per line; NULL:
                                any learner that knows the syncer's public key. Needs curve_keypair */
  distro_sync_log_fn log;   /* NULL: silent */
  void *log_ctx;
  /* Version 2. */
  int insecure;             /* 1: serve an endpoint reachable from other machines without CURVE (0) */
  uint64_t signature;       /* != 0: the only model signature accepted (distro_learner_signature); 0: the
                               first learner that seeds fixes the layout (0) */
  int64_t max_params;       /* largest model accepted (parameters); bounds every message's size (0: 2^26) */
  double round_timeout_s;   /* > 0: a round closes at most this long after it opened; 0: auto,
                               max(2 timeout_s, 3 median step times) (0) */
  /* Version 3: hostile learners (docs/protocol.md, "Threat model"). A report
   * is out of bounds when its fragment norm exceeds clip_multiple times the
   * median norm of the round's reports and the fragment's recent accepted
   * ones, or report_max_rel times the fragment's global norm. */
  distro_sync_robust robust; /* NONE */
  int robust_f;             /* TRIMMED: hostile reports tolerated per merge, f >= 1 (0: (quorum - 1) / 2); the
                               syncer refuses a quorum < 2f + 1 (the rule would degenerate) and merges only with
                               at least 2f + 1 reports. MEDIAN: 0 (f then follows the reports merged) */
  distro_sync_bound out_of_bound; /* CLIP */
  double clip_multiple;     /* >= 1, 0: no bound by the median (4) */
  double report_max_rel;    /* > 0, 0: no bound by the global norm (100) */
  double step_max_rel;      /* a merged update whose norm exceeds this times the fragment's global norm is not
                               applied: the last version stays, logged (100; 0: no cap) */
  double weight_cap;        /* token merges: no report's weight above this multiple of the (lower) median
                               weight (2; 0: no cap and no check of the claims). A learner's tokens per step
                               are fixed for the job by its HELLO (distro_learner_options.tokens_per_step;
                               else by its first accepted report), its steps per report bounded by its
                               heartbeat step counter and the elapsed time (docs/protocol.md, "Honest token
                               weights"); a claim beyond them is cut (CLIP) or refused (REFUSE) */
  int quarantine_after;     /* a learner whose reports were out of bounds this many times more than in bounds
                               is quarantined: not asked, its reports refused (3; 0: never) */
  double quarantine_s;      /* how long (60) */
  /* Version 4. */
  double min_step_s;        /* > 0: no learner's step is faster than this (seconds): a report claims at most
                               (elapsed time + timeout_s) / max(min_step_s, a quarter of the learner's fastest
                               claimed step time) + 2H + 8 steps. 0: only the learner's own step times (0) */
} distro_syncer_options;

DISTRO_API distro_syncer_options distro_syncer_options_default(void);

typedef struct distro_syncer distro_syncer;

/* Per merge, passed to the merge callback and summarised in the log. */
typedef struct distro_sync_merge_info {
  int fragment;
  uint64_t version;         /* the fragment's version after the merge */
  uint64_t round;
  int quorum;               /* K in effect (min(K, live)) */
  int live;                 /* learners alive when the round closed */
  int participants;         /* reports merged (late carried-over reports included) */
  uint32_t participant_mask; /* bit m: learner id m (ids < 32) took part */
  double time_to_quorum_s;  /* round opened -> quorum reached */
  double grace_s;           /* grace window granted */
  double waited_s;          /* round opened -> merge started */
  double merge_s;           /* decode, merge, outer step, sends */
  uint64_t bytes_in;        /* report bytes merged */
  uint64_t bytes_out;       /* fragment bytes sent back */
  uint64_t tokens;          /* tokens the merged reports counted (a data-parallel learner's: all its ranks') */
} distro_sync_merge_info;

typedef void (*distro_sync_merge_fn)(void *ctx, const distro_sync_merge_info *info);

typedef struct distro_syncer_stats {
  uint64_t merges;
  uint64_t abandoned;       /* rounds closed at their deadline without a quorum, or left with too few
                               reports after refusals (reports carried over) */
  double no_merge_s;        /* seconds without a merge while learners are live (0 when idle) */
  uint64_t rejected;        /* messages answered with an ERROR */
  uint64_t reports;         /* reports accepted */
  int live;                 /* learners alive now */
  int initialized;          /* a global copy exists */
  uint64_t epoch;           /* incremented at every start (saved in the checkpoint) */
  uint64_t checkpoints;     /* checkpoints written by this process */
  int64_t numel;            /* parameters (0 before the first learner) */
  int fragments;
  double merge_s_max, merge_s_mean;
  uint64_t clipped;         /* reports scaled down to their bound */
  uint64_t refused;         /* reports left out: out of bounds (REFUSE), non-finite, or from a quarantined learner */
  uint64_t capped;          /* token weights or claims cut down (weight_cap, tokens per step, steps) */
  uint64_t steps_skipped;   /* merged updates not applied (step_max_rel) */
  uint64_t quarantines;     /* learners quarantined */
} distro_syncer_stats;

/* What the syncer holds against one learner id (accountability). */
typedef struct distro_syncer_learner_stats {
  int known;                /* the id has said hello */
  int alive;
  uint64_t reports;         /* accepted */
  uint64_t merged;          /* reports merged */
  uint64_t clipped, refused, capped;
  uint64_t quarantines;
  double quarantined_s;     /* > 0: quarantined for this many more seconds */
  double tokens_per_step;   /* fixed for the job: declared in its HELLO, else by its first accepted report
                               (0: none yet) */
  double weight_share;      /* its share in the last merge it took part in */
  double weight_share_max;
} distro_syncer_learner_stats;

/* Checks the options (endpoint syntax and security, key files, that the
 * checkpoint's directory exists and is writable), binds the endpoint and,
 * with resume, loads the checkpoint. Without CURVE on a loopback endpoint
 * it logs a warning: any local process can join. */
DISTRO_API distro_status distro_syncer_create(const distro_syncer_options *o, distro_syncer **out);
/* Optional; call before distro_syncer_run. */
DISTRO_API distro_status distro_syncer_set_merge_callback(distro_syncer *s, distro_sync_merge_fn fn, void *ctx);
/* The bound address (with the port chosen for "*"). */
DISTRO_API const char *distro_syncer_endpoint(const distro_syncer *s);
/* Serves until distro_syncer_stop (from any thread or a signal handler). */
DISTRO_API distro_status distro_syncer_run(distro_syncer *s);
DISTRO_API void distro_syncer_stop(distro_syncer *s);
/* Thread-safe snapshots while run() serves. */
DISTRO_API distro_status distro_syncer_get_stats(distro_syncer *s, distro_syncer_stats *st);
DISTRO_API distro_status distro_syncer_versions(distro_syncer *s, uint64_t *versions, int P);
/* Copies all fragments' global values in parameter order (numel floats) and
 * the version vector (P entries, may be NULL), consistently. */
DISTRO_API distro_status distro_syncer_get_global(distro_syncer *s, float *out, int64_t numel, uint64_t *versions,
                                                  int P);
/* Per-learner counters (thread-safe): refused, clipped, weight share. */
DISTRO_API distro_status distro_syncer_get_learner_stats(distro_syncer *s, int learner_id,
                                                         distro_syncer_learner_stats *st);
/* Writes the checkpoint now. Thread-safe. */
DISTRO_API distro_status distro_syncer_checkpoint(distro_syncer *s);
DISTRO_API void distro_syncer_free(distro_syncer *s); /* accepts NULL */

/* Writes a CURVE keypair: `path` (public and secret key, mode 0600, also
 * when the file existed) and `path`.pub (public key only). Refuses a path
 * that exists as anything but a regular file. */
DISTRO_API distro_status distro_sync_keygen(const char *path);

/* --------------------------------------------------------------- learner */

/* Version 2 added `comm`, version 3 `insecure` and `curve_allowed`, version
 * 4 `tokens_per_step`; older structs are accepted. */
#define DISTRO_LEARNER_OPTIONS_VERSION 4

typedef struct distro_learner_options {
  int version;                 /* DISTRO_LEARNER_OPTIONS_VERSION */
  const char *syncer;          /* the syncer's endpoint */
  int learner_id;              /* >= 0, unique in the job */
  const char *serve_endpoint;  /* where peers pull this learner's state ("tcp://127.0.0.1:*") */
  const char *curve_server_key; /* the syncer's public key file (NULL: no CURVE) */
  const char *curve_keypair;   /* this learner's key file, mode 0600 (needed with curve_server_key); its
                                  serve endpoint uses the same keypair */
  double heartbeat_s;          /* 0.2 */
  double timeout_s;            /* syncer silent this long: say hello again (2.0) */
  double join_timeout_s;       /* distro_learner_start gives up after this (30); each join step (a
                                  peer's state, the syncer's) may take a third of it, at least 3 s */
  int keep_local;              /* 1: on arrival theta <- new global + local progress since the
                                  report (no step is discarded); 0: overwrite with the global copy (1) */
  distro_sync_log_fn log;
  void *log_ctx;
  /* A data-parallel learner: the communicator of its ranks (NULL: one
   * rank). Every rank creates its own distro_learner with its own comm and
   * the same options, registers the same tensors and makes the same calls:
   * distro_learner_start and distro_learner_step are then collective over
   * `comm`. Only rank 0 talks to the syncer (it alone runs the background
   * thread and serves peers); the other ranks get the joined parameters and
   * every merged fragment from rank 0 at the same step, so all ranks of the
   * learner stay bit-identical as long as their inner steps are. The tokens
   * passed to distro_learner_step are summed over the ranks. The comm must
   * be used by the calling thread only (as for distro_optim). */
  distro_comm *comm;
  /* Version 3. */
  int insecure;                /* 1: allow endpoints reachable from other machines without CURVE (0) */
  const char *curve_allowed;   /* file of the public keys allowed to pull this learner's state (the
                                  syncer's allowed-keys file); NULL: any client that knows its key */
  /* Version 4. */
  uint64_t tokens_per_step;    /* the most tokens one distro_learner_step processes, summed over the ranks
                                  (<= 2^53), declared in HELLO: the syncer fixes it for this learner id for
                                  the job (a later HELLO with another value is refused, ERROR refused) and
                                  cuts (or refuses) a report claiming more tokens than this per step. 0: not
                                  declared; the syncer takes the rate of the first report (0) */
} distro_learner_options;

DISTRO_API distro_learner_options distro_learner_options_default(void);

typedef struct distro_learner distro_learner;

typedef struct distro_learner_stats {
  int64_t step;             /* distro_learner_step calls */
  int reported;             /* fragment reported in this call, or -1 */
  int applied;              /* fragments applied in this call */
  uint64_t reports;         /* reports handed to the background thread */
  uint64_t applies;         /* merged fragments applied */
  uint64_t errors;          /* ERROR replies received */
  int last_error;           /* distro_sync_error of the last one */
  uint64_t rejoins;         /* hellos after the first */
  uint64_t bytes_up, bytes_down;
  double goodput;           /* useful step time / resolved step time (1 before any merge) */
  double step_s;            /* moving average of the time between two calls */
  int connected;            /* heard from the syncer within timeout_s */
  int joined_from_peer;     /* 1: start() pulled the state from a peer, 2: from the syncer, 3: seeded it */
  uint64_t tokens;          /* tokens counted since start, summed over the learner's ranks */
  int ranks;                /* the learner's data-parallel ranks (1 without a comm) */
  /* Step time behind goodput (seconds; goodput = useful / (useful + wasted)):
   * useful: its work reached a merge; wasted: its report was rejected or
   * overwritten; pending: not resolved yet (reported and not merged, or not
   * reported): what a crash now would lose. */
  double useful_s, wasted_s, pending_s;
  double no_merge_s;        /* seconds since a merged fragment last arrived (since the join before the first);
                               past a bound the learner logs "no merge for N s" */
  uint64_t forged;          /* peer states refused at the join (digest mismatch or non-finite values) */
} distro_learner_stats;

/* Checks the options, among them the endpoints' syntax (DISTRO_ERR_INVALID
 * names the problem). */
DISTRO_API distro_status distro_learner_create(const distro_learner_options *o, distro_learner **out);
/* Before start: register each parameter tensor (the caller's buffer, numel
 * floats). Flags: DISTRO_DILOCO_PLAIN_MERGE. Every learner registers the
 * same list in the same order (checked through the model signature). A job
 * holds at most 2^29 parameters in 65536 tensors. */
DISTRO_API distro_status distro_learner_add_tensor(distro_learner *l, const char *name, float *param, int64_t numel,
                                                   unsigned flags);
/* The model signature of the tensors registered so far (FNV-1a of names,
 * sizes and flags; 0 with none): what distro_syncer_options.signature pins. */
DISTRO_API uint64_t distro_learner_signature(const distro_learner *l);
/* Starts the background thread and joins: the first learner of a fresh
 * syncer seeds it with its parameters; every other learner overwrites its
 * parameters with a consistent copy of the global fragments pulled from a
 * peer (or from the syncer when no peer is alive). Blocks until joined or
 * join_timeout_s (DISTRO_ERR_TIMEOUT); an ERROR reply (signature) is
 * DISTRO_ERR_SHAPE, ERROR refused (tokens_per_step differs from what the job
 * fixed for this learner id) DISTRO_ERR_INVALID. With a comm it is collective: rank 0 joins, then every
 * rank receives rank 0's parameters and fragment layout; a rank whose
 * tensor list differs from rank 0's fails with DISTRO_ERR_SHAPE on every
 * rank, and rank 0's failure is every rank's. */
DISTRO_API distro_status distro_learner_start(distro_learner *l);
/* Call after every inner optimizer step, `tokens` processed in it (by this
 * rank). Reports the fragments the syncer asked for and applies merged
 * fragments whose tau steps have passed. Never waits for the network (a
 * data-parallel learner's ranks wait for each other: three small
 * collectives, plus the merged fragments' values when some are applied).
 * On every rank of a data-parallel learner the stats are rank 0's. */
DISTRO_API distro_status distro_learner_step(distro_learner *l, uint64_t tokens, distro_learner_stats *st);
DISTRO_API distro_status distro_learner_get_stats(distro_learner *l, distro_learner_stats *st);
/* The fragment count P and the versions of the fragments in the parameters. */
DISTRO_API int distro_learner_fragments(const distro_learner *l);
DISTRO_API distro_status distro_learner_versions(const distro_learner *l, uint64_t *versions, int P);
/* The global copy of tensor `name` (numel floats) as this learner last
 * applied it: each fragment at the version distro_learner_versions gives
 * (the syncer's copy as of this learner's last merges, without its local
 * progress). Any rank of a data-parallel learner. */
DISTRO_API distro_status distro_learner_get_global(const distro_learner *l, const char *name, float *out,
                                                   int64_t numel);
/* Says goodbye, stops the thread. Accepts NULL. */
DISTRO_API void distro_learner_free(distro_learner *l);

#ifdef __cplusplus
}
#endif
#endif
