/* Shared by the overlap suites (test_overlap.c, test_lookahead.c): the
 * tensors, and a dr_run (demo_ref.c) set up on them with an lr schedule.
 * Include after criterion, testutil.h and demo_ref.c. */
#ifndef DISTRO_TEST_OVERLAP_FIXTURE_H
#define DISTRO_TEST_OVERLAP_FIXTURE_H

static const char *const names[] = {"m96x128", "v100", "m67x64", "t2x48x50", "s1", "v768"};
static const int ndims[] = {2, 1, 2, 3, 1, 1};
static const int64_t sh0[] = {96, 128}, sh1[] = {100}, sh2[] = {67, 64}, sh3[] = {2, 48, 50}, sh4[] = {1},
                     sh5[] = {768};
static const int64_t *const shapes[] = {sh0, sh1, sh2, sh3, sh4, sh5};
#define NT ((int)(sizeof ndims / sizeof ndims[0]))

static uint64_t mix(uint64_t seed, uint64_t a) {
  tu_rng r = {seed ^ (a * 0x9e3779b97f4a7c15ULL)};
  return tu_next(&r);
}

static int64_t numel(int t) { return dr_shape_numel(ndims[t], shapes[t]); }

/* Elements of all tensors. */
static inline int64_t total(void) {
  int64_t n = 0;
  for (int t = 0; t < NT; t++) n += numel(t);
  return n;
}

static inline void keep(char *dst, const char *src) { snprintf(dst, 512, "%s", src); }

static inline void setup(dr_run *x, distro_options opt, int world, int steps, int threads, uint64_t seed) {
  memset(x, 0, sizeof *x);
  x->opt = opt;
  x->world = world;
  x->steps = steps;
  x->nt = NT;
  x->names = names;
  x->ndims = ndims;
  x->shapes = shapes;
  x->omp_threads = threads;
  cr_assert_eq(dr_run_prepare(x, seed, 1.0), 0, "out of memory");
  /* A schedule: applying a step with another step's lr shows. */
  for (int s = 0; s < steps; s++) x->lrs[s] = (opt.update == DISTRO_UPDATE_SIGN ? 0.01 : 2e-3) * (1.0 + 0.3 * s);
}

static inline void run_ok(dr_run *x, const char *label, uint64_t seed) {
  distro_status st = dr_run_exec(x);
  cr_assert_eq(st, DISTRO_OK, "%s world %d: %s / %s (DISTRO_TEST_SEED=%llu)", label, x->world, x->err[0],
               x->err[x->world - 1], (unsigned long long)seed);
}

static int same(const float *a, const float *b, int t) { return !memcmp(a, b, sizeof(float) * (size_t)numel(t)); }

typedef struct {
  const char *label;
  distro_update update;
  distro_values values;
  int wire, drop;
} mode;

static const mode modes[] = {
    {"sign/int8 (defaults)", DISTRO_UPDATE_SIGN, DISTRO_VALUES_INT8, 2, 0},
    {"sign/f32/wire-v1", DISTRO_UPDATE_SIGN, DISTRO_VALUES_F32, 1, 0},
    {"adamw-update/int8", DISTRO_UPDATE_ADAMW, DISTRO_VALUES_INT8, 2, 0},
    {"adamw-update/sign1/drop-invalid", DISTRO_UPDATE_ADAMW, DISTRO_VALUES_SIGN1, 2, 1},
};

static distro_options mode_opts(const mode *m, int overlap) {
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.update = m->update;
  o.values = m->values;
  o.wire_version = m->wire;
  o.drop_invalid_peers = m->drop;
  o.topk = 8;
  o.overlap = overlap;
  return o;
}

#endif
