/* Fragment layout shared by the syncer and the learners: the same balanced
 * (or strided, sequential) fragments as the DiLoCo mode, built from the
 * tensor sizes and the syncer's settings, and the encoded report layout. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sha256.h"
#include "compress/outer_codec.h"
#include "sync/sync_internal.h"

void distro__sy_layout_destroy(distro__sy_layout *L) {
  if (!L) return;
  free(L->numel);
  free(L->tflags);
  free(L->toff);
  free(L->piece_elem);
  free(L->piece_byte);
  free(L->frag_bytes);
  free(L->frag_off);
  distro__fragments_destroy(&L->frags);
  memset(L, 0, sizeof *L);
}

distro_status distro__sy_layout_build(distro__sy_layout *L, int nt, const int64_t *numel, const unsigned *flags,
                                      uint64_t signature, int P, distro_fragmenting fr, int64_t max_block,
                                      distro_outer_codec codec, int block) {
  distro_status st = DISTRO_OK;
  memset(L, 0, sizeof *L);
  if (nt < 1 || nt > DISTRO__SY_MAX_TENSORS)
    return distro__fail(DISTRO_ERR_INVALID, "%d tensors (1..%d)", nt, DISTRO__SY_MAX_TENSORS);
  if (P < 1 || P > DISTRO__SY_MAX_FRAGMENTS)
    return distro__fail(DISTRO_ERR_INVALID, "fragments %d not in [1, %d]", P, DISTRO__SY_MAX_FRAGMENTS);
  if (!distro__outer_codec_known(codec) || block < 1 || block > DISTRO__SY_MAX_BLOCK)
    return distro__fail(DISTRO_ERR_INVALID, "unknown codec %d or block %d", (int)codec, block);
  if ((int)fr < 0 || (int)fr > DISTRO_FRAG_SEQUENTIAL)
    return distro__fail(DISTRO_ERR_INVALID, "unknown fragmenting %d", (int)fr);
  /* Sizes come from peers: bound them before any sum or product. */
  int64_t total = 0;
  for (int i = 0; i < nt; i++) {
    if (numel[i] < 1 || numel[i] > DISTRO__SY_MAX_NUMEL - total)
      return distro__fail(DISTRO_ERR_INVALID, "tensor %d of %lld elements: a job holds 1..%lld parameters", i,
                          (long long)numel[i], (long long)DISTRO__SY_MAX_NUMEL);
    total += numel[i];
  }
  /* A block larger than every tensor cuts nothing, so clamping changes no layout. */
  if (max_block > DISTRO__SY_MAX_NUMEL) max_block = DISTRO__SY_MAX_NUMEL;
  if (fr != DISTRO_FRAG_STRIDED) {
    const int64_t B = max_block > 0 ? max_block : distro__fragments_auto_block(total, P);
    const int64_t units = distro__fragments_units(fr, nt, numel, NULL, B);
    if (units > DISTRO__SY_MAX_UNITS || units * P > ((int64_t)1 << 31))
      return distro__fail(DISTRO_ERR_INVALID, "%lld blocks of at most %lld elements in %d fragments: too many",
                          (long long)units, (long long)B, P);
  }
  L->nt = nt;
  L->P = P;
  L->codec = codec;
  L->block = block;
  L->signature = signature;
  L->numel = malloc(sizeof *L->numel * (size_t)nt);
  L->tflags = malloc(sizeof *L->tflags * (size_t)nt);
  L->toff = malloc(sizeof *L->toff * (size_t)nt);
  L->frag_bytes = calloc((size_t)P, sizeof *L->frag_bytes);
  L->frag_off = calloc((size_t)P + 1, sizeof *L->frag_off);
  if (!L->numel || !L->tflags || !L->toff || !L->frag_bytes || !L->frag_off)
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  for (int i = 0; i < nt; i++) {
    L->numel[i] = numel[i];
    L->tflags[i] = flags ? flags[i] : 0;
    L->toff[i] = L->total;
    L->total += numel[i];
  }
  DISTRO_CHECK(distro__fragments_build(&L->frags, fr, P, nt, numel, NULL, max_block));
  const distro__fragments *f = &L->frags;
  L->piece_elem = malloc(sizeof *L->piece_elem * (size_t)(f->npieces ? f->npieces : 1));
  L->piece_byte = malloc(sizeof *L->piece_byte * (size_t)(f->npieces ? f->npieces : 1));
  if (!L->piece_elem || !L->piece_byte) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  for (int p = 0; p < P; p++) {
    int64_t e = 0;
    size_t b = 0;
    for (int q = f->start[p]; q < f->start[p + 1]; q++) {
      L->piece_elem[q] = e;
      L->piece_byte[q] = b;
      e += f->pieces[q].count;
      b += distro__outer_bytes(codec, f->pieces[q].count, block);
    }
    L->frag_bytes[p] = b;
    L->frag_off[p + 1] = L->frag_off[p] + f->numel[p];
    if (f->numel[p] > L->maxf) L->maxf = f->numel[p];
    if (b > L->max_frag_bytes) L->max_frag_bytes = b;
  }
  return DISTRO_OK;
fail:
  distro__sy_layout_destroy(L);
  return st;
}

void distro__sy_gather(const distro__sy_layout *L, int p, float *const *params, float *dst) {
  const distro__fragments *f = &L->frags;
  for (int q = f->start[p]; q < f->start[p + 1]; q++)
    memcpy(dst + L->piece_elem[q], params[f->pieces[q].tensor] + f->pieces[q].offset,
           sizeof(float) * (size_t)f->pieces[q].count);
}

void distro__sy_scatter(const distro__sy_layout *L, int p, const float *src, float *const *params) {
  const distro__fragments *f = &L->frags;
  for (int q = f->start[p]; q < f->start[p + 1]; q++)
    memcpy(params[f->pieces[q].tensor] + f->pieces[q].offset, src + L->piece_elem[q],
           sizeof(float) * (size_t)f->pieces[q].count);
}

/* A tree of SHA-256 so that large fragments hash on every core: leaves of
 * 1 MiB, SHA-256(0x00 | leaf), and the root SHA-256(0x01 | u64 bytes |
 * leaf digests). The same bits whatever the thread count. */
#define LEAF ((size_t)1 << 20)

void distro__sy_hash(const float *x, int64_t n, uint8_t out[32]) {
  const size_t bytes = sizeof(float) * (size_t)n, leaves = (bytes + LEAF - 1) / LEAF;
  const uint8_t *b = (const uint8_t *)x;
  uint8_t *dig = malloc(32 * (leaves ? leaves : 1));
  distro__sha256_ctx root;
  distro__sha256_init(&root);
  const uint8_t one = 1, zero = 0;
  uint8_t len[8];
  distro__put_u64(len, bytes);
  distro__sha256_update(&root, &one, 1);
  distro__sha256_update(&root, len, 8);
  if (!dig) { /* no memory for the leaf list: the same tree, one leaf at a time */
    for (size_t i = 0; i < leaves; i++) {
      distro__sha256_ctx c;
      uint8_t d[32];
      distro__sha256_init(&c);
      distro__sha256_update(&c, &zero, 1);
      distro__sha256_update(&c, b + i * LEAF, i + 1 < leaves ? LEAF : bytes - i * LEAF);
      distro__sha256_final(&c, d);
      distro__sha256_update(&root, d, 32);
    }
    distro__sha256_final(&root, out);
    return;
  }
#pragma omp parallel for schedule(static) if (leaves > 1)
  for (int64_t i = 0; i < (int64_t)leaves; i++) {
    distro__sha256_ctx c;
    distro__sha256_init(&c);
    distro__sha256_update(&c, &zero, 1);
    distro__sha256_update(&c, b + (size_t)i * LEAF, (size_t)i + 1 < leaves ? LEAF : bytes - (size_t)i * LEAF);
    distro__sha256_final(&c, dig + 32 * (size_t)i);
  }
  distro__sha256_update(&root, dig, 32 * leaves);
  distro__sha256_final(&root, out);
  free(dig);
}
