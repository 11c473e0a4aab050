/* Custom communicator: the caller's callbacks (include/distro/comm.h,
 * distro_comm_from_callbacks) behind the internal collective table.
 *
 * Every collective is the callback's collective followed by a verdict
 * round: a 16-byte record per rank, {magic, sequence number, failed flag},
 * all-gathered through the same allgatherv callback. Every rank reads the
 * same records, so every rank reaches the same verdict: all succeed, or all
 * fail with DISTRO_ERR_COMM naming the first rank that failed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/error.h"

#define VERDICT_MAGIC 0x64636276u /* "vbcd" */
#define VERDICT_BYTES 16

typedef struct {
  distro_comm_callbacks cb; /* the caller's table; cb.ctx is this comm's context */
  uint64_t seq;             /* collectives run on this comm */
  double applied_timeout;   /* last value handed to cb.set_timeout */
} cb_impl;

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* The message a callback left, or a generic one. */
static const char *cb_msg(char *err) {
  err[DISTRO_COMM_ERR_MAX - 1] = '\0';
  return err[0] ? err : "no message";
}

/* Hands a changed distro_comm_set_timeout value to the callback, before a
 * collective (so a failure is this collective's, on this rank, and goes
 * into the verdict). */
static int apply_timeout(distro_comm *c, char *err) {
  cb_impl *k = c->impl;
  if (!k->cb.set_timeout || c->timeout_s == k->applied_timeout) return 0;
  int rc = k->cb.set_timeout(k->cb.ctx, c->timeout_s, err);
  if (rc == 0) k->applied_timeout = c->timeout_s;
  return rc;
}

/* The verdict round after a collective in which this rank's part returned
 * `st` (with distro_last_error() describing a failure). Returns DISTRO_OK
 * only when every rank's part succeeded. */
static distro_status verdict(distro_comm *c, const char *op, distro_status st) {
  cb_impl *k = c->impl;
  const int W = c->size;
  uint8_t mine[VERDICT_BYTES] = {0};
  char own[DISTRO_COMM_ERR_MAX];
  if (st != DISTRO_OK) snprintf(own, sizeof own, "%s", distro_last_error());
  put_u32(mine, VERDICT_MAGIC);
  put_u32(mine + 4, st == DISTRO_OK ? 0u : 1u);
  put_u64(mine + 8, k->seq);
  uint8_t *all = malloc((size_t)W * VERDICT_BYTES);
  size_t *sizes = malloc((size_t)W * sizeof *sizes);
  char err[DISTRO_COMM_ERR_MAX] = {0};
  int rc = -1;
  /* Out of memory here: this rank cannot take part, the comm breaks. */
  if (all && sizes) rc = k->cb.allgatherv(k->cb.ctx, mine, VERDICT_BYTES, all, VERDICT_BYTES, sizes, err);
  k->seq++;
  if (rc != 0) {
    free(all);
    free(sizes);
    c->broken = 1;
    if (!all || !sizes) return distro__fail(DISTRO_ERR_NOMEM, "custom comm %s: out of memory for the verdict round", op);
    return distro__fail(DISTRO_ERR_COMM,
                        "custom comm %s on rank %d: the verdict round failed (allgatherv callback returned %d: %s)%s%s; "
                        "the comm is unusable",
                        op, c->rank, rc, cb_msg(err), st != DISTRO_OK ? "; before it: " : "", st != DISTRO_OK ? own : "");
  }
  int failed = -1, odd = -1;
  for (int r = 0; r < W; r++) {
    const uint8_t *v = all + (size_t)r * VERDICT_BYTES;
    if (sizes[r] != VERDICT_BYTES || get_u32(v) != VERDICT_MAGIC || get_u64(v + 8) != k->seq - 1 || get_u32(v + 4) > 1) {
      if (odd < 0) odd = r;
    } else if (get_u32(v + 4) && failed < 0) {
      failed = r;
    }
  }
  free(all);
  free(sizes);
  if (odd >= 0) {
    c->broken = 1;
    return distro__fail(DISTRO_ERR_COMM,
                        "custom comm %s on rank %d: rank %d is out of step (its verdict record is not for collective "
                        "%llu); the comm is unusable",
                        op, c->rank, odd, (unsigned long long)(k->seq - 1));
  }
  if (st != DISTRO_OK) return distro__fail(st, "%s", own);
  if (failed >= 0)
    return distro__fail(DISTRO_ERR_COMM, "custom comm %s: rank %d's callback failed (see that rank's error)", op, failed);
  return DISTRO_OK;
}

static distro_status cb_allgatherv(distro_comm *c, const void *send, size_t bytes, void *recv, size_t slot,
                                   size_t *sizes) {
  cb_impl *k = c->impl;
  distro_status st = DISTRO_OK;
  char err[DISTRO_COMM_ERR_MAX] = {0};
  int rc = apply_timeout(c, err);
  if (rc != 0) {
    st = distro__fail(DISTRO_ERR_COMM, "custom comm: set_timeout callback on rank %d returned %d: %s", c->rank, rc,
                      cb_msg(err));
  } else if (bytes > slot) {
    st = distro__fail(DISTRO_ERR_INVALID, "custom comm allgatherv: %zu bytes exceed the %zu-byte slot", bytes, slot);
  } else {
    for (int r = 0; r < c->size; r++) sizes[r] = SIZE_MAX;
    rc = k->cb.allgatherv(k->cb.ctx, send, bytes, recv, slot, sizes, err);
    if (rc != 0) {
      st = distro__fail(DISTRO_ERR_COMM, "custom comm allgatherv callback on rank %d returned %d: %s", c->rank, rc,
                        cb_msg(err));
    } else {
      /* Never trust a callback's sizes: the decoder reads sizes[r] bytes. */
      for (int r = 0; r < c->size && st == DISTRO_OK; r++)
        if (sizes[r] > slot)
          st = distro__fail(DISTRO_ERR_COMM, "custom comm allgatherv on rank %d: rank %d's size %zu exceeds the slot %zu",
                            c->rank, r, sizes[r], slot);
    }
  }
  return verdict(c, "allgatherv", st);
}

static distro_status cb_allgather(distro_comm *c, const void *send, size_t bytes, void *recv) {
  size_t *sizes = malloc((size_t)c->size * sizeof *sizes);
  distro_status st;
  if (!sizes) {
    st = verdict(c, "allgather", distro__fail(DISTRO_ERR_NOMEM, "custom comm allgather: out of memory"));
    return st;
  }
  st = cb_allgatherv(c, send, bytes, recv, bytes, sizes);
  for (int r = 0; r < c->size && st == DISTRO_OK; r++)
    if (sizes[r] != bytes) /* every rank sees the same sizes, so every rank fails alike */
      st = distro__fail(DISTRO_ERR_COMM, "custom comm allgather: rank %d sent %zu bytes, rank %d expected %zu", r,
                        sizes[r], c->rank, bytes);
  free(sizes);
  return st;
}

/* allreduce without an allreduce callback: gather, then sum in rank order. */
static int gather_sum(distro_comm *c, float *buf, size_t count, char *err) {
  cb_impl *k = c->impl;
  const size_t bytes = count * sizeof *buf;
  if (count > SIZE_MAX / sizeof *buf / (size_t)c->size) {
    snprintf(err, DISTRO_COMM_ERR_MAX, "%zu floats from %d ranks overflow", count, c->size);
    return -1;
  }
  float *all = malloc(bytes * (size_t)c->size);
  size_t *sizes = malloc((size_t)c->size * sizeof *sizes);
  int rc = -1;
  if (!all || !sizes) {
    snprintf(err, DISTRO_COMM_ERR_MAX, "out of memory gathering %zu floats", count);
  } else {
    rc = k->cb.allgatherv(k->cb.ctx, buf, bytes, all, bytes, sizes, err);
    for (int r = 0; r < c->size && rc == 0; r++)
      if (sizes[r] != bytes) {
        snprintf(err, DISTRO_COMM_ERR_MAX, "rank %d sent %zu bytes for %zu floats", r, sizes[r], count);
        rc = -1;
      }
    if (rc == 0)
      for (size_t i = 0; i < count; i++) {
        float t = all[i];
        for (int r = 1; r < c->size; r++) t += all[(size_t)r * count + i];
        buf[i] = t;
      }
  }
  free(all);
  free(sizes);
  return rc;
}

/* On failure the buffer is restored, so a failed all-reduce leaves the
 * caller's data as it was on every rank. The copy costs count floats. */
static distro_status cb_allreduce_sum(distro_comm *c, float *buf, size_t count) {
  cb_impl *k = c->impl;
  distro_status st = DISTRO_OK;
  char err[DISTRO_COMM_ERR_MAX] = {0};
  float *keep = count ? malloc(count * sizeof *buf) : NULL;
  int rc;
  if (count && !keep) {
    st = distro__fail(DISTRO_ERR_NOMEM, "custom comm allreduce_sum: out of memory for %zu floats", count);
  } else if ((rc = apply_timeout(c, err)) != 0) {
    st = distro__fail(DISTRO_ERR_COMM, "custom comm: set_timeout callback on rank %d returned %d: %s", c->rank, rc,
                      cb_msg(err));
  } else {
    if (count) memcpy(keep, buf, count * sizeof *buf);
    rc = k->cb.allreduce_sum ? k->cb.allreduce_sum(k->cb.ctx, buf, count, err) : gather_sum(c, buf, count, err);
    if (rc != 0)
      st = distro__fail(DISTRO_ERR_COMM, "custom comm allreduce_sum callback on rank %d returned %d: %s", c->rank, rc,
                        cb_msg(err));
  }
  st = verdict(c, "allreduce_sum", st);
  if (st != DISTRO_OK && keep) memcpy(buf, keep, count * sizeof *buf);
  free(keep);
  return st;
}

static distro_status cb_barrier(distro_comm *c) {
  cb_impl *k = c->impl;
  distro_status st = DISTRO_OK;
  char err[DISTRO_COMM_ERR_MAX] = {0};
  int rc = apply_timeout(c, err);
  if (rc == 0 && k->cb.barrier) rc = k->cb.barrier(k->cb.ctx, err);
  if (rc != 0)
    st = distro__fail(DISTRO_ERR_COMM, "custom comm barrier on rank %d: callback returned %d: %s", c->rank, rc,
                      cb_msg(err));
  return verdict(c, "barrier", st);
}

static void cb_destroy(distro_comm *c) {
  cb_impl *k = c->impl;
  if (!k) return;
  if (k->cb.destroy) k->cb.destroy(k->cb.ctx);
  free(k);
  c->impl = NULL;
}

static distro_status cb_dup(distro_comm *c, distro_comm **out);

static const distro__comm_ops cb_ops = {
    .name = "custom",
    .allgather = cb_allgather,
    .allgatherv = cb_allgatherv,
    .allreduce_sum = cb_allreduce_sum,
    .barrier = cb_barrier,
    .destroy = cb_destroy,
    .timeouts = 1, /* unless the callbacks have no set_timeout: no_timeout */
    .dup = cb_dup,
};

static distro_status wrap(const distro_comm_callbacks *cb, void *ctx, distro_comm **out) {
  distro_comm *c = calloc(1, sizeof *c);
  cb_impl *k = calloc(1, sizeof *k);
  if (!c || !k) {
    free(c);
    free(k);
    return distro__fail(DISTRO_ERR_NOMEM, "distro_comm_from_callbacks: out of memory");
  }
  k->cb = *cb;
  k->cb.ctx = ctx;
  *c = (distro_comm){.ops = &cb_ops, .rank = cb->rank, .size = cb->world, .impl = k, .no_timeout = !cb->set_timeout};
  *out = c;
  return DISTRO_OK;
}

/* Collective: the callback's dup, then a verdict, so every rank gets a
 * duplicate or none does. */
static distro_status cb_dup(distro_comm *c, distro_comm **out) {
  cb_impl *k = c->impl;
  distro_status st = DISTRO_OK;
  char err[DISTRO_COMM_ERR_MAX] = {0};
  void *nctx = NULL;
  distro_comm *nc = NULL;
  if (!k->cb.dup) {
    st = distro__fail(DISTRO_ERR_UNSUPPORTED,
                      "the custom communicator has no dup callback, so it cannot run a background exchange "
                      "(options.overlap)");
  } else {
    int rc = k->cb.dup(k->cb.ctx, &nctx, err);
    if (rc != 0)
      st = distro__fail(DISTRO_ERR_COMM, "custom comm dup callback on rank %d returned %d: %s", c->rank, rc,
                        cb_msg(err));
    else
      st = wrap(&k->cb, nctx, &nc);
  }
  st = verdict(c, "dup", st);
  if (st != DISTRO_OK) {
    if (nc) distro_comm_free(nc); /* destroys nctx */
    else if (nctx && k->cb.destroy) k->cb.destroy(nctx);
    return st;
  }
  *out = nc;
  return DISTRO_OK;
}

distro_status distro_comm_from_callbacks(const distro_comm_callbacks *cb, distro_comm **out) {
  if (!out) return distro__fail(DISTRO_ERR_INVALID, "distro_comm_from_callbacks: argument 'out' is NULL");
  if (!cb) return distro__fail(DISTRO_ERR_INVALID, "distro_comm_from_callbacks: argument 'cb' is NULL");
  if (cb->version != DISTRO_COMM_CALLBACKS_VERSION)
    return distro__fail(DISTRO_ERR_INVALID, "distro_comm_from_callbacks: version %d, this library speaks %d",
                        cb->version, DISTRO_COMM_CALLBACKS_VERSION);
  if (cb->world < 1 || cb->rank < 0 || cb->rank >= cb->world)
    return distro__fail(DISTRO_ERR_INVALID, "distro_comm_from_callbacks: rank %d of world %d", cb->rank, cb->world);
  if (!cb->allgatherv)
    return distro__fail(DISTRO_ERR_INVALID, "distro_comm_from_callbacks: the allgatherv callback is required");
  return wrap(cb, cb->ctx, out);
}
