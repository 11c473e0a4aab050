/* The DeMo step's payloads: encode this rank's selection, exchange,
 * validate and decode every rank's payload (through the format chosen at
 * prepare, payload_format.c), and the robust
 * aggregation options. Every rank decodes the same bytes the same way, so
 * the decoded arrays, and everything computed from them, agree bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "compress/frame.h"
#include "common/error.h"
#include "optim/optim_internal.h"

/* The buckets: one holding every tensor, or with options.overlap BACKWARD
 * up to DISTRO__BUCKETS runs of consecutive tensors of about equal bound,
 * each sent as backward completes it (backward.c). A few buckets suffice to
 * hide the exchange behind the rest of backward; each costs a collective
 * (a round trip) and a payload header. */
#define DISTRO__BUCKETS 4
static distro_status make_buckets(distro_optim *o) {
  const int n = o->nparams;
  const int want = o->opt.overlap == DISTRO_OVERLAP_BACKWARD ? (n < DISTRO__BUCKETS ? n : DISTRO__BUCKETS) : 1;
  o->buckets = calloc((size_t)want, sizeof *o->buckets);
  if (!o->buckets) return distro__fail(DISTRO_ERR_NOMEM, "out of memory for the payload buckets");
  o->nbuckets = want;
  if (want == 1) {
    o->buckets[0] = (distro__bucket){0, n, o->slot, 0};
    return DISTRO_OK;
  }
  /* Cut where the running share of the selections passes b / want. */
  int first = 0, nb = 0;
  size_t most = 0;
  int64_t run = 0;
  for (int i = 0; i < n; i++) {
    run += o->tilings[i].nchunks * o->tilings[i].k;
    const int last = i == n - 1;
    if (!last && run * want < o->total_sel * (nb + 1) && n - 1 - i > want - 1 - nb) continue;
    if (!last && nb == want - 1) continue;
    uint64_t bytes = 0;
    distro_status st = o->fmt->bound(o->tilings + first, i + 1 - first, o->opt.values, &bytes);
    if (st != DISTRO_OK) return st;
    o->buckets[nb++] = (distro__bucket){first, i + 1 - first, (size_t)bytes, 0};
    if ((size_t)bytes > most) most = (size_t)bytes;
    first = i + 1;
  }
  /* Every bucket gets the largest one's slot: a rank whose buckets go out
   * in another order than its peers' then cannot overrun a receive slot
   * (the stamps tell the step that the order differed). */
  for (int b = 0; b < nb; b++) {
    o->buckets[b].slot = most;
    o->buckets[b].off = (size_t)b * most;
  }
  o->nbuckets = nb;
  o->slot = (size_t)nb * most;
  return DISTRO_OK;
}

distro_status distro__payload_prepare(distro_optim *o) {
  distro_status st = DISTRO_OK;
  const int n = o->nparams, world = o->comm->size;
  o->sel_off = malloc(sizeof(int64_t) * (size_t)n);
  o->idx_ptrs = malloc(sizeof(uint32_t *) * (size_t)n);
  o->val_ptrs = malloc(sizeof(float *) * (size_t)n);
  o->dropped = calloc((size_t)world, 1);
  if (!o->sel_off || !o->idx_ptrs || !o->val_ptrs || !o->dropped)
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for payload bookkeeping");
  o->total_sel = 0;
  for (int i = 0; i < n; i++) {
    o->sel_off[i] = o->total_sel;
    o->total_sel += o->tilings[i].nchunks * o->tilings[i].k;
  }
  o->fmt = distro__payload_format_of(o->opt.wire_version);
  if (!o->fmt) DISTRO_FAIL(DISTRO_ERR_INVALID, "wire_version %d is not known", o->opt.wire_version);
  DISTRO_CHECK(o->fmt->prepare(o));
  DISTRO_CHECK(make_buckets(o));
  o->sizes = calloc((size_t)world * (size_t)o->nbuckets, sizeof(size_t));
  o->send = malloc(o->slot);
  o->recv = malloc(o->slot * (size_t)world);
  o->dec_idx = malloc(sizeof(uint32_t) * (size_t)(o->total_sel * world));
  o->dec_val = malloc(sizeof(float) * (size_t)(o->total_sel * world));
  int64_t most = 1;
  for (int i = 0; i < n; i++)
    if (o->tilings[i].chunk_elems > most) most = o->tilings[i].chunk_elems;
  o->spread_bits = calloc((size_t)((most + 63) / 64), sizeof(uint64_t));
  if (!o->sizes || !o->send || !o->recv || !o->dec_idx || !o->dec_val || !o->spread_bits)
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for payload buffers (%zu bytes per rank)", o->slot);
  return DISTRO_OK;
fail:
  distro__payload_destroy(o);
  return st;
}

void distro__payload_destroy(distro_optim *o) {
  distro__wire_layout_destroy(&o->layout);
  for (int e = 0; e < o->n_etabs; e++) distro__enum_table_destroy(&o->etabs[e]);
  free(o->etabs);
  free(o->w2);
  free(o->sel_off);
  free(o->idx_ptrs);
  free(o->val_ptrs);
  free(o->sizes);
  free(o->dropped);
  free(o->send);
  free(o->recv);
  free(o->dec_idx);
  free(o->dec_val);
  free(o->spread_bits);
  free(o->buckets);
  o->buckets = NULL;
  o->nbuckets = 0;
  o->spread_bits = NULL;
  o->etabs = NULL;
  o->n_etabs = 0;
  o->w2 = NULL;
  o->sel_off = NULL;
  o->idx_ptrs = NULL;
  o->val_ptrs = NULL;
  o->sizes = NULL;
  o->dropped = NULL;
  o->send = o->recv = NULL;
  o->dec_idx = NULL;
  o->dec_val = NULL;
}

uint64_t distro__payload_stamp(const distro_optim *o, int64_t step, int b) {
  return (uint64_t)step * (uint64_t)o->nbuckets + (uint64_t)b;
}

size_t distro__payload_encode_bucket(distro_optim *o, int b, int bad_tensor) {
  const uint32_t rank = (uint32_t)o->comm->rank;
  const uint64_t stamp = distro__payload_stamp(o, o->step, b);
  if (bad_tensor >= 0) return o->fmt->encode_abort(o, b, rank, stamp, DISTRO_ERR_NONFINITE, (uint32_t)bad_tensor);
  return o->fmt->encode(o, b, rank, stamp);
}

size_t distro__payload_encode(distro_optim *o, int bad_tensor) { return distro__payload_encode_bucket(o, 0, bad_tensor); }

size_t distro__payload_encode_failed(distro_optim *o, distro_status why) {
  return o->fmt->encode_abort(o, 0, (uint32_t)o->comm->rank, distro__payload_stamp(o, o->step, 0), (uint32_t)why, 0);
}

void distro__payload_join_failed(distro_optim *o, distro_status why, distro_step_stats *s) {
  const size_t size = distro__payload_encode_failed(o, why);
  if (size) (void)distro__payload_exchange(o, size, s); /* fails on every rank, here too */
}

/* Validates and decodes rank r's payloads, one per bucket, into its rows of
 * x's dec_idx / dec_val; bucket b's must be stamped with step_want's stamp
 * for b (so no bucket can stand in for another, or for another step's). */
static distro_status decode_one(const distro_optim *o, distro__xset *x, int64_t step_want, int r, int *aborted,
                                uint32_t *why, uint32_t *tensor) {
  const size_t world = (size_t)o->comm->size;
  uint32_t *ri = x->dec_idx + (size_t)r * (size_t)o->total_sel;
  float *rv = x->dec_val + (size_t)r * (size_t)o->total_sel;
  for (int i = 0; i < o->nparams; i++) {
    x->idx_ptrs[i] = ri + o->sel_off[i];
    x->val_ptrs[i] = rv + o->sel_off[i];
  }
  for (int b = 0; b < o->nbuckets; b++) {
    const distro__bucket *k = &o->buckets[b];
    const uint8_t *buf = x->recv + world * k->off + (size_t)r * k->slot;
    const size_t size = x->sizes[(size_t)b * world + (size_t)r];
    uint32_t sender;
    uint64_t stamp;
    const uint64_t want = distro__payload_stamp(o, step_want, b);
    if (o->nbuckets > 1 && size >= DISTRO__WIRE_HEADER) {
      /* Another bucket of this step in b's place fails its layout checks
       * below; say the likely cause first (this only rejects). */
      distro__wire_read_origin(buf, &sender, &stamp);
      if (stamp != want && stamp / (uint64_t)o->nbuckets == (uint64_t)step_want)
        return distro__fail(DISTRO_ERR_PAYLOAD,
                            "payload from rank %d: bucket %llu of step %lld arrived where bucket %d was expected "
                            "(the ranks marked gradients ready in another order: distro_optim_grad_ready)",
                            r, (unsigned long long)(stamp % (uint64_t)o->nbuckets), (long long)step_want, b);
    }
    distro_status st = o->fmt->decode(o, b, buf, size, r, aborted, why, tensor, x->idx_ptrs, x->val_ptrs);
    if (st != DISTRO_OK || *aborted) return st;
    distro__wire_read_origin(buf, &sender, &stamp);
    if (sender != (uint32_t)r || stamp != want) {
      if (o->nbuckets == 1)
        return distro__fail(DISTRO_ERR_PAYLOAD,
                            "payload from rank %d: stamped rank %u step %llu, expected step %lld (ranks out of step?)",
                            r, sender, (unsigned long long)stamp, (long long)step_want);
      return distro__fail(DISTRO_ERR_PAYLOAD,
                          "payload from rank %d: stamped rank %u step %llu bucket %llu, expected step %lld bucket %d "
                          "(ranks out of step?)",
                          r, sender, (unsigned long long)(stamp / (uint64_t)o->nbuckets),
                          (unsigned long long)(stamp % (uint64_t)o->nbuckets), (long long)step_want, b);
    }
  }
  return DISTRO_OK;
}

int distro__robust_clip(float *const *vals, const uint8_t *dropped, int world, int64_t count, float multiple) {
  double *norms = malloc(sizeof(double) * 2 * (size_t)world), *sorted = norms + world;
  int live = 0, clipped = 0;
  if (!norms) return -1;
  for (int r = 0; r < world; r++) {
    double s = 0;
    for (int64_t j = 0; j < count; j++) s += (double)vals[r][j] * vals[r][j];
    norms[r] = sqrt(s);
    if (!dropped[r]) sorted[live++] = norms[r];
  }
  /* Median of the live peers' norms (lower median for an even count), by
   * insertion sort: world is small and the order must not depend on timing. */
  for (int i = 1; i < live; i++)
    for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
      double t = sorted[j];
      sorted[j] = sorted[j - 1];
      sorted[j - 1] = t;
    }
  const double cap = live ? multiple * sorted[(live - 1) / 2] : 0;
  for (int r = 0; r < world; r++) {
    if (dropped[r] || norms[r] <= cap) continue;
    const float scale = (float)(cap / norms[r]);
    for (int64_t j = 0; j < count; j++) vals[r][j] *= scale;
    clipped++;
  }
  free(norms);
  return clipped;
}

distro__xset distro__xset_own(const distro_optim *o) {
  distro__xset x = {o->recv, o->sizes, o->dec_idx, o->dec_val, o->dropped, o->idx_ptrs, o->val_ptrs};
  return x;
}

distro_status distro__xset_alloc(const distro_optim *o, distro__xset *x) {
  const size_t world = (size_t)o->comm->size, n = (size_t)o->nparams, all = (size_t)o->total_sel * world + 1;
  memset(x, 0, sizeof *x);
  x->recv = malloc(o->slot * world);
  x->sizes = calloc(world * (size_t)o->nbuckets, sizeof(size_t));
  x->dec_idx = malloc(sizeof(uint32_t) * all);
  x->dec_val = malloc(sizeof(float) * all);
  x->dropped = calloc(world, 1);
  x->idx_ptrs = malloc(sizeof(uint32_t *) * n);
  x->val_ptrs = malloc(sizeof(float *) * n);
  if (x->recv && x->sizes && x->dec_idx && x->dec_val && x->dropped && x->idx_ptrs && x->val_ptrs)
    return DISTRO_OK;
  distro__xset_free(x);
  return distro__fail(DISTRO_ERR_NOMEM, "out of memory for a second set of exchange buffers (%zu bytes per rank)",
                      o->slot);
}

void distro__xset_free(distro__xset *x) {
  free(x->recv);
  free(x->sizes);
  free(x->dec_idx);
  free(x->dec_val);
  free(x->dropped);
  free(x->idx_ptrs);
  free(x->val_ptrs);
  memset(x, 0, sizeof *x);
}

distro_status distro__payload_exchange(distro_optim *o, size_t size, distro_step_stats *s) {
  distro__xset x = distro__xset_own(o);
  return distro__payload_exchange_into(o, o->comm, o->step, &x, size, s);
}

distro_status distro__payload_exchange_into(const distro_optim *o, distro_comm *comm, int64_t step,
                                            distro__xset *x, size_t size, distro_step_stats *s) {
  s->bytes_sent = s->bytes_received = 0;
  distro_status st = distro__payload_gather(o, comm, 0, x, size, s);
  return st != DISTRO_OK ? st : distro__payload_decode(o, comm, step, x, s);
}

distro_status distro__payload_gather(const distro_optim *o, distro_comm *comm, int b, distro__xset *x, size_t size,
                                     distro_step_stats *s) {
  const int world = comm->size, rank = comm->rank;
  const distro__bucket *k = &o->buckets[b];
  size_t *sizes = x->sizes + (size_t)b * (size_t)world;
  const double t0 = distro__now();
  distro_status st = o->fmt->gather(o, comm, b, size, x->recv + (size_t)world * k->off, sizes);
  s->seconds_exchange += distro__now() - t0;
  if (st != DISTRO_OK) return st;
  if (o->opt.wire_version != 1 && comm->gatherv_pads) { /* what crosses: every slot whole, and its size */
    s->bytes_sent += k->slot + sizeof(uint64_t);
    s->bytes_received += (uint64_t)(world - 1) * (k->slot + sizeof(uint64_t));
    return DISTRO_OK;
  }
  s->bytes_sent += size;
  for (int r = 0; r < world; r++)
    if (r != rank) s->bytes_received += sizes[r];
  return DISTRO_OK;
}

distro_status distro__payload_decode(const distro_optim *o, distro_comm *comm, int64_t step, distro__xset *x,
                                     distro_step_stats *s) {
  distro_status st = DISTRO_OK;
  const int world = comm->size;
  const double t1 = distro__now();

  /* Validate and decode everything before anything is applied. A payload
   * that fails validation fails the step on every rank, or, with
   * drop_invalid_peers, is skipped by every rank alike. */
  for (int r = 0; r < world; r++) x->dropped[r] = 0;
  const double tdec = distro__now();
  int abort_rank = -1;
  uint32_t abort_tensor = 0, abort_why = DISTRO_ERR_NONFINITE;
  for (int r = 0; r < world; r++) {
    int aborted = 0;
    uint32_t why = 0, tensor = 0;
    distro_status dst = decode_one(o, x, step, r, &aborted, &why, &tensor);
    if (dst == DISTRO_OK && aborted) {
      if (abort_rank < 0) {
        abort_rank = r;
        abort_tensor = tensor;
        abort_why = why;
      }
      continue;
    }
    if (dst != DISTRO_OK) {
      if (!o->opt.drop_invalid_peers) {
        st = dst;
        goto fail;
      }
      x->dropped[r] = 1; /* our own payload too, when it did not survive */
    }
  }
  s->seconds_codec += distro__now() - tdec;
  if (o->opt.drop_invalid_peers) {
    /* Receivers can disagree (a payload damaged on one link only): agree on
     * the union of what anyone dropped, and on whether anyone must abort. */
    const size_t rec = (size_t)world + 1;
    uint8_t *mine = malloc(rec), *all = malloc(rec * (size_t)world);
    if (!mine || !all) {
      free(mine);
      free(all);
      DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
    }
    mine[0] = abort_rank >= 0;
    memcpy(mine + 1, x->dropped, (size_t)world);
    distro_status ast = comm->ops->allgather(comm, mine, rec, all);
    for (int q = 0; q < world && ast == DISTRO_OK; q++) {
      if (all[q * rec] && abort_rank < 0) abort_rank = q; /* q saw an abort notice; report q */
      for (int r = 0; r < world; r++) x->dropped[r] |= all[q * rec + 1 + (size_t)r];
    }
    free(mine);
    free(all);
    DISTRO_CHECK(ast);
  }
  if (abort_rank >= 0 && abort_why != DISTRO_ERR_NONFINITE) /* a local failure (the GPU step's) */
    DISTRO_FAIL(DISTRO_ERR_COMM, "rank %d could not step: it failed locally (%s); nothing was applied", abort_rank,
                distro_status_string((distro_status)abort_why));
  if (abort_rank >= 0) {
    const char *name = abort_tensor < (uint32_t)o->nparams ? o->params[abort_tensor].name : "?";
    DISTRO_FAIL(DISTRO_ERR_NONFINITE, "rank %d could not step: non-finite gradient (or momentum) in tensor '%s'; nothing was applied",
                abort_rank, name);
  }
  int live = 0;
  for (int r = 0; r < world; r++) {
    if (!x->dropped[r]) {
      live++;
      continue;
    }
    s->peers_dropped++;
    if (r < 64) s->peers_dropped_mask |= 1ULL << r;
  }
  if (o->opt.clip_median_multiple > 0 && live > 1) {
    float **vals = malloc(sizeof(float *) * (size_t)world);
    if (!vals) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
    int clipped = 0;
    for (int i = 0; i < o->nparams && clipped >= 0; i++) {
      for (int r = 0; r < world; r++) vals[r] = x->dec_val + (size_t)r * (size_t)o->total_sel + o->sel_off[i];
      int c = distro__robust_clip(vals, x->dropped, world, o->tilings[i].nchunks * o->tilings[i].k,
                                  o->opt.clip_median_multiple);
      clipped = c < 0 ? -1 : clipped + c;
    }
    free(vals);
    if (clipped < 0) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
    s->peers_clipped = clipped;
  }
  s->seconds_decode += distro__now() - t1;
  return DISTRO_OK;
fail:
  return st;
}
