/* The gradient-ready exchange (options.overlap = DISTRO_OVERLAP_BACKWARD,
 * docs/design.md "Overlap").
 *
 * The step is the blocking one, bit for bit: the same compress, the same
 * decoded payloads, the same apply. Only the payload travels in buckets
 * (runs of consecutive tensors, payload.c), and a bucket leaves as soon as
 * the caller has marked all its gradients final (distro_optim_grad_ready):
 * its tiles are compressed and encoded on the caller's thread, inside
 * backward, and its all-gather runs on a helper thread while backward goes
 * on. distro_optim_step then compresses and sends what is left, waits for
 * every bucket, validates and decodes them all, and applies the aggregate,
 * so nothing is applied before every payload has been checked.
 *
 * What the helper touches: the send buffer (each bucket its own part,
 * written before that bucket is handed over and not again until the step
 * returns), the optimizer's receive buffers (each bucket its own part; the
 * caller reads them only after the helper has reported every bucket), and a
 * private duplicate of the communicator. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/error.h"
#include "optim/optim_internal.h"

struct distro__backward {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int locks;   /* 1: mu initialized, 2: cv too */
  int running; /* the helper thread exists */
  /* Guarded by mu. */
  int *queue;  /* buckets handed over, in order (nbuckets entries) */
  int queued;  /* how many are in the queue */
  int taken;   /* how many the helper has started */
  int done;    /* how many it has finished */
  int quit;
  distro_status st; /* the first failure of the step's gathers */
  char msg[768];
  distro_step_stats bs; /* the gathers' bytes and time */
  /* Set by the caller's thread before a hand-over; the helper reads them. */
  distro_comm *comm; /* private duplicate of the optimizer's comm */
  size_t *size;      /* per bucket: this rank's payload bytes */
  /* Caller's thread only. */
  uint8_t *ready;    /* per tensor: marked final this step */
  int *left;         /* per bucket: tensors not marked yet */
  int *bucket_of;    /* per tensor: its bucket */
  float lr;          /* the lr the buckets sent this step were compressed with */
  distro_step_stats early; /* the compress and encode of buckets sent from
                              grad_ready, reported by the step */
};

static void *helper(void *arg) {
  distro_optim *o = arg;
  distro__backward *bw = o->bw;
  omp_set_num_threads(1); /* the gathers' loops are small: no team beside the caller's */
  pthread_mutex_lock(&bw->mu);
  for (;;) {
    while (bw->taken == bw->queued && !bw->quit) pthread_cond_wait(&bw->cv, &bw->mu);
    if (bw->taken == bw->queued) break;
    const int b = bw->queue[bw->taken++];
    pthread_mutex_unlock(&bw->mu);
    distro_step_stats bs;
    memset(&bs, 0, sizeof bs);
    distro__xset x = distro__xset_own(o);
    const double t0 = distro__now();
    const distro_status st = distro__payload_gather(o, bw->comm, b, &x, bw->size[b], &bs);
    const double dt = distro__now() - t0;
    pthread_mutex_lock(&bw->mu);
    if (st != DISTRO_OK && bw->st == DISTRO_OK) {
      bw->st = st;
      snprintf(bw->msg, sizeof bw->msg, "bucket %d of %d: %s", b + 1, o->nbuckets, distro_last_error());
    }
    bw->bs.bytes_sent += bs.bytes_sent;
    bw->bs.bytes_received += bs.bytes_received;
    bw->bs.seconds_exchange_bg += dt;
    bw->done++;
    pthread_cond_broadcast(&bw->cv);
  }
  pthread_mutex_unlock(&bw->mu);
  return NULL;
}

distro_status distro__backward_init(distro_optim *o) {
  distro_status st = DISTRO_OK;
  distro__backward *bw = calloc(1, sizeof *bw);
  if (!bw) return distro__fail(DISTRO_ERR_NOMEM, "out of memory for the gradient-ready exchange");
  o->bw = bw;
  const size_t n = (size_t)o->nparams, nb = (size_t)o->nbuckets;
  bw->queue = calloc(nb, sizeof *bw->queue);
  bw->size = calloc(nb, sizeof *bw->size);
  bw->left = calloc(nb, sizeof *bw->left);
  bw->ready = calloc(n, 1);
  bw->bucket_of = calloc(n, sizeof *bw->bucket_of);
  if (!bw->queue || !bw->size || !bw->left || !bw->ready || !bw->bucket_of)
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for the gradient-ready exchange");
  for (int b = 0; b < o->nbuckets; b++) {
    const distro__bucket *k = &o->buckets[b];
    bw->left[b] = k->count;
    for (int i = k->first; i < k->first + k->count; i++) bw->bucket_of[i] = b;
  }
  if (pthread_mutex_init(&bw->mu, NULL) != 0) DISTRO_FAIL(DISTRO_ERR_NOMEM, "overlap: cannot create a mutex");
  bw->locks = 1;
  if (pthread_cond_init(&bw->cv, NULL) != 0) DISTRO_FAIL(DISTRO_ERR_NOMEM, "overlap: cannot create a condition variable");
  bw->locks = 2;
  if (pthread_create(&bw->th, NULL, helper, o) != 0)
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "overlap: cannot start the exchange thread");
  bw->running = 1;
  return DISTRO_OK;
fail:
  distro__backward_free(o);
  return st;
}

int distro__backward_marked(const distro_optim *o, int i) { return o->bw && o->bw->ready[i]; }

int distro__backward_in_flight(const distro_optim *o) {
  if (!o->bw) return 0;
  for (int b = 0; b < o->nbuckets; b++)
    if (o->bw->left[b] != o->buckets[b].count) return 1;
  return 0;
}

distro_status distro__backward_begin(distro_optim *o, float lr) {
  distro__backward *bw = o->bw;
  if (bw->queued && lr != bw->lr)
    return distro__fail(DISTRO_ERR_INVALID,
                        "distro_optim_step: lr %g differs from the lr %g given to distro_optim_grad_ready this step "
                        "(the buckets already sent were compressed with it); nothing changed",
                        (double)lr, (double)bw->lr);
  if (bw->comm) return DISTRO_OK;
  distro_status st = distro__comm_dup(o->comm, &bw->comm);
  if (st != DISTRO_OK) return distro__fail(st, "options.overlap: %s", distro_last_error());
  return DISTRO_OK;
}

/* Compresses bucket b (this rank's selection and staged momentum), encodes
 * it, and hands it to the helper. A tensor whose state is not finite, or an
 * encode that did not fit (a bug), still sends a payload: an abort notice,
 * so every rank fails the step at its decode. */
static void send_bucket(distro_optim *o, int b, float lr, distro_step_stats *s) {
  distro__backward *bw = o->bw;
  size_t size = distro__demo_compress_bucket(o, b, lr, s);
  if (size == 0)
    size = o->fmt->encode_abort(o, b, (uint32_t)o->comm->rank, distro__payload_stamp(o, o->step, b),
                                DISTRO_ERR_PAYLOAD, (uint32_t)o->buckets[b].first);
  bw->size[b] = size;
  /* The caller's current timeout, set while the helper is idle (before the
   * step's first bucket), never under a gather in flight. */
  if (bw->queued == 0) bw->comm->timeout_s = o->comm->timeout_s;
  pthread_mutex_lock(&bw->mu);
  bw->queue[bw->queued++] = b;
  pthread_cond_broadcast(&bw->cv);
  pthread_mutex_unlock(&bw->mu);
}

distro_status distro_optim_grad_ready(distro_optim *o, const char *name, float lr) {
  if (!o || !name) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_grad_ready: optimizer or name is NULL");
  if (!(isfinite(lr) && lr >= 0))
    return distro__fail(DISTRO_ERR_INVALID, "distro_optim_grad_ready: lr %g must be finite and >= 0", (double)lr);
  int i = 0;
  while (i < o->nparams && strcmp(o->params[i].name, name) != 0) i++;
  if (i == o->nparams)
    return distro__fail(DISTRO_ERR_INVALID, "distro_optim_grad_ready: no tensor named '%s' is registered", name);
  distro__backward *bw = o->bw;
  /* Other modes, and the first step (the ranks have not agreed on the
   * tensor list yet), send everything from distro_optim_step. */
  if (!bw || !o->verified || !bw->comm) return DISTRO_OK;
  if (bw->ready[i])
    return distro__fail(DISTRO_ERR_INVALID, "distro_optim_grad_ready: '%s' was already marked ready this step", name);
  const int b = bw->bucket_of[i];
  if (bw->left[b] == 1 && bw->queued && lr != bw->lr)
    return distro__fail(DISTRO_ERR_INVALID,
                        "distro_optim_grad_ready('%s'): lr %g differs from the lr %g of this step's other buckets",
                        name, (double)lr, (double)bw->lr);
  if (bw->left[b] == 1 && bw->comm->broken)
    return distro__fail(DISTRO_ERR_TIMEOUT,
                        "an earlier exchange timed out (%.3g s); the optimizer's communicator is unusable, abort "
                        "the job",
                        bw->comm->timeout_s);
  const int caller_threads = omp_get_max_threads();
  if (o->opt.threads > 0) omp_set_num_threads(o->opt.threads);
  if (o->opt.clip_norm > 0) distro__clip_measure(o, i); /* its gradient is final now */
  if (bw->left[b] == 1) { /* the bucket is complete: it leaves now */
    bw->lr = lr;
    send_bucket(o, b, lr, &bw->early);
  }
  if (o->opt.threads > 0) omp_set_num_threads(caller_threads);
  bw->ready[i] = 1;
  bw->left[b]--;
  return DISTRO_OK;
}

/* The step's end: every bucket waited for, the marks cleared. */
static distro_status wait_all(distro_optim *o, distro_step_stats *s) {
  distro__backward *bw = o->bw;
  const double t0 = distro__now();
  distro__comm_hurry(bw->comm, 1);
  pthread_mutex_lock(&bw->mu);
  while (bw->done < bw->queued) pthread_cond_wait(&bw->cv, &bw->mu); /* bounded by the comm's timeout, if set */
  distro__comm_hurry(bw->comm, 0);
  const distro_status st = bw->st;
  s->bytes_sent = bw->bs.bytes_sent;
  s->bytes_received = bw->bs.bytes_received;
  s->seconds_exchange_bg = bw->bs.seconds_exchange_bg;
  s->seconds_exchange += distro__now() - t0;
  memset(&bw->bs, 0, sizeof bw->bs);
  bw->st = DISTRO_OK;
  bw->queued = bw->taken = bw->done = 0;
  pthread_mutex_unlock(&bw->mu);
  memset(bw->ready, 0, (size_t)o->nparams);
  for (int b = 0; b < o->nbuckets; b++) bw->left[b] = o->buckets[b].count;
  if (st != DISTRO_OK)
    return distro__fail(st, "the exchange of step %lld failed (%s); nothing of that step was applied on any rank",
                        (long long)o->step + 1, bw->msg);
  return DISTRO_OK;
}

distro_status distro__backward_step(distro_optim *o, float lr, distro_step_stats *s) {
  distro__backward *bw = o->bw;
  /* What backward did not send leaves now, in bucket order (the same on
   * every rank: the ranks mark their gradients in the same order). */
  for (int b = 0; b < o->nbuckets; b++)
    if (bw->left[b]) send_bucket(o, b, lr, s); /* left 0: sent from grad_ready */
  /* What the buckets sent from grad_ready cost is this step's too. */
  s->seconds_transform += bw->early.seconds_transform;
  s->seconds_topk += bw->early.seconds_topk;
  s->seconds_codec += bw->early.seconds_codec;
  s->seconds_decode += bw->early.seconds_decode;
  memset(&bw->early, 0, sizeof bw->early);
  distro_status st = wait_all(o, s);
  if (st != DISTRO_OK) return st;
  /* Validate and decode every payload before anything is applied (on the
   * private comm, which the helper no longer uses). */
  distro__xset x = distro__xset_own(o);
  st = distro__payload_decode(o, bw->comm, o->step, &x, s);
  if (st != DISTRO_OK) return st;
  distro__demo_commit(o);
  distro__demo_apply(o, 1, lr, o->step + 1, 0.0f, s);
  return DISTRO_OK;
}

void distro__backward_free(distro_optim *o) {
  distro__backward *bw = o->bw;
  if (!bw) return;
  if (bw->running) {
    /* Gathers handed over finish first (their peers are in them too). */
    pthread_mutex_lock(&bw->mu);
    bw->quit = 1;
    pthread_cond_broadcast(&bw->cv);
    pthread_mutex_unlock(&bw->mu);
    pthread_join(bw->th, NULL);
  }
  if (bw->locks > 1) pthread_cond_destroy(&bw->cv);
  if (bw->locks > 0) pthread_mutex_destroy(&bw->mu);
  distro_comm_free(bw->comm);
  free(bw->queue);
  free(bw->size);
  free(bw->left);
  free(bw->ready);
  free(bw->bucket_of);
  free(bw);
  o->bw = NULL;
}
