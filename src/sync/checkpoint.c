/* Syncer checkpoint: the layout, every fragment's global copy, outer
 * momentum, version and round, the epoch and merge count, written atomically
 * (temporary file, fsync, rename; a crash leaves the old or the new file)
 * with a CRC32C trailer. A load checks everything before using it.
 *
 * File: "DSTRSYN\0" | u32 format 1 | u64 epoch | u64 merges | u32 P, codec,
 * codec block, fragmenting | u64 max_block | u32 ntensors | u64 signature |
 * ntensors x (u64 numel, u32 flags) | P x (u64 version, u64 round) |
 * per fragment: global copy, then momentum, float32 | u32 CRC32C of all
 * before. Integers little-endian. The file is read only if it is a regular
 * file no larger than max_params allows; every size in it is checked. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/atomic_file.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "sync/checkpoint.h"

#define CK_MAGIC "DSTRSYN"
#define CK_FORMAT 1u

static size_t ck_size(const distro__sy_layout *L) {
  return 8 + 4 + 8 + 8 + 16 + 8 + 4 + 8 + 12 * (size_t)L->nt + 16 * (size_t)L->P + 8 * (size_t)L->total + 4;
}

distro_status distro__syncer_ckpt_save(distro_syncer *s) {
  distro_status st = DISTRO_OK;
  const distro__sy_layout *L = &s->L;
  const size_t n = ck_size(L);
  uint8_t *buf = malloc(n), *b = buf;
  distro__afile w = {0};
  if (!buf) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  memcpy(b, CK_MAGIC, 8), b += 8;
  distro__put_u32(b, CK_FORMAT), b += 4;
  distro__put_u64(b, s->epoch), b += 8;
  distro__put_u64(b, s->merges), b += 8;
  distro__put_u32(b, (uint32_t)L->P), b += 4;
  distro__put_u32(b, (uint32_t)L->codec), b += 4;
  distro__put_u32(b, (uint32_t)L->block), b += 4;
  distro__put_u32(b, (uint32_t)s->opt.fragmenting), b += 4;
  distro__put_u64(b, (uint64_t)s->opt.max_block), b += 8;
  distro__put_u32(b, (uint32_t)L->nt), b += 4;
  distro__put_u64(b, L->signature), b += 8;
  for (int i = 0; i < L->nt; i++) {
    distro__put_u64(b, (uint64_t)L->numel[i]), b += 8;
    distro__put_u32(b, L->tflags[i]), b += 4;
  }
  for (int p = 0; p < L->P; p++) {
    distro__put_u64(b, s->frag[p].version), b += 8;
    distro__put_u64(b, s->frag[p].round), b += 8;
  }
  for (int p = 0; p < L->P; p++) {
    const size_t k = 4 * (size_t)L->frags.numel[p];
    memcpy(b, s->frag[p].global, k), b += k;
    memcpy(b, s->frag[p].mom, k), b += k;
  }
  /* The CRC32C trailer is appended by the commit. */
  DISTRO_CHECK(distro__afile_open(&w, s->opt.checkpoint));
  distro__afile_write(&w, buf, (size_t)(b - buf));
  st = distro__afile_commit(&w);
  free(buf);
  return st;
fail:
  distro__afile_abort(&w);
  free(buf);
  return st;
}

distro_status distro__syncer_ckpt_load(distro_syncer *s, int *found) {
  distro_status st = DISTRO_OK;
  uint8_t *buf = NULL;
  int64_t *numel = NULL;
  unsigned *flags = NULL;
  FILE *f = NULL;
  int err = 0;
  *found = 0;
  if (distro__open_regular(s->opt.checkpoint, &f, &err) != DISTRO_OK) {
    if (err == ENOENT) return DISTRO_OK;
    return distro__fail(DISTRO_ERR_IO, "checkpoint: %s", distro_last_error());
  }
  if (fseek(f, 0, SEEK_END) != 0) DISTRO_FAIL(DISTRO_ERR_IO, "seek '%s'", s->opt.checkpoint);
  const long sz = ftell(f);
  /* The largest file max_params allows; a larger one is not read at all. */
  const int64_t cap = 8 + 4 + 8 + 8 + 16 + 8 + 4 + 8 + 12 * (int64_t)DISTRO__SY_MAX_TENSORS +
                      16 * (int64_t)s->opt.fragments + 8 * s->opt.max_params + 4;
  if (sz < 72) DISTRO_FAIL(DISTRO_ERR_IO, "checkpoint '%s' is truncated (%ld bytes)", s->opt.checkpoint, sz);
  if ((int64_t)sz > cap)
    DISTRO_FAIL(DISTRO_ERR_IO, "checkpoint '%s' has %ld bytes, more than max_params %lld allows", s->opt.checkpoint, sz,
                (long long)s->opt.max_params);
  rewind(f);
  buf = malloc((size_t)sz);
  if (!buf) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) DISTRO_FAIL(DISTRO_ERR_IO, "reading '%s'", s->opt.checkpoint);
  if (distro__crc32c(buf, (size_t)sz - 4) != distro__get_u32(buf + sz - 4))
    DISTRO_FAIL(DISTRO_ERR_IO, "checkpoint '%s': CRC32C mismatch", s->opt.checkpoint);
  if (memcmp(buf, CK_MAGIC, 8) != 0 || distro__get_u32(buf + 8) != CK_FORMAT)
    DISTRO_FAIL(DISTRO_ERR_IO, "checkpoint '%s': not a syncer checkpoint (format 1)", s->opt.checkpoint);
  const uint8_t *b = buf + 12;
  const uint64_t epoch = distro__get_u64(b), merges = distro__get_u64(b + 8);
  b += 16;
  const uint32_t P = distro__get_u32(b), codec = distro__get_u32(b + 4), block = distro__get_u32(b + 8),
                 fr = distro__get_u32(b + 12);
  const int64_t maxb = (int64_t)distro__get_u64(b + 16);
  b += 24;
  if ((int)P != s->opt.fragments || (int)codec != (int)s->opt.codec || (int)block != s->opt.codec_block ||
      (int)fr != (int)s->opt.fragmenting || maxb != s->opt.max_block)
    DISTRO_FAIL(DISTRO_ERR_SHAPE,
                "checkpoint '%s' was written with fragments %u, codec %u, block %u, fragmenting %u, max_block %lld; "
                "the options differ",
                s->opt.checkpoint, (unsigned)P, (unsigned)codec, (unsigned)block, (unsigned)fr, (long long)maxb);
  const uint32_t nt = distro__get_u32(b);
  const uint64_t sig = distro__get_u64(b + 4);
  b += 12;
  if (nt < 1 || nt > DISTRO__SY_MAX_TENSORS || (size_t)(sz - (b - buf)) / 12 < nt)
    DISTRO_FAIL(DISTRO_ERR_IO, "checkpoint: bad tensor count %u", (unsigned)nt);
  if (s->opt.signature && sig != s->opt.signature)
    DISTRO_FAIL(DISTRO_ERR_SHAPE, "checkpoint '%s' holds model %016llx, the syncer was given %016llx",
                s->opt.checkpoint, (unsigned long long)sig, (unsigned long long)s->opt.signature);
  numel = malloc(sizeof *numel * nt);
  flags = malloc(sizeof *flags * nt);
  if (!numel || !flags) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  int64_t total = 0;
  for (uint32_t i = 0; i < nt; i++) {
    numel[i] = (int64_t)distro__get_u64(b);
    flags[i] = distro__get_u32(b + 8);
    if (numel[i] < 1 || numel[i] > s->opt.max_params - total || (flags[i] & ~DISTRO_DILOCO_PLAIN_MERGE))
      DISTRO_FAIL(DISTRO_ERR_IO, "checkpoint: bad tensor size or flags (or more than max_params parameters)");
    total += numel[i];
    b += 12;
  }
  if (distro__sy_layout_build(&s->L, (int)nt, numel, flags, sig, (int)P, (distro_fragmenting)fr, maxb,
                              (distro_outer_codec)codec, (int)block) != DISTRO_OK)
    DISTRO_FAIL(DISTRO_ERR_IO, "checkpoint '%s': %s", s->opt.checkpoint, distro_last_error());
  if ((size_t)sz != ck_size(&s->L)) {
    const size_t want = ck_size(&s->L);
    distro__sy_layout_destroy(&s->L);
    DISTRO_FAIL(DISTRO_ERR_IO, "checkpoint '%s' has %ld bytes, its layout needs %zu", s->opt.checkpoint, sz, want);
  }
  DISTRO_CHECK(distro__syncer_alloc_state(s));
  for (uint32_t p = 0; p < P; p++) {
    s->frag[p].version = distro__get_u64(b);
    s->frag[p].round = distro__get_u64(b + 8);
    b += 16;
  }
  for (uint32_t p = 0; p < P; p++) {
    const size_t k = 4 * (size_t)s->L.frags.numel[p];
    memcpy(s->frag[p].global, b, k), b += k;
    memcpy(s->frag[p].mom, b, k), b += k;
  }
  s->epoch = epoch;
  s->merges = merges;
  s->have_layout = 1;
  s->initialized = 1;
  s->provisional = 0;
  *found = 1;
fail:
  free(numel);
  free(flags);
  free(buf);
  if (f) fclose(f);
  return st;
}
