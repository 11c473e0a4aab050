/* Bad input gets a clear error and changes nothing, on every rank. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>
#include "comm/comm_internal.h"
#include "corrupt_comm.h"
#include "testutil.h"

#define MAXR 4
#define NT 3
static const int64_t shapes[NT][2] = {{96, 128}, {64, 1}, {50, 67}};
static const int ndims[NT] = {2, 1, 2};

typedef struct {
  distro_options opt;
  uint64_t seed;
  int bad_rank;       /* rank whose gradient turns NaN at step `bad_step` */
  int bad_step;
  int corrupt_rank;   /* rank whose payload gets a flipped byte at bad_step */
  int skip_bad_step;  /* control run: leave the bad step out entirely */
  int huge_gradient;  /* the bad rank's tensor t2 is all FLT_MAX (finite, but
                         its DCT and so the momentum overflow) instead of a NaN */
  int nsteps;
  float *out[MAXR];   /* final parameters per rank */
  distro_status st_bad[MAXR];
  char msg[MAXR][512];
} run_cfg;

static size_t numel(int i) { return (size_t)(shapes[i][0] * (ndims[i] == 2 ? shapes[i][1] : 1)); }

static distro_status rank_main(distro_comm *comm, int rank, void *arg) {
  run_cfg *cfg = arg;
  tu_corrupting k = {.inner = comm, .corrupt_rank = cfg->corrupt_rank, .corrupt_self = 1};
  distro_comm wrapped;
  tu_corrupting_wrap(&k, &wrapped);
  float *p[NT], *g[NT];
  distro_optim *o = NULL;
  cr_assert_eq(distro_optim_create(&cfg->opt, &wrapped, &o), DISTRO_OK);
  tu_rng init = {cfg->seed};
  size_t total = 0;
  for (int i = 0; i < NT; i++) {
    p[i] = malloc(numel(i) * sizeof(float));
    g[i] = malloc(numel(i) * sizeof(float));
    tu_fill_normal(&init, p[i], numel(i), 1.0f); /* same on every rank */
    char name[16];
    snprintf(name, sizeof name, "t%d", i);
    cr_assert_eq(distro_optim_add_param(o, name, p[i], g[i], ndims[i], shapes[i]), DISTRO_OK);
    total += numel(i);
  }
  for (int s = 0; s < cfg->nsteps; s++) {
    const int bad = s == cfg->bad_step;
    if (bad && cfg->skip_bad_step) continue;
    tu_rng r = {cfg->seed * 31 + (uint64_t)(s * MAXR + rank) + 1};
    for (int i = 0; i < NT; i++) tu_fill_normal(&r, g[i], numel(i), 1.0f);
    if (bad && rank == cfg->bad_rank) {
      if (cfg->huge_gradient)
        for (size_t j = 0; j < numel(2); j++) g[2][j] = FLT_MAX;
      else
        g[2][7] = NAN;
    }
    k.armed = bad;
    distro_status st = distro_optim_step(o, 0.01f, NULL);
    if (bad) {
      cfg->st_bad[rank] = st;
      snprintf(cfg->msg[rank], sizeof cfg->msg[rank], "%s", distro_last_error());
    } else {
      cr_assert_eq(st, DISTRO_OK, "rank %d step %d: %s", rank, s, distro_last_error());
    }
  }
  cfg->out[rank] = malloc(total * sizeof(float));
  for (int i = 0, off = 0; i < NT; off += (int)numel(i), i++) memcpy(cfg->out[rank] + off, p[i], numel(i) * sizeof(float));
  for (int i = 0; i < NT; i++) {
    free(p[i]);
    free(g[i]);
  }
  distro_optim_free(o);
  return DISTRO_OK;
}

static size_t total_numel(void) {
  size_t t = 0;
  for (int i = 0; i < NT; i++) t += numel(i);
  return t;
}

/* Runs with a failing step and without it; final parameters must match. */
static void failed_step_changes_nothing_with(distro_options opt, int world, int bad_rank, int corrupt_rank,
                                             int huge_gradient, distro_status want, const char *want_in_msg) {
  run_cfg a = {.opt = opt, .seed = tu_seed(), .bad_rank = bad_rank, .bad_step = 2, .corrupt_rank = corrupt_rank,
               .nsteps = 4, .huge_gradient = huge_gradient};
  run_cfg b = a;
  b.skip_bad_step = 1;
  cr_assert_eq(distro_comm_run_local(world, rank_main, &a), DISTRO_OK);
  cr_assert_eq(distro_comm_run_local(world, rank_main, &b), DISTRO_OK);
  for (int r = 0; r < world; r++) {
    cr_expect_eq(a.st_bad[r], want, "rank %d got %s: %s", r, distro_status_string(a.st_bad[r]), a.msg[r]);
    cr_expect(strstr(a.msg[r], want_in_msg) != NULL, "rank %d message '%s' lacks '%s'", r, a.msg[r], want_in_msg);
    cr_expect(memcmp(a.out[r], b.out[r], total_numel() * sizeof(float)) == 0,
              "rank %d: the failed step changed parameters or optimizer state", r);
    cr_expect(memcmp(a.out[r], a.out[0], total_numel() * sizeof(float)) == 0, "rank %d diverged from rank 0", r);
  }
  for (int r = 0; r < world; r++) {
    free(a.out[r]);
    free(b.out[r]);
  }
}

static void failed_step_changes_nothing(distro_options opt, int world, int bad_rank, int corrupt_rank,
                                        distro_status want, const char *want_in_msg) {
  failed_step_changes_nothing_with(opt, world, bad_rank, corrupt_rank, 0, want, want_in_msg);
}

/* A finite gradient whose transform overflows: caught where the momentum is
 * written, reported like a NaN, and nothing changes on any rank. */
Test(errors, momentum_overflow_demo) {
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.topk = 4;
  o.update = DISTRO_UPDATE_ADAMW;
  failed_step_changes_nothing_with(o, 3, 1, -1, 1, DISTRO_ERR_NONFINITE, "rank 1 could not step");
  o.update = DISTRO_UPDATE_SIGN;
  failed_step_changes_nothing_with(o, 2, 0, -1, 1, DISTRO_ERR_NONFINITE, "'t2'");
}

Test(errors, nonfinite_gradient_demo) {
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.topk = 4;
  failed_step_changes_nothing(o, 3, 1, -1, DISTRO_ERR_NONFINITE, "rank 1");
  o.update = DISTRO_UPDATE_ADAMW;
  failed_step_changes_nothing(o, 2, 0, -1, DISTRO_ERR_NONFINITE, "'t2'");
}

Test(errors, nonfinite_gradient_adamw_baseline) {
  distro_options o = distro_options_default(DISTRO_ALG_ADAMW);
  failed_step_changes_nothing(o, 3, 2, -1, DISTRO_ERR_NONFINITE, "non-finite");
  failed_step_changes_nothing(o, 1, 0, -1, DISTRO_ERR_NONFINITE, "'t2'");
}

Test(errors, corrupt_peer_payload) {
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.topk = 8;
  failed_step_changes_nothing(o, 3, -1, 1, DISTRO_ERR_PAYLOAD, "rank 1");
  o.values = DISTRO_VALUES_SIGN1;
  failed_step_changes_nothing(o, 4, -1, 3, DISTRO_ERR_PAYLOAD, "rank 3");
}

/* ---- argument checks ------------------------------------------------------ */

static distro_comm *solo(void) {
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  return c[0];
}

#define EXPECT_INVALID(expr)                                                               \
  do {                                                                                     \
    distro_status s_ = (expr);                                                             \
    cr_expect_eq(s_, DISTRO_ERR_INVALID, #expr " gave %s", distro_status_string(s_));      \
    cr_expect(strlen(distro_last_error()) > 0, #expr " left no message");                  \
  } while (0)

Test(errors, bad_options) {
  distro_comm *c = solo();
  distro_optim *o = (distro_optim *)0x1;
  distro_options opt = distro_options_default(DISTRO_ALG_DEMO);
  EXPECT_INVALID(distro_optim_create(NULL, c, &o));
  cr_expect_null(o);
  EXPECT_INVALID(distro_optim_create(&opt, NULL, &o));
  EXPECT_INVALID(distro_optim_create(&opt, c, NULL));
  distro_options b = opt;
  b.chunk = 0;
  EXPECT_INVALID(distro_optim_create(&b, c, &o));
  cr_expect(strstr(distro_last_error(), "chunk") != NULL);
  b = opt;
  b.topk = -3;
  EXPECT_INVALID(distro_optim_create(&b, c, &o));
  cr_expect(strstr(distro_last_error(), "topk") != NULL);
  b.chunk = 8;
  b.topk = 65; /* more than an 8x8 chunk holds */
  EXPECT_INVALID(distro_optim_create(&b, c, &o));
  cr_expect(strstr(distro_last_error(), "exceeds the 64 coefficients") != NULL, "%s", distro_last_error());
  b = opt;
  b.compression_decay = 1.0f;
  EXPECT_INVALID(distro_optim_create(&b, c, &o));
  b.compression_decay = -0.1f;
  EXPECT_INVALID(distro_optim_create(&b, c, &o));
  b = opt;
  b.version = 99;
  EXPECT_INVALID(distro_optim_create(&b, c, &o));
  b = opt;
  b.lr = NAN;
  EXPECT_INVALID(distro_optim_create(&b, c, &o));
  b = opt;
  b.values = (distro_values)7;
  EXPECT_INVALID(distro_optim_create(&b, c, &o));
  cr_expect_eq(distro_comm_local_group(0, NULL), DISTRO_ERR_INVALID);
  distro_comm_free(c);
}

Test(errors, bad_params_and_order) {
  distro_comm *c = solo();
  distro_options opt = distro_options_default(DISTRO_ALG_DEMO);
  distro_optim *o;
  cr_assert_eq(distro_optim_create(&opt, c, &o), DISTRO_OK);
  float p[64] = {0}, g[64] = {0};
  int64_t sh[2] = {8, 8}, zero[2] = {8, 0}, neg[1] = {-4};
  EXPECT_INVALID(distro_optim_step(o, 0.1f, NULL)); /* nothing registered */
  EXPECT_INVALID(distro_optim_add_param(o, NULL, p, g, 2, sh));
  cr_expect(strstr(distro_last_error(), "name is NULL") != NULL, "%s", distro_last_error());
  EXPECT_INVALID(distro_optim_add_param(o, "w", NULL, g, 2, sh));
  cr_expect(strstr(distro_last_error(), "param is NULL") != NULL, "%s", distro_last_error());
  EXPECT_INVALID(distro_optim_add_param(o, "w", p, g, 2, NULL));
  cr_expect(strstr(distro_last_error(), "shape is NULL") != NULL, "%s", distro_last_error());
  EXPECT_INVALID(distro_optim_add_param(o, "w", p, g, 0, sh));
  EXPECT_INVALID(distro_optim_add_param(o, "w", p, g, 2, zero));
  EXPECT_INVALID(distro_optim_add_param(o, "w", p, g, 1, neg));
  cr_assert_eq(distro_optim_add_param(o, "w", p, g, 2, sh), DISTRO_OK);
  EXPECT_INVALID(distro_optim_add_param(o, "w", p, g, 2, sh));
  cr_expect(strstr(distro_last_error(), "duplicate") != NULL);
  /* Overlapping buffers under another name are refused, naming the owner. */
  float p2[64] = {0}, g2[64] = {0};
  int64_t half[2] = {4, 8};
  EXPECT_INVALID(distro_optim_add_param(o, "alias", p + 32, g2, 2, half));
  cr_expect(strstr(distro_last_error(), "param overlaps the param buffer of 'w'") != NULL, "%s", distro_last_error());
  EXPECT_INVALID(distro_optim_add_param(o, "alias", p2, g + 60, 2, half));
  cr_expect(strstr(distro_last_error(), "grad overlaps the grad buffer of 'w'") != NULL, "%s", distro_last_error());
  /* The other entry points name the missing argument too. */
  EXPECT_INVALID(distro_optim_save(o, NULL));
  cr_expect(strstr(distro_last_error(), "distro_optim_save: argument 'path' is NULL") != NULL, "%s",
            distro_last_error());
  EXPECT_INVALID(distro_optim_save(o, ""));
  cr_expect(strstr(distro_last_error(), "'path' is empty") != NULL, "%s", distro_last_error());
  EXPECT_INVALID(distro_optim_load(o, NULL));
  cr_expect(strstr(distro_last_error(), "'path' is NULL") != NULL, "%s", distro_last_error());
  EXPECT_INVALID(distro_optim_payload_bytes(o, NULL));
  cr_expect(strstr(distro_last_error(), "'bytes' is NULL") != NULL, "%s", distro_last_error());
  EXPECT_INVALID(distro_comm_allgather(c, NULL, 4, p2));
  cr_expect(strstr(distro_last_error(), "'send' is NULL") != NULL, "%s", distro_last_error());
  EXPECT_INVALID(distro_comm_allreduce_sum(c, NULL, 4));
  cr_expect(strstr(distro_last_error(), "'buf' is NULL") != NULL, "%s", distro_last_error());
  uint64_t bytes = 0;
  const int64_t *one_shape[1] = {sh};
  int nd[1] = {2};
  EXPECT_INVALID(distro_payload_bytes(&opt, 0, nd, one_shape, &bytes));
  cr_expect(strstr(distro_last_error(), "at least one tensor") != NULL, "%s", distro_last_error());
  EXPECT_INVALID(distro_optim_step(o, NAN, NULL));
  EXPECT_INVALID(distro_optim_step(o, -1.0f, NULL));
  EXPECT_INVALID(distro_optim_step(NULL, 0.1f, NULL));
  for (int i = 0; i < 64; i++) g[i] = (float)i - 30.0f;
  cr_assert_eq(distro_optim_step(o, 0.1f, NULL), DISTRO_OK);
  EXPECT_INVALID(distro_optim_add_param(o, "late", p, g, 2, sh));
  cr_expect(strstr(distro_last_error(), "frozen") != NULL);
  distro_optim_free(o);
  distro_optim_free(NULL);
  distro_comm_free(c);
  distro_comm_free(NULL);
  cr_expect_str_eq(distro_status_string(DISTRO_ERR_PAYLOAD), "corrupt payload");
  cr_expect_str_eq(distro_status_string((distro_status)123), "unknown status");
}

/* ---- mismatched tensor lists ---------------------------------------------- */

typedef struct {
  distro_status st[MAXR];
  char msg[MAXR][512];
  int variant; /* 0: shape differs on rank 2; 1: extra tensor on rank 1; 2: topk differs on rank 1 */
} sig_cfg;

static distro_status sig_rank(distro_comm *comm, int rank, void *arg) {
  sig_cfg *cfg = arg;
  distro_options opt = distro_options_default(DISTRO_ALG_DEMO);
  if (cfg->variant == 2 && rank == 1) opt.topk = 16;
  distro_optim *o;
  cr_assert_eq(distro_optim_create(&opt, comm, &o), DISTRO_OK);
  static float params[4][4 * 4096], grads[4][4 * 4096];
  float *p = params[rank], *g = grads[rank];
  int64_t a[2] = {64, 64}, b[2] = {32, 64}, bb[2] = {cfg->variant == 0 && rank == 2 ? 64 : 32, 32};
  distro_optim_add_param(o, "embed", p, g, 2, a);
  distro_optim_add_param(o, "attn.w", p + 4096, g + 4096, 2, b);
  distro_optim_add_param(o, "mlp.w", p + 2 * 4096, g + 2 * 4096, 2, bb);
  if (cfg->variant == 1 && rank == 1) distro_optim_add_param(o, "extra", p + 3 * 4096, g + 3 * 4096, 2, b);
  cfg->st[rank] = distro_optim_step(o, 0.1f, NULL);
  snprintf(cfg->msg[rank], sizeof cfg->msg[rank], "%s", distro_last_error());
  distro_optim_free(o);
  return DISTRO_OK;
}

Test(errors, mismatched_tensor_lists) {
  for (int v = 0; v < 3; v++) {
    sig_cfg cfg = {.variant = v};
    cr_assert_eq(distro_comm_run_local(3, sig_rank, &cfg), DISTRO_OK);
    for (int r = 0; r < 3; r++) {
      cr_expect_eq(cfg.st[r], DISTRO_ERR_SHAPE, "variant %d rank %d: %s", v, r, cfg.msg[r]);
      if (v == 0) cr_expect(strstr(cfg.msg[r], "mlp.w") != NULL, "message names the tensor: %s", cfg.msg[r]);
      if (v == 1) cr_expect(strstr(cfg.msg[r], "#3") != NULL, "message names the tensor: %s", cfg.msg[r]);
    }
  }
}

/* A trainer that allocates gradients in its first backward pass registers
 * with grad = NULL and hands the buffer over later. */
typedef struct {
  distro_status first[2], second[2];
  char msg[2][512];
  float w[2][256];
} lazy_cfg;

static distro_status lazy_rank(distro_comm *comm, int rank, void *arg) {
  lazy_cfg *cfg = arg;
  distro_options opt = distro_options_default(DISTRO_ALG_DEMO);
  distro_optim *o;
  cr_assert_eq(distro_optim_create(&opt, comm, &o), DISTRO_OK);
  int64_t sh[2] = {16, 16};
  float *g = calloc(256, sizeof *g);
  for (int i = 0; i < 256; i++) cfg->w[rank][i] = 0.5f;
  cr_assert_eq(distro_optim_add_param(o, "w", cfg->w[rank], NULL, 2, sh), DISTRO_OK);
  /* Rank 1 forgets its buffer on the first try: both ranks fail alike. */
  if (rank == 0) cr_assert_eq(distro_optim_set_grad(o, "w", g), DISTRO_OK);
  cfg->first[rank] = distro_optim_step(o, 0.1f, NULL);
  snprintf(cfg->msg[rank], sizeof cfg->msg[rank], "%s", distro_last_error());
  cr_expect_eq(distro_optim_set_grad(o, "nope", g), DISTRO_ERR_INVALID);
  cr_expect(strstr(distro_last_error(), "'nope'") != NULL, "%s", distro_last_error());
  cr_expect_eq(distro_optim_set_grad(o, "w", NULL), DISTRO_ERR_INVALID);
  for (int i = 0; i < 256; i++) g[i] = (float)(i % 7) - 3.0f;
  cr_assert_eq(distro_optim_set_grad(o, "w", g), DISTRO_OK);
  cfg->second[rank] = distro_optim_step(o, 0.1f, NULL);
  distro_optim_free(o);
  free(g);
  return DISTRO_OK;
}

Test(errors, lazy_gradient_buffers) {
  lazy_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cr_assert_eq(distro_comm_run_local(2, lazy_rank, &cfg), DISTRO_OK);
  for (int r = 0; r < 2; r++) {
    cr_expect_neq(cfg.first[r], DISTRO_OK, "rank %d stepped without rank 1's gradient", r);
    cr_expect_eq(cfg.second[r], DISTRO_OK, "rank %d", r);
  }
  cr_expect(strstr(cfg.msg[1], "'w' has no gradient buffer") != NULL, "%s", cfg.msg[1]);
  cr_expect(memcmp(cfg.w[0], cfg.w[1], sizeof cfg.w[0]) == 0, "ranks differ after the step");
  int moved = 0;
  for (int i = 0; i < 256; i++) moved |= cfg.w[0][i] != 0.5f;
  cr_expect(moved, "the step after set_grad did not change the parameters");
}
