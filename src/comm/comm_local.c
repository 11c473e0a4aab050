/* In-process communicator: `world` ranks in one process, one thread each.
 *
 * Every collective runs the same protocol on a group shared by all ranks:
 * each rank publishes what it is doing (operation, pointers, size) into its
 * own slot, waits at a barrier, then reads the other ranks' slots. Because
 * every rank reads the same slots it reaches the same verdict on a mismatch,
 * so all ranks fail together instead of some hanging or reading past a
 * peer's buffer. A closing barrier keeps every buffer alive and every slot
 * unchanged until all ranks are done reading them.
 *
 * With a timeout (distro_comm_set_timeout) the first barrier of a
 * collective, where every rank arrives, waits at most that long; a rank
 * that gives up aborts the group, so every rank waiting there and every
 * later arrival fail with DISTRO_ERR_TIMEOUT. The barriers after it need
 * no timeout: every rank has arrived and only copies remain. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "common/error.h"

typedef enum { OP_ALLGATHER, OP_ALLGATHERV, OP_ALLREDUCE, OP_BARRIER, OP_DUP } local_op;

static const char *op_name(local_op op) {
  switch (op) {
    case OP_ALLGATHER: return "allgather";
    case OP_ALLGATHERV: return "allgatherv";
    case OP_ALLREDUCE: return "allreduce_sum";
    case OP_BARRIER: return "barrier";
    case OP_DUP: return "dup";
  }
  return "?";
}

typedef struct {
  local_op op;
  const void *send; /* allgather: this rank's send buffer; allreduce: its buf */
  size_t n;         /* bytes (allgather), slot bytes (allgatherv) or floats (allreduce) */
  size_t len;       /* allgatherv: this rank's bytes */
  int ok;           /* 0 if this rank could not take part (no memory) */
} local_slot;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int world;
  int refs;              /* comms still holding the group */
  int arrived;           /* ranks waiting at the current barrier */
  unsigned long gen;     /* barrier generation, so a fast rank cannot
                            slip through the next barrier early */
  local_slot *slots;     /* one per rank; written only by its owner */
  unsigned long *seen;   /* per rank: the generation it last arrived in, + 1 */
  int aborted;           /* a rank timed out arriving: the group is dead */
  int missing;           /* a rank that had not arrived then */
  double waited;         /* the timeout that fired */
  void *handoff;         /* dup: the new group, from rank 0 */
} local_group;

/* Barrier. rank >= 0: the arrival barrier of a collective, which fails
 * (-1) when the group is or gets aborted, and after timeout_s (> 0) aborts
 * it; 0 when every rank arrived. rank < 0: a barrier after the arrival,
 * where every rank is known to come. */
static int group_wait_timed(local_group *g, int rank, double timeout_s) {
  int rc = 0;
  pthread_mutex_lock(&g->mu);
  if (rank >= 0 && g->aborted) {
    pthread_mutex_unlock(&g->mu);
    return -1;
  }
  unsigned long gen = g->gen;
  if (rank >= 0) g->seen[rank] = gen + 1;
  if (++g->arrived == g->world) {
    g->arrived = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
  } else if (rank >= 0) {
    struct timespec dl;
    if (timeout_s > 0) {
      clock_gettime(CLOCK_REALTIME, &dl);
      const double end = (double)dl.tv_sec + 1e-9 * (double)dl.tv_nsec + timeout_s;
      dl.tv_sec = (time_t)end;
      dl.tv_nsec = (long)((end - (double)dl.tv_sec) * 1e9);
    }
    while (gen == g->gen && !g->aborted) {
      if (timeout_s <= 0) {
        pthread_cond_wait(&g->cv, &g->mu);
      } else if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT && gen == g->gen && !g->aborted) {
        g->aborted = 1;
        g->waited = timeout_s;
        for (int r = 0; r < g->world; r++)
          if (g->seen[r] != gen + 1) {
            g->missing = r;
            break;
          }
        pthread_cond_broadcast(&g->cv);
      }
    }
    rc = gen == g->gen ? -1 : 0;
  } else {
    while (gen == g->gen) pthread_cond_wait(&g->cv, &g->mu);
  }
  pthread_mutex_unlock(&g->mu);
  return rc;
}

static void group_wait(local_group *g) { (void)group_wait_timed(g, -1, 0); }

static void group_free(local_group *g) {
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  free(g->slots);
  free(g->seen);
  free(g);
}

/* A group of `world` ranks, each holding a reference; NULL when out of
 * memory. */
static local_group *group_new(int world) {
  local_group *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->slots = calloc((size_t)world, sizeof *g->slots);
  g->seen = calloc((size_t)world, sizeof *g->seen);
  int locks = 0;
  if (g->slots && g->seen && pthread_mutex_init(&g->mu, NULL) == 0) {
    locks = 1;
    if (pthread_cond_init(&g->cv, NULL) == 0) {
      g->world = world;
      g->refs = world;
      return g;
    }
  }
  if (locks) pthread_mutex_destroy(&g->mu);
  free(g->slots);
  free(g->seen);
  free(g);
  return NULL;
}

static void group_release(local_group *g) {
  pthread_mutex_lock(&g->mu);
  int last = --g->refs == 0;
  pthread_mutex_unlock(&g->mu);
  if (!last) return;
  group_free(g);
}

/* Publishes this rank's slot and waits for everyone. Then checks that all
 * ranks run the same operation on the same size; every rank sees the same
 * slots, so every rank returns the same status. */
static distro_status publish_and_check(distro_comm *c, local_slot s) {
  local_group *g = c->impl;
  g->slots[c->rank] = s;
  if (group_wait_timed(g, c->rank, c->timeout_s) != 0) {
    pthread_mutex_lock(&g->mu);
    const int missing = g->missing;
    const double waited = g->waited;
    pthread_mutex_unlock(&g->mu);
    c->broken = 1;
    return distro__fail(DISTRO_ERR_TIMEOUT,
                        "local comm %s on rank %d: rank %d did not arrive within %.3g s; the group is aborted",
                        op_name(s.op), c->rank, missing, waited);
  }
  const local_slot *sl = g->slots;
  for (int r = 0; r < g->world; r++) {
    if (sl[r].op != sl[0].op)
      return distro__fail(DISTRO_ERR_COMM,
                          "local comm: rank %d called %s while rank 0 called %s",
                          r, op_name(sl[r].op), op_name(sl[0].op));
  }
  for (int r = 0; r < g->world; r++) {
    if (sl[r].n != sl[0].n)
      return distro__fail(DISTRO_ERR_COMM,
                          "local comm %s: rank %d passed %zu %s but rank 0 passed %zu",
                          op_name(s.op), r, sl[r].n,
                          s.op == OP_ALLGATHER ? "bytes" : "floats", sl[0].n);
  }
  for (int r = 0; r < g->world; r++) {
    if (!sl[r].ok)
      return distro__fail(r == c->rank ? DISTRO_ERR_NOMEM : DISTRO_ERR_COMM,
                          "local comm %s: rank %d could not allocate its buffer",
                          op_name(s.op), r);
  }
  return DISTRO_OK;
}

static distro_status local_allgather(distro_comm *c, const void *send, size_t bytes,
                                     void *recv) {
  local_group *g = c->impl;
  local_slot s = {.op = OP_ALLGATHER, .send = send, .n = bytes, .ok = 1};
  distro_status st = publish_and_check(c, s);
  if (st == DISTRO_ERR_TIMEOUT) return st;
  if (st == DISTRO_OK && bytes) {
    for (int r = 0; r < g->world; r++)
      memcpy((char *)recv + (size_t)r * bytes, g->slots[r].send, bytes);
  }
  group_wait(g); /* peers may still be reading our send buffer */
  return st;
}

static distro_status local_allgatherv(distro_comm *c, const void *send, size_t bytes, void *recv, size_t slot,
                                      size_t *sizes) {
  local_group *g = c->impl;
  local_slot s = {.op = OP_ALLGATHERV, .send = send, .n = slot, .len = bytes, .ok = 1};
  distro_status st = publish_and_check(c, s);
  if (st == DISTRO_ERR_TIMEOUT) return st;
  if (st == DISTRO_OK) {
    for (int r = 0; r < g->world; r++)
      if (g->slots[r].len > slot) {
        st = distro__fail(DISTRO_ERR_COMM, "local comm allgatherv: rank %d sent %zu bytes, more than the %zu-byte slot",
                          r, g->slots[r].len, slot);
        break;
      }
  }
  if (st == DISTRO_OK)
    for (int r = 0; r < g->world; r++) {
      if (g->slots[r].len) memcpy((char *)recv + (size_t)r * slot, g->slots[r].send, g->slots[r].len);
      sizes[r] = g->slots[r].len;
    }
  group_wait(g); /* peers may still be reading our send buffer */
  return st;
}

/* Rank r reduces elements [r*n/W, (r+1)*n/W) over ranks 0..W-1 in rank
 * order, so each element is summed in one fixed order whichever thread runs
 * first, and writes the sums into that slice of its own buffer; then every
 * rank copies the other ranks' reduced slices into its buffer. In the first
 * phase rank r writes only slice r of its buffer while peers read other
 * slices of it; in the second it writes only the other slices while peers
 * read slice r. So nothing is allocated and no read races a write. */
static size_t slice_lo(size_t n, int r, int world) {
  /* n*r/W without overflowing n*r. */
  return (n / (size_t)world) * (size_t)r + (n % (size_t)world) * (size_t)r / (size_t)world;
}

static distro_status local_allreduce_sum(distro_comm *c, float *buf, size_t count) {
  local_group *g = c->impl;
  const int W = g->world, me = c->rank;
  local_slot s = {.op = OP_ALLREDUCE, .send = buf, .n = count, .ok = 1};
  distro_status st = publish_and_check(c, s);
  if (st == DISTRO_ERR_TIMEOUT) return st;
  if (st != DISTRO_OK || W == 1) {
    group_wait(g); /* same barrier count on every path */
    return st;
  }
  const size_t lo = slice_lo(count, me, W), hi = slice_lo(count, me + 1, W);
  const float *b0 = g->slots[0].send;
  for (size_t i = lo; i < hi; i++) {
    float t = b0[i];
    for (int r = 1; r < W; r++) t += ((const float *)g->slots[r].send)[i];
    buf[i] = t;
  }
  group_wait(g); /* all slices reduced */
  for (int r = 0; r < W; r++) {
    size_t rlo = slice_lo(count, r, W), rhi = slice_lo(count, r + 1, W);
    if (r != me && rhi > rlo) memcpy(buf + rlo, (const float *)g->slots[r].send + rlo, (rhi - rlo) * sizeof *buf);
  }
  group_wait(g); /* all slices copied: peers may reuse their buffers */
  return DISTRO_OK;
}

static distro_status local_barrier(distro_comm *c) {
  local_slot s = {.op = OP_BARRIER, .ok = 1};
  distro_status st = publish_and_check(c, s);
  if (st == DISTRO_ERR_TIMEOUT) return st;
  group_wait(c->impl); /* slots must stay put until all ranks checked them */
  return st;
}

/* Rank 0 creates the new group and leaves its address in the old one;
 * every rank takes it between the arrival and the closing barrier. A rank
 * that could not allocate its comm fails the call on every rank. */
static distro_status local_dup(distro_comm *c, distro_comm **out) {
  local_group *g = c->impl, *ng = NULL;
  distro_comm *nc = calloc(1, sizeof *nc);
  if (c->rank == 0) g->handoff = ng = group_new(g->world);
  local_slot s = {.op = OP_DUP, .ok = nc && (c->rank != 0 || ng)};
  distro_status st = publish_and_check(c, s);
  if (st == DISTRO_ERR_TIMEOUT) { /* nobody reads the handoff of an aborted call */
    free(nc);
    if (ng) group_free(ng);
    return st;
  }
  if (st == DISTRO_OK) ng = g->handoff;
  group_wait(g); /* everyone has read the handoff */
  if (st != DISTRO_OK) {
    free(nc);
    if (c->rank == 0 && ng) group_free(ng);
    return st;
  }
  *nc = (distro_comm){.ops = c->ops, .rank = c->rank, .size = c->size, .impl = ng};
  *out = nc;
  return DISTRO_OK;
}

static void local_destroy(distro_comm *c) {
  if (c->impl) group_release(c->impl);
  c->impl = NULL;
}

static const distro__comm_ops local_ops = {
    .name = "local",
    .allgather = local_allgather,
    .allgatherv = local_allgatherv,
    .allreduce_sum = local_allreduce_sum,
    .barrier = local_barrier,
    .destroy = local_destroy,
    .timeouts = 1,
    .dup = local_dup,
};

distro_status distro_comm_local_group(int world, distro_comm **comms) {
  distro_status st = DISTRO_OK;
  local_group *g = NULL;
  distro_comm **tmp = NULL;
  int made = 0;
  if (world < 1) DISTRO_FAIL(DISTRO_ERR_INVALID, "distro_comm_local_group: world %d < 1", world);
  if (!comms) DISTRO_FAIL(DISTRO_ERR_INVALID, "distro_comm_local_group: comms is NULL");

  g = group_new(world);
  tmp = calloc((size_t)world, sizeof *tmp);
  if (!g || !tmp) DISTRO_FAIL(DISTRO_ERR_NOMEM, "distro_comm_local_group: out of memory");
  for (made = 0; made < world; made++) {
    distro_comm *c = calloc(1, sizeof *c);
    if (!c) DISTRO_FAIL(DISTRO_ERR_NOMEM, "distro_comm_local_group: out of memory");
    *c = (distro_comm){.ops = &local_ops, .rank = made, .size = world, .impl = g};
    tmp[made] = c;
  }
  /* Written only on success, so a failed call leaves comms untouched. */
  memcpy(comms, tmp, (size_t)world * sizeof *comms);
  free(tmp);
  return DISTRO_OK;

fail:
  if (tmp)
    for (int i = 0; i < made; i++) free(tmp[i]); /* not yet holding references */
  free(tmp);
  if (g) group_free(g);
  return st;
}

/* run_local: threads wait at a start gate until all of them exist, so if one
 * cannot be created the others are told to skip fn instead of blocking
 * forever in a collective with a missing rank. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int state; /* 0 wait, 1 go, -1 abort */
  distro_rank_fn fn;
  void *arg;
} run_gate;

typedef struct {
  run_gate *gate;
  distro_comm *comm;
  int rank;
  distro_status st;
  char msg[512]; /* the rank thread's distro_last_error(), for the caller */
} run_rank;

static void *run_thread(void *p) {
  run_rank *rr = p;
  run_gate *gt = rr->gate;
  pthread_mutex_lock(&gt->mu);
  while (gt->state == 0) pthread_cond_wait(&gt->cv, &gt->mu);
  int go = gt->state > 0;
  pthread_mutex_unlock(&gt->mu);
  if (!go) return NULL;
  rr->st = gt->fn(rr->comm, rr->rank, gt->arg);
  if (rr->st != DISTRO_OK) {
    const char *m = distro_last_error();
    size_t len = strlen(m);
    if (len >= sizeof rr->msg) len = sizeof rr->msg - 1;
    memcpy(rr->msg, m, len);
    rr->msg[len] = '\0';
  }
  return NULL;
}

distro_status distro_comm_run_local(int world, distro_rank_fn fn, void *arg) {
  if (world < 1)
    return distro__fail(DISTRO_ERR_INVALID, "distro_comm_run_local: world %d < 1", world);
  if (!fn) return distro__fail(DISTRO_ERR_INVALID, "distro_comm_run_local: fn is NULL");

  distro_status st = DISTRO_OK;
  distro_comm **comms = calloc((size_t)world, sizeof *comms);
  run_rank *ranks = calloc((size_t)world, sizeof *ranks);
  pthread_t *th = calloc((size_t)world, sizeof *th);
  run_gate gate = {.state = 0, .fn = fn, .arg = arg};
  int started = 0, gate_ok = 0;
  if (!comms || !ranks || !th) DISTRO_FAIL(DISTRO_ERR_NOMEM, "distro_comm_run_local: out of memory");
  DISTRO_CHECK(distro_comm_local_group(world, comms));
  if (pthread_mutex_init(&gate.mu, NULL) != 0)
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "distro_comm_run_local: pthread_mutex_init failed");
  if (pthread_cond_init(&gate.cv, NULL) != 0) {
    pthread_mutex_destroy(&gate.mu);
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "distro_comm_run_local: pthread_cond_init failed");
  }
  gate_ok = 1;

  for (; started < world; started++) {
    ranks[started] = (run_rank){.gate = &gate, .comm = comms[started], .rank = started};
    if (pthread_create(&th[started], NULL, run_thread, &ranks[started]) != 0) break;
  }
  pthread_mutex_lock(&gate.mu);
  gate.state = started == world ? 1 : -1;
  pthread_cond_broadcast(&gate.cv);
  pthread_mutex_unlock(&gate.mu);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  if (started < world)
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "distro_comm_run_local: could not start thread %d of %d",
                started, world);

  /* Carry the failing rank's message over to the calling thread. */
  for (int r = 0; r < world; r++) {
    if (ranks[r].st != DISTRO_OK) {
      st = distro__fail(ranks[r].st, "rank %d: %s", r,
                        ranks[r].msg[0] ? ranks[r].msg : distro_status_string(ranks[r].st));
      break;
    }
  }

fail:
  if (gate_ok) {
    pthread_cond_destroy(&gate.cv);
    pthread_mutex_destroy(&gate.mu);
  }
  if (comms)
    for (int i = 0; i < world; i++) distro_comm_free(comms[i]);
  free(comms);
  free(ranks);
  free(th);
  return st;
}
