/* Custom communicator (distro_comm_from_callbacks): callbacks built on the
 * in-process communicator carry every optimizer bit-identically to it, and
 * a callback that fails mid-step fails the step on every rank with nothing
 * changed. Rank threads record; the test thread asserts after the join. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/diloco.h>
#include <distro/optim.h>

#include "comm/comm_internal.h"
#include "testutil.h"

#define WORLD 3
#define STEPS 6
#define NT 4

static const int ndims[NT] = {2, 1, 3, 2};
static const int64_t s0[] = {40, 72}, s1[] = {50}, s2[] = {2, 33, 40}, s3[] = {17, 9};
static const int64_t *const shapes[NT] = {s0, s1, s2, s3};
static const char *const tnames[NT] = {"w", "b", "t3", "odd"};

static size_t numel(int t) {
  size_t n = 1;
  for (int d = 0; d < ndims[t]; d++) n *= (size_t)shapes[t][d];
  return n;
}

/* ---- the callbacks: a thin layer over an in-process comm ----------------- */

typedef struct {
  distro_comm *inner;
  int fail_rank;      /* the rank whose collective fails, or -1 */
  int fail_step;      /* ... at its first data collective in this step */
  int fail_skip;      /* 1: it fails without taking part; 0: after taking part */
  const int *cur_step; /* the step the rank thread is in */
  int fired;
  int use_allreduce;  /* 0: leave allreduce_sum NULL (the gather fallback) */
  int destroyed;
} cb_ctx;

static int should_fail(const cb_ctx *k) {
  return !k->fired && k->fail_rank == k->inner->rank && k->cur_step && *k->cur_step == k->fail_step;
}

static int cb_allgatherv(void *ctx, const void *send, size_t bytes, void *recv, size_t slot, size_t *sizes,
                         char *err) {
  cb_ctx *k = ctx;
  /* Data, not the library's 16-byte verdict rounds. */
  const int fail = should_fail(k) && slot != 16;
  if (fail) k->fired = 1;
  if (fail && k->fail_skip) {
    snprintf(err, DISTRO_COMM_ERR_MAX, "injected failure (skipped the collective)");
    return 7;
  }
  distro_status st = k->inner->ops->allgatherv(k->inner, send, bytes, recv, slot, sizes);
  if (st != DISTRO_OK) {
    snprintf(err, DISTRO_COMM_ERR_MAX, "inner: %s", distro_last_error());
    return 1;
  }
  if (fail) {
    snprintf(err, DISTRO_COMM_ERR_MAX, "injected failure (after the collective)");
    return 5;
  }
  return 0;
}
static int cb_allreduce(void *ctx, float *buf, size_t count, char *err) {
  cb_ctx *k = ctx;
  const int fail = should_fail(k);
  if (fail) k->fired = 1;
  if (fail && k->fail_skip) {
    snprintf(err, DISTRO_COMM_ERR_MAX, "injected failure (skipped the collective)");
    return 7;
  }
  if (k->inner->ops->allreduce_sum(k->inner, buf, count) != DISTRO_OK) {
    snprintf(err, DISTRO_COMM_ERR_MAX, "inner: %s", distro_last_error());
    return 1;
  }
  if (fail) {
    buf[0] += 1.0f; /* the damage a failing callback may leave */
    snprintf(err, DISTRO_COMM_ERR_MAX, "injected failure (after the collective)");
    return 5;
  }
  return 0;
}
static int cb_barrier(void *ctx, char *err) {
  cb_ctx *k = ctx;
  (void)err;
  return distro_comm_barrier(k->inner) != DISTRO_OK;
}
static int cb_timeout(void *ctx, double s, char *err) {
  cb_ctx *k = ctx;
  (void)err;
  return distro_comm_set_timeout(k->inner, s) != DISTRO_OK;
}
static int cb_dup(void *ctx, void **out, char *err) {
  cb_ctx *k = ctx;
  cb_ctx *n = calloc(1, sizeof *n);
  if (!n) return 1;
  *n = (cb_ctx){.fail_rank = -1, .use_allreduce = k->use_allreduce};
  if (distro__comm_dup(k->inner, &n->inner) != DISTRO_OK) {
    snprintf(err, DISTRO_COMM_ERR_MAX, "%s", distro_last_error());
    free(n);
    return 1;
  }
  n->destroyed = -1; /* owned by the library: freed in destroy */
  *out = n;
  return 0;
}
static void cb_destroy(void *ctx) {
  cb_ctx *k = ctx;
  if (k->destroyed < 0) {
    distro_comm_free(k->inner);
    free(k);
  } else {
    k->destroyed++;
  }
}

static distro_comm *make_cb_comm(cb_ctx *k, int world) {
  distro_comm_callbacks cb = {.version = DISTRO_COMM_CALLBACKS_VERSION,
                              .rank = k->inner->rank,
                              .world = world,
                              .ctx = k,
                              .allgatherv = cb_allgatherv,
                              .allreduce_sum = k->use_allreduce ? cb_allreduce : NULL,
                              .barrier = cb_barrier,
                              .set_timeout = cb_timeout,
                              .dup = cb_dup,
                              .destroy = cb_destroy};
  distro_comm *c = NULL;
  return distro_comm_from_callbacks(&cb, &c) == DISTRO_OK ? c : NULL;
}

/* ---- one run: WORLD rank threads, STEPS steps ----------------------------- */

typedef enum { KIND_OPTIM, KIND_DILOCO, KIND_SPARSELOCO } run_kind;

typedef struct {
  distro_options opt;
  run_kind kind;
  int custom;         /* 1: callback comms, 0: the local comms themselves */
  int use_allreduce;
  int fail_rank, fail_step, fail_skip;
  int skip_step;      /* >= 0: no rank calls this step (a reference run) */
  double timeout;     /* > 0: distro_comm_set_timeout on every rank */
  uint64_t seed;
  /* results */
  float *params[WORLD][NT];
  float *before_fail[WORLD][NT]; /* parameters before the step that failed */
  distro_status st[WORLD][STEPS];
  char err[WORLD][256];
  uint64_t bytes[WORLD];
  int failed_at[WORLD];         /* first failing step, or -1 */
  int changed_on_fail[WORLD];   /* the failing step changed a parameter */
  int destroyed[WORLD];
} run;

typedef struct {
  run *r;
  distro_comm *local;
  int rank;
} rank_arg;

static void fill_grad(const run *r, int rank, int step, int t, float *g) {
  tu_rng rng = {r->seed ^ (uint64_t)(rank * 7919 + step * 131 + t + 1) * 0x9e3779b97f4a7c15ULL};
  tu_fill_normal(&rng, g, numel(t), 1.0f);
}

static void *rank_main(void *p) {
  rank_arg *a = p;
  run *r = a->r;
  const int me = a->rank;
  int cur_step = -1;
  cb_ctx k = {.inner = a->local, .fail_rank = r->fail_rank, .fail_step = r->fail_step, .fail_skip = r->fail_skip,
              .cur_step = &cur_step, .use_allreduce = r->use_allreduce};
  distro_comm *comm = r->custom ? make_cb_comm(&k, WORLD) : a->local;
  distro_comm *solo = NULL; /* DiLoCo: each learner is one rank */
  distro_optim *o = NULL;
  distro_diloco *d = NULL;
  float *g[NT] = {0};
  r->failed_at[me] = -1;
  if (!comm) {
    snprintf(r->err[me], sizeof r->err[me], "comm: %s", distro_last_error());
    return NULL;
  }
  if (r->timeout > 0) distro_comm_set_timeout(comm, r->timeout);
  distro_status st;
  if (r->kind == KIND_OPTIM) {
    st = distro_optim_create(&r->opt, comm, &o);
  } else {
    distro_comm_local_group(1, &solo);
    distro_options io = distro_options_default(DISTRO_ALG_ADAMW);
    st = distro_optim_create(&io, solo, &o);
  }
  for (int t = 0; t < NT && st == DISTRO_OK; t++) {
    r->params[me][t] = malloc(numel(t) * sizeof(float));
    r->before_fail[me][t] = malloc(numel(t) * sizeof(float));
    g[t] = malloc(numel(t) * sizeof(float));
    tu_rng rng = {r->seed + (uint64_t)t}; /* the same initial parameters on every rank */
    tu_fill_normal(&rng, r->params[me][t], numel(t), 0.1f);
    st = distro_optim_add_param(o, tnames[t], r->params[me][t], g[t], ndims[t], shapes[t]);
  }
  if (st == DISTRO_OK && r->kind != KIND_OPTIM) {
    distro_diloco_options dopt = r->kind == KIND_SPARSELOCO ? distro_diloco_options_sparseloco()
                                                             : distro_diloco_options_default();
    dopt.H = 2;
    dopt.overlap = 0;
    dopt.progress_thread = 0;
    st = distro_diloco_create(&dopt, o, comm, &d);
  }
  if (st != DISTRO_OK) snprintf(r->err[me], sizeof r->err[me], "setup: %s", distro_last_error());
  for (int s = 0; s < STEPS && st == DISTRO_OK; s++) {
    for (int t = 0; t < NT; t++) {
      fill_grad(r, me, s, t, g[t]);
      memcpy(r->before_fail[me][t], r->params[me][t], numel(t) * sizeof(float));
    }
    if (s == r->skip_step) continue;
    cur_step = s;
    const float lr = 1e-3f * (1.0f + 0.25f * (float)s);
    distro_step_stats ss = {0};
    distro_diloco_stats ds = {0};
    distro_status sst = d ? distro_diloco_step(d, lr, 100, &ds) : distro_optim_step(o, lr, &ss);
    r->st[me][s] = sst;
    if (sst != DISTRO_OK) {
      if (r->failed_at[me] < 0) {
        r->failed_at[me] = s;
        snprintf(r->err[me], sizeof r->err[me], "%s", distro_last_error());
        for (int t = 0; t < NT; t++)
          r->changed_on_fail[me] |= memcmp(r->before_fail[me][t], r->params[me][t], numel(t) * sizeof(float)) != 0;
      }
      if (r->fail_skip) break; /* the comm is gone after a timeout */
      continue;
    }
    r->bytes[me] += d ? ds.outer_bytes_sent + ds.outer_bytes_received : ss.bytes_sent + ss.bytes_received;
  }
  if (st == DISTRO_OK && o && r->opt.overlap && r->failed_at[me] < 0) {
    st = distro_optim_flush(o, NULL);
    if (st != DISTRO_OK) snprintf(r->err[me], sizeof r->err[me], "flush: %s", distro_last_error());
  }
  distro_diloco_free(d);
  distro_optim_free(o);
  distro_comm_free(solo);
  for (int t = 0; t < NT; t++) free(g[t]);
  if (r->custom) {
    distro_comm_free(comm);
    r->destroyed[me] = k.destroyed;
  }
  return NULL;
}

static void exec_run(run *r) {
  distro_comm *local[WORLD];
  cr_assert_eq(distro_comm_local_group(WORLD, local), DISTRO_OK);
  pthread_t th[WORLD];
  rank_arg args[WORLD];
  for (int i = 0; i < WORLD; i++) {
    args[i] = (rank_arg){.r = r, .local = local[i], .rank = i};
    cr_assert_eq(pthread_create(&th[i], NULL, rank_main, &args[i]), 0);
  }
  for (int i = 0; i < WORLD; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < WORLD; i++) distro_comm_free(local[i]);
}

static void free_run(run *r) {
  for (int i = 0; i < WORLD; i++)
    for (int t = 0; t < NT; t++) {
      free(r->params[i][t]);
      free(r->before_fail[i][t]);
    }
}

static int same_params(const run *a, int ra, const run *b, int rb) {
  for (int t = 0; t < NT; t++)
    if (!a->params[ra][t] || !b->params[rb][t] || memcmp(a->params[ra][t], b->params[rb][t], numel(t) * sizeof(float)))
      return 0;
  return 1;
}

typedef struct {
  const char *label;
  run_kind kind;
  distro_algorithm alg;
  distro_update update;
  distro_values values;
  int wire, overlap, use_allreduce;
} config;

static const config configs[] = {
    {"DeMo sign int8", KIND_OPTIM, DISTRO_ALG_DEMO, DISTRO_UPDATE_SIGN, DISTRO_VALUES_INT8, 2, 0, 1},
    {"DeMo sign f32 wire v1", KIND_OPTIM, DISTRO_ALG_DEMO, DISTRO_UPDATE_SIGN, DISTRO_VALUES_F32, 1, 0, 1},
    {"DisTrO-AdamW", KIND_OPTIM, DISTRO_ALG_DEMO, DISTRO_UPDATE_ADAMW, DISTRO_VALUES_INT8, 2, 0, 1},
    {"DisTrO-AdamW lookahead", KIND_OPTIM, DISTRO_ALG_DEMO, DISTRO_UPDATE_ADAMW, DISTRO_VALUES_INT8, 2,
     DISTRO_OVERLAP_LOOKAHEAD, 1},
    {"DeMo sign stale", KIND_OPTIM, DISTRO_ALG_DEMO, DISTRO_UPDATE_SIGN, DISTRO_VALUES_INT8, 2, DISTRO_OVERLAP_STALE,
     1},
    {"AdamW baseline", KIND_OPTIM, DISTRO_ALG_ADAMW, DISTRO_UPDATE_SIGN, DISTRO_VALUES_INT8, 2, 0, 1},
    {"AdamW baseline, gather fallback", KIND_OPTIM, DISTRO_ALG_ADAMW, DISTRO_UPDATE_SIGN, DISTRO_VALUES_INT8, 2, 0, 0},
    {"DiLoCo", KIND_DILOCO, DISTRO_ALG_ADAMW, DISTRO_UPDATE_SIGN, DISTRO_VALUES_INT8, 2, 0, 1},
    {"SparseLoCo", KIND_SPARSELOCO, DISTRO_ALG_ADAMW, DISTRO_UPDATE_SIGN, DISTRO_VALUES_INT8, 2, 0, 1},
};

static run make_run(const config *c, int custom, uint64_t seed) {
  run r;
  memset(&r, 0, sizeof r);
  r.opt = distro_options_default(c->alg);
  r.opt.update = c->update;
  r.opt.values = c->values;
  r.opt.wire_version = c->wire;
  r.opt.overlap = c->overlap;
  r.opt.topk = 8;
  r.opt.threads = 1;
  r.kind = c->kind;
  r.custom = custom;
  r.use_allreduce = c->use_allreduce;
  r.fail_rank = -1;
  r.skip_step = -1;
  r.seed = seed;
  return r;
}

Test(comm_callback, bit_identical_to_local_for_every_optimizer, .timeout = 240) {
  const uint64_t seed = tu_seed();
  for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
    const config *c = &configs[i];
    run *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    *a = make_run(c, 0, seed);
    *b = make_run(c, 1, seed);
    exec_run(a);
    exec_run(b);
    for (int r = 0; r < WORLD; r++) {
      cr_assert_eq(a->failed_at[r], -1, "%s local rank %d: %s (seed %llu)", c->label, r, a->err[r],
                   (unsigned long long)seed);
      cr_assert_eq(b->failed_at[r], -1, "%s custom rank %d: %s (seed %llu)", c->label, r, b->err[r],
                   (unsigned long long)seed);
      cr_assert(!b->err[r][0], "%s custom rank %d: %s", c->label, r, b->err[r]);
      cr_assert(same_params(a, r, b, r), "%s rank %d: custom comm parameters differ from the local comm's (seed %llu)",
                c->label, r, (unsigned long long)seed);
      cr_assert_eq(a->bytes[r], b->bytes[r], "%s rank %d: byte counters differ", c->label, r);
      cr_assert_eq(b->destroyed[r], 1, "%s rank %d: destroy callback ran %d times", c->label, r, b->destroyed[r]);
    }
    /* The parameters moved, and (all but DiLoCo's local steps) agree across ranks. */
    int moved = 0;
    for (int t = 0; t < NT; t++) {
      tu_rng rng = {seed + (uint64_t)t};
      float *init = malloc(numel(t) * sizeof(float));
      tu_fill_normal(&rng, init, numel(t), 0.1f);
      moved |= memcmp(init, b->params[0][t], numel(t) * sizeof(float)) != 0;
      free(init);
    }
    cr_assert(moved, "%s: no parameter moved", c->label);
    if (c->kind == KIND_OPTIM && c->overlap != DISTRO_OVERLAP_LOOKAHEAD)
      for (int r = 1; r < WORLD; r++) cr_assert(same_params(b, 0, b, r), "%s: ranks 0 and %d differ", c->label, r);
    cr_assert_gt(b->bytes[0], 0, "%s: no bytes counted", c->label);
    free_run(a);
    free_run(b);
    free(a);
    free(b);
  }
}

/* Rank 1's callback takes part in the transport's collective, then reports
 * a failure (a local error after the transfer, leaving its buffer damaged)
 * in step 3. Every rank returns DISTRO_ERR_COMM from that step with its
 * parameters as they were, and since the comm stays usable the later steps
 * continue as if the failed step had never been called: the final
 * parameters equal those of a run over local comms that skips that step. */
Test(comm_callback, failure_after_the_collective_fails_every_rank, .timeout = 120) {
  const uint64_t seed = tu_seed();
  const config *cs[] = {&configs[0], &configs[2], &configs[5]};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    const int at = 3;
    run *f = calloc(1, sizeof *f), *ref = calloc(1, sizeof *ref);
    *f = make_run(cs[i], 1, seed);
    f->fail_rank = 1;
    f->fail_step = at;
    exec_run(f);
    *ref = make_run(cs[i], 0, seed);
    ref->skip_step = at;
    exec_run(ref);
    for (int r = 0; r < WORLD; r++) {
      cr_assert_eq(f->failed_at[r], at, "%s: rank %d failed at step %d, not %d (%s; seed %llu)", cs[i]->label, r,
                   f->failed_at[r], at, f->err[r], (unsigned long long)seed);
      cr_assert_eq(f->st[r][at], DISTRO_ERR_COMM, "%s rank %d: status %d", cs[i]->label, r, f->st[r][at]);
      cr_assert(strstr(f->err[r], r == 1 ? "injected failure" : "rank 1's callback failed"), "%s rank %d: message '%s'",
                cs[i]->label, r, f->err[r]);
      cr_assert(!f->changed_on_fail[r], "%s rank %d: the failed step changed a parameter", cs[i]->label, r);
      for (int s = 0; s < STEPS; s++)
        if (s != at) cr_assert_eq(f->st[r][s], DISTRO_OK, "%s rank %d step %d failed too", cs[i]->label, r, s);
      cr_assert_eq(ref->failed_at[r], -1, "%s reference rank %d: %s", cs[i]->label, r, ref->err[r]);
      cr_assert(same_params(f, r, ref, r),
                "%s rank %d: after the failed step the run differs from one that never called it (seed %llu)",
                cs[i]->label, r, (unsigned long long)seed);
    }
    free_run(f);
    free_run(ref);
    free(f);
    free(ref);
  }
}

/* Rank 1's callback fails WITHOUT taking part: the others wait inside the
 * transport's collective until the timeout the comm was given; every rank
 * returns an error, none hangs, and the failing step changed no parameter. */
Test(comm_callback, failure_without_taking_part_ends_in_the_timeout, .timeout = 120) {
  const uint64_t seed = tu_seed();
  const config *cs[] = {&configs[2], &configs[5]};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    run *f = calloc(1, sizeof *f);
    *f = make_run(cs[i], 1, seed);
    f->fail_rank = 1;
    f->fail_step = 2;
    f->fail_skip = 1;
    f->timeout = 0.5;
    exec_run(f);
    for (int r = 0; r < WORLD; r++) {
      cr_assert_eq(f->failed_at[r], 2, "%s rank %d: failed at %d (seed %llu)", cs[i]->label, r, f->failed_at[r],
                   (unsigned long long)seed);
      cr_assert_neq(f->st[r][2], DISTRO_OK);
      cr_assert(!f->changed_on_fail[r], "%s rank %d: parameters changed by the failed step", cs[i]->label, r);
    }
    free_run(f);
    free(f);
  }
}

Test(comm_callback, bad_tables_are_refused) {
  distro_comm *local = NULL, *c = NULL;
  cr_assert_eq(distro_comm_local_group(1, &local), DISTRO_OK);
  cb_ctx k = {.inner = local, .fail_rank = -1};
  distro_comm_callbacks cb = {.version = DISTRO_COMM_CALLBACKS_VERSION, .rank = 0, .world = 1, .ctx = &k,
                              .allgatherv = cb_allgatherv};
  distro_comm_callbacks bad = cb;
  bad.version = 2;
  cr_assert_eq(distro_comm_from_callbacks(&bad, &c), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "version 2"), "%s", distro_last_error());
  bad = cb;
  bad.rank = 1;
  cr_assert_eq(distro_comm_from_callbacks(&bad, &c), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "rank 1 of world 1"), "%s", distro_last_error());
  bad = cb;
  bad.allgatherv = NULL;
  cr_assert_eq(distro_comm_from_callbacks(&bad, &c), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "allgatherv"), "%s", distro_last_error());
  cr_assert_null(c);
  /* Without set_timeout the comm has no timeout, and says so. */
  cr_assert_eq(distro_comm_from_callbacks(&cb, &c), DISTRO_OK);
  cr_assert_eq(distro_comm_set_timeout(c, 1.0), DISTRO_ERR_UNSUPPORTED);
  cr_assert(strstr(distro_last_error(), "custom"), "%s", distro_last_error());
  float x[4] = {1, 2, 3, 4};
  cr_assert_eq(distro_comm_allreduce_sum(c, x, 4), DISTRO_OK); /* the gather fallback, one rank */
  cr_assert_eq(x[3], 4.0f);
  distro_comm_free(c);
  distro_comm_free(local);
}
