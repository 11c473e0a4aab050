/* Test support: learner processes (tests/support/sync_learner.c) and
 * distro-syncer processes for the syncer tests, with their output parsed
 * on a reader thread. */
#ifndef DISTRO_TEST_SYNC_PROC_H
#define DISTRO_TEST_SYNC_PROC_H

#include <pthread.h>
#include <stdio.h>
#include <sys/types.h>

#define SP_MAXREC 4096
typedef struct sp_proc {
  pid_t pid;
  FILE *out;
  pthread_t th;
  pthread_mutex_t mu;
  int nrec;
  double t[SP_MAXREC];      /* monotonic time of each progress line */
  long step[SP_MAXREC];
  long rss_kb[SP_MAXREC];
  double goodput;           /* of the last progress line */
  int joined_source, done, failed;
  long rejoins, errors;
  char versions[256];
  float *params;            /* right after the join (256-parameter learners) */
  int nparams;
} sp_proc;

/* Starts a learner process: sync_learner EP ID STEPS STEP_MS OFFSET
 * [SERVE_EP [NPARAMS]] (serve_ep NULL: default; nparams 0: 256). */
void sp_spawn_learner(sp_proc *p, const char *ep, int id, int steps, int step_ms, double offset, const char *serve_ep,
                      int nparams);
/* Waits for the process and its reader. */
void sp_reap(sp_proc *p);
void sp_free(sp_proc *p);
/* Steps per second within [t0, t1] from its progress lines (0 if too few). */
double sp_rate(sp_proc *p, double t0, double t1);
/* Largest RSS (kB) a progress line reported within [t0, t1]. */
long sp_max_rss(sp_proc *p, double t0, double t1);

/* distro-syncer with `args` (NULL-terminated) and its stdout in `log`. */
pid_t sp_spawn_syncer(const char *log, const char *const *args);
/* Merge lines of a syncer log: highest version per fragment (v may be NULL,
 * P entries), the epoch line, and the number of merges. */
int sp_read_syncer_log(const char *log, uint64_t *v, int P, unsigned long long *epoch);
/* 1 if a line of the log contains `needle`. */
int sp_log_has(const char *log, const char *needle);
/* VmHWM or VmRSS ("VmHWM:"/"VmRSS:") of a process in kB, -1 if unknown. */
long sp_status_kb(pid_t pid, const char *key);

#endif
