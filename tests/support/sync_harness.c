#define _POSIX_C_SOURCE 200809L
#include "sync_harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double sh_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void sh_sleep(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Temporary directories are removed when the test process exits (each
 * Criterion test runs in its own process); not by forked children. */
static char tmpdirs[8][64];
static int ntmpdirs;
static pid_t tmpdir_owner;

static void remove_tmpdirs(void) {
  if (getpid() != tmpdir_owner) return;
  for (int i = 0; i < ntmpdirs; i++) {
    char cmd[640];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdirs[i]);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdirs[i]);
  }
}

void sh_tmpdir(char *dir, size_t n) {
  snprintf(dir, n, "/tmp/distro-sync-XXXXXX");
  if (!mkdtemp(dir)) {
    dir[0] = 0;
    return;
  }
  if (ntmpdirs == 0) {
    tmpdir_owner = getpid();
    atexit(remove_tmpdirs);
  }
  if (ntmpdirs < 8 && strlen(dir) < sizeof tmpdirs[0]) snprintf(tmpdirs[ntmpdirs++], sizeof tmpdirs[0], "%s", dir);
}

void sh_init(sh_syncer *h, char *ep, size_t n) {
  const int record = h->record_values;
  memset(h, 0, sizeof *h);
  h->record_values = record;
  sh_tmpdir(h->dir, sizeof h->dir);
  snprintf(ep, n, "ipc://%s/s.ipc", h->dir);
}

void sh_options(distro_syncer_options *o, const char *ep, int P) {
  *o = distro_syncer_options_default();
  o->endpoint = ep;
  o->fragments = P;
  o->interval_s = 0.05;
  o->timeout_s = 1.0;
  o->heartbeat_s = 0.1;
}

static void on_merge(void *ctx, const distro_sync_merge_info *info) {
  sh_syncer *h = ctx;
  pthread_mutex_lock(&h->mu);
  if (h->nm < SH_MAX_MERGES) {
    const int k = h->nm;
    h->m[k] = *info;
    h->t_merge[k] = sh_now();
    if (h->record_values) {
      distro_syncer_stats st;
      distro_syncer_get_stats(h->s, &st);
      h->numel = st.numel;
      h->P = st.fragments;
      h->values[k] = malloc(sizeof(float) * (size_t)st.numel);
      h->versions[k] = malloc(sizeof(uint64_t) * (size_t)st.fragments);
      if (h->values[k] && h->versions[k])
        distro_syncer_get_global(h->s, h->values[k], st.numel, h->versions[k], st.fragments);
    }
    h->nm++;
  }
  pthread_mutex_unlock(&h->mu);
}

static void *run_main(void *arg) {
  sh_syncer *h = arg;
  distro_syncer_run(h->s);
  return NULL;
}

distro_status sh_start(sh_syncer *h, const distro_syncer_options *o) {
  if (!h->running && h->nm == 0) pthread_mutex_init(&h->mu, NULL);
  distro_status st = distro_syncer_create(o, &h->s);
  if (st != DISTRO_OK) return st;
  distro_syncer_set_merge_callback(h->s, on_merge, h);
  if (pthread_create(&h->th, NULL, run_main, h) != 0) return DISTRO_ERR_NOMEM;
  h->running = 1;
  return DISTRO_OK;
}

distro_status sh_start_job(sh_syncer *h, char *ep, size_t n, int P) {
  distro_syncer_options o;
  sh_init(h, ep, n);
  sh_options(&o, ep, P);
  return sh_start(h, &o);
}

void sh_stop(sh_syncer *h) {
  if (!h->running) return;
  distro_syncer_stop(h->s);
  pthread_join(h->th, NULL);
  pthread_mutex_lock(&h->mu);
  distro_syncer_free(h->s);
  h->s = NULL;
  pthread_mutex_unlock(&h->mu);
  h->running = 0;
}

int sh_merges(sh_syncer *h) {
  pthread_mutex_lock(&h->mu);
  const int n = h->nm;
  pthread_mutex_unlock(&h->mu);
  return n;
}

int sh_wait_merges(sh_syncer *h, int n, double seconds) {
  for (double t0 = sh_now(); sh_merges(h) < n && sh_now() - t0 < seconds;) sh_sleep(0.05);
  return sh_merges(h);
}

int sh_check_fragment(sh_syncer *h, int p, uint64_t v, const float *full, const int64_t *idx, int64_t n) {
  int r = -1;
  pthread_mutex_lock(&h->mu);
  for (int k = 0; k < h->nm && r < 0; k++) {
    if (!h->values[k] || h->versions[k][p] != v) continue;
    r = 1;
    for (int64_t j = 0; j < n; j++)
      if (memcmp(&h->values[k][idx[j]], &full[idx[j]], sizeof(float)) != 0) {
        if (r) fprintf(stderr, "fragment %d v%llu element %lld: recorded %a, got %a (merge %d)\n", p, (unsigned long long)v, (long long)idx[j], (double)h->values[k][idx[j]], (double)full[idx[j]], k);
        r = 0;
      }
  }
  pthread_mutex_unlock(&h->mu);
  return r;
}

void sh_learner_init(sh_learner *L, const char *endpoint, int id, int n, double target, double step_ms) {
  memset(L, 0, sizeof *L);
  L->endpoint = endpoint;
  L->id = id;
  L->n = n;
  L->target = target;
  L->lr = 0.3;
  L->step_ms = step_ms;
  L->tokens_per_step = 100;
  L->keep_local = 1;
}

static void *learner_main(void *arg) {
  sh_learner *L = arg;
  distro_learner_options o = distro_learner_options_default();
  o.syncer = L->endpoint;
  o.learner_id = L->id;
  o.heartbeat_s = 0.1;
  o.timeout_s = 1.0;
  o.join_timeout_s = 15;
  o.curve_server_key = L->server_key;
  o.curve_keypair = L->keypair;
  o.keep_local = L->keep_local;
  o.log = L->log;
  if (L->serve_endpoint) o.serve_endpoint = L->serve_endpoint;
  o.curve_allowed = L->allowed;
  o.tokens_per_step = L->declared;
  const int nb = L->n / 4, nw = L->n - nb;
  distro_status st = distro_learner_create(&o, &L->l);
  if (st == DISTRO_OK) st = distro_learner_add_tensor(L->l, "w", L->theta, nw, 0);
  if (st == DISTRO_OK) st = distro_learner_add_tensor(L->l, "b", L->theta + nw, nb, 0);
  if (st == DISTRO_OK && L->before_start) L->before_start(L);
  if (st == DISTRO_OK) st = distro_learner_start(L->l);
  L->start_status = st;
  if (st != DISTRO_OK) {
    snprintf(L->start_error, sizeof L->start_error, "%s", distro_last_error());
    distro_learner_free(L->l);
    L->l = NULL;
    atomic_store(&L->started, 1);
    return NULL;
  }
  atomic_store(&L->started, 1);
  for (long t = 0; !atomic_load(&L->stop) && (L->steps == 0 || t < L->steps); t++) {
    for (int i = 0; i < L->n; i++) L->theta[i] -= (float)(L->lr * (L->theta[i] - L->target));
    if (L->step_ms > 0) sh_sleep(L->step_ms * 1e-3);
    distro_learner_step(L->l, L->tokens_per_step, &L->last);
    if (L->after_step) L->after_step(L);
    atomic_store(&L->done, t + 1);
  }
  return NULL;
}

int sh_learner_run(sh_learner *L) {
  if (!L->theta) {
    L->theta = calloc((size_t)L->n, sizeof(float));
    if (!L->theta) return -1;
    for (int i = 0; i < L->n; i++) L->theta[i] = (float)(0.1 * sin(0.7 * i));
  }
  return pthread_create(&L->th, NULL, learner_main, L);
}

distro_status sh_learner_wait_start(sh_learner *L, double seconds) {
  for (double t0 = sh_now(); !atomic_load(&L->started) && sh_now() - t0 < seconds;) sh_sleep(0.01);
  return atomic_load(&L->started) ? L->start_status : DISTRO_ERR_TIMEOUT;
}

void sh_learner_join(sh_learner *L) {
  atomic_store(&L->stop, 1);
  pthread_join(L->th, NULL);
  distro_learner_free(L->l);
  L->l = NULL;
}
