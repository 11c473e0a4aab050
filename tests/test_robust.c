/* Robust aggregation for untrusted peers, through the public API with
 * in-process ranks: drop_invalid_peers (a payload that fails validation is
 * skipped, and reported in the step stats, instead of failing the step),
 * clip_median_multiple (each peer's values of a tensor scaled down to a
 * multiple of the lower median norm over the live peers; checked directly
 * against a float64 reference too), and the wire_version option.
 *
 * Corruption comes from a communicator that wraps the local one and flips a
 * byte in one rank's slot of the payload exchange. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>
#include "comm/comm_internal.h"
#include "optim/optim_internal.h"
#include "corrupt_comm.h"
#include "testutil.h"

#define MAXR 4
#define MAXS 4
#define NT 3
static const int64_t shapes[NT][2] = {{96, 128}, {64, 1}, {50, 67}};
static const int ndims[NT] = {2, 1, 2};

static size_t numel(int i) { return (size_t)(shapes[i][0] * (ndims[i] == 2 ? shapes[i][1] : 1)); }
static size_t total_numel(void) {
  size_t t = 0;
  for (int i = 0; i < NT; i++) t += numel(i);
  return t;
}

typedef struct {
  distro_options opt;
  uint64_t seed;
  int world, nsteps;
  int ident[MAXR];       /* whose gradients rank r computes (default r) */
  float grad_scale[MAXR]; /* 0 reads as 1 */
  int wire_version[MAXR]; /* 0: opt's */
  int nan_rank, nan_step; /* a NaN gradient (nan_rank -1: none) */
  int corrupt_rank;       /* whose payload is damaged (-1: none) */
  unsigned corrupt_steps; /* bit s: at step s */
  int corrupt_self;       /* 1: every rank receives the damaged bytes (a faulty
                             sender); 0: only the other ranks (damage in transit) */
  int skip_step;          /* control runs: leave this step out (-1: none) */
  /* results */
  float *out[MAXR];
  distro_status st[MAXR][MAXS];
  distro_step_stats stats[MAXR][MAXS];
  char msg[MAXR][MAXS][512];
} run_cfg;

static run_cfg cfg_new(distro_options opt, int world, int nsteps) {
  run_cfg c;
  memset(&c, 0, sizeof c);
  c.opt = opt;
  c.seed = tu_seed();
  c.world = world;
  c.nsteps = nsteps;
  for (int r = 0; r < MAXR; r++) c.ident[r] = r;
  c.nan_rank = -1;
  c.corrupt_rank = -1;
  c.corrupt_self = 1;
  c.skip_step = -1;
  return c;
}

static void cfg_free(run_cfg *c) {
  for (int r = 0; r < MAXR; r++) {
    free(c->out[r]);
    c->out[r] = NULL;
  }
}

static distro_status rank_main(distro_comm *comm, int rank, void *arg) {
  run_cfg *cfg = arg;
  tu_corrupting k = {.inner = comm, .corrupt_rank = cfg->corrupt_rank, .corrupt_self = cfg->corrupt_self};
  distro_comm wrapped;
  tu_corrupting_wrap(&k, &wrapped);
  distro_options opt = cfg->opt;
  if (cfg->wire_version[rank]) opt.wire_version = cfg->wire_version[rank];
  float *p[NT], *g[NT];
  distro_optim *o = NULL;
  cr_assert_eq(distro_optim_create(&opt, &wrapped, &o), DISTRO_OK, "%s", distro_last_error());
  tu_rng init = {cfg->seed};
  for (int i = 0; i < NT; i++) {
    p[i] = malloc(numel(i) * sizeof(float));
    g[i] = malloc(numel(i) * sizeof(float));
    tu_fill_normal(&init, p[i], numel(i), 1.0f); /* same on every rank */
    char name[16];
    snprintf(name, sizeof name, "t%d", i);
    cr_assert_eq(distro_optim_add_param(o, name, p[i], g[i], ndims[i], shapes[i]), DISTRO_OK);
  }
  const float scale = cfg->grad_scale[rank] != 0 ? cfg->grad_scale[rank] : 1.0f;
  for (int s = 0; s < cfg->nsteps; s++) {
    if (s == cfg->skip_step) continue;
    tu_rng r = {cfg->seed * 31 + (uint64_t)(s * 16 + cfg->ident[rank]) + 1};
    for (int i = 0; i < NT; i++) tu_fill_normal(&r, g[i], numel(i), scale);
    if (rank == cfg->nan_rank && s == cfg->nan_step) g[1][3] = NAN;
    k.armed = (cfg->corrupt_steps >> s) & 1;
    memset(&cfg->stats[rank][s], 0xee, sizeof cfg->stats[rank][s]);
    cfg->st[rank][s] = distro_optim_step(o, 0.01f, &cfg->stats[rank][s]);
    snprintf(cfg->msg[rank][s], sizeof cfg->msg[rank][s], "%s", cfg->st[rank][s] ? distro_last_error() : "");
  }
  cfg->out[rank] = malloc(total_numel() * sizeof(float));
  size_t off = 0;
  for (int i = 0; i < NT; i++) {
    memcpy(cfg->out[rank] + off, p[i], numel(i) * sizeof(float));
    off += numel(i);
    free(p[i]);
    free(g[i]);
  }
  distro_optim_free(o);
  return DISTRO_OK;
}

static void run(run_cfg *c) { cr_assert_eq(distro_comm_run_local(c->world, rank_main, c), DISTRO_OK); }

static int same_params(const float *a, const float *b) { return memcmp(a, b, total_numel() * sizeof(float)) == 0; }

static int names_rank(const char *hay, int peer) {
  char needle[32];
  snprintf(needle, sizeof needle, "rank %d", peer);
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) {
    char nx = p[strlen(needle)];
    if (nx < '0' || nx > '9') return 1;
  }
  return 0;
}

static distro_options demo(distro_values v, int wire_version) {
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.topk = 8;
  o.values = v;
  o.wire_version = wire_version;
  return o;
}

/* ---------------------------------------------------------------- dropping */

/* Rank 2's payload is damaged at every step; the other three ranks drop it
 * every time and end up exactly where three ranks holding their gradients
 * end up, and not where four undamaged ranks do. */
Test(robust, drop_invalid_peer_live_ranks_agree) {
  const distro_options opts[] = {demo(DISTRO_VALUES_F32, 2), demo(DISTRO_VALUES_INT4, 2), demo(DISTRO_VALUES_BF16, 1)};
  for (int v = 0; v < 3; v++) {
    distro_options o = opts[v];
    o.drop_invalid_peers = 1;
    run_cfg a = cfg_new(o, 4, 3);
    a.corrupt_rank = 2;
    a.corrupt_steps = 7;
    run(&a);
    const unsigned long long seed = a.seed;
    for (int r = 0; r < 4; r++) {
      if (r == 2) continue;
      for (int s = 0; s < 3; s++) {
        cr_expect_eq(a.st[r][s], DISTRO_OK, "variant %d rank %d step %d: %s (seed %llu)", v, r, s, a.msg[r][s], seed);
        cr_expect_eq(a.stats[r][s].peers_dropped, 1, "variant %d rank %d step %d", v, r, s);
        cr_expect_eq(a.stats[r][s].peers_dropped_mask, 1ull << 2, "variant %d rank %d step %d", v, r, s);
        cr_expect_eq(a.stats[r][s].step, s + 1);
      }
      cr_expect(same_params(a.out[r], a.out[0]), "variant %d: rank %d differs from rank 0 (seed %llu)", v, r, seed);
    }
    /* Three ranks with the gradients of ranks 0, 1 and 3. */
    run_cfg b = cfg_new(o, 3, 3);
    b.seed = a.seed;
    b.ident[2] = 3;
    run(&b);
    for (int r = 0; r < 3; r++)
      for (int s = 0; s < 3; s++) {
        cr_assert_eq(b.st[r][s], DISTRO_OK, "%s", b.msg[r][s]);
        cr_expect_eq(b.stats[r][s].peers_dropped, 0);
        cr_expect_eq(b.stats[r][s].peers_dropped_mask, 0);
      }
    cr_expect(same_params(a.out[0], b.out[0]),
              "variant %d: dropping rank 2 is not the same as a world without it (seed %llu)", v, seed);
    /* Four undamaged ranks: rank 2's gradients change the result. */
    run_cfg c = cfg_new(o, 4, 3);
    c.seed = a.seed;
    run(&c);
    cr_expect(!same_params(a.out[0], c.out[0]), "variant %d: dropping rank 2 changed nothing (seed %llu)", v, seed);
    cfg_free(&a);
    cfg_free(&b);
    cfg_free(&c);
  }
}

/* Regression test (bug found by this suite, fixed): src/optim/payload.c, distro__payload_exchange. Ranks used
 * not to agree on the set of dropped peers: a rank fails the step when
 * its *own* payload is invalid (`if (!o->opt.drop_invalid_peers || r ==
 * rank)`), so a faulty sender (all ranks receive the same damaged bytes)
 * fails its step while the others complete theirs, falls a step behind and
 * from then on disagrees with them. Every rank should drop the same set
 * (e.g. after exchanging the per-rank drop masks) and step alike. */
Test(robust, drop_invalid_peer_faulty_sender_steps_alike) {
  distro_options o = demo(DISTRO_VALUES_F32, 2);
  o.drop_invalid_peers = 1;
  run_cfg a = cfg_new(o, 3, 3);
  a.corrupt_rank = 1;
  a.corrupt_steps = 1u << 1;
  run(&a);
  for (int r = 0; r < 3; r++) {
    for (int s = 0; s < 3; s++)
      cr_expect_eq(a.st[r][s], DISTRO_OK, "rank %d step %d: %s (seed %llu)", r, s, a.msg[r][s],
                   (unsigned long long)a.seed);
    cr_expect_eq(a.stats[r][1].peers_dropped, 1, "rank %d: peers_dropped %d", r, a.stats[r][1].peers_dropped);
    cr_expect_eq(a.stats[r][1].peers_dropped_mask, 2ull, "rank %d", r);
    cr_expect(same_params(a.out[r], a.out[0]), "rank %d diverged from rank 0 (seed %llu)", r, (unsigned long long)a.seed);
  }
  cfg_free(&a);
}

/* Regression test (bug found by this suite, fixed), same cause: damage in transit to the other ranks only.
 * Ranks 0 and 2 drop rank 1's payload, rank 1 applies its own undamaged copy,
 * and the replicas silently diverge (every step reports success). */
Test(robust, drop_invalid_peer_damaged_in_transit_replicas_agree) {
  distro_options o = demo(DISTRO_VALUES_INT8, 2);
  o.drop_invalid_peers = 1;
  run_cfg a = cfg_new(o, 3, 2);
  a.corrupt_rank = 1;
  a.corrupt_self = 0;
  a.corrupt_steps = 1u << 0;
  run(&a);
  for (int r = 0; r < 3; r++) {
    for (int s = 0; s < 2; s++) cr_expect_eq(a.st[r][s], DISTRO_OK, "rank %d step %d: %s", r, s, a.msg[r][s]);
    cr_expect(same_params(a.out[r], a.out[0]), "rank %d diverged from rank 0: the ranks dropped different peers (seed %llu)",
              r, (unsigned long long)a.seed);
    cr_expect_eq(a.stats[r][0].peers_dropped_mask, a.stats[0][0].peers_dropped_mask,
                 "rank %d dropped mask 0x%llx, rank 0 0x%llx", r, (unsigned long long)a.stats[r][0].peers_dropped_mask,
                 (unsigned long long)a.stats[0][0].peers_dropped_mask);
  }
  cfg_free(&a);
}

/* Without the option the same damage fails the step on every rank, names the
 * sender, and changes nothing. */
Test(robust, invalid_peer_without_drop_fails_everywhere) {
  const distro_options opts[] = {demo(DISTRO_VALUES_INT4, 2), demo(DISTRO_VALUES_BF16, 2), demo(DISTRO_VALUES_SIGN1, 1)};
  for (int v = 0; v < 3; v++) {
    run_cfg a = cfg_new(opts[v], 3, 4);
    a.corrupt_rank = 1;
    a.corrupt_steps = 1u << 2;
    run(&a);
    run_cfg b = cfg_new(opts[v], 3, 4);
    b.seed = a.seed;
    b.skip_step = 2;
    run(&b);
    for (int r = 0; r < 3; r++) {
      cr_expect_eq(a.st[r][2], DISTRO_ERR_PAYLOAD, "variant %d rank %d: %s", v, r, a.msg[r][2]);
      cr_expect(names_rank(a.msg[r][2], 1), "variant %d rank %d: message does not name rank 1: %s", v, r, a.msg[r][2]);
      for (int s = 0; s < 4; s++)
        if (s != 2) cr_expect_eq(a.st[r][s], DISTRO_OK, "variant %d rank %d step %d: %s", v, r, s, a.msg[r][s]);
      cr_expect(same_params(a.out[r], b.out[r]), "variant %d rank %d: the failed step changed something", v, r);
      cr_expect(same_params(a.out[r], a.out[0]), "variant %d rank %d diverged", v, r);
    }
    cfg_free(&a);
    cfg_free(&b);
  }
}

/* Dropping is for payloads that fail validation; a peer that announces a
 * non-finite gradient still stops the step everywhere. */
Test(robust, abort_payload_is_not_dropped) {
  distro_options o = demo(DISTRO_VALUES_F32, 2);
  o.drop_invalid_peers = 1;
  o.clip_median_multiple = 2.0f;
  run_cfg a = cfg_new(o, 3, 3);
  a.nan_rank = 2;
  a.nan_step = 1;
  run(&a);
  run_cfg b = cfg_new(o, 3, 3);
  b.seed = a.seed;
  b.skip_step = 1;
  run(&b);
  for (int r = 0; r < 3; r++) {
    cr_expect_eq(a.st[r][1], DISTRO_ERR_NONFINITE, "rank %d: %s", r, a.msg[r][1]);
    cr_expect(names_rank(a.msg[r][1], 2), "rank %d: %s", r, a.msg[r][1]);
    cr_expect(same_params(a.out[r], b.out[r]), "rank %d: the failed step changed something", r);
  }
  cfg_free(&a);
  cfg_free(&b);
}

/* ---------------------------------------------------------------- clipping */

/* float64 reference of the rule: norms over each peer's values, the lower
 * median over live peers, scale = multiple * median / norm where the norm
 * exceeds multiple * median. Returns the number of peers scaled. */
static int ref_clip(float **vals, const uint8_t *dropped, int world, int64_t count, float multiple) {
  double norms[16], sorted[16];
  int live = 0, clipped = 0;
  for (int r = 0; r < world; r++) {
    double s = 0;
    for (int64_t j = 0; j < count; j++) s += (double)vals[r][j] * vals[r][j];
    norms[r] = sqrt(s);
    if (!dropped[r]) sorted[live++] = norms[r];
  }
  for (int i = 0; i < live; i++) /* selection sort */
    for (int j = i + 1; j < live; j++)
      if (sorted[j] < sorted[i]) {
        double t = sorted[i];
        sorted[i] = sorted[j];
        sorted[j] = t;
      }
  const double cap = live ? (double)multiple * sorted[(live - 1) / 2] : 0;
  for (int r = 0; r < world; r++) {
    if (dropped[r] || !(norms[r] > cap)) continue;
    const float scale = (float)(cap / norms[r]);
    for (int64_t j = 0; j < count; j++) vals[r][j] = vals[r][j] * scale;
    clipped++;
  }
  return clipped;
}

Test(robust, clip_matches_float64_reference) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int trial = 0; trial < 400; trial++) {
    const int world = 1 + (int)(tu_next(&r) % 12);
    const int64_t count = 1 + (int64_t)(tu_next(&r) % 200);
    const float multiple = trial % 7 == 0 ? 1.0f : (float)(0.25 + 4 * tu_uniform(&r));
    float *vals[16], *ref[16], *orig[16];
    uint8_t dropped[16];
    for (int p = 0; p < world; p++) {
      vals[p] = malloc(sizeof(float) * (size_t)count);
      ref[p] = malloc(sizeof(float) * (size_t)count);
      orig[p] = malloc(sizeof(float) * (size_t)count);
      const double sc = trial % 5 == 0 && p == 0 ? 1e6 : pow(10.0, 3 * (2 * tu_uniform(&r) - 1));
      for (int64_t j = 0; j < count; j++) orig[p][j] = (float)(tu_normal(&r) * sc);
      if (trial % 11 == 0 && p == 1) memset(orig[p], 0, sizeof(float) * (size_t)count); /* a zero-norm peer */
      memcpy(vals[p], orig[p], sizeof(float) * (size_t)count);
      memcpy(ref[p], orig[p], sizeof(float) * (size_t)count);
      dropped[p] = trial % 13 == 0 ? 1 : (uint8_t)(tu_next(&r) % 4 == 0);
    }
    const int got = distro__robust_clip(vals, dropped, world, count, multiple);
    const int want = ref_clip(ref, dropped, world, count, multiple);
    cr_assert_eq(got, want, "trial %d world %d: clipped %d peers, reference %d (seed %llu)", trial, world, got, want,
                 (unsigned long long)seed);
    for (int p = 0; p < world; p++) {
      cr_assert_eq(memcmp(vals[p], ref[p], sizeof(float) * (size_t)count), 0,
                   "trial %d peer %d: values differ from the reference (seed %llu)", trial, p, (unsigned long long)seed);
      if (dropped[p]) cr_assert_eq(memcmp(vals[p], orig[p], sizeof(float) * (size_t)count), 0, "dropped peer touched");
    }
    for (int p = 0; p < world; p++) {
      free(vals[p]);
      free(ref[p]);
      free(orig[p]);
    }
  }
}

/* Small cases worked by hand: one value per peer, so norms are |value|. */
static int clip1(const float *in, const uint8_t *dropped, int world, float multiple, float *out) {
  float *vals[16];
  for (int p = 0; p < world; p++) {
    out[p] = in[p];
    vals[p] = &out[p];
  }
  return distro__robust_clip(vals, dropped, world, 1, multiple);
}

Test(robust, clip_worked_cases) {
  float out[8];
  /* Even count: live norms 1, 2, 3, 4 -> lower median 2; x1.5 -> cap 3. The
   * dropped peer (64) neither counts toward the median nor is scaled. */
  const float a[5] = {1, -2, 3, 4, 64};
  const uint8_t da[5] = {0, 0, 0, 0, 1};
  cr_assert_eq(clip1(a, da, 5, 1.5f, out), 1);
  cr_assert_eq(out[0], 1.0f);
  cr_assert_eq(out[1], -2.0f);
  cr_assert_eq(out[2], 3.0f, "a norm equal to the cap is not clipped");
  cr_assert_eq(out[3], 3.0f);
  cr_assert_eq(out[4], 64.0f);
  /* With that peer live the median is 3, the cap 4.5: only it is clipped. */
  const uint8_t none[5] = {0};
  cr_assert_eq(clip1(a, none, 5, 1.5f, out), 1);
  cr_assert_eq(out[3], 4.0f);
  cr_assert_eq(out[4], 4.5f);
  /* Odd count: 1, -4, -8 -> median 4; x1 -> -8 becomes -4, sign kept. */
  const float b[3] = {1, -4, -8};
  cr_assert_eq(clip1(b, none, 3, 1.0f, out), 1);
  cr_assert(out[0] == 1.0f && out[1] == -4.0f && out[2] == -4.0f);
  /* A multiple below 1 scales the median peer too. */
  cr_assert_eq(clip1(b, none, 3, 0.5f, out), 2);
  cr_assert(out[0] == 1.0f && out[1] == -2.0f && out[2] == -2.0f);
  /* All dropped: nothing happens. One live peer: its own median. */
  const uint8_t all[3] = {1, 1, 1}, one[3] = {1, 0, 1};
  cr_assert_eq(clip1(b, all, 3, 0.5f, out), 0);
  cr_assert(out[0] == 1.0f && out[1] == -4.0f && out[2] == -8.0f);
  cr_assert_eq(clip1(b, one, 3, 2.0f, out), 0);
  cr_assert_eq(clip1(b, one, 3, 0.5f, out), 1);
  cr_assert(out[0] == 1.0f && out[1] == -2.0f && out[2] == -8.0f);
  /* Median 0: every peer with a non-zero norm goes to zero. */
  const float z[3] = {0, 0, 3};
  cr_assert_eq(clip1(z, none, 3, 4.0f, out), 1);
  cr_assert_eq(out[2], 0.0f);
}

/* Rank 1's gradients are 1e6 times larger; with clipping it is scaled down
 * on every tensor, every rank reports it and the replicas stay identical.
 * (The sign update: DisTrO-AdamW normalizes each rank's gradient by its own
 * second moment, so a uniformly scaled gradient is no outlier there.) */
Test(robust, clip_outlier_through_api) {
  const distro_values vs[2] = {DISTRO_VALUES_F32, DISTRO_VALUES_INT8};
  for (int v = 0; v < 2; v++) {
    distro_options o = demo(vs[v], 2);
    o.update = DISTRO_UPDATE_SIGN;
    o.clip_median_multiple = 2.0f;
    run_cfg a = cfg_new(o, 3, 3);
    a.grad_scale[1] = 1e6f;
    run(&a);
    for (int r = 0; r < 3; r++) {
      for (int s = 0; s < 3; s++) {
        cr_assert_eq(a.st[r][s], DISTRO_OK, "rank %d step %d: %s", r, s, a.msg[r][s]);
        cr_expect_eq(a.stats[r][s].peers_clipped, NT, "codec %d rank %d step %d: %d (peer, tensor) pairs clipped", v, r, s,
                     a.stats[r][s].peers_clipped);
        cr_expect_eq(a.stats[r][s].peers_dropped, 0);
      }
      cr_expect(same_params(a.out[r], a.out[0]), "codec %d: rank %d diverged (seed %llu)", v, r,
                (unsigned long long)a.seed);
    }
    /* Without clipping the outlier dominates: a different result. */
    run_cfg b = cfg_new(o, 3, 3);
    b.opt.clip_median_multiple = 0;
    b.seed = a.seed;
    b.grad_scale[1] = 1e6f;
    run(&b);
    for (int s = 0; s < 3; s++) cr_expect_eq(b.stats[0][s].peers_clipped, 0);
    cr_expect(!same_params(a.out[0], b.out[0]), "codec %d: clipping changed nothing", v);
    cfg_free(&a);
    cfg_free(&b);
  }
  /* A generous multiple clips nothing and changes nothing, bit for bit. */
  distro_options o = demo(DISTRO_VALUES_BF16, 2);
  o.update = DISTRO_UPDATE_ADAMW;
  o.clip_median_multiple = 100.0f;
  run_cfg a = cfg_new(o, 3, 3);
  run(&a);
  run_cfg b = cfg_new(o, 3, 3);
  b.opt.clip_median_multiple = 0;
  b.seed = a.seed;
  run(&b);
  for (int s = 0; s < 3; s++) cr_expect_eq(a.stats[0][s].peers_clipped, 0);
  cr_expect(same_params(a.out[0], b.out[0]), "an inactive clip changed the result");
  cfg_free(&a);
  cfg_free(&b);
}

/* ---------------------------------------------------------------- options */

Test(robust, wire_version_option_checked) {
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_optim *o = (distro_optim *)0x1;
  distro_options d = distro_options_default(DISTRO_ALG_DEMO);
  cr_expect_eq(d.wire_version, 2);
  cr_expect_eq(d.drop_invalid_peers, 0);
  cr_expect_eq(d.clip_median_multiple, 0.0f);
  const int bad_versions[] = {0, -1, 3, 99};
  for (int i = 0; i < 4; i++) {
    distro_options b = d;
    b.wire_version = bad_versions[i];
    cr_expect_eq(distro_optim_create(&b, c[0], &o), DISTRO_ERR_INVALID, "wire_version %d", bad_versions[i]);
    cr_expect(strstr(distro_last_error(), "wire_version") != NULL, "%s", distro_last_error());
  }
  for (int v = DISTRO_VALUES_INT8; v <= DISTRO_VALUES_INT4; v++) {
    distro_options b = d;
    b.wire_version = 1;
    b.values = (distro_values)v;
    cr_expect_eq(distro_optim_create(&b, c[0], &o), DISTRO_ERR_INVALID, "wire_version 1 with values %d", v);
    cr_expect(strstr(distro_last_error(), "wire_version 2") != NULL, "%s", distro_last_error());
    const int64_t shape[2] = {64, 64}, *sh[1] = {shape};
    const int nd[1] = {2};
    uint64_t bytes;
    cr_expect_eq(distro_payload_bytes(&b, 1, nd, sh, &bytes), DISTRO_ERR_INVALID);
    b.wire_version = 2;
    cr_expect_eq(distro_optim_create(&b, c[0], &o), DISTRO_OK, "%s", distro_last_error());
    distro_optim_free(o);
  }
  const float bad_clip[] = {-1.0f, NAN, INFINITY};
  for (int i = 0; i < 3; i++) {
    distro_options b = d;
    b.clip_median_multiple = bad_clip[i];
    cr_expect_eq(distro_optim_create(&b, c[0], &o), DISTRO_ERR_INVALID, "clip %g", (double)bad_clip[i]);
  }
  for (int w = 1; w <= 2; w++) {
    distro_options b = d;
    b.values = DISTRO_VALUES_F32; /* v1 carries F32, BF16 and SIGN1 only */
    b.wire_version = w;
    cr_expect_eq(distro_optim_create(&b, c[0], &o), DISTRO_OK);
    distro_optim_free(o);
  }
  distro_comm_free(c[0]);
}

/* Ranks configured with different wire versions cannot exchange payloads:
 * the first step's signature catches it on every rank, before anything. */
Test(robust, mismatched_wire_versions_fail_everywhere) {
  run_cfg a = cfg_new(demo(DISTRO_VALUES_BF16, 2), 3, 2);
  a.wire_version[2] = 1;
  run(&a);
  run_cfg b = cfg_new(demo(DISTRO_VALUES_BF16, 2), 3, 0);
  b.seed = a.seed;
  run(&b);
  for (int r = 0; r < 3; r++) {
    for (int s = 0; s < 2; s++) {
      cr_expect_eq(a.st[r][s], DISTRO_ERR_SHAPE, "rank %d step %d: %s", r, s, a.msg[r][s]);
      cr_expect(strstr(a.msg[r][s], "wire version") != NULL, "rank %d: %s", r, a.msg[r][s]);
    }
    cr_expect(same_params(a.out[r], b.out[r]), "rank %d: parameters changed", r);
  }
  cfg_free(&a);
  cfg_free(&b);
}
