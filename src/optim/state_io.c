/* Saving and loading optimizer state.
 *
 * File: "DSTROPT\0" | u32 version | u32 algorithm, update, values, chunk,
 * topk, nparams | i64 step | per tensor: u32 name length, name, u32 ndim,
 * i64 shape[ndim], then its arrays (DeMo momentum, and DisTrO-AdamW's v;
 * the AdamW baseline's m and v) as little-endian float32 | u32 CRC32C of
 * everything before. Version 2: DisTrO-AdamW keeps no first moment.
 * Version 3 adds, after the step, the warm-up seen so far (step_rule.h):
 * f32 lr of the latest step | i64 steps observed | i64 steps of the rise
 * (0: still rising). Version 2 files still load, as if the warm-up were
 * over (a state saved after the rise resumes as it would have run before).
 * Saves go to a temporary file that is synced and renamed over the target,
 * so a crash leaves either the old or the new file. Loads verify everything
 * into fresh buffers and swap them in only at the end. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "optim/optim_internal.h"

#define STATE_MAGIC "DSTROPT"
#define STATE_VERSION 3u

int distro__state_arrays(const distro_options *o, distro__state_array out[3]) {
  int n = 0;
  out[n++] = o->algorithm == DISTRO_ALG_DEMO ? DISTRO__STATE_MOM : DISTRO__STATE_M;
  if (distro__uses_adam(o)) out[n++] = DISTRO__STATE_V;
  return n;
}

static float **param_array(distro__param *p, distro__state_array a) {
  return a == DISTRO__STATE_MOM ? &p->mom : a == DISTRO__STATE_M ? &p->m : &p->v;
}

/* Start of tensor row r's part in tile column tc of a tile-by-tile array. */
static int64_t tiled_row(const distro__tiling *t, int64_t r, int64_t tc) {
  return ((r / t->h) * t->tiles_c + tc) * t->chunk_elems + (r % t->h) * t->w;
}

/* The file holds every array in the tensor's layout; the CPU momentum is
 * kept tile by tile (optim_internal.h) and is written row by row. */
static void put_array(distro__afile *w, const distro_optim *o, const distro__param *p, distro__state_array kind,
                      const float *a) {
  const distro__tiling *t = &p->tiling;
  if (kind != DISTRO__STATE_MOM || !o->mom_tiled) {
    distro__afile_write(w, a, sizeof(float) * (size_t)p->numel);
    return;
  }
  for (int64_t r = 0; r < t->rows; r++)
    for (int64_t tc = 0; tc < t->tiles_c; tc++) distro__afile_write(w, a + tiled_row(t, r, tc), sizeof(float) * (size_t)t->w);
}

static distro_status get_array(distro__rfile *r, const distro_optim *o, const distro__param *p,
                               distro__state_array kind, float *a) {
  distro_status st = DISTRO_OK;
  const distro__tiling *t = &p->tiling;
  if (kind != DISTRO__STATE_MOM || !o->mom_tiled) return distro__rfile_read(r, a, sizeof(float) * (size_t)p->numel);
  for (int64_t row = 0; row < t->rows; row++)
    for (int64_t tc = 0; tc < t->tiles_c; tc++)
      DISTRO_CHECK(distro__rfile_read(r, a + tiled_row(t, row, tc), sizeof(float) * (size_t)t->w));
fail:
  return st;
}

/* A tensor's entry, shared with the DiLoCo state: u32 name length, name,
 * u32 ndim, i64 shape[ndim]. */
void distro__state_put_tensor(distro__afile *w, const distro__param *p) {
  const uint32_t nl = (uint32_t)strlen(p->name);
  distro__afile_u32(w, nl);
  distro__afile_write(w, p->name, nl);
  distro__afile_u32(w, (uint32_t)p->ndim);
  for (int d = 0; d < p->ndim; d++) distro__afile_u64(w, (uint64_t)p->shape[d]);
}

/* Reads tensor #i's entry and checks it names and shapes p. */
distro_status distro__state_check_tensor(distro__rfile *r, const distro__param *p, int i) {
  distro_status st = DISTRO_OK;
  const char *path = r->path;
  uint32_t nl, nd;
  char name[256];
  DISTRO_CHECK(distro__rfile_read(r, &nl, 4));
  if (nl == 0 || nl > 255) DISTRO_FAIL(DISTRO_ERR_IO, "'%s': corrupt tensor name length", path);
  DISTRO_CHECK(distro__rfile_read(r, name, nl));
  name[nl] = 0;
  if (strcmp(name, p->name) != 0)
    DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s': tensor #%d is '%s', this run has '%s'", path, i, name, p->name);
  DISTRO_CHECK(distro__rfile_read(r, &nd, 4));
  if (nd != (uint32_t)p->ndim)
    DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s': tensor '%s' has %u dims, expected %d", path, name, nd, p->ndim);
  for (int d = 0; d < p->ndim; d++) {
    int64_t e;
    DISTRO_CHECK(distro__rfile_read(r, &e, 8));
    if (e != p->shape[d])
      DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s': tensor '%s' dim %d is %lld, expected %lld", path, name, d, (long long)e,
                  (long long)p->shape[d]);
  }
fail:
  return st;
}

distro_status distro_optim_save(const distro_optim *co, const char *path) {
  distro_status st = DISTRO_OK;
  distro__afile w = {0};
  DISTRO__NONNULL("distro_optim_save", co);
  DISTRO__NONNULL("distro_optim_save", path);
  if (!*path) return distro__fail(DISTRO_ERR_INVALID, "distro_optim_save: argument 'path' is empty");
  distro_optim *o = (distro_optim *)co; /* prepare() allocates lazily; no observable change */
  if (distro__overlap_pending(o))
    return distro__fail(DISTRO_ERR_INVALID,
                        "distro_optim_save: an exchange is in flight (options.overlap); call distro_optim_flush first");
  DISTRO_CHECK(distro__optim_prepare(o));
  DISTRO_CHECK(distro__afile_open(&w, path));
  distro__afile_write(&w, STATE_MAGIC, 8);
  distro__afile_u32(&w, STATE_VERSION);
  uint32_t hdr[6] = {(uint32_t)o->opt.algorithm, (uint32_t)o->opt.update, (uint32_t)o->opt.values,
                     (uint32_t)o->opt.chunk, (uint32_t)o->opt.topk, (uint32_t)o->nparams};
  for (int i = 0; i < 6; i++) distro__afile_u32(&w, hdr[i]);
  distro__afile_u64(&w, (uint64_t)o->step);
  uint32_t lr_bits;
  memcpy(&lr_bits, &o->ramp.lr_last, 4);
  distro__afile_u32(&w, lr_bits);
  distro__afile_u64(&w, (uint64_t)o->ramp.seen);
  distro__afile_u64(&w, (uint64_t)o->ramp.rise);
  distro__state_array kinds[3];
  const int arrays = distro__state_arrays(&o->opt, kinds);
  for (int i = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    distro__state_put_tensor(&w, p);
    for (int a = 0; a < arrays; a++) put_array(&w, o, p, kinds[a], *param_array(p, kinds[a]));
  }
  return distro__afile_commit(&w);
fail:
  distro__afile_abort(&w);
  return st;
}

distro_status distro_optim_load(distro_optim *o, const char *path) {
  distro_status st = DISTRO_OK;
  distro__rfile r = {0};
  float **fresh = NULL;
  int nfresh = 0;
  DISTRO__NONNULL("distro_optim_load", o);
  DISTRO__NONNULL("distro_optim_load", path);
  if (distro__overlap_pending(o))
    return distro__fail(DISTRO_ERR_INVALID,
                        "distro_optim_load: an exchange is in flight (options.overlap); call distro_optim_flush first");
  DISTRO_CHECK(distro__optim_prepare(o));
  DISTRO_CHECK(distro__rfile_open(&r, path));
  char magic[8];
  uint32_t version, hdr[6];
  int64_t step;
  DISTRO_CHECK(distro__rfile_read(&r, magic, 8));
  if (memcmp(magic, STATE_MAGIC, 8) != 0) DISTRO_FAIL(DISTRO_ERR_IO, "'%s' is not a distro optimizer state file", path);
  DISTRO_CHECK(distro__rfile_read(&r, &version, 4));
  if (version != STATE_VERSION && version != 2u)
    DISTRO_FAIL(DISTRO_ERR_IO, "'%s': unsupported state version %u", path, version);
  for (int i = 0; i < 6; i++) DISTRO_CHECK(distro__rfile_read(&r, &hdr[i], 4));
  DISTRO_CHECK(distro__rfile_read(&r, &step, 8));
  distro__ramp ramp = {0.0f, step, step > 0}; /* version 2: the warm-up is over */
  if (version == STATE_VERSION) {
    DISTRO_CHECK(distro__rfile_read(&r, &ramp.lr_last, 4));
    DISTRO_CHECK(distro__rfile_read(&r, &ramp.seen, 8));
    DISTRO_CHECK(distro__rfile_read(&r, &ramp.rise, 8));
    if (!(isfinite(ramp.lr_last) && ramp.lr_last >= 0) || ramp.seen < 0 || ramp.rise < 0 || ramp.rise > ramp.seen)
      DISTRO_FAIL(DISTRO_ERR_IO, "'%s': corrupt warm-up record (lr %g, %lld steps seen, rise %lld)", path,
                  (double)ramp.lr_last, (long long)ramp.seen, (long long)ramp.rise);
  }
  if (hdr[0] != (uint32_t)o->opt.algorithm || hdr[1] != (uint32_t)o->opt.update)
    DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s' was saved by a different algorithm or update rule", path);
  if (o->opt.algorithm == DISTRO_ALG_DEMO && (hdr[3] != (uint32_t)o->opt.chunk || hdr[4] != (uint32_t)o->opt.topk))
    DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s' was saved with chunk %u topk %u, this optimizer uses %d and %d", path, hdr[3],
                hdr[4], o->opt.chunk, o->opt.topk);
  if (hdr[5] != (uint32_t)o->nparams)
    DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s' holds %u tensors, this optimizer has %d", path, hdr[5], o->nparams);
  if (step < 0) DISTRO_FAIL(DISTRO_ERR_IO, "'%s': negative step count", path);
  distro__state_array kinds[3];
  const int arrays = distro__state_arrays(&o->opt, kinds);
  fresh = calloc((size_t)o->nparams * (size_t)arrays, sizeof *fresh);
  if (!fresh) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  for (int i = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    DISTRO_CHECK(distro__state_check_tensor(&r, p, i));
    for (int a = 0; a < arrays; a++) {
      float *buf = malloc(sizeof(float) * (size_t)(p->numel ? p->numel : 1));
      if (!buf) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory loading '%s'", p->name);
      fresh[nfresh++] = buf;
      DISTRO_CHECK(get_array(&r, o, p, kinds[a], buf));
    }
  }
  DISTRO_CHECK(distro__rfile_finish(&r));
  /* Everything checked: swap the fresh arrays in. */
  for (int i = 0, n = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    for (int a = 0; a < arrays; a++, n++) {
      float **slot = param_array(p, kinds[a]);
      free(*slot);
      *slot = fresh[n];
      fresh[n] = NULL;
    }
  }
  o->step = step;
  o->ramp = ramp;
  free(fresh);
  return DISTRO_OK;
fail:
  distro__rfile_close(&r);
  for (int i = 0; i < nfresh; i++) free(fresh[i]);
  free(fresh);
  return st;
}
