/* The overlapped DeMo step (options.overlap, docs/design.md "Overlap").
 *
 * Step t waits for the exchange of step t-1, commits the momentum it staged,
 * compresses and encodes its own gradient, hands the exchange to a helper
 * thread, and only then applies the aggregate of step t-1: the helper's
 * all-gather runs during that apply and during the caller's next forward
 * and backward. The phases are demo.c's and payload.c's, so the arithmetic
 * of the agreed parameters is the blocking step's, one step later. With
 * look-ahead the aggregate lands on the agreed copy (p->base) and the
 * caller's parameters get it plus this rank's provisional step, so that the
 * next gradient is not taken one whole update behind.
 *
 * What the helper touches: the send buffer (written by the encode before the
 * hand-over, not again before the next wait), a second set of receive and
 * decode buffers (swapped with the optimizer's own set once the exchange
 * completed, so the apply reads the finished set while the helper fills the
 * other), and a private duplicate of the communicator (so the caller's own
 * collectives on `comm` never meet ours). Everything else it reads (layout,
 * options, tensor names) does not change after the first step. */
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/error.h"
#include "optim/optim_internal.h"
#include "optim/step_rule.h"

struct distro__overlap {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int locks;   /* 1: mu initialized, 2: cv too */
  int running; /* the helper thread exists */
  /* Guarded by mu. */
  int job;     /* an exchange handed over, not yet taken */
  int done;    /* the exchange finished: st, msg, bs hold its result */
  int quit;
  distro_status st;
  char msg[768];
  distro_step_stats bs;
  /* Set by the caller's thread before the hand-over; the helper only reads
   * them until it reports done. */
  distro_comm *comm; /* private duplicate of the optimizer's comm */
  distro__xset x;    /* where the exchange in flight lands */
  size_t size;       /* this rank's payload bytes */
  int64_t step;      /* the step stamped in the payloads */
  /* Caller's thread only. */
  int pending;       /* an exchange was handed over and not yet waited for */
  int replay;        /* a loaded state's exchange, not yet handed over: its
                        payload is in the send buffer, size and lr below */
  float lr;          /* the lr of the pending step, for its apply */
};

static void *helper(void *arg) {
  distro_optim *o = arg;
  distro__overlap *ov = o->ov;
  /* The exchange's only parallel loop (wire v1 decoding) is small: stay on
   * this thread rather than start a team beside the caller's compute. */
  omp_set_num_threads(1);
  pthread_mutex_lock(&ov->mu);
  for (;;) {
    while (!ov->job && !ov->quit) pthread_cond_wait(&ov->cv, &ov->mu);
    if (!ov->job) break;
    ov->job = 0;
    pthread_mutex_unlock(&ov->mu);
    distro_step_stats bs;
    memset(&bs, 0, sizeof bs);
    const double t0 = distro__now();
    const distro_status st = distro__payload_exchange_into(o, ov->comm, ov->step, &ov->x, ov->size, &bs);
    bs.seconds_exchange_bg = distro__now() - t0;
    pthread_mutex_lock(&ov->mu);
    ov->st = st;
    ov->bs = bs;
    if (st != DISTRO_OK) snprintf(ov->msg, sizeof ov->msg, "%s", distro_last_error());
    ov->done = 1;
    pthread_cond_broadcast(&ov->cv);
  }
  pthread_mutex_unlock(&ov->mu);
  return NULL;
}

distro_status distro__overlap_init(distro_optim *o) {
  distro_status st = DISTRO_OK;
  distro__overlap *ov = calloc(1, sizeof *ov);
  if (!ov) return distro__fail(DISTRO_ERR_NOMEM, "out of memory for the background exchange");
  o->ov = ov;
  DISTRO_CHECK(distro__xset_alloc(o, &ov->x));
  if (pthread_mutex_init(&ov->mu, NULL) != 0) DISTRO_FAIL(DISTRO_ERR_NOMEM, "overlap: cannot create a mutex");
  ov->locks = 1;
  if (pthread_cond_init(&ov->cv, NULL) != 0) DISTRO_FAIL(DISTRO_ERR_NOMEM, "overlap: cannot create a condition variable");
  ov->locks = 2;
  if (pthread_create(&ov->th, NULL, helper, o) != 0)
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "overlap: cannot start the exchange thread");
  ov->running = 1;
  return DISTRO_OK;
fail:
  distro__overlap_free(o);
  return st;
}

distro_status distro__overlap_attach(distro_optim *o) {
  if (o->ov->comm) return DISTRO_OK;
  distro_status st = distro__comm_dup(o->comm, &o->ov->comm);
  if (st != DISTRO_OK) return distro__fail(st, "options.overlap: %s", distro_last_error());
  return DISTRO_OK;
}

int distro__overlap_pending(const distro_optim *o) { return o->ov && (o->ov->pending || o->ov->replay); }

int distro__overlap_in_flight(const distro_optim *o) { return o->ov && o->ov->pending; }

/* Look-ahead: the caller's parameters become the agreed ones (to_caller)
 * or the other way round. */
static void copy_agreed(distro_optim *o, int to_caller) {
  if (o->opt.overlap != DISTRO_OVERLAP_LOOKAHEAD) return;
  for (int i = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    const size_t bytes = sizeof(float) * (size_t)p->numel;
    if (to_caller) memcpy(p->param, p->base, bytes);
    else memcpy(p->base, p->param, bytes);
  }
}

/* The provisional step of look-ahead for this step's lr: DisTrO-AdamW's
 * grows with the spread of the latest committed aggregate, the best guess
 * of the one in flight (a state file keeps it, so a resumed run takes the
 * same provisional step), and so does its fraction of the step
 * (distro__ahead_fraction). */
static float ahead_step(const distro_optim *o, float lr, int64_t t) {
  if (o->opt.update == DISTRO_UPDATE_SIGN) return DISTRO__AHEAD_SIGN * lr;
  const double g = distro__step_growth(o);
  return distro__ahead_fraction(g) * distro__adamw_sign_step(o->opt.beta2, t, lr, &o->ramp, g);
}

int distro__overlap_saved(const distro_optim *o, size_t *size, float *lr) {
  if (!distro__overlap_pending(o)) return 0;
  *size = o->ov->size;
  *lr = o->ov->lr;
  return 1;
}

void distro__overlap_restore(distro_optim *o, const uint8_t *payload, size_t size, float lr) {
  distro__overlap *ov = o->ov;
  ov->replay = payload != NULL;
  if (!payload) return;
  memcpy(o->send, payload, size);
  ov->size = size;
  ov->lr = lr;
  /* Look-ahead: the caller's parameters become this rank's as the saving
   * step left them, the agreed ones minus its provisional step, rebuilt
   * from the saved selection and staged momentum by the same code. */
  if (o->opt.overlap == DISTRO_OVERLAP_LOOKAHEAD) {
    distro_step_stats s;
    memset(&s, 0, sizeof s);
    distro__demo_apply(o, 0, 0.0f, o->step, ahead_step(o, lr, o->step + 1), &s);
  }
}

/* Waits for the exchange in flight; on success its buffers become the
 * optimizer's own set (what the apply reads). Either way nothing is in
 * flight afterwards. Adds the exchange's figures to s. */
static distro_status wait_exchange(distro_optim *o, distro_step_stats *s, int drop_provisional) {
  distro__overlap *ov = o->ov;
  const double t0 = distro__now();
  distro__comm_hurry(ov->comm, 1);
  pthread_mutex_lock(&ov->mu);
  while (!ov->done) pthread_cond_wait(&ov->cv, &ov->mu); /* bounded by the comm's timeout, if set */
  distro__comm_hurry(ov->comm, 0);
  ov->done = 0;
  const distro_status st = ov->st;
  const distro_step_stats bs = ov->bs;
  pthread_mutex_unlock(&ov->mu);
  ov->pending = 0;
  s->seconds_exchange += distro__now() - t0;
  s->seconds_exchange_bg += bs.seconds_exchange_bg;
  s->seconds_codec += bs.seconds_codec;
  s->seconds_decode += bs.seconds_decode;
  s->bytes_sent = bs.bytes_sent;
  s->bytes_received = bs.bytes_received;
  s->peers_dropped = bs.peers_dropped;
  s->peers_dropped_mask = bs.peers_dropped_mask;
  s->peers_clipped = bs.peers_clipped;
  if (st != DISTRO_OK) {
    if (drop_provisional) copy_agreed(o, 1); /* drop the provisional step */
    return distro__fail(st,
                        "the exchange of step %lld (run in the background) failed: %s; nothing of that step was "
                        "applied on any rank, and this call's gradient was not used",
                        (long long)ov->step + 1, ov->msg);
  }
  distro__xset mine = distro__xset_own(o), *x = &ov->x;
  o->recv = x->recv;
  o->sizes = x->sizes;
  o->dec_idx = x->dec_idx;
  o->dec_val = x->dec_val;
  o->dropped = x->dropped;
  o->idx_ptrs = x->idx_ptrs;
  o->val_ptrs = x->val_ptrs;
  *x = mine;
  return DISTRO_OK;
}

/* Say a broken private comm now, not after the next hand-over. */
static distro_status check_comm(const distro_optim *o) {
  const distro__overlap *ov = o->ov;
  if (!ov->pending && ov->comm->broken)
    return distro__fail(DISTRO_ERR_TIMEOUT,
                        "an earlier background exchange timed out (%.3g s); the optimizer's communicator is "
                        "unusable, abort the job",
                        ov->comm->timeout_s);
  return DISTRO_OK;
}

/* Starts the exchange of the payload in the send buffer (size bytes, this
 * step's lr) on the helper thread. */
static void hand_over(distro_optim *o, size_t size, float lr) {
  distro__overlap *ov = o->ov;
  ov->size = size;
  ov->step = o->step;
  ov->lr = lr;
  ov->comm->timeout_s = o->comm->timeout_s; /* the caller's current setting */
  pthread_mutex_lock(&ov->mu);
  ov->job = 1;
  pthread_cond_broadcast(&ov->cv);
  pthread_mutex_unlock(&ov->mu);
  ov->pending = 1;
}

/* A loaded state's exchange (distro__overlap_restore) starts now: every
 * rank resuming from the same save sends again what it had in flight. */
static void replay(distro_optim *o) {
  distro__overlap *ov = o->ov;
  if (!ov->replay) return;
  ov->replay = 0;
  hand_over(o, ov->size, ov->lr);
}

distro_status distro__overlap_step(distro_optim *o, float lr, distro_step_stats *s) {
  distro__overlap *ov = o->ov;
  int apply = 0;
  float lr_prev = 0.0f;
  distro_status cst = check_comm(o);
  if (cst != DISTRO_OK) return cst;
  replay(o);
  if (ov->pending) {
    distro_status st = wait_exchange(o, s, 1);
    if (st != DISTRO_OK) return st;
    distro__demo_commit(o);
    o->step++;
    apply = 1;
    lr_prev = ov->lr;
  } else {
    copy_agreed(o, 0); /* nothing in flight: the caller's parameters are the agreed ones */
  }
  const size_t size = distro__demo_compress(o, lr, s);
  if (size == 0) { /* a bug (the bound did not hold): finish the committed step, start nothing */
    distro__demo_apply(o, apply, lr_prev, o->step, 0.0f, s);
    return DISTRO_ERR_PAYLOAD;
  }
  hand_over(o, size, lr);
  /* The helper reads only the send buffer: the selection in p->idx / p->val
   * stays ours for the provisional step. */
  if (apply || o->opt.overlap == DISTRO_OVERLAP_LOOKAHEAD)
    distro__demo_apply(o, apply, lr_prev, o->step, ahead_step(o, lr, o->step + 1), s);
  return DISTRO_OK;
}

distro_status distro__overlap_flush(distro_optim *o, distro_step_stats *s) {
  distro__overlap *ov = o->ov;
  if (!distro__overlap_pending(o)) return DISTRO_OK;
  distro_status cst = check_comm(o);
  if (cst != DISTRO_OK) return cst;
  replay(o);
  distro_status st = wait_exchange(o, s, 1);
  if (st != DISTRO_OK) return st;
  distro__demo_commit(o);
  o->step++;
  distro__demo_apply(o, 1, ov->lr, o->step, 0.0f, s);
  return DISTRO_OK;
}

/* The external state's wait: a failed exchange also drops the provisional
 * step (look-ahead). */
static distro_status ext_wait(distro_optim *o, const distro__overlap_ext_ops *ops, distro_step_stats *s) {
  distro_status st = wait_exchange(o, s, 0);
  if (st != DISTRO_OK && ops->ahead) {
    char msg[768];
    snprintf(msg, sizeof msg, "%s", distro_last_error());
    distro_status ast = ops->ahead(ops->ctx, 0.0f);
    return ast != DISTRO_OK ? ast : distro__fail(st, "%s", msg);
  }
  return st;
}

distro_status distro__overlap_ext_step(distro_optim *o, const distro__overlap_ext_ops *ops, float lr,
                                       distro_step_stats *s) {
  distro__overlap *ov = o->ov;
  distro_status st = check_comm(o);
  if (st != DISTRO_OK) return st;
  if (ov->pending) {
    st = ext_wait(o, ops, s);
    if (st != DISTRO_OK) return st;
    st = ops->apply(ops->ctx, ov->lr);
    if (st != DISTRO_OK) return st;
    o->step++;
  } else if (ops->agree) {
    st = ops->agree(ops->ctx); /* nothing in flight: the caller's parameters are the agreed ones */
    if (st != DISTRO_OK) return st;
  }
  int bad = -1;
  st = ops->compress(ops->ctx, lr, &bad);
  size_t size = 0;
  if (st == DISTRO_OK) {
    const double t0 = distro__now();
    size = distro__payload_encode(o, bad);
    s->seconds_topk += distro__now() - t0;
    if (size == 0) st = distro__fail(DISTRO_ERR_PAYLOAD, "internal error: the payload did not fit its bound");
  }
  if (st != DISTRO_OK) { /* every rank fails this step at its next wait */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", distro_last_error());
    size = distro__payload_encode_failed(o, st);
    if (size) hand_over(o, size, lr);
    if (ops->ahead) (void)ops->ahead(ops->ctx, 0.0f); /* the caller's parameters: the agreed ones */
    return distro__fail(st, "%s", msg);
  }
  hand_over(o, size, lr);
  /* Look-ahead: the caller's parameters step ahead of the agreed ones while
   * the exchange runs (the selection stays the caller's: the helper reads
   * only the send buffer). */
  if (ops->ahead) return ops->ahead(ops->ctx, ahead_step(o, lr, o->step + 1));
  return DISTRO_OK;
}

distro_status distro__overlap_ext_flush(distro_optim *o, const distro__overlap_ext_ops *ops, distro_step_stats *s) {
  distro__overlap *ov = o->ov;
  if (!ov || !ov->pending) return DISTRO_OK;
  distro_status st = ext_wait(o, ops, s);
  if (st != DISTRO_OK) return st;
  st = ops->apply(ops->ctx, ov->lr);
  if (st != DISTRO_OK) return st;
  o->step++;
  return ops->ahead ? ops->ahead(ops->ctx, 0.0f) : DISTRO_OK;
}

distro_status distro__overlap_ext_fail(distro_optim *o, distro_status why) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", distro_last_error());
  distro__overlap *ov = o->ov;
  if (check_comm(o) == DISTRO_OK) {
    if (ov->pending) {
      distro_step_stats s;
      memset(&s, 0, sizeof s);
      (void)wait_exchange(o, &s, 0);
    }
    const size_t size = distro__payload_encode_failed(o, why);
    if (size) hand_over(o, size, 0.0f);
  }
  return distro__fail(why, "%s", msg);
}

void distro__overlap_free(distro_optim *o) {
  distro__overlap *ov = o->ov;
  if (!ov) return;
  if (ov->running) {
    /* An exchange in flight finishes first (its peers are in it too). */
    pthread_mutex_lock(&ov->mu);
    while (ov->pending && !ov->done) pthread_cond_wait(&ov->cv, &ov->mu);
    ov->quit = 1;
    pthread_cond_broadcast(&ov->cv);
    pthread_mutex_unlock(&ov->mu);
    pthread_join(ov->th, NULL);
  }
  if (ov->locks > 1) pthread_cond_destroy(&ov->cv);
  if (ov->locks > 0) pthread_mutex_destroy(&ov->mu);
  distro_comm_free(ov->comm);
  distro__xset_free(&ov->x);
  free(ov);
  o->ov = NULL;
}
