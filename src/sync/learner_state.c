/* The learner's state (learner_state.h): its per-fragment buffers, the
 * log line and the report hook that every part of the learner uses. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "sync/learner_state.h"

void distro__ln_log(distro_learner *l, const char *fmt, ...) {
  if (!l->opt.log) return;
  char line[768];
  int n = snprintf(line, sizeof line, "learner %d: ", l->opt.learner_id);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  l->opt.log(l->opt.log_ctx, line);
}

distro_status distro__ln_alloc_buffers(distro_learner *l) {
  const int P = l->L.P;
  const size_t N = (size_t)l->L.total;
  int64_t maxf = 1;
  for (int p = 0; p < P; p++)
    if (l->L.frags.numel[p] > maxf) maxf = l->L.frags.numel[p];
  l->incoming = calloc(N, sizeof(float));
  l->base = calloc(N, sizeof(float));
  l->snap = calloc(N, sizeof(float));
  l->scratch = calloc((size_t)maxf, sizeof(float));
  l->in_version = calloc((size_t)P, 8);
  l->in_new = calloc((size_t)P, 1);
  l->in_newest = calloc((size_t)P, 8);
  l->req_round = calloc((size_t)P, 8);
  l->rej_round = calloc((size_t)P, 8);
  l->version = calloc((size_t)P, 8);
  l->tok = calloc((size_t)P, sizeof(double));
  l->stp = calloc((size_t)P, sizeof(double));
  l->sec = calloc((size_t)P, sizeof(double));
  l->rep_tok = calloc((size_t)P, sizeof(double));
  l->rep_stp = calloc((size_t)P, sizeof(double));
  l->rep_t = calloc((size_t)P, sizeof(int64_t));
  l->rep_pending = calloc((size_t)P, sizeof(int));
  l->pend = calloc((size_t)P * NPEND, sizeof(ln_pend));
  l->npend = calloc((size_t)P, sizeof(int));
  if (!l->incoming || !l->base || !l->snap || !l->scratch || !l->in_version || !l->in_new || !l->in_newest ||
      !l->req_round || !l->rej_round || !l->version || !l->tok || !l->stp || !l->sec || !l->rep_tok ||
      !l->rep_stp || !l->rep_t || !l->rep_pending || !l->pend || !l->npend)
    return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  return DISTRO_OK;
}

void distro__ln_free_buffers(distro_learner *l) {
  void *b[] = {l->incoming, l->base, l->snap, l->scratch, l->in_version, l->in_new, l->in_newest, l->req_round,
               l->rej_round, l->version, l->tok, l->stp, l->sec, l->rep_tok, l->rep_stp, l->rep_t, l->rep_pending,
               l->pend, l->npend};
  for (size_t i = 0; i < sizeof b / sizeof *b; i++) free(b[i]);
  distro__sy_layout_destroy(&l->L);
}

void distro__learner_set_report_hook(distro_learner *l, distro__ln_report_hook fn, void *ctx) {
  if (!l) return;
  l->report_hook = fn;
  l->report_hook_ctx = ctx;
}
