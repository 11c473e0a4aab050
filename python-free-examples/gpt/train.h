/* One training run of the byte-level GPT, data-parallel over distro_comm. */
#ifndef GPT_TRAIN_H
#define GPT_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include <distro/distro.h>

#include "data.h"
#include "model.h"
#include "util.h" /* gpt_optim_kind and the option names */

typedef struct {
  gpt_config model;
  const char *data; /* NULL: the fortunes corpus */

  /* schedule */
  int steps, batch, warmup;
  float lr;          /* peak; warm-up from 0, then cosine down to lr * lr_final */
  float lr_final;
  float clip;        /* global-norm clipping of each rank's local gradient (0: off) */
  int clip_each;     /* the library clips each tensor by its own norm
                        (options.clip_norm = clip) instead */
  float wd, beta1, beta2;
  uint64_t seed;
  gpt_sampling sampling; /* where each rank draws its windows from */

  /* optimizer */
  gpt_optim_kind optim;
  int topk, chunk;
  float decay;       /* DeMo momentum decay */
  distro_values values;
  int overlap_step;  /* DeMo: options.overlap (1 look-ahead, 2 stale, 3 gradient-ready):
                        exchange in the background */

  /* DiLoCo (optim == GPT_OPT_DILOCO): `learners` x `ranks_per_learner` ranks,
   * each learner data-parallel inside with `inner`; the topk/chunk/decay/values
   * settings above apply to a DisTrO inner optimizer. */
  gpt_optim_kind inner;
  int learners, ranks_per_learner;
  distro_diloco_options diloco;

  /* Decoupled DiLoCo (optim == GPT_OPT_DECOUPLED): this run is learner
   * `learner_id` of the job the syncer at `syncer` holds (fragments, H,
   * codec and the outer step are the syncer's settings); its `ranks` are
   * one data-parallel learner with `inner` inside. */
  const char *syncer;
  int learner_id;
  const char *serve_endpoint; /* where peers pull this learner's state (NULL: the library's loopback default) */
  const char *curve_server_key, *curve_keypair; /* CURVE key files (NULL: none) */
  int insecure;               /* 1: no CURVE on a routable address */
  double sync_timeout;        /* > 0: the learner's timeout_s (0: the library's default) */
  double step_delay_ms; /* sleep this long after each step (a slower learner) */
  double time_limit;    /* > 0: stop after this many seconds (at a step all ranks agree on) */
  int start_step;       /* begin the schedule here (a learner restarted mid-run) */

  /* ranks */
  int ranks;         /* in-process ranks (ignored under MPI) */
  double comm_timeout; /* > 0: each collective of the run fails after this many seconds
                          (distro_comm_set_timeout; 0: none) */
  int threads;       /* OpenMP threads per rank; 0: cores / ranks (on this node) */
  int node_ranks;    /* MPI: ranks on this node (0: one) */

  /* output */
  int eval_every, eval_batches, print_every;
  const char *log_path, *save_path, *resume_path;
  const char *tensor_log_path; /* per-tensor figures every tensor_every steps (tensor_log.h) */
  int tensor_every;
  int save_every;    /* also save every N steps (0: only at the end) */
  int stop_after;    /* stop after this step (0: run to `steps`); resume later */
  int quiet;         /* no progress lines */
  const char *label; /* prefix of progress lines */
  int print_checksum;
} train_config;

/* The optimizer of each step: DiLoCo's inner one, or c->optim. */
gpt_optim_kind step_optim_kind(const train_config *c);

/* What rank 0 measured. */
typedef struct {
  int steps_done;
  int nevals;
  int eval_step[1024];
  double eval_loss[1024];     /* periodic evaluations on a fixed subset of the validation split */
  double final_val;           /* the whole validation split, after the last step (NAN if stopped early) */
  double last_train;          /* mean over ranks of the last step's loss */
  double sent_per_step, recv_per_step; /* per rank per step, mean over ranks and steps */
  double peak_sent;           /* the largest per-rank mean of one step */
  uint64_t total_sent, total_recv;     /* all ranks, whole run */
  double wall;                /* seconds, evaluation included */
  double step_seconds;        /* sum of step times (sampling, forward, backward, clip, optimizer) */
  double optim_seconds;       /* sum of distro_step_stats.seconds_total */
  double exchange_seconds;    /* of which in the collective (waiting for peers included) */
  double tokens_per_s;        /* all ranks, training steps only */
  /* Decoupled DiLoCo */
  double goodput;             /* distro_learner_stats.goodput at the end */
  uint64_t applies, reports;  /* merged fragments applied, reports sent */
  double global_val;          /* final validation of the global copy this learner last applied */
  uint64_t checksum;          /* gpt_param_checksum at the end */
  size_t nparams;
  int world;
} train_result;

/* Runs one training run: on `comm` (an MPI communicator: this process is one
 * rank) or, with comm NULL, on cfg->ranks in-process ranks. Progress goes to
 * `out` (rank 0 only), errors to stderr. Returns 0 on success. */
int train_run(const train_config *cfg, const gpt_corpus *data, distro_comm *comm, FILE *out, train_result *res);

#endif
