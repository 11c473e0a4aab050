/* DiLoCo outer loop, part 3: the API's checks: bad options, too many
 * fragments for tensors registered after create, unknown tensor names, and
 * corrupt or mismatched state files. Runs of the outer loop are in
 * test_diloco_reference.c and test_diloco_runs.c. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, nanosleep */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <distro/distro.h>

#include "comm/comm_internal.h"
#include "common/crc32c.h"
#include "diloco_util.h"
#include "optim/diloco_internal.h"
#include "testutil.h"

/* ---- tests -------------------------------------------------------------------- */

static distro_status try_create(distro_diloco_options o) {
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_options io = distro_options_default(DISTRO_ALG_ADAMW);
  distro_optim *opt = NULL;
  cr_assert_eq(distro_optim_create(&io, c[0], &opt), DISTRO_OK);
  static float p[TOTAL], g[TOTAL];
  for (int i = 0; i < NT; i++)
    cr_assert_eq(distro_optim_add_param(opt, tnames[i], p + toff(i), g + toff(i), ndims[i], shapes[i]), DISTRO_OK);
  distro_diloco *d = (distro_diloco *)0x1;
  distro_status st = distro_diloco_create(&o, opt, c[0], &d);
  if (st != DISTRO_OK) {
    cr_assert_null(d, "out must be NULL on failure");
    cr_assert_neq(distro_last_error()[0], 0, "no message");
  }
  distro_diloco_free(d);
  distro_optim_free(opt);
  distro_comm_free(c[0]);
  return st;
}

Test(diloco, bad_options_rejected) {
  const distro_diloco_options def = distro_diloco_options_default();
  distro_diloco_options o;
#define BAD(field, value)                                                                                      \
  do {                                                                                                         \
    o = def;                                                                                                   \
    o.field = value;                                                                                           \
    cr_assert_eq(try_create(o), DISTRO_ERR_INVALID, #field " = " #value " accepted");                            \
  } while (0)
  BAD(version, 0);
  BAD(H, 0);
  BAD(H, -5);
  BAD(fragments, 0);
  BAD(fragments, 501);
  BAD(overlap, -1);
  BAD(overlap, 500);
  BAD(alpha, -0.1f);
  BAD(alpha, 1.5f);
  BAD(alpha, NAN);
  BAD(outer_lr, NAN);
  BAD(outer_lr, -1.0f);
  BAD(outer_momentum, 1.0f);
  BAD(nesterov, 2);
  BAD(codec, (distro_outer_codec)17);
  BAD(codec_block, 0);
  BAD(merge, (distro_merge)17);
  BAD(fragmenting, (distro_fragmenting)17);
  BAD(max_block, -1);
  BAD(progress_thread, 3);
  /* tau < H/P */
  o = def;
  o.H = 10;
  o.fragments = 3;
  o.overlap = 4;
  cr_assert_eq(try_create(o), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "overlap") != NULL, "%s", distro_last_error());
  o.overlap = 3;
  cr_assert_eq(try_create(o), DISTRO_OK);
  /* more fragments than blocks (layers for strided) */
  o = def;
  o.fragments = 5;
  o.fragmenting = DISTRO_FRAG_STRIDED;
  cr_assert_eq(try_create(o), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "layers") != NULL, "%s", distro_last_error());
  o.fragmenting = DISTRO_FRAG_BALANCED;
  o.max_block = 1 << 20;
  cr_assert_eq(try_create(o), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "blocks") != NULL, "%s", distro_last_error());
  o.max_block = 0;
  cr_assert_eq(try_create(o), DISTRO_OK);
  /* NULLs */
  distro_diloco *d = NULL;
  cr_assert_eq(distro_diloco_create(NULL, NULL, NULL, &d), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_create(&def, NULL, NULL, NULL), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_step(NULL, 0.1f, 0, NULL), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_save(NULL, "x"), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_load(NULL, "x"), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_sync_all(NULL, NULL), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_flush(NULL, NULL), DISTRO_ERR_INVALID);
  distro_diloco_free(NULL);
}

/* Too many fragments for tensors registered after create: every learner
 * fails its first step with DISTRO_ERR_INVALID, nothing stepped. Unknown
 * names in set_tensor, and corrupt state files, are rejected too. */
static distro_status late_rank(distro_comm *outer, int rank, void *arg) {
  (void)rank;
  distro_comm *c[1];
  distro_status *res = arg;
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_options io = distro_options_default(DISTRO_ALG_ADAMW);
  distro_optim *opt = NULL;
  distro_diloco *d = NULL;
  distro_diloco_options o = distro_diloco_options_default();
  o.fragments = 3;
  o.fragmenting = DISTRO_FRAG_STRIDED;
  float p[8] = {0}, g[8] = {0};
  const int64_t sh[1] = {4};
  cr_assert_eq(distro_optim_create(&io, c[0], &opt), DISTRO_OK);
  cr_assert_eq(distro_diloco_create(&o, opt, outer, &d), DISTRO_OK);
  cr_assert_eq(distro_optim_add_param(opt, "a", p, g, 1, sh), DISTRO_OK);
  cr_assert_eq(distro_optim_add_param(opt, "b", p + 4, g + 4, 1, sh), DISTRO_OK);
  cr_assert_eq(distro_diloco_set_tensor(d, "nope", 0, 0), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_set_tensor(d, "a", 0, 4u), DISTRO_ERR_INVALID);
  distro_diloco_stats s;
  res[distro_comm_rank(outer)] = distro_diloco_step(d, 0.1f, 1, &s);
  cr_assert_eq(s.inner_done, 0);
  cr_assert_eq(p[0], 0.0f);
  distro_diloco_free(d);
  distro_optim_free(opt);
  distro_comm_free(c[0]);
  return DISTRO_OK;
}

Test(diloco, too_many_fragments_at_first_step) {
  distro_status res[2] = {DISTRO_OK, DISTRO_OK};
  cr_assert_eq(distro_comm_run_local(2, late_rank, res), DISTRO_OK);
  cr_assert_eq(res[0], DISTRO_ERR_INVALID);
  cr_assert_eq(res[1], DISTRO_ERR_INVALID);
}

static distro_status corrupt_file_rank(distro_comm *outer, int rank, void *arg) {
  const char *dir = arg;
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_options io = distro_options_default(DISTRO_ALG_ADAMW);
  distro_optim *opt = NULL;
  distro_diloco *d = NULL, *d2 = NULL;
  distro_diloco_options o = distro_diloco_options_default();
  o.H = 2;
  float *p = calloc(TOTAL, sizeof(float)), *g = calloc(TOTAL, sizeof(float));
  float *before = malloc(sizeof(float) * TOTAL), *after = malloc(sizeof(float) * TOTAL);
  cr_assert_eq(distro_optim_create(&io, c[0], &opt), DISTRO_OK);
  for (int i = 0; i < NT; i++)
    cr_assert_eq(distro_optim_add_param(opt, tnames[i], p + toff(i), g + toff(i), ndims[i], shapes[i]), DISTRO_OK);
  cr_assert_eq(distro_diloco_create(&o, opt, outer, &d), DISTRO_OK);
  for (int s = 0; s < 3; s++) cr_assert_eq(distro_diloco_step(d, 0.01f, 1, NULL), DISTRO_OK, "%s", distro_last_error());
  char path[128];
  snprintf(path, sizeof path, "%s/s%d.bin", dir, rank);
  cr_assert_eq(distro_diloco_save(d, path), DISTRO_OK, "%s", distro_last_error());
  FILE *f = fopen(path, "r+b");
  fseek(f, -100, SEEK_END); /* inside the outer momentum */
  int ch = fgetc(f);
  fseek(f, -100, SEEK_END);
  fputc(ch ^ 1, f);
  fclose(f);
  cr_assert_eq(distro_diloco_get_global(d, "w0", before, tnumel(0)), DISTRO_OK);
  cr_assert_eq(distro_diloco_load(d, path), DISTRO_ERR_IO);
  cr_assert(strstr(distro_last_error(), "checksum") != NULL, "%s", distro_last_error());
  cr_assert_eq(distro_diloco_get_global(d, "w0", after, tnumel(0)), DISTRO_OK);
  cr_assert_eq(memcmp(before, after, sizeof(float) * (size_t)tnumel(0)), 0, "a failed load changed the state");
  /* a file from other options */
  distro_diloco_options o2 = o;
  o2.H = 3;
  cr_assert_eq(distro_diloco_create(&o2, opt, outer, &d2), DISTRO_OK);
  cr_assert_eq(distro_diloco_save(d, path), DISTRO_OK);
  cr_assert_eq(distro_diloco_load(d2, path), DISTRO_ERR_SHAPE);
  cr_assert(strstr(distro_last_error(), "H") != NULL, "%s", distro_last_error());
  cr_assert_eq(distro_diloco_get_global(d, "nope", before, 1), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_get_global(d, "w0", before, 3), DISTRO_ERR_INVALID);
  unlink(path);
  distro_diloco_free(d2);
  distro_diloco_free(d);
  distro_optim_free(opt);
  distro_comm_free(c[0]);
  free(p);
  free(g);
  free(before);
  free(after);
  return DISTRO_OK;
}

Test(diloco, state_file_checks) {
  char dir[] = "/tmp/distro_dlcf_XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  cr_assert_eq(distro_comm_run_local(2, corrupt_file_rank, dir), DISTRO_OK);
  rmdir(dir);
}
