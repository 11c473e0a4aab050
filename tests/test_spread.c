/* The aggregate's spread (src/optim/spread.c) and the step's growth with it
 * (step_rule.h), against a brute-force count on fresh random selections:
 * every rank's picks per tile sorted and distinct as the wire guarantees,
 * ranks dropped at random, models under and over the 4096 sampled tiles. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "optim/optim_internal.h"
#include "testutil.h"

typedef struct {
  distro_optim o;
  distro_comm comm;
  distro__tiling *tilings;
} fake;

static int cmp_u32(const void *a, const void *b) {
  const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* k distinct sorted positions in [0, n), overlapping another rank's picks
 * with probability `share` each (so the spread spans 1 to the rank count). */
static void pick(tu_rng *g, uint32_t *out, int64_t k, int64_t n, const uint32_t *other, double share) {
  int64_t got = 0;
  while (got < k) {
    uint32_t x = other && tu_uniform(g) < share ? other[tu_next(g) % (uint64_t)k] : (uint32_t)(tu_next(g) % (uint64_t)n);
    int dup = 0;
    for (int64_t j = 0; j < got && !dup; j++) dup = out[j] == x;
    if (!dup) out[got++] = x;
  }
  qsort(out, (size_t)k, sizeof *out, cmp_u32);
}

static void build(fake *f, tu_rng *g, int world, int n, const int64_t (*shapes)[2], int64_t chunk, int64_t topk,
                  double share) {
  memset(f, 0, sizeof *f);
  f->comm.size = world;
  f->o.comm = &f->comm;
  f->o.nparams = n;
  f->tilings = calloc((size_t)n, sizeof *f->tilings);
  f->o.tilings = f->tilings;
  f->o.sel_off = calloc((size_t)n, sizeof(int64_t));
  int64_t most = 1;
  for (int i = 0; i < n; i++) {
    cr_assert_eq(distro__tiling_init(&f->tilings[i], 2, shapes[i], chunk, topk), DISTRO_OK);
    f->o.sel_off[i] = f->o.total_sel;
    f->o.total_sel += f->tilings[i].nchunks * f->tilings[i].k;
    if (f->tilings[i].chunk_elems > most) most = f->tilings[i].chunk_elems;
  }
  f->o.spread_bits = calloc((size_t)((most + 63) / 64), sizeof(uint64_t));
  f->o.dec_idx = malloc(sizeof(uint32_t) * (size_t)(f->o.total_sel * world));
  f->o.dropped = calloc((size_t)world, 1);
  for (int r = 0; r < world; r++) {
    f->o.dropped[r] = world > 1 && tu_uniform(g) < 0.25;
    for (int i = 0; i < n; i++) {
      const distro__tiling *t = &f->tilings[i];
      for (int64_t c = 0; c < t->nchunks; c++) {
        uint32_t *mine = f->o.dec_idx + (size_t)r * (size_t)f->o.total_sel + (size_t)(f->o.sel_off[i] + c * t->k);
        pick(g, mine, t->k, t->chunk_elems, r ? mine - f->o.total_sel : NULL, share);
      }
    }
  }
}

static void release(fake *f) {
  free(f->tilings);
  free(f->o.sel_off);
  free(f->o.spread_bits);
  free(f->o.dec_idx);
  free(f->o.dropped);
}

/* Brute force: the union of the live ranks' picks on every stride-th tile
 * (global order), with stride = ceil(tiles / 4096) once there are more. */
static double ref_spread(const fake *f) {
  int64_t tiles = 0, distinct = 0, picks = 0, g = 0;
  for (int i = 0; i < f->o.nparams; i++) tiles += f->tilings[i].nchunks;
  const int64_t stride = tiles > 4096 ? (tiles + 4095) / 4096 : 1;
  for (int i = 0; i < f->o.nparams; i++) {
    const distro__tiling *t = &f->tilings[i];
    for (int64_t c = 0; c < t->nchunks; c++, g++) {
      if (g % stride) continue;
      picks += t->k;
      for (int r = 0; r < f->comm.size; r++) {
        if (f->o.dropped[r]) continue;
        const uint32_t *ri = f->o.dec_idx + (size_t)r * (size_t)f->o.total_sel + (size_t)(f->o.sel_off[i] + c * t->k);
        for (int64_t j = 0; j < t->k; j++) {
          int seen = 0;
          for (int q = 0; q < r && !seen; q++) {
            if (f->o.dropped[q]) continue;
            const uint32_t *qi =
                f->o.dec_idx + (size_t)q * (size_t)f->o.total_sel + (size_t)(f->o.sel_off[i] + c * t->k);
            for (int64_t l = 0; l < t->k && !seen; l++) seen = qi[l] == ri[j];
          }
          distinct += !seen;
        }
      }
    }
  }
  return picks && distinct ? (double)distinct / (double)picks : 1.0;
}

static void check(int world, int n, const int64_t (*shapes)[2], int64_t chunk, int64_t topk, double share) {
  tu_rng g = {tu_seed()};
  const uint64_t seed = g.s;
  fake f;
  build(&f, &g, world, n, shapes, chunk, topk, share);
  int live = 0;
  for (int r = 0; r < world; r++) live += !f.o.dropped[r];
  const double got = distro__aggregate_spread(&f.o), want = ref_spread(&f);
  cr_assert_eq(got, want, "world %d (%d live), chunk %lld, topk %lld: spread %.17g, brute force %.17g (DISTRO_TEST_SEED=%llu)",
               world, live, (long long)chunk, (long long)topk, got, want, (unsigned long long)seed);
  cr_assert(got >= 1.0 && got <= (live ? live : 1), "spread %g outside [1, %d live ranks]", got, live);
  /* the scratch bits are clear again, so the next call counts afresh */
  int64_t most = 1;
  for (int i = 0; i < n; i++) most = f.tilings[i].chunk_elems > most ? f.tilings[i].chunk_elems : most;
  for (int64_t w = 0; w < (most + 63) / 64; w++) cr_assert_eq(f.o.spread_bits[w], 0u, "scratch word %lld left set", (long long)w);
  cr_assert_eq(distro__aggregate_spread(&f.o), got, "a second call counts differently");
  release(&f);
}

static const int64_t mixed[][2] = {{96, 40}, {7, 64}, {1, 130}, {64, 64}, {65, 33}};

Test(spread, brute_force_mixed_shapes) {
  for (int world = 1; world <= 8; world++)
    for (int s = 0; s < 3; s++) check(world, 5, mixed, 32, 8, s * 0.45);
}

Test(spread, every_rank_picks_the_same_or_none_coincide) {
  tu_rng g = {tu_seed()};
  fake f;
  build(&f, &g, 4, 5, mixed, 32, 4, 1.0);
  memset(f.o.dropped, 0, 4);
  /* rank r's picks copied from rank 0's: spread 1 exactly */
  for (int r = 1; r < 4; r++)
    memcpy(f.o.dec_idx + (size_t)r * (size_t)f.o.total_sel, f.o.dec_idx, sizeof(uint32_t) * (size_t)f.o.total_sel);
  cr_assert_eq(distro__aggregate_spread(&f.o), 1.0);
  /* disjoint: rank r picks positions r, r + 4, ... of every tile */
  for (int r = 0; r < 4; r++)
    for (int i = 0; i < 5; i++) {
      const distro__tiling *t = &f.tilings[i];
      for (int64_t c = 0; c < t->nchunks; c++)
        for (int64_t j = 0; j < t->k; j++)
          f.o.dec_idx[(size_t)r * (size_t)f.o.total_sel + (size_t)(f.o.sel_off[i] + c * t->k + j)] = (uint32_t)(4 * j + r);
    }
  for (int i = 0; i < 5; i++)
    cr_assert_geq(f.tilings[i].chunk_elems, 4 * f.tilings[i].k, "tensor %d: tiles too small for 4 disjoint picks", i);
  cr_assert_eq(distro__aggregate_spread(&f.o), 4.0);
  release(&f);
}

Test(spread, sampled_beyond_4096_tiles) {
  /* 70 x 70 tiles of 16 x 16 and a few more: over 4096, every second counted */
  static const int64_t big[][2] = {{1120, 1120}, {160, 48}, {3, 500}};
  for (int world = 2; world <= 6; world += 2) check(world, 3, big, 16, 4, 0.5);
}

/* The growth keeps each released coefficient's share of the step at the
 * calibrated one: selections of 32 in 32 x 32 tiles (a union of at most a
 * sixteenth of the tile at two ranks), computed here from the union's share
 * of the tiles rather than from the library's anchor. */
static double ref_growth(double density, double s) {
  const double cal = 2.0 * 32.0 / 1024.0;
  double ratio = density >= cal / 2.0 ? s / 2.0 : s * density / cal; /* the union over the calibrated one */
  if (ratio > 2.0) ratio = 2.0;                                      /* grown no further than twice it */
  return ratio > 1.0 ? sqrt(ratio) : 1.0;
}

Test(spread, step_growth_from_the_calibrated_two_ranks) {
  tu_rng g = {tu_seed()};
  for (int n = 0; n < 4000; n++) {
    /* a share of the coefficients kept from 1/4096 to 1/2, log-uniform */
    const double density = exp2(-1.0 - 11.0 * tu_uniform(&g));
    const double s = 1.0 + 15.0 * tu_uniform(&g);
    const double got = distro__adamw_spread_scale(s, distro__spread_anchor(density)), want = ref_growth(density, s);
    if (want == 1.0)
      cr_assert_eq(got, 1.0, "density %.17g spread %.17g: growth %.17g, not exactly 1", density, s, got);
    else cr_assert(fabs(got - want) <= 1e-14 * want, "density %.17g spread %.17g: growth %.17g, want %.17g", density, s,
                   got, want);
  }
  /* the defaults anchor at two ranks' most; topk 16 at four ranks' */
  cr_assert_eq(distro__spread_anchor(32.0 / 1024.0), 2.0);
  cr_assert_eq(distro__spread_anchor(64.0 / 1024.0), 2.0);
  cr_assert_eq(distro__spread_anchor(16.0 / 1024.0), 4.0);
  cr_assert_eq(distro__adamw_spread_scale(2.0, 2.0), 1.0);
  cr_assert_eq(distro__adamw_spread_scale(4.0, 4.0), 1.0);
  cr_assert(distro__adamw_spread_scale(3.0, 2.0) == sqrt(1.5), "spread 3: growth %.17g, want sqrt(1.5)",
            distro__adamw_spread_scale(3.0, 2.0));
  /* grown no further than at twice the anchor */
  cr_assert(distro__adamw_spread_scale(8.0, 2.0) == sqrt(2.0), "spread 8: growth %.17g, want sqrt(2)",
            distro__adamw_spread_scale(8.0, 2.0));
  cr_assert_eq(distro__adamw_spread_scale(4.0, 2.0), distro__adamw_spread_scale(16.0, 2.0));
  /* the step rounds once: ungrown, the same float as without the growth */
  const float lr = 3e-3f;
  distro__ramp r = {0};
  for (int64_t t = 1; t <= 60; t++) {
    distro__ramp_observe(&r, t <= 20 ? lr * (float)t / 20.0f : lr);
    const float plain = (float)(distro__adamw_step_scale(0.95, t) * distro__ramp_scale(&r, t) * (double)lr);
    cr_assert_eq(distro__adamw_sign_step(0.95, t, lr, &r, distro__adamw_spread_scale(1.7, 2.0)), plain,
                 "step %lld changed at spread 1.7", (long long)t);
  }
}

/* The optimizer's own growth: counted only where the ranks can spread past
 * the anchor (topk 16 in 32 x 32 tiles: more than four), then as above. */
Test(spread, counted_only_past_the_anchor) {
  static const int64_t shapes[][2] = {{64, 96}, {32, 32}, {96, 64}};
  tu_rng g = {tu_seed()};
  for (int world = 2; world <= 6; world++) {
    fake f;
    build(&f, &g, world, 3, shapes, 32, 16, 0.5);
    memset(f.o.dropped, 0, (size_t)world);
    f.o.opt.update = DISTRO_UPDATE_ADAMW;
    f.o.opt.topk = 16;
    f.o.opt.chunk = 32;
    /* disjoint selections (tiles of 1024 hold 6 x 16): the spread is the rank count */
    for (int r = 0; r < world; r++)
      for (int i = 0; i < 3; i++) {
        const distro__tiling *t = &f.tilings[i];
        for (int64_t c = 0; c < t->nchunks; c++)
          for (int64_t j = 0; j < t->k; j++)
            f.o.dec_idx[(size_t)r * (size_t)f.o.total_sel + (size_t)(f.o.sel_off[i] + c * t->k + j)] =
                (uint32_t)((world * j + r) % t->chunk_elems);
      }
    const double sp = distro__step_spread(&f.o);
    if (world <= 4) cr_assert_eq(sp, 1.0, "world %d, anchor 4: spread %g counted", world, sp);
    else cr_assert_eq(sp, (double)world, "world %d: disjoint selections spread %g", world, sp);
    f.o.spread = sp;
    const double want = ref_growth(16.0 / 1024.0, world <= 4 ? 1.0 : sp);
    cr_assert(fabs(distro__step_growth(&f.o) - want) <= 1e-14 * want, "world %d: growth %.17g, want %.17g", world,
              distro__step_growth(&f.o), want);
    release(&f);
  }
}
