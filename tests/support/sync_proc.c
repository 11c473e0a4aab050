#define _POSIX_C_SOURCE 200809L
#include <stdint.h>

#include "sync_proc.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sync_harness.h"

static void *reader(void *arg) {
  sp_proc *p = arg;
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, p->out) > 0) {
    pthread_mutex_lock(&p->mu);
    long s, e, r, a, rss = -1;
    double g, nm;
    const int k = sscanf(line, "step %ld goodput %lf errors %ld rejoins %ld applies %ld rss %ld no_merge %lf", &s, &g,
                         &e, &r, &a, &rss, &nm);
    if (k >= 5) {
      if (p->nrec < SP_MAXREC) p->t[p->nrec] = sh_now(), p->step[p->nrec] = s, p->rss_kb[p->nrec++] = rss;
      p->rejoins = r;
      p->errors = e;
      p->goodput = g;
    } else if (strncmp(line, "joined source=", 14) == 0) {
      sscanf(line, "joined source=%d versions=%255s", &p->joined_source, p->versions);
    } else if (strncmp(line, "params", 6) == 0) {
      free(p->params);
      p->params = malloc(sizeof(float) * 256);
      char *q = line + 6;
      for (p->nparams = 0; p->params && p->nparams < 256; p->nparams++) {
        char *end;
        const double v = strtod(q, &end);
        if (end == q) break;
        p->params[p->nparams] = (float)v;
        q = end;
      }
    } else if (strncmp(line, "done", 4) == 0) {
      p->done = 1;
    } else if (strncmp(line, "failed", 6) == 0) {
      p->failed = 1;
    }
    pthread_mutex_unlock(&p->mu);
  }
  free(line);
  return NULL;
}

void sp_spawn_learner(sp_proc *p, const char *ep, int id, int steps, int step_ms, double offset, const char *serve_ep,
                      int nparams) {
  memset(p, 0, sizeof *p);
  pthread_mutex_init(&p->mu, NULL);
  int fd[2];
  cr_assert_eq(pipe(fd), 0);
  char a_id[16], a_steps[16], a_ms[16], a_off[32], a_n[16];
  snprintf(a_id, sizeof a_id, "%d", id);
  snprintf(a_steps, sizeof a_steps, "%d", steps);
  snprintf(a_ms, sizeof a_ms, "%d", step_ms);
  snprintf(a_off, sizeof a_off, "%g", offset);
  snprintf(a_n, sizeof a_n, "%d", nparams > 0 ? nparams : 256);
  p->pid = fork();
  cr_assert_geq(p->pid, 0);
  if (p->pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    execl(SYNC_LEARNER_BIN, SYNC_LEARNER_BIN, ep, a_id, a_steps, a_ms, a_off, serve_ep ? serve_ep : "-", a_n,
          (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  p->out = fdopen(fd[0], "r");
  pthread_create(&p->th, NULL, reader, p);
}

void sp_reap(sp_proc *p) {
  waitpid(p->pid, NULL, 0);
  pthread_join(p->th, NULL);
  fclose(p->out);
}

void sp_free(sp_proc *p) {
  free(p->params);
  p->params = NULL;
}

double sp_rate(sp_proc *p, double t0, double t1) {
  pthread_mutex_lock(&p->mu);
  int a = -1, b = -1;
  for (int k = 0; k < p->nrec; k++) {
    if (p->t[k] >= t0 && a < 0) a = k;
    if (p->t[k] <= t1) b = k;
  }
  const double r = a >= 0 && b > a ? (double)(p->step[b] - p->step[a]) / (p->t[b] - p->t[a]) : 0;
  pthread_mutex_unlock(&p->mu);
  return r;
}

long sp_max_rss(sp_proc *p, double t0, double t1) {
  long m = -1;
  pthread_mutex_lock(&p->mu);
  for (int k = 0; k < p->nrec; k++)
    if (p->t[k] >= t0 && p->t[k] <= t1 && p->rss_kb[k] > m) m = p->rss_kb[k];
  pthread_mutex_unlock(&p->mu);
  return m;
}

pid_t sp_spawn_syncer(const char *log, const char *const *args) {
  const char *argv[64];
  int n = 0;
  argv[n++] = SYNC_SYNCER_BIN;
  for (int i = 0; args[i] && n < 63; i++) argv[n++] = args[i];
  argv[n] = NULL;
  const pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    FILE *f = freopen(log, "w", stdout);
    if (!f) _exit(126);
    execv(SYNC_SYNCER_BIN, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

int sp_read_syncer_log(const char *log, uint64_t *v, int P, unsigned long long *epoch) {
  FILE *f = fopen(log, "r");
  cr_assert(f, "no syncer log %s", log);
  char line[2048];
  int merges = 0;
  for (int p = 0; v && p < P; p++) v[p] = 0;
  if (epoch) *epoch = 0;
  while (fgets(line, sizeof line, f)) {
    const char *m = strstr(line, "merge frag=");
    const char *e = strstr(line, "syncer epoch ");
    int frag;
    unsigned long long ver;
    if (m && sscanf(m, "merge frag=%d version=%llu", &frag, &ver) == 2) {
      if (v && frag >= 0 && frag < P && ver > v[frag]) v[frag] = ver;
      merges++;
    }
    if (e && epoch) sscanf(e, "syncer epoch %llu", epoch);
  }
  fclose(f);
  return merges;
}

int sp_log_has(const char *log, const char *needle) {
  FILE *f = fopen(log, "r");
  char line[4096];
  int hit = 0;
  while (f && !hit && fgets(line, sizeof line, f)) hit = strstr(line, needle) != NULL;
  if (f) fclose(f);
  return hit;
}

long sp_status_kb(pid_t pid, const char *key) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long v = -1;
  const size_t n = strlen(key);
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0) v = atol(line + n);
  if (f) fclose(f);
  return v;
}
