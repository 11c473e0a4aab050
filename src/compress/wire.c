/* Payload wire format v1: its fixed layout, encode, validate, decode
 * helpers. The framing both versions share is in frame.c. */
#include "compress/wire.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "compress/value_codec.h"

size_t distro__wire_value_bytes(distro_values v, int64_t count) {
  /* v1 carries f32, bf16 (plain words) and 1-bit values, no chunk scales. */
  if (v != DISTRO_VALUES_F32 && v != DISTRO_VALUES_BF16 && v != DISTRO_VALUES_SIGN1) return 0;
  return distro__val_bound(v, 1, count);
}

float distro__wire_value(const uint8_t *sec, distro_values v, int64_t j) {
  switch (v) {
    case DISTRO_VALUES_F32: {
      float x;
      memcpy(&x, sec + 4 * j, 4);
      return x;
    }
    case DISTRO_VALUES_BF16: return distro__bf16_to_float(distro__get_u16(sec + 2 * j));
    case DISTRO_VALUES_SIGN1: return (sec[j >> 3] >> (j & 7)) & 1 ? -1.0f : 1.0f;
    case DISTRO_VALUES_INT8:
    case DISTRO_VALUES_INT4:
    case DISTRO_VALUES_INT2: break; /* wire v2 only */
  }
  return 0.0f;
}

distro_status distro__wire_layout_init(distro__wire_layout *l, const distro__tiling *t, int n, distro_values v) {
  memset(l, 0, sizeof *l);
  if (v != DISTRO_VALUES_F32 && v != DISTRO_VALUES_BF16 && v != DISTRO_VALUES_SIGN1)
    return distro__fail(DISTRO_ERR_INVALID, "values codec %d is not available in wire version 1", (int)v);
  l->ntensors = n;
  l->values = v;
  l->idx_off = malloc(sizeof(size_t) * (size_t)(n ? n : 1));
  l->val_off = malloc(sizeof(size_t) * (size_t)(n ? n : 1));
  l->idx_width = malloc(sizeof(int) * (size_t)(n ? n : 1));
  if (!l->idx_off || !l->val_off || !l->idx_width) {
    distro__wire_layout_destroy(l);
    return distro__fail(DISTRO_ERR_NOMEM, "payload layout allocation failed");
  }
  size_t off = DISTRO__WIRE_HEADER + (size_t)n * DISTRO__WIRE_DESC;
  for (int i = 0; i < n; i++) {
    int64_t count = t[i].nchunks * t[i].k;
    l->idx_width[i] = distro__wire_index_width(t[i].chunk_elems);
    l->idx_off[i] = off;
    off += (size_t)count * (size_t)l->idx_width[i];
    l->val_off[i] = off;
    off += distro__wire_value_bytes(v, count);
  }
  l->total = off + 4;
  return DISTRO_OK;
}

void distro__wire_layout_destroy(distro__wire_layout *l) {
  if (!l) return;
  free(l->idx_off);
  free(l->val_off);
  free(l->idx_width);
  memset(l, 0, sizeof *l);
}

void distro__wire_write_header(uint8_t *buf, const distro__wire_layout *l, const distro__tiling *t, uint32_t flags,
                               uint32_t sender, uint64_t step, uint32_t abort_status, uint32_t abort_tensor) {
  distro__wire_put_header(buf, DISTRO__WIRE_VERSION, l->values, flags, l->ntensors, sender, step, l->total,
                          abort_status, abort_tensor);
  for (int i = 0; i < l->ntensors; i++) {
    uint8_t *d = buf + DISTRO__WIRE_HEADER + (size_t)i * DISTRO__WIRE_DESC;
    distro__put_u32(d + 0, (uint32_t)t[i].h);
    distro__put_u32(d + 4, (uint32_t)t[i].w);
    distro__put_u32(d + 8, (uint32_t)t[i].k);
    distro__put_u32(d + 12, (uint32_t)l->idx_width[i]);
    distro__put_u64(d + 16, (uint64_t)t[i].nchunks);
  }
}

void distro__wire_write_tensor(uint8_t *buf, const distro__wire_layout *l, const distro__tiling *t, int i,
                               const uint32_t *idx, const float *val) {
  const int64_t count = t[i].nchunks * t[i].k;
  uint8_t *is = buf + l->idx_off[i], *vs = buf + l->val_off[i];
  const int w = l->idx_width[i];
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < count; j++) {
    if (w == 1) is[j] = (uint8_t)idx[j];
    else if (w == 2) distro__put_u16(is + 2 * j, (uint16_t)idx[j]);
    else distro__put_u32(is + 4 * j, idx[j]);
  }
  switch (l->values) {
    case DISTRO_VALUES_F32: memcpy(vs, val, 4 * (size_t)count); break;
    case DISTRO_VALUES_BF16:
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < count; j++) distro__put_u16(vs + 2 * j, distro__bf16_from_float(val[j]));
      break;
    case DISTRO_VALUES_SIGN1: {
      const int64_t nbytes = (count + 7) / 8;
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < nbytes; b++) {
        uint8_t byte = 0;
        for (int64_t j = 8 * b; j < 8 * b + 8 && j < count; j++)
          if (signbit(val[j])) byte |= (uint8_t)(1u << (j & 7));
        vs[b] = byte;
      }
      break;
    }
    case DISTRO_VALUES_INT8:
    case DISTRO_VALUES_INT4:
    case DISTRO_VALUES_INT2: break; /* wire v2 only; rejected by the layout */
  }
}

void distro__wire_clear_body(uint8_t *buf, const distro__wire_layout *l) {
  size_t start = DISTRO__WIRE_HEADER + (size_t)l->ntensors * DISTRO__WIRE_DESC;
  memset(buf + start, 0, l->total - start);
}

void distro__wire_seal(uint8_t *buf, const distro__wire_layout *l) {
  distro__put_u32(buf + l->total - 4, distro__crc32c(buf, l->total - 4));
}

distro_status distro__wire_validate(const uint8_t *buf, size_t size, const distro__wire_layout *l,
                                    const distro__tiling *t, int peer, int *aborted, uint32_t *abort_status,
                                    uint32_t *abort_tensor) {
  *aborted = 0;
  if (size != l->total)
    return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: %zu bytes, expected %zu", peer, size, l->total);
  distro_status st = distro__wire_check_header(buf, size, DISTRO__WIRE_VERSION, l->values, l->ntensors, peer, aborted,
                                               abort_status, abort_tensor);
  if (st != DISTRO_OK || *aborted) return st;
  for (int i = 0; i < l->ntensors; i++) {
    const uint8_t *d = buf + DISTRO__WIRE_HEADER + (size_t)i * DISTRO__WIRE_DESC;
    if (distro__get_u32(d) != (uint32_t)t[i].h || distro__get_u32(d + 4) != (uint32_t)t[i].w || distro__get_u32(d + 8) != (uint32_t)t[i].k ||
        distro__get_u32(d + 12) != (uint32_t)l->idx_width[i] || distro__get_u64(d + 16) != (uint64_t)t[i].nchunks)
      return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: tensor %d descriptor disagrees", peer, i);
  }
  /* Indices strictly increasing within each chunk and in range; values
   * finite. Scanned in parallel; the message names the first offender. */
  for (int i = 0; i < l->ntensors; i++) {
    const uint8_t *is = buf + l->idx_off[i], *vs = buf + l->val_off[i];
    const int64_t k = t[i].k, n = t[i].chunk_elems, count = t[i].nchunks * k;
    const int width = l->idx_width[i];
    int64_t bad_chunk = INT64_MAX;
#pragma omp parallel for schedule(static) reduction(min : bad_chunk)
    for (int64_t c = 0; c < t[i].nchunks; c++) {
      int64_t prev = -1;
      for (int64_t j = c * k; j < (c + 1) * k; j++) {
        int64_t ix = distro__wire_index(is, width, j);
        if (ix <= prev || ix >= n) {
          if (c < bad_chunk) bad_chunk = c;
          break;
        }
        prev = ix;
      }
    }
    if (bad_chunk != INT64_MAX) {
      int64_t prev = -1, ix = 0;
      for (int64_t j = bad_chunk * k; j < (bad_chunk + 1) * k; j++) {
        ix = distro__wire_index(is, width, j);
        if (ix <= prev || ix >= n) break;
        prev = ix;
      }
      return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: tensor %d chunk %lld: index %lld out of range or order",
                          peer, i, (long long)bad_chunk, (long long)ix);
    }
    if (l->values != DISTRO_VALUES_SIGN1) {
      int nonfinite = 0;
#pragma omp parallel for schedule(static) reduction(| : nonfinite)
      for (int64_t j = 0; j < count; j++) nonfinite |= !isfinite(distro__wire_value(vs, l->values, j));
      if (nonfinite)
        return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: tensor %d: non-finite value", peer, i);
    } else if (count % 8 && (vs[count / 8] >> (count % 8))) {
      /* Padding bits past the last value must be zero (one encoding). */
      return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: tensor %d: nonzero padding bits", peer, i);
    }
  }
  return DISTRO_OK;
}
