/* Sparse DiLoCo outer gradients (SparseLoCo), part 2: bit-identical learners,
 * save/load, bad options and bad payloads. The compressor and the outer step
 * against float64 are in test_sparseloco_reference.c; the codec and the
 * payload format in test_sparseloco_codec.c. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <distro/distro.h>

#include "comm/comm_internal.h"
#include "compress/outer_sparse.h"
#include "optim/diloco_internal.h"
#include "sparseloco_util.h"
#include "testutil.h"
#include "wire_ref.h"

/* ---- runs of M learners x R ranks ----------------------------------------------- */

/* Learners with two ranks each, fragments, overlap, the DCT: every rank of
 * every learner ends with the same bits, with or without the progress
 * thread; and the payloads are a small fraction of dense f32 ones. */
Test(sparseloco, learners_bit_identical, .timeout = 60) {
  run a, b;
  run_init(&a, 3, 2, 14);
  a.dl.H = 4;
  a.dl.fragments = 2;
  a.dl.overlap = 1;
  a.dl.sparse_dct = 1;
  a.dl.density = 0.02f;
  a.dl.merge = DISTRO_MERGE_RADIAL;
  run_like(&b, &a);
  b.progress = 1;
  run_exec(&a);
  run_exec(&b);
  expect_ok(&a, "blocking");
  expect_ok(&b, "progress thread");
  for (int m = 0; m < a.M; m++)
    for (int r = 0; r < a.R; r++)
      cr_assert_eq(memcmp(a.out[m][r], a.out[0][0], sizeof(float) * TOTAL), 0, "learner %d rank %d differs", m, r);
  expect_identical(&a, &b, "progress thread vs blocking");
  /* 7 exchanges of half the model in the steps (fragment 0 at 4, 8, 12;
   * fragment 1 at 2, 6, 10, 14): under a tenth of dense f32 payloads. */
  const uint64_t dense_f32 = 7 * 4 * (uint64_t)TOTAL / 2;
  cr_assert(a.sent_sum[0][0] > 0 && a.sent_sum[0][0] < dense_f32 / 10,
            "sparse payloads %llu bytes in all, dense f32 would be %llu", (unsigned long long)a.sent_sum[0][0],
            (unsigned long long)dense_f32);
  run_free(&a);
  run_free(&b);
}

/* Saved mid-window and between an exchange's start and its application,
 * the run continues bit for bit: e, the global copy and the pending
 * exchange are in the state. */
Test(sparseloco, save_load_continues_identically, .timeout = 60) {
  run full, first, second;
  run_init(&full, 2, 2, 15);
  full.dl.H = 6;
  full.dl.fragments = 2;
  full.dl.overlap = 1;
  full.dl.sparse_dct = 1;
  run_exec(&full);
  expect_ok(&full, "uninterrupted");
  run_like(&first, &full);
  first.save_after = 7; /* fragment 0 left at 6, fragment 1 started at 3 and 9: step 7 is mid-window */
  snprintf(first.dir, sizeof first.dir, "/tmp/distro_splc_XXXXXX");
  cr_assert_not_null(mkdtemp(first.dir));
  first.steps = 7;
  run_exec(&first);
  expect_ok(&first, "first half");
  run_like(&second, &full);
  memcpy(second.dir, first.dir, sizeof second.dir);
  memcpy(second.saved, first.saved, sizeof second.saved);
  second.save_after = 7;
  second.resume = 1;
  run_exec(&second);
  expect_ok(&second, "resumed");
  expect_identical(&full, &second, "save/load mid-run");
  /* A pending exchange too: saved at 10, one step after fragment 1 started at 9 (tau 1). */
  run third, fourth;
  run_like(&third, &full);
  memcpy(third.dir, first.dir, sizeof third.dir);
  third.save_after = 9;
  third.steps = 9;
  run_exec(&third);
  expect_ok(&third, "first half, saved with an exchange pending");
  run_like(&fourth, &full);
  memcpy(fourth.dir, first.dir, sizeof fourth.dir);
  fourth.resume = 1;
  fourth.save_after = 9;
  memcpy(fourth.saved, third.saved, sizeof fourth.saved);
  run_exec(&fourth);
  expect_ok(&fourth, "resumed with an exchange pending");
  expect_identical(&full, &fourth, "save/load with an exchange pending");
  /* A dense run refuses the sparse state, and the other way round. */
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_optim *o;
  distro_diloco *d;
  static float p[TOTAL], g[TOTAL];
  cr_assert_eq(distro_optim_create(&full.inner, c[0], &o), DISTRO_OK);
  for (int i = 0; i < NT; i++)
    cr_assert_eq(distro_optim_add_param(o, tnames[i], p + toff(i), g + toff(i), ndims[i], shapes[i]), DISTRO_OK);
  distro_diloco_options dense = full.dl;
  dense.compressor = DISTRO_OUTER_DENSE;
  cr_assert_eq(distro_diloco_create(&dense, o, c[0], &d), DISTRO_OK);
  char path[160];
  snprintf(path, sizeof path, "%s/outer-0-0.bin", first.dir);
  cr_assert_eq(distro_diloco_load(d, path), DISTRO_ERR_SHAPE);
  cr_assert(strstr(distro_last_error(), "sparse") != NULL, "%s", distro_last_error());
  snprintf(path, sizeof path, "%s/dense.bin", first.dir);
  cr_assert_eq(distro_diloco_save(d, path), DISTRO_OK, "%s", distro_last_error());
  distro_diloco_free(d);
  distro_diloco_options other = full.dl;
  cr_assert_eq(distro_diloco_create(&other, o, c[0], &d), DISTRO_OK);
  cr_assert_eq(distro_diloco_load(d, path), DISTRO_ERR_SHAPE);
  snprintf(path, sizeof path, "%s/outer-0-0.bin", first.dir);
  distro_diloco_free(d);
  other.ef_beta = 0.5f; /* a sparse state from other sparse settings */
  cr_assert_eq(distro_diloco_create(&other, o, c[0], &d), DISTRO_OK);
  cr_assert_eq(distro_diloco_load(d, path), DISTRO_ERR_SHAPE);
  cr_assert(strstr(distro_last_error(), "ef_beta") != NULL, "%s", distro_last_error());
  distro_diloco_free(d);
  distro_optim_free(o);
  distro_comm_free(c[0]);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", first.dir);
  cr_assert_eq(system(cmd), 0);
  run_free(&first); /* owns saved[] */
  memset(second.saved, 0, sizeof second.saved);
  run_free(&second);
  run_free(&third);
  memset(fourth.saved, 0, sizeof fourth.saved);
  run_free(&fourth);
  run_free(&full);
}

/* ---- bad options and bad payloads ----------------------------------------------- */

static distro_status try_create(distro_diloco_options o) {
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_options io = distro_options_default(DISTRO_ALG_ADAMW);
  distro_optim *opt = NULL;
  cr_assert_eq(distro_optim_create(&io, c[0], &opt), DISTRO_OK);
  distro_diloco *d = (distro_diloco *)0x1;
  distro_status st = distro_diloco_create(&o, opt, c[0], &d);
  if (st != DISTRO_OK) cr_assert_null(d);
  distro_diloco_free(d);
  distro_optim_free(opt);
  distro_comm_free(c[0]);
  return st;
}

Test(sparseloco, bad_options_name_the_reason) {
  const distro_diloco_options def = distro_diloco_options_sparseloco();
  cr_assert_eq(def.compressor, DISTRO_OUTER_SPARSE);
  cr_assert_eq(def.outer_momentum, 0.0f, "no outer momentum by default");
  distro_diloco_options o;
#define BAD(field, value, word)                                                                                  \
  do {                                                                                                           \
    o = def;                                                                                                     \
    o.field = value;                                                                                             \
    cr_assert_eq(try_create(o), DISTRO_ERR_INVALID, #field " = " #value " accepted");                           \
    cr_assert(strstr(distro_last_error(), word) != NULL, "%s: %s", #field, distro_last_error());                 \
  } while (0)
  BAD(density, 0.0f, "density");
  BAD(density, -0.5f, "density");
  BAD(density, 1.01f, "density");
  BAD(density, NAN, "density");
  BAD(ef_beta, 1.0f, "ef_beta");
  BAD(ef_beta, -0.1f, "ef_beta");
  BAD(ef_beta, NAN, "ef_beta");
  BAD(sparse_values, (distro_values)17, "codec");
  BAD(sparse_values, DISTRO_VALUES_SIGN1, "SIGN1");
  BAD(compressor, (distro_outer_compressor)5, "compressor");
  BAD(sparse_chunk, 0, "sparse_chunk");
  BAD(sparse_chunk, 257, "sparse_chunk");
  BAD(sparse_dct, 2, "sparse_dct");
  BAD(version, 1, "version");
  o = def;
  o.density = 1.0f;
  o.ef_beta = 0.0f;
  cr_assert_eq(try_create(o), DISTRO_OK, "the closed ends are allowed");
  /* The DeMo step does not take INT2 values. */
  distro_options io = distro_options_default(DISTRO_ALG_DEMO);
  io.values = DISTRO_VALUES_INT2;
  distro_comm *c[1];
  distro_optim *opt = NULL;
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  cr_assert_eq(distro_optim_create(&io, c[0], &opt), DISTRO_ERR_INVALID);
  distro_comm_free(c[0]);
}

/* A damaged payload (a flipped byte, or a NaN behind a valid CRC), or a
 * learner whose outer gradient is not finite: DISTRO_ERR_PAYLOAD on every
 * learner, the global copy and e untouched, and the next exchange works. */
Test(sparseloco, bad_payloads_change_nothing, .timeout = 60) {
  for (int kind = 0; kind < 3; kind++) {
    run x;
    run_init(&x, 3, 1, kind == 2 ? 6 : 12);
    if (kind < 2) {
      x.corrupt_at = 2; /* the exchange at step 6 */
      x.corrupt_nan = kind == 1;
      if (x.corrupt_nan) x.dl.sparse_values = DISTRO_VALUES_F32;
    } else {
      x.nan_step = 6;
      x.nan_learner = 2;
    }
    run_exec(&x);
    for (int m = 0; m < x.M; m++) {
      for (int s = 0; s < x.steps; s++) {
        const distro_status want = s == 5 ? DISTRO_ERR_PAYLOAD : DISTRO_OK;
        cr_assert_eq(x.st[m][0][s], want, "kind %d learner %d step %d: status %d (%s)", kind, m, s + 1, x.st[m][0][s],
                     x.err[m][0]);
      }
      cr_assert(strstr(x.err[m][0], kind == 0 ? "checksum" : kind == 1 ? "non-finite" : "not finite") != NULL,
                "kind %d: %s", kind, x.err[m][0]);
      cr_assert_not_null(x.before_bad[m]);
      cr_assert_not_null(x.after_bad[m]);
      cr_assert_eq(memcmp(x.before_bad[m], x.after_bad[m], sizeof(float) * TOTAL), 0,
                   "kind %d learner %d: the global copy moved", kind, m);
      cr_assert_eq(memcmp(x.ef_before_bad[m], x.ef_after_bad[m], sizeof(float) * TOTAL), 0,
                   "kind %d learner %d: e moved", kind, m);
      if (kind < 2) { /* the exchanges at 9 and 12 worked: learners identical at the end */
        cr_assert_eq(x.sync_st[m][0], DISTRO_OK);
        cr_assert_eq(memcmp(x.out[m][0], x.out[0][0], sizeof(float) * TOTAL), 0, "kind %d learner %d differs", kind, m);
      }
    }
    run_free(&x);
  }
}
