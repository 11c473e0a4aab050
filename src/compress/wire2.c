/* Payload wire format v2: per-tensor choice of index codec, any value codec,
 * variable size. */
#include "compress/wire2.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "compress/codec_fault.h"
#include "compress/frame.h"
#include "compress/value_codec.h"

/* Header and descriptors. */
static size_t head_bytes(int n) {
  return DISTRO__WIRE_HEADER + (size_t)n * DISTRO__WIRE2_DESC;
}
static size_t desc_at(int i) { return DISTRO__WIRE_HEADER + (size_t)i * DISTRO__WIRE2_DESC; }

size_t distro__wire2_bound(const distro__wire2_tensor *ts, int n, distro_values v) {
  size_t total = head_bytes(n) + 4;
  for (int i = 0; i < n; i++) {
    const distro__tiling *t = &ts[i].t;
    /* The chooser never picks more than the fixed-width layout. */
    total += (size_t)(t->nchunks * t->k) * (size_t)distro__wire_index_width(t->chunk_elems);
    total += distro__val_bound(v, t->nchunks, t->k);
  }
  return total;
}

static void write_desc(uint8_t *d, const distro__tiling *t, int icodec, int iparam, int vparam, uint64_t ibytes,
                       uint64_t vbytes) {
  memset(d, 0, DISTRO__WIRE2_DESC);
  distro__put_u32(d, (uint32_t)t->h);
  distro__put_u32(d + 4, (uint32_t)t->w);
  distro__put_u32(d + 8, (uint32_t)t->k);
  d[12] = (uint8_t)icodec;
  d[13] = (uint8_t)iparam;
  d[14] = (uint8_t)vparam;
  distro__put_u64(d + 16, (uint64_t)t->nchunks);
  distro__put_u64(d + 24, ibytes);
  distro__put_u64(d + 32, vbytes);
}

size_t distro__wire2_encode(uint8_t *buf, size_t cap, const distro__wire2_tensor *ts, int n, distro_values v,
                            uint32_t sender, uint64_t step, uint32_t *const *idx, float *const *val) {
  size_t *ibytes = malloc(sizeof(size_t) * 2 * (size_t)(n ? n : 1)), *vbytes = ibytes + n;
  int *codes = malloc(sizeof(int) * 3 * (size_t)(n ? n : 1));
  size_t total = 0;
  if (!ibytes || !codes) goto done;
  if (cap < head_bytes(n) + 4) goto done;
  /* Plan every tensor (sizes decide the offsets), then encode in place. */
#pragma omp parallel for schedule(dynamic, 1)
  for (int i = 0; i < n; i++) {
    const distro__tiling *t = &ts[i].t;
    distro__idx_codec ic;
    ibytes[i] = distro__idx_choose(idx[i], t->nchunks, t->k, t->chunk_elems, ts[i].et, &ic, &codes[3 * i + 1]);
    codes[3 * i] = (int)ic;
    vbytes[i] = distro__val_plan(v, val[i], t->nchunks, t->k, &codes[3 * i + 2]);
  }
  size_t off = head_bytes(n);
  for (int i = 0; i < n; i++) off += ibytes[i] + vbytes[i];
  if (off + 4 > cap) goto done;
  int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed)
  for (int i = 0; i < n; i++) {
    size_t at = head_bytes(n);
    for (int j = 0; j < i; j++) at += ibytes[j] + vbytes[j];
    const distro__tiling *t = &ts[i].t;
    write_desc(buf + desc_at(i), t, codes[3 * i], codes[3 * i + 1],
               codes[3 * i + 2], ibytes[i], vbytes[i]);
    size_t a = distro__idx_encode(idx[i], t->nchunks, t->k, t->chunk_elems, ts[i].et,
                                  (distro__idx_codec)codes[3 * i], codes[3 * i + 1], buf + at, ibytes[i]);
    size_t b = distro__val_encode(v, codes[3 * i + 2], val[i], t->nchunks, t->k, buf + at + ibytes[i], vbytes[i]);
    failed |= (a != ibytes[i] && ibytes[i] > 0) || (b != vbytes[i] && vbytes[i] > 0);
  }
  if (failed) goto done;
  distro__wire_put_header(buf, DISTRO__WIRE2_VERSION, v, 0, n, sender, step, off + 4, 0, 0);
  distro__put_u32(buf + off, distro__crc32c(buf, off));
  total = off + 4;
done:
  free(ibytes);
  free(codes);
  return total;
}

size_t distro__wire2_encode_abort(uint8_t *buf, const distro__wire2_tensor *ts, int n, distro_values v,
                                  uint32_t sender, uint64_t step, uint32_t status, uint32_t tensor) {
  const size_t off = head_bytes(n);
  distro__wire_put_header(buf, DISTRO__WIRE2_VERSION, v, DISTRO__WIRE_FLAG_ABORT, n, sender, step, off + 4, status,
                          tensor);
  for (int i = 0; i < n; i++) write_desc(buf + desc_at(i), &ts[i].t, 0, 0, 0, 0, 0);
  distro__put_u32(buf + off, distro__crc32c(buf, off));
  return off + 4;
}

distro_status distro__wire2_decode(const uint8_t *buf, size_t size, const distro__wire2_tensor *ts, int n,
                                   distro_values v, int peer, int *aborted, uint32_t *abort_status,
                                   uint32_t *abort_tensor, uint32_t *const *idx, float *const *val) {
  *aborted = 0;
  if (size < head_bytes(n) + 4)
    return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: %zu bytes, too short for %d tensors", peer, size, n);
  distro_status st =
      distro__wire_check_header(buf, size, DISTRO__WIRE2_VERSION, v, n, peer, aborted, abort_status, abort_tensor);
  if (st != DISTRO_OK || *aborted) return st;
  /* Descriptors: geometry must be ours; sections must tile the body exactly. */
  size_t off = head_bytes(n);
  for (int i = 0; i < n; i++) {
    const uint8_t *d = buf + desc_at(i);
    const distro__tiling *t = &ts[i].t;
    if (distro__get_u32(d) != (uint32_t)t->h || distro__get_u32(d + 4) != (uint32_t)t->w || distro__get_u32(d + 8) != (uint32_t)t->k ||
        distro__get_u64(d + 16) != (uint64_t)t->nchunks || d[15] != 0)
      return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: tensor %d descriptor disagrees", peer, i);
    uint64_t ib = distro__get_u64(d + 24), vb = distro__get_u64(d + 32);
    if (ib > size || vb > size || off + ib + vb > size - 4)
      return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: tensor %d sections overrun the payload", peer, i);
    off += ib + vb;
  }
  if (off != size - 4)
    return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: sections do not fill the payload", peer);
  /* Decode every tensor; report the first failure by tensor order, from
   * the faults its decoders returned (no second decode). */
  int first_bad = n;
  distro__codec_fault fault = DISTRO__CODEC_NO_FAULT;
#pragma omp parallel for schedule(dynamic, 1)
  for (int i = 0; i < n; i++) {
    size_t at = head_bytes(n);
    for (int j = 0; j < i; j++) {
      const uint8_t *dj = buf + desc_at(j);
      at += distro__get_u64(dj + 24) + distro__get_u64(dj + 32);
    }
    const uint8_t *d = buf + desc_at(i);
    const distro__tiling *t = &ts[i].t;
    const size_t ib = distro__get_u64(d + 24), vb = distro__get_u64(d + 32);
    distro__codec_fault f = distro__idx_decode(buf + at, ib, t->nchunks, t->k, t->chunk_elems, ts[i].et,
                                               (distro__idx_codec)d[12], d[13], idx[i]);
    if (f.kind == DISTRO__CODEC_OK) f = distro__val_decode(v, d[14], buf + at + ib, vb, t->nchunks, t->k, val[i]);
    if (f.kind != DISTRO__CODEC_OK) {
#pragma omp critical(distro_wire2_fault)
      if (i < first_bad) {
        first_bad = i;
        fault = f;
      }
    }
  }
  if (first_bad < n) {
    const uint8_t *d = buf + desc_at(first_bad);
    char what[96];
    return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: tensor %d: %s (index codec %u)", peer, first_bad,
                        distro__codec_fault_text(fault, what, sizeof what), d[12]);
  }
  return DISTRO_OK;
}
