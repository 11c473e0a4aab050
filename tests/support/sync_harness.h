/* Test harness for the Decoupled DiLoCo runtime: a syncer on a thread, a
 * recorder of every merge (and of every fragment version's values), and
 * quadratic learners on threads. */
#ifndef DISTRO_TEST_SYNC_HARNESS_H
#define DISTRO_TEST_SYNC_HARNESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <distro/distro.h>

#define SH_MAX_MERGES 4096
typedef struct sh_syncer {
  distro_syncer *s;
  pthread_t th;
  int running;
  char dir[256];                 /* temporary directory (ipc endpoints, checkpoints) */
  pthread_mutex_t mu;
  int nm;
  distro_sync_merge_info m[SH_MAX_MERGES];
  double t_merge[SH_MAX_MERGES]; /* monotonic time of each merge */
  /* Every (fragment, version) seen: full parameter snapshots when record_values. */
  int record_values;
  int64_t numel;
  int P;
  float *values[SH_MAX_MERGES];
  uint64_t *versions[SH_MAX_MERGES];
} sh_syncer;

double sh_now(void);
void sh_sleep(double s);
/* mkdtemp under /tmp. */
void sh_tmpdir(char *dir, size_t n);
/* Zeroes h (but record_values), makes its temporary directory and writes
 * "ipc://DIR/s.ipc" to ep. */
void sh_init(sh_syncer *h, char *ep, size_t n);
/* Default options for a test job on ep: P fragments, a round every 50 ms,
 * learners time out after 1 s, heartbeats every 0.1 s. */
void sh_options(distro_syncer_options *o, const char *ep, int P);
/* sh_init, sh_options(P), sh_start. */
distro_status sh_start_job(sh_syncer *h, char *ep, size_t n, int P);
/* Creates the syncer (recording merges) and runs it on a thread. */
distro_status sh_start(sh_syncer *h, const distro_syncer_options *o);
/* Stops and frees the syncer (like a crash: no final checkpoint). */
void sh_stop(sh_syncer *h);
int sh_merges(sh_syncer *h);
/* Waits up to `seconds` for n merges in all; returns the count. */
int sh_wait_merges(sh_syncer *h, int n, double seconds);
/* 1 if the snapshot of fragment p at version v was recorded and equals x
 * (the fragment's elements taken from the full vector `full`), 0 if it
 * differs, -1 if that version was never seen. */
int sh_check_fragment(sh_syncer *h, int p, uint64_t v, const float *full, const int64_t *frag_idx, int64_t n);

/* A quadratic learner on a thread: theta_i <- theta_i - lr (theta_i - target_i). */
typedef struct sh_learner {
  const char *endpoint;
  int id;
  int n;                 /* parameters: tensors "w" (n - n/4) and "b" (n/4) */
  float *theta;
  double target;         /* every element's optimum for this learner */
  double lr;
  double step_ms;
  uint64_t tokens_per_step;
  int steps;             /* 0: until stop */
  atomic_int stop;
  atomic_long done;      /* steps completed */
  distro_status start_status;
  char start_error[512];
  distro_learner_stats last;
  distro_learner *l;     /* valid while running */
  pthread_t th;
  int keep_local;
  const char *server_key, *keypair; /* CURVE (NULL: plain) */
  distro_sync_log_fn log;           /* NULL: silent */
  const char *serve_endpoint;       /* NULL: the default */
  const char *allowed;              /* curve_allowed of its state endpoint (NULL: any key) */
  uint64_t declared;                /* options' tokens_per_step, declared at HELLO (0: none) */
  /* Optional: called before distro_learner_start (a test installs a report
   * hook), and after every step. */
  void (*before_start)(struct sh_learner *L);
  void (*after_step)(struct sh_learner *L);
  void *ctx;                        /* for them */
  atomic_int started;               /* distro_learner_start returned (start_status) */
} sh_learner;

void sh_learner_init(sh_learner *L, const char *endpoint, int id, int n, double target, double step_ms);
int sh_learner_run(sh_learner *L);  /* starts the thread */
/* Waits up to `seconds` for distro_learner_start to return; its status. */
distro_status sh_learner_wait_start(sh_learner *L, double seconds);
void sh_learner_join(sh_learner *L); /* sets stop, joins, frees */

#endif
