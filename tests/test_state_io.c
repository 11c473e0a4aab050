/* Save/load: round trip, atomicity and every rejection leaves state as it was. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <distro/distro.h>
#include "testutil.h"
#include "state_file.h"

#define N1 (96 * 64)
#define N2 100

typedef struct {
  distro_comm *comm;
  distro_optim *o;
  float p1[N1], g1[N1], p2[N2], g2[N2];
} model;

static model *model_new(distro_options opt, int64_t rows) {
  model *m = calloc(1, sizeof *m);
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  m->comm = c[0];
  cr_assert_eq(distro_optim_create(&opt, m->comm, &m->o), DISTRO_OK);
  int64_t s1[2] = {rows, N1 / rows}, s2[1] = {N2};
  cr_assert_eq(distro_optim_add_param(m->o, "w", m->p1, m->g1, 2, s1), DISTRO_OK);
  cr_assert_eq(distro_optim_add_param(m->o, "b", m->p2, m->g2, 1, s2), DISTRO_OK);
  return m;
}

static void model_free(model *m) {
  distro_optim_free(m->o);
  distro_comm_free(m->comm);
  free(m);
}

/* A 4-step linear warm-up: DisTrO-AdamW's step depends on the whole lr
 * history (its stretched warm-up), which a resumed run must not lose. */
static float lr_at(int s) { return s < 4 ? 0.0025f * (float)(s + 1) : 0.01f; }

static void steps(model *m, uint64_t seed, int from, int to) {
  for (int s = from; s < to; s++) {
    tu_rng r = {seed + (uint64_t)s};
    tu_fill_normal(&r, m->g1, N1, 1.0f);
    tu_fill_normal(&r, m->g2, N2, 1.0f);
    cr_assert_eq(distro_optim_step(m->o, lr_at(s), NULL), DISTRO_OK, "%s", distro_last_error());
  }
}

static void same_params(const model *a, const model *b, const char *what) {
  cr_expect(memcmp(a->p1, b->p1, sizeof a->p1) == 0 && memcmp(a->p2, b->p2, sizeof a->p2) == 0, "%s", what);
}

static char path[256];
static void tmp_path(void) { snprintf(path, sizeof path, "/tmp/distro_state_%d.bin", (int)getpid()); }

static void round_trip(distro_options opt) {
  tmp_path();
  uint64_t seed = tu_seed();
  model *a = model_new(opt, 96), *b = model_new(opt, 96);
  steps(a, seed, 0, 3); /* saved while the lr still rises */
  cr_assert_eq(distro_optim_save(a->o, path), DISTRO_OK, "%s", distro_last_error());
  memcpy(b->p1, a->p1, sizeof a->p1);
  memcpy(b->p2, a->p2, sizeof a->p2);
  cr_assert_eq(distro_optim_load(b->o, path), DISTRO_OK, "%s", distro_last_error());
  steps(a, seed, 3, 10); /* through the stretched warm-up (steps 5-6) */
  steps(b, seed, 3, 10);
  same_params(a, b, "resumed run differs from the uninterrupted one");
  char tmpname[300];
  snprintf(tmpname, sizeof tmpname, "%s.tmp.%d", path, (int)getpid());
  cr_expect(access(tmpname, F_OK) != 0, "temporary file left behind");
  unlink(path);
  model_free(a);
  model_free(b);
}

Test(state_io, round_trip_all_modes) {
  distro_options d = distro_options_default(DISTRO_ALG_DEMO);
  d.topk = 8;
  round_trip(d);
  d.update = DISTRO_UPDATE_ADAMW;
  round_trip(d);
  round_trip(distro_options_default(DISTRO_ALG_ADAMW));
}

/* float64 DCT-II basis, for the layout check below. */
static double basis64(int64_t n, int64_t i, int64_t k) {
  const double ck = k == 0 ? sqrt(1.0 / (double)n) : sqrt(2.0 / (double)n);
  return ck * cos(M_PI * (2.0 * (double)i + 1.0) * (double)k / (2.0 * (double)n));
}

/* The file's momentum is in the tensor's layout whatever the step keeps in
 * memory: after one DeMo step from zero it is lr DCT(g) tile by tile
 * (float64 reference), with each tile's k largest coefficients sent and
 * zeroed. Read straight from the file: header, then per tensor its entry
 * and its rows x cols floats. */
Test(state_io, momentum_file_layout) {
  tmp_path();
  distro_options d = distro_options_default(DISTRO_ALG_DEMO);
  d.chunk = 32;
  d.topk = 8;
  model *m = model_new(d, 96); /* w: 96 x 64 -> 3 x 2 tiles of 32 x 32; b: 100 -> 4 tiles of 1 x 25 */
  tu_rng r = {tu_seed()};
  tu_fill_normal(&r, m->g1, N1, 1.0f);
  tu_fill_normal(&r, m->g2, N2, 1.0f);
  const float lr = 0.01f;
  cr_assert_eq(distro_optim_step(m->o, lr, NULL), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(distro_optim_save(m->o, path), DISTRO_OK, "%s", distro_last_error());
  FILE *f = fopen(path, "rb");
  cr_assert(f);
  cr_assert_eq(fseek(f, 8 + 4 + 24 + 8, SEEK_SET), 0);
  float lr_last;
  int64_t seen, rise; /* the warm-up record: one step seen, its lr still rising */
  cr_assert(fread(&lr_last, 4, 1, f) == 1 && fread(&seen, 8, 1, f) == 1 && fread(&rise, 8, 1, f) == 1);
  cr_assert(lr_last == lr && seen == 1 && rise == 0, "warm-up record: lr %g, %lld seen, rise %lld", (double)lr_last,
            (long long)seen, (long long)rise);
  uint32_t pending; /* no exchange in flight (version 4) */
  cr_assert(fread(&pending, 4, 1, f) == 1 && pending == 0, "pending record %u", pending);
  double spread; /* one rank: its selection is the aggregate's (version 5) */
  cr_assert(fread(&spread, 8, 1, f) == 1 && spread == 1.0, "spread record %g", spread);
  uint32_t nshares; /* no clip, no shares (version 6) */
  cr_assert(fread(&nshares, 4, 1, f) == 1 && nshares == 0, "clip record %u", nshares);
  const struct {
    const float *g;
    int64_t rows, cols, h, w;
  } ts[2] = {{m->g1, 96, 64, 32, 32}, {m->g2, 1, N2, 1, 25}};
  float *mom = malloc(sizeof(float) * N1);
  double *ref = malloc(sizeof(double) * N1);
  for (int i = 0; i < 2; i++) {
    const int64_t rows = ts[i].rows, cols = ts[i].cols, h = ts[i].h, w = ts[i].w, n = rows * cols;
    const long entry = 4 + 1 + 4 + 8 * (i == 0 ? 2 : 1); /* name length, name, ndim, shape */
    cr_assert_eq(fseek(f, entry, SEEK_CUR), 0);
    cr_assert_eq(fread(mom, sizeof(float), (size_t)n, f), (size_t)n);
    for (int64_t tr = 0; tr < rows / h; tr++)
      for (int64_t tc = 0; tc < cols / w; tc++) {
        int zeros = 0;
        double kth = INFINITY; /* smallest |ref| among the zeroed ones */
        for (int64_t b = 0; b < h; b++)
          for (int64_t dd = 0; dd < w; dd++) {
            double s = 0;
            for (int64_t a = 0; a < h; a++)
              for (int64_t c = 0; c < w; c++)
                s += (double)ts[i].g[(tr * h + a) * cols + tc * w + c] * basis64(h, a, b) * basis64(w, c, dd);
            const int64_t at = (tr * h + b) * cols + tc * w + dd;
            ref[at] = lr * s;
            if (mom[at] == 0.0f) {
              zeros++;
              kth = fabs(ref[at]) < kth ? fabs(ref[at]) : kth;
            } else {
              cr_assert(fabs(mom[at] - ref[at]) <= 1e-5 * lr * sqrt((double)(h * w)),
                        "tensor %d at (%lld, %lld): file %g, float64 %g", i, (long long)(tr * h + b),
                        (long long)(tc * w + dd), mom[at], ref[at]);
            }
          }
        cr_assert_eq(zeros, 8, "tensor %d tile (%lld, %lld): %d coefficients zeroed, want topk 8", i, (long long)tr,
                     (long long)tc, zeros);
        for (int64_t b = 0; b < h; b++) /* the zeroed ones are the largest */
          for (int64_t dd = 0; dd < w; dd++) {
            const int64_t at = (tr * h + b) * cols + tc * w + dd;
            if (mom[at] != 0.0f) cr_assert(fabs(ref[at]) <= kth * (1 + 1e-4), "tensor %d: a larger one kept", i);
          }
      }
  }
  fclose(f);
  free(mom);
  free(ref);
  unlink(path);
  model_free(m);
}

/* A rejected load must leave the optimizer exactly as it was: b continues in
 * lockstep with a. */
static void rejected_load(const char *file, distro_status want, const char *what) {
  distro_options opt = distro_options_default(DISTRO_ALG_DEMO);
  opt.update = DISTRO_UPDATE_ADAMW;
  uint64_t seed = tu_seed();
  model *a = model_new(opt, 96), *b = model_new(opt, 96);
  steps(a, seed, 0, 2);
  steps(b, seed, 0, 2);
  distro_status st = distro_optim_load(b->o, file);
  cr_expect_eq(st, want, "%s: got %s (%s)", what, distro_status_string(st), distro_last_error());
  cr_expect(strlen(distro_last_error()) > 0);
  steps(a, seed, 2, 4);
  steps(b, seed, 2, 4);
  same_params(a, b, what);
  model_free(a);
  model_free(b);
}

static long file_size(const char *f) {
  FILE *fp = fopen(f, "rb");
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fclose(fp);
  return n;
}

Test(state_io, rejections_leave_state_untouched) {
  tmp_path();
  distro_options opt = distro_options_default(DISTRO_ALG_DEMO);
  opt.update = DISTRO_UPDATE_ADAMW;
  model *a = model_new(opt, 96);
  steps(a, 7, 0, 3);
  cr_assert_eq(distro_optim_save(a->o, path), DISTRO_OK);
  long n = file_size(path);
  char bad[300];
  snprintf(bad, sizeof bad, "%s.bad", path);

  rejected_load("/nonexistent/dir/file", DISTRO_ERR_IO, "missing file");
  /* truncated */
  FILE *in = fopen(path, "rb");
  char *buf = malloc((size_t)n);
  cr_assert_eq(fread(buf, 1, (size_t)n, in), (size_t)n);
  fclose(in);
  const long cuts[] = {0, 10, n / 2, n - 1};
  for (int i = 0; i < 4; i++) {
    FILE *f = fopen(bad, "wb");
    fwrite(buf, 1, (size_t)cuts[i], f);
    fclose(f);
    rejected_load(bad, DISTRO_ERR_IO, "truncated file");
  }
  /* one flipped bit, in the header, a name and the data */
  const long at[] = {9, 50, n / 2, n - 2};
  for (int i = 0; i < 4; i++) {
    buf[at[i]] ^= 0x04;
    FILE *f = fopen(bad, "wb");
    fwrite(buf, 1, (size_t)n, f);
    fclose(f);
    buf[at[i]] ^= 0x04;
    distro_options o2 = opt;
    (void)o2;
    model *b = model_new(opt, 96);
    distro_status st = distro_optim_load(b->o, bad);
    cr_expect(st == DISTRO_ERR_IO || st == DISTRO_ERR_SHAPE, "flip at %ld accepted", at[i]);
    model_free(b);
  }
  rejected_load(bad, DISTRO_ERR_IO, "corrupted data");
  free(buf);
  unlink(bad);
  model_free(a);

  /* a file from a different model shape */
  model *c = model_new(opt, 64);
  steps(c, 9, 0, 1);
  cr_assert_eq(distro_optim_save(c->o, path), DISTRO_OK);
  model_free(c);
  rejected_load(path, DISTRO_ERR_SHAPE, "different shape");
  /* a file from a different algorithm */
  distro_options other = distro_options_default(DISTRO_ALG_ADAMW);
  model *d = model_new(other, 96);
  steps(d, 9, 0, 1);
  cr_assert_eq(distro_optim_save(d->o, path), DISTRO_OK);
  model_free(d);
  rejected_load(path, DISTRO_ERR_SHAPE, "different algorithm");
  unlink(path);
}

Test(state_io, save_replaces_atomically_and_reports_bad_paths) {
  tmp_path();
  distro_options opt = distro_options_default(DISTRO_ALG_DEMO);
  model *a = model_new(opt, 96);
  steps(a, 3, 0, 1);
  cr_assert_eq(distro_optim_save(a->o, path), DISTRO_OK);
  steps(a, 3, 1, 2);
  cr_assert_eq(distro_optim_save(a->o, path), DISTRO_OK); /* overwrite */
  model *b = model_new(opt, 96);
  cr_assert_eq(distro_optim_load(b->o, path), DISTRO_OK);
  cr_expect_eq(distro_optim_save(a->o, "/nonexistent/dir/state.bin"), DISTRO_ERR_IO);
  cr_expect(strstr(distro_last_error(), "/nonexistent/dir") != NULL);
  cr_expect_eq(distro_optim_save(NULL, path), DISTRO_ERR_INVALID);
  cr_expect_eq(distro_optim_load(b->o, NULL), DISTRO_ERR_INVALID);
  unlink(path);
  model_free(a);
  model_free(b);
}

/* ---- file versions and the record of an exchange in flight --------------- */

#define HEADER 64 /* magic, version, 6 x u32, step, warm-up record */
#define SPREAD (HEADER + 4) /* after the pending record */
#define CLIP (SPREAD + 8) /* u32: how many clip shares follow (0: none) */
#define TENSORS (CLIP + 4)

/* Version 5 files (version 6 without the clip record), version 4 ones
 * (without the spread record either) and version 3 ones (without the
 * pending record too) still load, and a one-rank run (its spread is 1)
 * resumes from them as the uninterrupted run. */
Test(state_io, older_versions_load) {
  tmp_path();
  distro_options d = distro_options_default(DISTRO_ALG_DEMO);
  d.update = DISTRO_UPDATE_ADAMW;
  d.topk = 8;
  for (uint32_t old = 3; old <= 5; old++) {
    uint64_t seed = tu_seed();
    model *a = model_new(d, 96), *b = model_new(d, 96);
    steps(a, seed, 0, 3);
    cr_assert_eq(distro_optim_save(a->o, path), DISTRO_OK, "%s", distro_last_error());
    long n;
    unsigned char *buf = sf_slurp(path, &n);
    uint32_t v, pending, nshares;
    double spread;
    memcpy(&v, buf + 8, 4);
    memcpy(&pending, buf + HEADER, 4);
    memcpy(&spread, buf + SPREAD, 8);
    memcpy(&nshares, buf + CLIP, 4);
    cr_assert(v == 6 && pending == 0 && spread == 1.0 && nshares == 0, "version %u, pending %u, spread %g, %u shares",
              v, pending, spread, nshares);
    const long cut = old == 5 ? 4 : old == 4 ? 12 : 16, at = old == 5 ? CLIP : old == 4 ? SPREAD : HEADER;
    memcpy(buf + 8, &old, 4);
    memmove(buf + at, buf + at + cut, (size_t)(n - at - cut));
    sf_spill(path, buf, n - cut);
    memcpy(b->p1, a->p1, sizeof a->p1);
    memcpy(b->p2, a->p2, sizeof a->p2);
    cr_assert_eq(distro_optim_load(b->o, path), DISTRO_OK, "version %u: %s", old, distro_last_error());
    steps(a, seed, 3, 8);
    steps(b, seed, 3, 8);
    char what[64];
    snprintf(what, sizeof what, "a run resumed from a version %u file differs", old);
    same_params(a, b, what);
    free(buf);
    unlink(path);
    model_free(a);
    model_free(b);
  }
}

/* A look-ahead state saved in flight (one rank): the pending record, the
 * staged arrays, the selection and the payload are where the format says;
 * a file whose record lies (bad mode, payload size beyond the bound, zero
 * size, a NaN lr, a selected position outside its tile, a NaN selected
 * value, a spread below 1 or NaN), re-checksummed, is refused as corrupt
 * and leaves a fresh optimizer fresh; the true file, loaded, saves again to
 * the same bytes and resumes bit for bit. */
Test(state_io, pending_exchange_record) {
  tmp_path();
  distro_options d = distro_options_default(DISTRO_ALG_DEMO);
  d.chunk = 32; /* w: 6 tiles of 32 x 32, b: 4 of 1 x 25 */
  d.topk = 8;
  d.overlap = DISTRO_OVERLAP_LOOKAHEAD;
  uint64_t seed = tu_seed();
  model *a = model_new(d, 96);
  steps(a, seed, 0, 3);
  cr_assert_eq(distro_optim_save(a->o, path), DISTRO_OK, "%s", distro_last_error());
  uint64_t bound;
  cr_assert_eq(distro_optim_payload_bytes(a->o, &bound), DISTRO_OK);
  long n;
  unsigned char *buf = sf_slurp(path, &n);
  uint32_t pending;
  memcpy(&pending, buf + HEADER, 4);
  cr_assert_eq(pending, (uint32_t)DISTRO_OVERLAP_LOOKAHEAD);
  /* Per tensor: entry, momentum, staged momentum, agreed parameters, the
   * selection (k = 8 positions and values per tile). */
  const long sel_w = TENSORS + 4 + 1 + 4 + 16 + 3 * 4 * N1;
  const long rec = sel_w + 8 * 6 * 8 + (4 + 1 + 4 + 8 + 3 * 4 * N2 + 8 * 4 * 8);
  float lr;
  uint64_t size;
  memcpy(&lr, buf + rec, 4);
  memcpy(&size, buf + rec + 4, 8);
  cr_assert(lr == lr_at(2) && size > 0 && size <= bound && rec + 12 + (long)size + 4 == n,
            "pending record: lr %g, %llu payload bytes (bound %llu), file %ld bytes", (double)lr,
            (unsigned long long)size, (unsigned long long)bound, n);
  char bad[300];
  snprintf(bad, sizeof bad, "%s.bad", path);
  const float nan = NAN;
  uint32_t pos;
  memcpy(&pos, buf + sel_w, 4);
  cr_assert_lt(pos, 32 * 32, "w's first selected position %u", pos);
  for (int k = 0; k < 8; k++) {
    unsigned char *c = malloc((size_t)n);
    memcpy(c, buf, (size_t)n);
    uint32_t mode = 3, far = 32 * 32;
    uint64_t big = bound + 1, zero = 0;
    const double dnan = NAN, half = 0.5;
    if (k == 6) memcpy(c + SPREAD, &dnan, 8);
    if (k == 7) memcpy(c + SPREAD, &half, 8);
    if (k == 0) memcpy(c + HEADER, &mode, 4);
    if (k == 1) memcpy(c + rec + 4, &big, 8);
    if (k == 2) memcpy(c + rec + 4, &zero, 8);
    if (k == 3) memcpy(c + rec, &nan, 4);
    if (k == 4) memcpy(c + sel_w, &far, 4);
    if (k == 5) memcpy(c + sel_w + 4 * 6 * 8, &nan, 4);
    sf_spill(bad, c, n);
    free(c);
    model *b = model_new(d, 96), *f = model_new(d, 96);
    distro_status st = distro_optim_load(b->o, bad);
    cr_expect_eq(st, DISTRO_ERR_IO, "lie %d: %s (%s)", k, distro_status_string(st), distro_last_error());
    cr_expect(strstr(distro_last_error(), "corrupt") != NULL, "lie %d: %s", k, distro_last_error());
    steps(b, seed, 0, 3);
    steps(f, seed, 0, 3);
    same_params(b, f, "a refused load changed the optimizer");
    model_free(b);
    model_free(f);
  }
  model *b = model_new(d, 96);
  memcpy(b->p1, a->p1, sizeof a->p1);
  memcpy(b->p2, a->p2, sizeof a->p2);
  cr_assert_eq(distro_optim_load(b->o, path), DISTRO_OK, "%s", distro_last_error());
  /* Saved again before any step: the same bytes (the restored exchange is
   * still pending). */
  cr_assert_eq(distro_optim_save(b->o, bad), DISTRO_OK, "%s", distro_last_error());
  long n2;
  unsigned char *again = sf_slurp(bad, &n2);
  cr_assert(n2 == n && memcmp(again, buf, (size_t)n) == 0, "a loaded state saved again differs (%ld vs %ld bytes)",
            n2, n);
  free(again);
  unlink(bad);
  steps(a, seed, 3, 7);
  steps(b, seed, 3, 7);
  cr_assert_eq(distro_optim_flush(a->o, NULL), DISTRO_OK);
  cr_assert_eq(distro_optim_flush(b->o, NULL), DISTRO_OK);
  same_params(a, b, "the run resumed from a save in flight differs");
  free(buf);
  unlink(path);
  model_free(a);
  model_free(b);
}

/* The spread record of a DisTrO-AdamW look-ahead state saved in flight
 * once its step is rectified (the restored provisional step grows with the
 * record): the true file gives the caller back the saving run's
 * parameters; a spread of 7, as a seven-rank job would save, loads into
 * this one-rank job as the largest it can have, 1, and so gives the same. */
Test(state_io, spread_record_is_bounded_by_the_ranks) {
  tmp_path();
  distro_options d = distro_options_default(DISTRO_ALG_DEMO);
  d.update = DISTRO_UPDATE_ADAMW;
  d.chunk = 32;
  d.topk = 8;
  d.overlap = DISTRO_OVERLAP_LOOKAHEAD;
  uint64_t seed = tu_seed();
  model *a = model_new(d, 96), *b = model_new(d, 96), *w = model_new(d, 96);
  steps(a, seed, 0, 7);
  cr_assert_eq(distro_optim_save(a->o, path), DISTRO_OK, "%s", distro_last_error());
  long n;
  unsigned char *buf = sf_slurp(path, &n);
  char other[300];
  snprintf(other, sizeof other, "%s.seven", path);
  for (int i = 0; i < 2; i++) {
    model *m = i == 0 ? b : w;
    memcpy(m->p1, a->p1, sizeof a->p1); /* the saving run's: the load rebuilds the provisional step */
    memcpy(m->p2, a->p2, sizeof a->p2);
    const double s = i == 0 ? 1.0 : 7.0;
    memcpy(buf + SPREAD, &s, 8);
    sf_spill(other, buf, n);
    cr_assert_eq(distro_optim_load(m->o, other), DISTRO_OK, "%s", distro_last_error());
  }
  same_params(a, b, "the restored provisional step differs from the saving run's");
  same_params(a, w, "a spread above the job's ranks did not load as its largest");
  unlink(other);
  unlink(path);
  free(buf);
  model_free(a);
  model_free(b);
  model_free(w);
}
