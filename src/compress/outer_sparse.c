/* Sparse DiLoCo outer payloads; layout in outer_sparse.h. Sections are
 * planned, encoded and decoded independently, so the bytes and the decoded
 * selection do not depend on the OpenMP thread count. */
#include "compress/outer_sparse.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "compress/codec_fault.h"
#include "compress/value_codec.h"
#include "compress/wire.h"

int64_t distro__sparse_k(int64_t n, double density) {
  const double k = floor(density * (double)n + 0.5);
  return k < 1 ? 1 : k > (double)n ? n : (int64_t)k;
}

int distro__sparse_views(int ndim, const int64_t *shape, int64_t offset, int64_t count, int edge, double density,
                         distro__tiling out[2], int *matrix) {
  *matrix = 0;
  if (ndim < 1 || !shape || offset < 0 || count < 1 || edge < 1 || edge > DISTRO__SPARSE_MAX_EDGE) return -1;
  const int64_t cols = shape[ndim - 1];
  int n = 0;
  if (ndim >= 2 && cols > 0 && offset % cols == 0 && count % cols == 0) {
    const int64_t sh[2] = {count / cols, cols};
    if (distro__tiling_init(&out[n++], 2, sh, edge, 1) != DISTRO_OK) return -1;
    *matrix = 1;
  } else {
    /* Runs of edge^2 elements: the chunk rule gives exactly that width for
     * any multiple of it, and the remainder (< edge^2) is its own chunk. */
    const int64_t run = (int64_t)edge * edge, full = count / run * run;
    const int64_t sh[2] = {full, count - full};
    for (int i = 0; i < 2; i++)
      if (sh[i] > 0 && distro__tiling_init(&out[n++], 1, &sh[i], run, 1) != DISTRO_OK) return -1;
  }
  for (int i = 0; i < n; i++) out[i].k = distro__sparse_k(out[i].chunk_elems, density);
  return n;
}

int64_t distro__sparse_layout(distro__sparse_section *s, int n) {
  int64_t sel = 0;
  for (int i = 0; i < n; i++) {
    s[i].sel = sel;
    sel += s[i].t.nchunks * s[i].t.k;
  }
  return sel;
}

static uint64_t index_bound(const distro__tiling *t) {
  return (uint64_t)(t->nchunks * t->k) * (uint64_t)distro__wire_index_width(t->chunk_elems);
}

uint64_t distro__sparse_bound(const distro__sparse_section *s, int n, distro_values v) {
  uint64_t total = DISTRO__SPARSE_HEADER + (uint64_t)n * DISTRO__SPARSE_DESC + 4;
  for (int i = 0; i < n; i++) total += index_bound(&s[i].t) + distro__val_bound(v, s[i].t.nchunks, s[i].t.k);
  return total;
}

static void put_head(uint8_t *buf, const distro__sparse_head *h, uint64_t total) {
  distro__dlc_put_header(buf, &h->dlc);
  uint32_t dbits;
  memcpy(&dbits, &h->density, 4);
  distro__put_u64(buf + 56, total);
  distro__put_u32(buf + 64, dbits);
  distro__put_u32(buf + 68, 0);
}

size_t distro__sparse_encode(uint8_t *buf, size_t cap, const distro__sparse_section *s, int n,
                             const distro__sparse_head *h, const uint32_t *idx, const float *val) {
  const distro_values v = (distro_values)h->dlc.codec;
  const size_t head = DISTRO__SPARSE_HEADER + (size_t)n * DISTRO__SPARSE_DESC;
  if (cap < head + 4) return 0;
  memset(buf + DISTRO__SPARSE_HEADER, 0, (size_t)n * DISTRO__SPARSE_DESC);
  if (h->dlc.flags & DISTRO__DLC_FLAG_ABORT) {
    put_head(buf, h, head + 4);
    distro__put_u32(buf + head, distro__crc32c(buf, head));
    return head + 4;
  }
  size_t *ib = malloc(sizeof(size_t) * 2 * (size_t)(n ? n : 1)), *vb = ib ? ib + n : NULL;
  int *codes = malloc(sizeof(int) * 3 * (size_t)(n ? n : 1));
  size_t total = 0;
  if (!ib || !codes) goto done;
  /* Plan every section (sizes decide the offsets), then encode in place. */
#pragma omp parallel for schedule(dynamic, 1)
  for (int i = 0; i < n; i++) {
    const distro__tiling *t = &s[i].t;
    distro__idx_codec ic;
    ib[i] = distro__idx_choose(idx + s[i].sel, t->nchunks, t->k, t->chunk_elems, s[i].et, &ic, &codes[3 * i + 1]);
    codes[3 * i] = (int)ic;
    vb[i] = distro__val_plan(v, val + s[i].sel, t->nchunks, t->k, &codes[3 * i + 2]);
  }
  size_t off = head;
  for (int i = 0; i < n; i++) {
    if (ib[i] > UINT32_MAX || vb[i] > UINT32_MAX) goto done;
    off += ib[i] + vb[i];
  }
  if (off + 4 > cap) goto done;
  int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed)
  for (int i = 0; i < n; i++) {
    size_t at = head;
    for (int j = 0; j < i; j++) at += ib[j] + vb[j];
    const distro__tiling *t = &s[i].t;
    uint8_t *d = buf + DISTRO__SPARSE_HEADER + (size_t)i * DISTRO__SPARSE_DESC;
    d[0] = (uint8_t)codes[3 * i];
    d[1] = (uint8_t)codes[3 * i + 1];
    d[2] = (uint8_t)codes[3 * i + 2];
    distro__put_u32(d + 4, (uint32_t)ib[i]);
    distro__put_u32(d + 8, (uint32_t)vb[i]);
    const size_t a = distro__idx_encode(idx + s[i].sel, t->nchunks, t->k, t->chunk_elems, s[i].et,
                                        (distro__idx_codec)codes[3 * i], codes[3 * i + 1], buf + at, ib[i]);
    const size_t b = distro__val_encode(v, codes[3 * i + 2], val + s[i].sel, t->nchunks, t->k, buf + at + ib[i], vb[i]);
    failed |= (a != ib[i] && ib[i] > 0) || (b != vb[i] && vb[i] > 0);
  }
  if (failed) goto done;
  put_head(buf, h, off + 4);
  distro__put_u32(buf + off, distro__crc32c(buf, off));
  total = off + 4;
done:
  free(ib);
  free(codes);
  return total;
}

/* Byte offset of section i's body (the descriptors were checked). */
static size_t body_at(const uint8_t *buf, int n, int i) {
  size_t at = DISTRO__SPARSE_HEADER + (size_t)n * DISTRO__SPARSE_DESC;
  for (int j = 0; j < i; j++) {
    const uint8_t *d = buf + DISTRO__SPARSE_HEADER + (size_t)j * DISTRO__SPARSE_DESC;
    at += (size_t)distro__get_u32(d + 4) + distro__get_u32(d + 8);
  }
  return at;
}

static distro__codec_fault decode_section(const uint8_t *buf, int n, int i, const distro__sparse_section *sec,
                                          distro_values v, uint32_t *idx, float *val) {
  const uint8_t *d = buf + DISTRO__SPARSE_HEADER + (size_t)i * DISTRO__SPARSE_DESC;
  const distro__tiling *t = &sec->t;
  const size_t at = body_at(buf, n, i), ib = distro__get_u32(d + 4), vb = distro__get_u32(d + 8);
  /* Parameters an encoder never writes: only RICE and BF16 have one. */
  if (d[0] != DISTRO__IDX_RICE && d[1] != 0) return distro__codec_fault_at(DISTRO__CODEC_INDEX_SECTION, -1);
  if (v != DISTRO_VALUES_BF16 && d[2] != 0) return distro__codec_fault_at(DISTRO__CODEC_VALUES, -1);
  const distro__codec_fault f = distro__idx_decode(buf + at, ib, t->nchunks, t->k, t->chunk_elems, sec->et,
                                                   (distro__idx_codec)d[0], d[1], idx + sec->sel);
  if (f.kind != DISTRO__CODEC_OK) return f;
  return distro__val_decode(v, d[2], buf + at + ib, vb, t->nchunks, t->k, val + sec->sel);
}

distro_status distro__sparse_decode(const uint8_t *buf, size_t size, int slot, const distro__sparse_section *s, int n,
                                    const distro__sparse_head *want, distro__dlc_head *got, int *bad_section,
                                    uint32_t *idx, float *val) {
  const size_t head = DISTRO__SPARSE_HEADER + (size_t)n * DISTRO__SPARSE_DESC;
  const unsigned p = want->dlc.fragment;
  *bad_section = -1;
  if (size < head + 4)
    return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: learner %d's sparse payload for fragment %u has %zu bytes, too "
                        "short for %d sections", slot, p, size, n);
  distro_status st = distro__dlc_check_header(buf, size, slot, &want->dlc, got);
  if (st != DISTRO_OK) return st;
  if (distro__get_u64(buf + 56) != (uint64_t)size)
    return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: learner %d's sparse payload says %llu bytes but has %zu", slot,
                        (unsigned long long)distro__get_u64(buf + 56), size);
  uint32_t dbits;
  memcpy(&dbits, &want->density, 4);
  if (distro__get_u32(buf + 64) != dbits || distro__get_u32(buf + 68) != 0)
    return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: learner %d's sparse payload has another density", slot);
  uint64_t body = 0;
  for (int i = 0; i < n; i++) {
    const uint8_t *d = buf + DISTRO__SPARSE_HEADER + (size_t)i * DISTRO__SPARSE_DESC;
    if (d[0] > DISTRO__IDX_ENUM || d[3] != 0)
      return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: learner %d's sparse payload: section %d has a bad descriptor",
                          slot, i);
    body += (uint64_t)distro__get_u32(d + 4) + distro__get_u32(d + 8); /* n u32 pairs: no overflow */
  }
  if (body != size - head - 4)
    return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: learner %d's sparse sections do not fill its payload", slot);
  const distro_values v = (distro_values)want->dlc.codec;
  int first_bad = n;
#pragma omp parallel for schedule(dynamic, 1) reduction(min : first_bad)
  for (int i = 0; i < n; i++)
    if (decode_section(buf, n, i, &s[i], v, idx, val).kind != DISTRO__CODEC_OK && i < first_bad) first_bad = i;
  if (first_bad == n) return DISTRO_OK;
  /* Again, serially, to describe the first fault. */
  *bad_section = first_bad;
  char what[96];
  const distro__codec_fault f = decode_section(buf, n, first_bad, &s[first_bad], v, idx, val);
  return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: learner %d's sparse payload: section %d: %s", slot, first_bad,
                      distro__codec_fault_text(f, what, sizeof what));
}
