/* In-process communicator: collectives, mismatch handling, argument checks.
 * Rank threads never call cr_assert (it must run on the test's own thread);
 * they record what they saw and the test thread checks it after the join. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/comm.h>

#include "testutil.h"

#define MAX_WORLD 5

/* ---- allgather ---------------------------------------------------------- */

static const size_t gather_sizes[] = {0, 1, 3, 8, 64, 1000, 4097, 65537};
#define N_GATHER (sizeof gather_sizes / sizeof gather_sizes[0])

static unsigned char pattern(int rank, size_t size_idx, size_t i) {
  return (unsigned char)(rank * 37 + size_idx * 11 + i * 7 + (i >> 8));
}

typedef struct {
  int bad[MAX_WORLD]; /* first failing size index + 1, 0 if all good */
} gather_ctx;

static distro_status gather_rank(distro_comm *c, int rank, void *arg) {
  gather_ctx *ctx = arg;
  int world = distro_comm_size(c);
  for (size_t k = 0; k < N_GATHER; k++) {
    size_t n = gather_sizes[k];
    unsigned char *send = malloc(n ? n : 1), *recv = malloc(n * (size_t)world + 1);
    if (!send || !recv) return DISTRO_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) send[i] = pattern(rank, k, i);
    recv[n * (size_t)world] = 0xAB; /* guard byte past the end */
    distro_status st = distro_comm_allgather(c, send, n, recv);
    int ok = st == DISTRO_OK && recv[n * (size_t)world] == 0xAB;
    for (int r = 0; ok && r < world; r++)
      for (size_t i = 0; ok && i < n; i++) ok = recv[(size_t)r * n + i] == pattern(r, k, i);
    free(send);
    free(recv);
    if (!ok && !ctx->bad[rank]) ctx->bad[rank] = (int)k + 1;
    if (st != DISTRO_OK) return st;
  }
  return DISTRO_OK;
}

Test(comm_local, allgather_world_1_to_5, .timeout = 60) {
  for (int world = 1; world <= MAX_WORLD; world++) {
    gather_ctx ctx = {{0}};
    distro_status st = distro_comm_run_local(world, gather_rank, &ctx);
    cr_assert_eq(st, DISTRO_OK, "world %d: %s", world, distro_last_error());
    for (int r = 0; r < world; r++)
      cr_assert_eq(ctx.bad[r], 0, "world %d rank %d wrong at %zu bytes", world, r,
                   ctx.bad[r] ? gather_sizes[ctx.bad[r] - 1] : 0);
  }
}

/* ---- allreduce ---------------------------------------------------------- */

static const size_t reduce_sizes[] = {0, 1, 2, 3, 4, 5, 7, 100, 1023, 100003};
#define N_REDUCE (sizeof reduce_sizes / sizeof reduce_sizes[0])

typedef struct {
  size_t n;
  float *in[MAX_WORLD];  /* inputs, filled by the test thread */
  float *out[MAX_WORLD]; /* each rank's result */
} reduce_ctx;

static distro_status reduce_rank(distro_comm *c, int rank, void *arg) {
  reduce_ctx *ctx = arg;
  memcpy(ctx->out[rank], ctx->in[rank], ctx->n * sizeof(float));
  return distro_comm_allreduce_sum(c, ctx->out[rank], ctx->n);
}

Test(comm_local, allreduce_matches_float64_and_is_bit_identical, .timeout = 120) {
  uint64_t seed = tu_seed();
  tu_rng rng = {seed};
  for (int world = 1; world <= MAX_WORLD; world++) {
    for (size_t k = 0; k < N_REDUCE; k++) {
      size_t n = reduce_sizes[k];
      reduce_ctx ctx = {.n = n};
      for (int r = 0; r < world; r++) {
        ctx.in[r] = malloc((n ? n : 1) * sizeof(float));
        ctx.out[r] = malloc((n ? n : 1) * sizeof(float));
        cr_assert(ctx.in[r] && ctx.out[r]);
        tu_fill_normal(&rng, ctx.in[r], n, 1.0f + (float)r);
      }
      /* Two runs: thread timing differs, the bits must not. */
      for (int run = 0; run < 2; run++) {
        distro_status st = distro_comm_run_local(world, reduce_rank, &ctx);
        cr_assert_eq(st, DISTRO_OK, "world %d n %zu: %s", world, n, distro_last_error());
        for (size_t i = 0; i < n; i++) {
          double exact = 0, mag = 0;
          float seq = ctx.in[0][i]; /* float sum in rank order */
          for (int r = 0; r < world; r++) {
            exact += ctx.in[r][i];
            mag += fabs(ctx.in[r][i]);
            if (r) seq += ctx.in[r][i];
          }
          float got = ctx.out[0][i];
          cr_assert(fabs((double)got - exact) <= world * 6e-8 * mag + 1e-30,
                    "seed %llu world %d n %zu i %zu: %.9g vs %.17g",
                    (unsigned long long)seed, world, n, i, got, exact);
          cr_assert(memcmp(&got, &seq, sizeof got) == 0,
                    "seed %llu world %d n %zu i %zu: not the rank-order sum",
                    (unsigned long long)seed, world, n, i);
        }
        for (int r = 1; r < world; r++)
          cr_assert(n == 0 || memcmp(ctx.out[r], ctx.out[0], n * sizeof(float)) == 0,
                    "seed %llu world %d n %zu: rank %d differs from rank 0",
                    (unsigned long long)seed, world, n, r);
      }
      for (int r = 0; r < world; r++) {
        free(ctx.in[r]);
        free(ctx.out[r]);
      }
    }
  }
}

/* World 1 is the identity, down to the sign of zero and NaN payloads. */
Test(comm_local, allreduce_world1_is_identity) {
  distro_comm *c = NULL;
  cr_assert_eq(distro_comm_local_group(1, &c), DISTRO_OK);
  float x[4] = {-0.0f, 1.5f, NAN, -INFINITY}, y[4];
  memcpy(y, x, sizeof x);
  cr_assert_eq(distro_comm_allreduce_sum(c, y, 4), DISTRO_OK);
  cr_assert(memcmp(x, y, sizeof x) == 0);
  distro_comm_free(c);
}

/* ---- many mixed collectives (barrier generations) ----------------------- */

typedef struct {
  int bad[MAX_WORLD];
} stress_ctx;

static distro_status stress_rank(distro_comm *c, int rank, void *arg) {
  stress_ctx *ctx = arg;
  int world = distro_comm_size(c);
  for (int it = 0; it < 2000; it++) {
    int v = it * 10 + rank, all[MAX_WORLD];
    distro_status st = distro_comm_allgather(c, &v, sizeof v, all);
    if (st != DISTRO_OK) return st;
    for (int r = 0; r < world; r++)
      if (all[r] != it * 10 + r) ctx->bad[rank] = 1;
    float f = (float)(rank + 1);
    if ((st = distro_comm_allreduce_sum(c, &f, 1)) != DISTRO_OK) return st;
    if (f != (float)(world * (world + 1) / 2)) ctx->bad[rank] = 1;
    if (it % 7 == 0 && (st = distro_comm_barrier(c)) != DISTRO_OK) return st;
  }
  return DISTRO_OK;
}

Test(comm_local, many_mixed_collectives, .timeout = 120) {
  for (int world = 1; world <= MAX_WORLD; world++) {
    stress_ctx ctx = {{0}};
    cr_assert_eq(distro_comm_run_local(world, stress_rank, &ctx), DISTRO_OK, "%s",
                 distro_last_error());
    for (int r = 0; r < world; r++) cr_assert_eq(ctx.bad[r], 0, "world %d rank %d", world, r);
  }
}

/* ---- mismatches: every rank fails, nobody hangs ------------------------- */

typedef struct {
  int mode;
  distro_status st[MAX_WORLD];
  int msg_ok[MAX_WORLD];
  distro_status after[MAX_WORLD]; /* a correct collective after the failure */
} mismatch_ctx;

static distro_status mismatch_rank(distro_comm *c, int rank, void *arg) {
  mismatch_ctx *ctx = arg;
  float buf[16] = {0};
  unsigned char recv[MAX_WORLD * 16 * sizeof(float)];
  size_t n = rank == 1 ? 8 : 4; /* rank 1 disagrees */
  distro_status st;
  switch (ctx->mode) {
    case 0: st = distro_comm_allgather(c, buf, n, recv); break;
    case 1: st = distro_comm_allreduce_sum(c, buf, n); break;
    default: /* rank 0 runs a different collective */
      st = rank == 0 ? distro_comm_barrier(c) : distro_comm_allgather(c, buf, 4, recv);
      break;
  }
  ctx->st[rank] = st;
  ctx->msg_ok[rank] = distro_last_error()[0] != '\0';
  /* The group stays usable. */
  ctx->after[rank] = distro_comm_allreduce_sum(c, buf, 16);
  return DISTRO_OK;
}

Test(comm_local, mismatches_fail_on_every_rank, .timeout = 30) {
  for (int mode = 0; mode < 3; mode++) {
    for (int world = 2; world <= MAX_WORLD; world++) {
      mismatch_ctx ctx = {.mode = mode};
      cr_assert_eq(distro_comm_run_local(world, mismatch_rank, &ctx), DISTRO_OK);
      for (int r = 0; r < world; r++) {
        cr_assert_eq(ctx.st[r], DISTRO_ERR_COMM, "mode %d world %d rank %d: status %d", mode,
                     world, r, ctx.st[r]);
        cr_assert(ctx.msg_ok[r], "mode %d world %d rank %d: empty message", mode, world, r);
        cr_assert_eq(ctx.after[r], DISTRO_OK, "mode %d world %d rank %d", mode, world, r);
      }
    }
  }
}

/* ---- argument checks, getters, free ------------------------------------- */

static distro_status noop_rank(distro_comm *c, int rank, void *arg) {
  (void)c, (void)rank, (void)arg;
  return DISTRO_OK;
}

Test(comm_local, invalid_arguments) {
  distro_comm *comms[2] = {NULL, NULL};
  cr_assert_eq(distro_comm_local_group(0, comms), DISTRO_ERR_INVALID);
  cr_assert_neq(distro_last_error()[0], '\0');
  cr_assert_eq(distro_comm_local_group(-3, comms), DISTRO_ERR_INVALID);
  cr_assert_neq(distro_last_error()[0], '\0');
  cr_assert_eq(distro_comm_local_group(2, NULL), DISTRO_ERR_INVALID);
  cr_assert_neq(distro_last_error()[0], '\0');
  cr_assert(comms[0] == NULL && comms[1] == NULL, "failed call wrote comms");

  cr_assert_eq(distro_comm_run_local(0, noop_rank, NULL), DISTRO_ERR_INVALID);
  cr_assert_neq(distro_last_error()[0], '\0');
  cr_assert_eq(distro_comm_run_local(2, NULL, NULL), DISTRO_ERR_INVALID);
  cr_assert_neq(distro_last_error()[0], '\0');

  float f = 0;
  unsigned char b[4];
  cr_assert_eq(distro_comm_allgather(NULL, b, 1, b), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_comm_allreduce_sum(NULL, &f, 1), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_comm_barrier(NULL), DISTRO_ERR_INVALID);
  cr_assert_neq(distro_last_error()[0], '\0');
}

Test(comm_local, getters_and_free) {
  distro_comm *comms[MAX_WORLD];
  cr_assert_eq(distro_comm_local_group(MAX_WORLD, comms), DISTRO_OK);
  for (int r = 0; r < MAX_WORLD; r++) {
    cr_assert_eq(distro_comm_rank(comms[r]), r);
    cr_assert_eq(distro_comm_size(comms[r]), MAX_WORLD);
  }
  cr_assert_eq(distro_comm_rank(NULL), -1);
  cr_assert_eq(distro_comm_size(NULL), -1);
  distro_comm_free(NULL);
  /* Any free order: the group lives until its last comm goes. */
  int order[MAX_WORLD] = {3, 0, 4, 1, 2};
  for (int i = 0; i < MAX_WORLD; i++) distro_comm_free(comms[order[i]]);
}

static distro_status failing_rank(distro_comm *c, int rank, void *arg) {
  (void)arg;
  /* All ranks still finish the collective before some fail. */
  distro_status st = distro_comm_barrier(c);
  if (st != DISTRO_OK) return st;
  if (rank == 2) return DISTRO_ERR_SHAPE; /* no message of its own */
  if (rank == 3) {
    distro_comm_barrier(NULL); /* sets this thread's message */
    return DISTRO_ERR_IO;
  }
  return DISTRO_OK;
}

Test(comm_local, run_local_propagates_first_error_by_rank) {
  cr_assert_eq(distro_comm_run_local(4, failing_rank, NULL), DISTRO_ERR_SHAPE);
  cr_assert(strstr(distro_last_error(), "rank 2") != NULL, "message: %s", distro_last_error());
  cr_assert_eq(distro_comm_run_local(5, failing_rank, NULL), DISTRO_ERR_SHAPE);
  cr_assert_eq(distro_comm_run_local(3, failing_rank, NULL), DISTRO_ERR_SHAPE);
  cr_assert_eq(distro_comm_run_local(2, failing_rank, NULL), DISTRO_OK); /* no rank 2 */
}

static distro_status io_rank(distro_comm *c, int rank, void *arg) {
  (void)c, (void)arg;
  if (rank == 1) {
    distro_comm_barrier(NULL); /* sets this thread's message */
    return DISTRO_ERR_IO;
  }
  return DISTRO_OK;
}

Test(comm_local, run_local_carries_rank_message) {
  cr_assert_eq(distro_comm_run_local(3, io_rank, NULL), DISTRO_ERR_IO);
  const char *m = distro_last_error();
  cr_assert(strstr(m, "rank 1") && strstr(m, "distro_comm_barrier"), "message: %s", m);
}

/* ---- collective timeout -------------------------------------------------- */

#include <time.h>

typedef struct {
  int stopped;               /* this rank stops before the collective */
  distro_status st[MAX_WORLD], later[MAX_WORLD], set[MAX_WORLD];
  char msg[MAX_WORLD][256];
  int op;                    /* 0 barrier, 1 allgather, 2 allreduce */
} timeout_ctx;

static distro_status timeout_rank(distro_comm *c, int rank, void *arg) {
  timeout_ctx *x = arg;
  float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  unsigned char g[8 * MAX_WORLD];
  x->set[rank] = distro_comm_set_timeout(c, 0.3);
  /* One round that completes: the timeout changes nothing while everyone comes. */
  if (distro_comm_allreduce_sum(c, buf, 8) != DISTRO_OK) return DISTRO_ERR_COMM;
  if (rank == x->stopped) {
    struct timespec ts = {1, 0}; /* a stopped peer: it comes back after the others gave up */
    nanosleep(&ts, NULL);
  }
  x->st[rank] = x->op == 0   ? distro_comm_barrier(c)
                : x->op == 1 ? distro_comm_allgather(c, buf, 8, g)
                             : distro_comm_allreduce_sum(c, buf, 8);
  snprintf(x->msg[rank], sizeof x->msg[rank], "%s", distro_last_error());
  x->later[rank] = distro_comm_barrier(c); /* the group is aborted: fails at once */
  return DISTRO_OK;
}

Test(comm_local, timeout_on_a_stopped_rank_fails_every_rank_with_timeout, .timeout = 60) {
  for (int op = 0; op < 3; op++) {
    timeout_ctx x;
    memset(&x, 0, sizeof x);
    x.stopped = 2;
    x.op = op;
    cr_assert_eq(distro_comm_run_local(4, timeout_rank, &x), DISTRO_OK);
    for (int r = 0; r < 4; r++) {
      cr_assert_eq(x.set[r], DISTRO_OK);
      cr_assert_eq(x.st[r], DISTRO_ERR_TIMEOUT, "op %d rank %d: %s (%s)", op, r, distro_status_string(x.st[r]),
                   x.msg[r]);
      cr_assert(strstr(x.msg[r], "rank 2 did not arrive"), "op %d rank %d: %s", op, r, x.msg[r]);
      cr_assert_eq(x.later[r], DISTRO_ERR_TIMEOUT, "op %d rank %d: a broken group must stay broken", op, r);
    }
  }
}

Test(comm_local, set_timeout_arguments) {
  distro_comm *comms[2];
  cr_assert_eq(distro_comm_local_group(2, comms), DISTRO_OK);
  cr_assert_eq(distro_comm_set_timeout(NULL, 1), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_comm_set_timeout(comms[0], -1), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_comm_set_timeout(comms[0], NAN), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_comm_set_timeout(comms[0], INFINITY), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_comm_set_timeout(comms[0], 0), DISTRO_OK);
  cr_assert_eq(distro_comm_set_timeout(comms[0], 2.5), DISTRO_OK);
  distro_comm_free(comms[0]);
  distro_comm_free(comms[1]);
}
