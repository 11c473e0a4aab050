/* The syncer's state (syncer_state.h): its allocation, and the log line,
 * the send and the queries that every part of the syncer uses on it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "sync/syncer_state.h"

void distro__syncer_log(distro_syncer *s, const char *fmt, ...) {
  if (!s->opt.log) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  s->opt.log(s->opt.log_ctx, line);
}

void distro__syncer_free_state(distro_syncer *s) {
  if (s->frag) {
    for (int p = 0; p < s->L.P; p++) {
      sy_fragment *F = &s->frag[p];
      free(F->global);
      free(F->mom);
      if (F->hist) {
        for (int k = 0; k < s->opt.max_staleness; k++) free(F->hist[k].data);
        free(F->hist);
      }
      for (int i = 0; i < F->nrep; i++) free(F->rep[i].enc);
      free(F->rep);
    }
    free(s->frag);
    s->frag = NULL;
  }
  free(s->scratch);
  s->scratch = NULL;
  for (int i = 0; i < s->deltas_cap; i++) free(s->deltas[i]);
  free(s->deltas);
  s->deltas = NULL;
  s->deltas_cap = 0;
  distro__sy_layout_destroy(&s->L);
  s->have_layout = 0;
  s->initialized = 0;
  s->provisional = 0;
}

distro_status distro__syncer_alloc_state(distro_syncer *s) {
  distro_status st = DISTRO_OK;
  const int P = s->L.P;
  const int64_t maxf = s->L.maxf > 0 ? s->L.maxf : 1;
  s->frag = calloc((size_t)P, sizeof *s->frag);
  if (!s->frag) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  for (int p = 0; p < P; p++) {
    sy_fragment *F = &s->frag[p];
    const int64_t n = s->L.frags.numel[p];
    F->global = calloc((size_t)n, sizeof(float));
    F->mom = calloc((size_t)n, sizeof(float));
    if (s->opt.max_staleness > 0) F->hist = calloc((size_t)s->opt.max_staleness, sizeof *F->hist);
    if (!F->global || !F->mom || (s->opt.max_staleness > 0 && !F->hist))
      DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  }
  s->scratch = malloc(sizeof(float) * (size_t)maxf * 3); /* merged gradient, momentum, previous global */
  if (!s->scratch) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  return DISTRO_OK;
fail:
  distro__syncer_free_state(s);
  return st;
}

void distro__syncer_send_to(distro_syncer *s, const sy_learner *l, distro__sy_msg *m, const void *payload) {
  m->epoch = s->epoch;
  distro__sy_send(s->router, l->rid, l->rid_n, m, payload);
}

int distro__syncer_count_live(distro_syncer *s, int ready_only) {
  int n = 0;
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
    if (s->learners[i] && s->learners[i]->alive && (!ready_only || s->learners[i]->ready)) n++;
  return n;
}

const float *distro__syncer_history(const distro_syncer *s, const sy_fragment *F, uint64_t v) {
  const int S = s->opt.max_staleness;
  if (S == 0) return NULL;
  const sy_hist *h = &F->hist[v % (uint64_t)S];
  return h->valid && h->version == v ? h->data : NULL;
}
