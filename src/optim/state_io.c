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
 * Version 4 adds, after the warm-up, u32 pending: 0, or the options.overlap
 * mode of a save made with an exchange in flight. Version 5 adds after it
 * f64 the spread of the latest committed aggregate (step_rule.h), which the
 * look-ahead's next provisional step grows with; older files load with 1.
 * Version 6 adds after it u32 n: 0, or the tensor count when the saving
 * optimizer clips (options.clip_norm), then n f64 clip shares in tensor
 * order; an optimizer that clips and loads a file without them starts its
 * shares afresh (each tensor's share of the parameters).
 * Then each tensor's arrays
 * are followed by what that exchange's step staged (the momentum; DisTrO-
 * AdamW's v; with look-ahead the agreed parameters, then the selection as
 * u32 positions and f32 values, k per tile), and the tensors by f32
 * lr of that step | u64 n | this rank's payload (n bytes), which the loaded
 * optimizer sends again at its next step or flush: a run resumed from such
 * a save goes on as the one that saved it (docs/design.md "Overlap").
 * Saves go to a temporary file that is synced and renamed over the target,
 * so a crash leaves either the old or the new file. Loads verify everything
 * into fresh buffers and swap them in only at the end. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "optim/optim_internal.h"

#define STATE_MAGIC "DSTROPT"
#define STATE_VERSION 6u

int distro__state_arrays(const distro_options *o, distro__state_array out[3]) {
  int n = 0;
  out[n++] = o->algorithm == DISTRO_ALG_DEMO ? DISTRO__STATE_MOM : DISTRO__STATE_M;
  if (distro__uses_adam(o)) out[n++] = DISTRO__STATE_V;
  return n;
}

static float **param_array(distro__param *p, distro__state_array a) {
  return a == DISTRO__STATE_MOM ? &p->mom : a == DISTRO__STATE_M ? &p->m : &p->v;
}

/* What an exchange in flight staged for tensor p, in file order: the
 * momentum, DisTrO-AdamW's v (with overlap), the agreed parameters
 * (look-ahead). Returns how many (<= 3). */
static int staged_arrays(distro__param *p, float **out[3]) {
  int n = 0;
  out[n++] = &p->mom_next;
  if (p->v_next) out[n++] = &p->v_next;
  if (p->base) out[n++] = &p->base;
  return n;
}

/* The layout staged array a is stored in: the momentum tile by tile, the
 * others in the tensor's layout (as v). */
static distro__state_array staged_kind(int a) { return a == 0 ? DISTRO__STATE_MOM : DISTRO__STATE_V; }

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
  DISTRO_CHECK(distro__optim_prepare(o));
  /* An exchange in flight is saved as it was sent: the helper thread only
   * reads the send buffer, and nothing here waits for it. */
  size_t psize = 0;
  float plr = 0.0f;
  const int pending = distro__overlap_saved(o, &psize, &plr);
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
  distro__afile_u32(&w, pending ? (uint32_t)o->opt.overlap : 0u);
  uint64_t spread_bits;
  memcpy(&spread_bits, &o->spread, 8);
  distro__afile_u64(&w, spread_bits);
  const uint32_t nshares = o->opt.clip_norm > 0 ? (uint32_t)o->nparams : 0u;
  distro__afile_u32(&w, nshares);
  for (uint32_t i = 0; i < nshares; i++) distro__afile_write(&w, &o->params[i].clip_share, 8);
  distro__state_array kinds[3];
  const int arrays = distro__state_arrays(&o->opt, kinds);
  for (int i = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    distro__state_put_tensor(&w, p);
    for (int a = 0; a < arrays; a++) put_array(&w, o, p, kinds[a], *param_array(p, kinds[a]));
    if (!pending) continue;
    float **staged[3];
    const int ns = staged_arrays(p, staged);
    for (int a = 0; a < ns; a++) put_array(&w, o, p, staged_kind(a), *staged[a]);
    if (!p->base) continue;
    /* Look-ahead: this rank's selection before quantization, from which
     * the load rebuilds its provisional step. */
    const size_t sel = (size_t)(p->tiling.nchunks * p->tiling.k);
    distro__afile_write(&w, p->idx, sizeof(uint32_t) * sel);
    distro__afile_write(&w, p->val, sizeof(float) * sel);
  }
  if (pending) {
    uint32_t plr_bits;
    memcpy(&plr_bits, &plr, 4);
    distro__afile_u32(&w, plr_bits);
    distro__afile_u64(&w, (uint64_t)psize);
    distro__afile_write(&w, o->send, psize);
  }
  return distro__afile_commit(&w);
fail:
  distro__afile_abort(&w);
  return st;
}

distro_status distro_optim_load(distro_optim *o, const char *path) {
  distro_status st = DISTRO_OK;
  distro__rfile r = {0};
  float **fresh = NULL, **fval = NULL;
  uint32_t **fidx = NULL;
  double *shares = NULL;
  uint32_t nshares = 0;
  uint8_t *payload = NULL;
  int nfresh = 0;
  DISTRO__NONNULL("distro_optim_load", o);
  DISTRO__NONNULL("distro_optim_load", path);
  if (distro__overlap_in_flight(o))
    return distro__fail(DISTRO_ERR_INVALID,
                        "distro_optim_load: an exchange is in flight (options.overlap); call distro_optim_flush first");
  if (distro__backward_in_flight(o))
    return distro__fail(DISTRO_ERR_INVALID,
                        "distro_optim_load: gradients were marked ready for a step not taken yet "
                        "(distro_optim_grad_ready); call distro_optim_step first");
  DISTRO_CHECK(distro__optim_prepare(o));
  DISTRO_CHECK(distro__rfile_open(&r, path));
  char magic[8];
  uint32_t version, hdr[6];
  int64_t step;
  DISTRO_CHECK(distro__rfile_read(&r, magic, 8));
  if (memcmp(magic, STATE_MAGIC, 8) != 0) DISTRO_FAIL(DISTRO_ERR_IO, "'%s' is not a distro optimizer state file", path);
  DISTRO_CHECK(distro__rfile_read(&r, &version, 4));
  if (version < 2u || version > STATE_VERSION)
    DISTRO_FAIL(DISTRO_ERR_IO, "'%s': unsupported state version %u", path, version);
  for (int i = 0; i < 6; i++) DISTRO_CHECK(distro__rfile_read(&r, &hdr[i], 4));
  DISTRO_CHECK(distro__rfile_read(&r, &step, 8));
  distro__ramp ramp = {0.0f, step, step > 0}; /* version 2: the warm-up is over */
  uint32_t pending = 0;
  if (version >= 3u) {
    DISTRO_CHECK(distro__rfile_read(&r, &ramp.lr_last, 4));
    DISTRO_CHECK(distro__rfile_read(&r, &ramp.seen, 8));
    DISTRO_CHECK(distro__rfile_read(&r, &ramp.rise, 8));
    if (!(isfinite(ramp.lr_last) && ramp.lr_last >= 0) || ramp.seen < 0 || ramp.rise < 0 || ramp.rise > ramp.seen)
      DISTRO_FAIL(DISTRO_ERR_IO, "'%s': corrupt warm-up record (lr %g, %lld steps seen, rise %lld)", path,
                  (double)ramp.lr_last, (long long)ramp.seen, (long long)ramp.rise);
  }
  if (version >= 4u) DISTRO_CHECK(distro__rfile_read(&r, &pending, 4));
  double spread = 1.0;
  if (version >= 5u) {
    DISTRO_CHECK(distro__rfile_read(&r, &spread, 8));
    if (!(isfinite(spread) && spread >= 1.0))
      DISTRO_FAIL(DISTRO_ERR_IO, "'%s': corrupt spread record (%g; a spread is finite and at least 1)", path, spread);
    /* A spread cannot exceed the ranks that selected; a state saved by a
     * larger job resumes with this job's largest. */
    if (spread > (double)o->comm->size) spread = (double)o->comm->size;
  }
  if (version >= 6u) {
    DISTRO_CHECK(distro__rfile_read(&r, &nshares, 4));
    if (nshares != 0 && nshares != hdr[5])
      DISTRO_FAIL(DISTRO_ERR_IO, "'%s': corrupt clip record (%u shares for %u tensors)", path, nshares, hdr[5]);
    if (nshares != 0 && hdr[5] == (uint32_t)o->nparams) {
      shares = malloc(sizeof *shares * nshares);
      if (!shares) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory loading '%s'", path);
      DISTRO_CHECK(distro__rfile_read(&r, shares, sizeof *shares * nshares));
      for (uint32_t i = 0; i < nshares; i++)
        if (!(isfinite(shares[i]) && shares[i] >= 0 && shares[i] <= 1))
          DISTRO_FAIL(DISTRO_ERR_IO, "'%s': corrupt clip share of tensor #%u (%g, not in [0, 1])", path, i, shares[i]);
    }
  }
  if (hdr[0] != (uint32_t)o->opt.algorithm || hdr[1] != (uint32_t)o->opt.update)
    DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s' was saved by a different algorithm or update rule", path);
  if (o->opt.algorithm == DISTRO_ALG_DEMO && (hdr[3] != (uint32_t)o->opt.chunk || hdr[4] != (uint32_t)o->opt.topk))
    DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s' was saved with chunk %u topk %u, this optimizer uses %d and %d", path, hdr[3],
                hdr[4], o->opt.chunk, o->opt.topk);
  if (hdr[5] != (uint32_t)o->nparams)
    DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s' holds %u tensors, this optimizer has %d", path, hdr[5], o->nparams);
  if (step < 0) DISTRO_FAIL(DISTRO_ERR_IO, "'%s': negative step count", path);
  if (pending > (uint32_t)DISTRO_OVERLAP_STALE) DISTRO_FAIL(DISTRO_ERR_IO, "'%s': corrupt overlap record (%u)", path, pending);
  if (pending && !(o->ov && o->mom_tiled && pending == (uint32_t)o->opt.overlap))
    DISTRO_FAIL(DISTRO_ERR_SHAPE,
                "'%s' was saved with an exchange in flight (options.overlap %s); it loads only into a CPU optimizer "
                "with the same overlap mode (or save after distro_optim_flush)",
                path, pending == (uint32_t)DISTRO_OVERLAP_LOOKAHEAD ? "LOOKAHEAD" : "STALE");
  distro__state_array kinds[3];
  const int arrays = distro__state_arrays(&o->opt, kinds);
  fresh = calloc((size_t)o->nparams * (size_t)(arrays + 3), sizeof *fresh);
  fidx = calloc((size_t)o->nparams, sizeof *fidx);
  fval = calloc((size_t)o->nparams, sizeof *fval);
  if (!fresh || !fidx || !fval) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  for (int i = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    DISTRO_CHECK(distro__state_check_tensor(&r, p, i));
    /* Its arrays, then what a pending exchange staged (as saved). */
    float **staged[3];
    const int ns = pending ? staged_arrays(p, staged) : 0;
    for (int a = 0; a < arrays + ns; a++) {
      float *buf = malloc(sizeof(float) * (size_t)(p->numel ? p->numel : 1));
      if (!buf) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory loading '%s'", p->name);
      fresh[nfresh++] = buf;
      DISTRO_CHECK(get_array(&r, o, p, a < arrays ? kinds[a] : staged_kind(a - arrays), buf));
    }
    if (pending && p->base) { /* the selection: positions inside each tile, finite values */
      const int64_t sel = p->tiling.nchunks * p->tiling.k;
      fidx[i] = malloc(sizeof(uint32_t) * (size_t)(sel ? sel : 1));
      fval[i] = malloc(sizeof(float) * (size_t)(sel ? sel : 1));
      if (!fidx[i] || !fval[i]) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory loading '%s'", p->name);
      DISTRO_CHECK(distro__rfile_read(&r, fidx[i], sizeof(uint32_t) * (size_t)sel));
      DISTRO_CHECK(distro__rfile_read(&r, fval[i], sizeof(float) * (size_t)sel));
      for (int64_t j = 0; j < sel; j++)
        if (fidx[i][j] >= (uint32_t)p->tiling.chunk_elems || !isfinite(fval[i][j]))
          DISTRO_FAIL(DISTRO_ERR_IO, "'%s': corrupt selection of '%s' (entry %lld: position %u of %lld, value %g)", path,
                      p->name, (long long)j, fidx[i][j], (long long)p->tiling.chunk_elems, (double)fval[i][j]);
    }
  }
  size_t psize = 0;
  float plr = 0.0f;
  if (pending) {
    uint64_t n;
    DISTRO_CHECK(distro__rfile_read(&r, &plr, 4));
    DISTRO_CHECK(distro__rfile_read(&r, &n, 8));
    if (!(isfinite(plr) && plr >= 0) || n == 0 || n > (uint64_t)o->slot)
      DISTRO_FAIL(DISTRO_ERR_IO, "'%s': corrupt pending exchange (lr %g, %llu payload bytes, at most %zu)", path,
                  (double)plr, (unsigned long long)n, o->slot);
    psize = (size_t)n;
    payload = malloc(psize);
    if (!payload) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory loading '%s'", path);
    DISTRO_CHECK(distro__rfile_read(&r, payload, psize));
  }
  DISTRO_CHECK(distro__rfile_finish(&r));
  /* Everything checked: swap the fresh arrays in. */
  for (int i = 0, n = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    float **staged[3];
    const int ns = pending ? staged_arrays(p, staged) : 0;
    for (int a = 0; a < arrays + ns; a++, n++) {
      float **slot = a < arrays ? param_array(p, kinds[a]) : staged[a - arrays];
      free(*slot);
      *slot = fresh[n];
      fresh[n] = NULL;
    }
    if (fidx[i]) {
      free(p->idx);
      free(p->val);
      p->idx = fidx[i];
      p->val = fval[i];
      fidx[i] = NULL;
      fval[i] = NULL;
    }
  }
  o->step = step;
  o->ramp = ramp;
  o->spread = spread;
  if (o->opt.clip_norm > 0) { /* the saved shares, or afresh */
    distro__clip_init(o);
    for (uint32_t i = 0; shares && i < nshares; i++) o->params[i].clip_share = shares[i];
  }
  free(shares);
  if (o->ov) distro__overlap_restore(o, payload, psize, plr); /* NULL: nothing pending */
  free(fresh);
  free(fidx);
  free(fval);
  free(payload);
  return DISTRO_OK;
fail:
  distro__rfile_close(&r);
  free(shares);
  for (int i = 0; i < nfresh; i++) free(fresh[i]);
  for (int i = 0; fidx && fval && i < o->nparams; i++) {
    free(fidx[i]);
    free(fval[i]);
  }
  free(fresh);
  free(fidx);
  free(fval);
  free(payload);
  return st;
}
