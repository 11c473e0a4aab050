/* Saving and loading the DiLoCo outer state.
 *
 * File: "DSTRDLC\0" | u32 version | u32 H, P, tau, nesterov, codec,
 * codec_block, merge, fragmenting | u32 bits of alpha, outer lr, momentum |
 * i64 max_block | u32 ntensors | per tensor: u32 name length, name, u32 ndim,
 * i64 shape[ndim], i32 layer, u32 flags | i64 inner steps | u64 peak and
 * total outer bytes sent | u32 global copy set | per fragment: i64 elements,
 * u64 tokens, u64 steps since its last send | pending exchange: u32 active,
 * u32 fragment, i64 sent at, i64 apply at, u64 tokens and steps at the send |
 * per fragment: global copy, then outer momentum, float32 | u32 CRC32C of
 * everything before. Little-endian hosts, like the optimizer state.
 *
 * Version 2, for sparse outer gradients: after the bits of the outer
 * momentum, u32 compressor, bits of density, sparse_chunk, sparse_dct, bits
 * of ef_beta, sparse_values; after each fragment's momentum, its error
 * feedback e (float32). Dense runs write version 1, as before.
 *
 * Written to a temporary file, synced and renamed over the target (a crash
 * leaves the old or the new file); loads check everything into fresh
 * buffers and swap them in only at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "optim/diloco_internal.h"
#include "optim/optim_internal.h"

#define DLC_MAGIC "DSTRDLC"
#define DLC_STATE_VERSION 1u
#define DLC_STATE_VERSION_SPARSE 2u
#define NFIELDS 17

static int sparse(const distro_diloco *d) { return d->opt.compressor == DISTRO_OUTER_SPARSE; }

/* Returns how many of the fields the file holds (11 dense, 17 sparse). */
static int header_fields(const distro_diloco *d, uint32_t f[NFIELDS]) {
  const distro_diloco_options *o = &d->opt;
  f[0] = (uint32_t)o->H;
  f[1] = (uint32_t)o->fragments;
  f[2] = (uint32_t)o->overlap;
  f[3] = (uint32_t)o->nesterov;
  f[4] = (uint32_t)o->codec;
  f[5] = (uint32_t)o->codec_block;
  f[6] = (uint32_t)o->merge;
  f[7] = (uint32_t)o->fragmenting;
  memcpy(&f[8], &o->alpha, 4);
  memcpy(&f[9], &o->outer_lr, 4);
  memcpy(&f[10], &o->outer_momentum, 4);
  f[11] = (uint32_t)o->compressor;
  memcpy(&f[12], &o->density, 4);
  f[13] = (uint32_t)o->sparse_chunk;
  f[14] = (uint32_t)o->sparse_dct;
  memcpy(&f[15], &o->ef_beta, 4);
  f[16] = (uint32_t)o->sparse_values;
  return sparse(d) ? NFIELDS : 11;
}
static const char *const field_names[NFIELDS] = {"H", "fragments", "overlap", "nesterov", "codec", "codec_block",
                                                 "merge", "fragmenting", "alpha", "outer_lr", "outer_momentum",
                                                 "compressor", "density", "sparse_chunk", "sparse_dct", "ef_beta",
                                                 "sparse_values"};

distro_status distro_diloco_save(distro_diloco *d, const char *path) {
  distro_status st = DISTRO_OK;
  distro__afile w = {0};
  DISTRO__NONNULL("distro_diloco_save", d);
  DISTRO__NONNULL("distro_diloco_save", path);
  if (!*path) return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_save: argument 'path' is empty");
  DISTRO_CHECK(distro__diloco_prepare(d));
  DISTRO_CHECK(distro__diloco_wait(d, NULL));
  DISTRO_CHECK(distro__afile_open(&w, path));
  distro__afile_write(&w, DLC_MAGIC, 8);
  distro__afile_u32(&w, sparse(d) ? DLC_STATE_VERSION_SPARSE : DLC_STATE_VERSION);
  uint32_t hf[NFIELDS];
  const int nf = header_fields(d, hf);
  for (int i = 0; i < nf; i++) distro__afile_u32(&w, hf[i]);
  distro__afile_u64(&w, (uint64_t)d->max_block);
  distro__afile_u32(&w, (uint32_t)d->nt);
  for (int i = 0; i < d->nt; i++) {
    const distro__param *p = &d->inner->params[i];
    distro__state_put_tensor(&w, p);
    distro__afile_u32(&w, (uint32_t)d->layer[i]);
    distro__afile_u32(&w, d->tflags[i]);
  }
  distro__afile_u64(&w, (uint64_t)d->t);
  distro__afile_u64(&w, d->peak_sent);
  distro__afile_u64(&w, d->total_sent);
  distro__afile_u32(&w, (uint32_t)d->global_init);
  const int P = d->opt.fragments;
  for (int p = 0; p < P; p++) {
    distro__afile_u64(&w, (uint64_t)d->frags.numel[p]);
    distro__afile_u64(&w, d->tok[p]);
    distro__afile_u64(&w, d->steps[p]);
  }
  const distro__diloco_pending *pd = &d->pending;
  distro__afile_u32(&w, (uint32_t)pd->active);
  distro__afile_u32(&w, (uint32_t)(pd->active ? pd->frag : 0));
  distro__afile_u64(&w, (uint64_t)(pd->active ? pd->sent_at : 0));
  distro__afile_u64(&w, (uint64_t)(pd->active ? pd->apply_at : 0));
  distro__afile_u64(&w, pd->active ? pd->tokens_sent : 0);
  distro__afile_u64(&w, pd->active ? pd->steps_sent : 0);
  for (int p = 0; p < P; p++) {
    const size_t n = (size_t)d->frags.numel[p];
    if (d->global_init) {
      distro__afile_write(&w, d->global[p], sizeof(float) * n);
    } else { /* set from the parameters at the first step */
      static const float zeros[1024];
      for (size_t j = 0; j < n; j += 1024) distro__afile_write(&w, zeros, sizeof(float) * (n - j < 1024 ? n - j : 1024));
    }
    distro__afile_write(&w, d->mom[p], sizeof(float) * n);
    if (sparse(d)) distro__afile_write(&w, d->ef[p], sizeof(float) * n);
  }
  return distro__afile_commit(&w);
fail:
  distro__afile_abort(&w);
  return st;
}

distro_status distro_diloco_load(distro_diloco *d, const char *path) {
  distro_status st = DISTRO_OK;
  distro__rfile r = {0};
  float **fresh = NULL;
  const int P = d ? d->opt.fragments : 0;
  DISTRO__NONNULL("distro_diloco_load", d);
  DISTRO__NONNULL("distro_diloco_load", path);
  DISTRO_CHECK(distro__diloco_prepare(d));
  (void)distro__diloco_wait(d, NULL); /* the loaded state replaces its outcome */
  DISTRO_CHECK(distro__rfile_open(&r, path));
  char magic[8];
  uint32_t version, hf[NFIELDS], want[NFIELDS], nt, gi;
  uint64_t max_block, t, peak, total;
  DISTRO_CHECK(distro__rfile_read(&r, magic, 8));
  if (memcmp(magic, DLC_MAGIC, 8) != 0) DISTRO_FAIL(DISTRO_ERR_IO, "'%s' is not a distro DiLoCo state file", path);
  DISTRO_CHECK(distro__rfile_read(&r, &version, 4));
  if (version != DLC_STATE_VERSION && version != DLC_STATE_VERSION_SPARSE)
    DISTRO_FAIL(DISTRO_ERR_IO, "'%s': unsupported DiLoCo state version %u", path, version);
  if ((version == DLC_STATE_VERSION_SPARSE) != sparse(d))
    DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s' was saved with %s outer gradients, this run sends %s ones", path,
                version == DLC_STATE_VERSION ? "dense" : "sparse", sparse(d) ? "sparse" : "dense");
  const int nf = header_fields(d, want);
  for (int i = 0; i < nf; i++) {
    DISTRO_CHECK(distro__rfile_read(&r, &hf[i], 4));
    if (hf[i] != want[i])
      DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s' was saved with a different DiLoCo option %s", path, field_names[i]);
  }
  DISTRO_CHECK(distro__rfile_read(&r, &max_block, 8));
  if (max_block != (uint64_t)d->max_block)
    DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s' was saved with max_block %llu, this run uses %lld", path,
                (unsigned long long)max_block, (long long)d->max_block);
  DISTRO_CHECK(distro__rfile_read(&r, &nt, 4));
  if (nt != (uint32_t)d->nt) DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s' holds %u tensors, this run has %d", path, nt, d->nt);
  for (int i = 0; i < d->nt; i++) {
    const distro__param *p = &d->inner->params[i];
    uint32_t lay, fl;
    DISTRO_CHECK(distro__state_check_tensor(&r, p, i));
    DISTRO_CHECK(distro__rfile_read(&r, &lay, 4));
    DISTRO_CHECK(distro__rfile_read(&r, &fl, 4));
    if (lay != (uint32_t)d->layer[i] || fl != d->tflags[i])
      DISTRO_FAIL(DISTRO_ERR_SHAPE, "'%s': tensor '%s' was saved with layer %d flags %u, this run has %d and %u", path, p->name,
                  (int)lay, fl, d->layer[i], d->tflags[i]);
  }
  DISTRO_CHECK(distro__rfile_read(&r, &t, 8));
  DISTRO_CHECK(distro__rfile_read(&r, &peak, 8));
  DISTRO_CHECK(distro__rfile_read(&r, &total, 8));
  DISTRO_CHECK(distro__rfile_read(&r, &gi, 4));
  if (t > (uint64_t)INT64_MAX / 2 || gi > 1) DISTRO_FAIL(DISTRO_ERR_IO, "'%s': corrupt schedule position", path);
  uint64_t *ctr = calloc(2 * (size_t)P, sizeof *ctr);
  if (!ctr) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  for (int p = 0; p < P && st == DISTRO_OK; p++) {
    uint64_t n;
    st = distro__rfile_read(&r, &n, 8);
    if (st == DISTRO_OK && n != (uint64_t)d->frags.numel[p])
      st = distro__fail(DISTRO_ERR_SHAPE, "'%s': fragment %d has %llu elements, this run %lld", path, p,
                        (unsigned long long)n, (long long)d->frags.numel[p]);
    if (st == DISTRO_OK) st = distro__rfile_read(&r, &ctr[2 * p], 8);
    if (st == DISTRO_OK) st = distro__rfile_read(&r, &ctr[2 * p + 1], 8);
  }
  if (st != DISTRO_OK) {
    free(ctr);
    goto fail;
  }
  uint32_t pa, pf;
  uint64_t ps, pap, ptok, pst;
  distro_status s2 = DISTRO_OK;
  s2 = distro__rfile_read(&r, &pa, 4);
  if (s2 == DISTRO_OK) s2 = distro__rfile_read(&r, &pf, 4);
  if (s2 == DISTRO_OK) s2 = distro__rfile_read(&r, &ps, 8);
  if (s2 == DISTRO_OK) s2 = distro__rfile_read(&r, &pap, 8);
  if (s2 == DISTRO_OK) s2 = distro__rfile_read(&r, &ptok, 8);
  if (s2 == DISTRO_OK) s2 = distro__rfile_read(&r, &pst, 8);
  if (s2 == DISTRO_OK && (pa > 1 || (pa && (pf >= (uint32_t)P || ps > t || pap <= t || pap - ps != (uint64_t)d->opt.overlap))))
    s2 = distro__fail(DISTRO_ERR_IO, "'%s': corrupt pending exchange record", path);
  if (s2 != DISTRO_OK) {
    free(ctr);
    DISTRO_CHECK(s2);
  }
  const int arrays = sparse(d) ? 3 : 2; /* global copy, momentum, e */
  fresh = calloc((size_t)arrays * (size_t)P, sizeof *fresh);
  if (!fresh) {
    free(ctr);
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  }
  for (int p = 0; p < P && st == DISTRO_OK; p++)
    for (int a = 0; a < arrays && st == DISTRO_OK; a++) {
      const size_t n = (size_t)d->frags.numel[p];
      float **dst = &fresh[arrays * p + a];
      *dst = malloc(sizeof(float) * n);
      st = *dst ? distro__rfile_read(&r, *dst, sizeof(float) * n)
                : distro__fail(DISTRO_ERR_NOMEM, "out of memory loading the global copy");
    }
  if (st == DISTRO_OK) st = distro__rfile_finish(&r);
  if (st != DISTRO_OK) {
    free(ctr);
    goto fail;
  }
  /* Everything checked: swap in. */
  for (int p = 0; p < P; p++) {
    free(d->global[p]);
    free(d->mom[p]);
    d->global[p] = fresh[arrays * p];
    d->mom[p] = fresh[arrays * p + 1];
    if (arrays == 3) {
      free(d->ef[p]);
      d->ef[p] = fresh[arrays * p + 2];
    }
    d->tok[p] = ctr[2 * p];
    d->steps[p] = ctr[2 * p + 1];
  }
  free(ctr);
  free(fresh);
  fresh = NULL;
  d->t = (int64_t)t;
  d->peak_sent = peak;
  d->total_sent = total;
  d->global_init = (int)gi;
  d->pending = (distro__diloco_pending){(int)pa, (int)pf, (int64_t)ps, (int64_t)pap, ptok, pst};
  d->verified = 0; /* learners agree again at the next step */
  return DISTRO_OK;
fail:
  distro__rfile_close(&r);
  if (fresh)
    for (int i = 0; i < (sparse(d) ? 3 : 2) * P; i++) free(fresh[i]);
  free(fresh);
  return st;
}
