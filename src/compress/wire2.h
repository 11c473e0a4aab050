/* Internal: payload wire format v2 (docs/wire-format.md).
 *
 *   header (40 bytes, as v1, version 2) | per-tensor descriptors (40 bytes
 *   each, with codec choices and section sizes) | per tensor: index
 *   section, value section | CRC32C
 *
 * Section sizes depend on the data, so payloads differ in size across ranks
 * and travel with a variable-size all-gather. */
#ifndef DISTRO_COMPRESS_WIRE2_H
#define DISTRO_COMPRESS_WIRE2_H

#include <stddef.h>
#include <stdint.h>
#include <distro/optim.h>

#include "compress/chunk.h"
#include "compress/index_codec.h"

#define DISTRO__WIRE2_VERSION 2
#define DISTRO__WIRE2_DESC 40

/* What the sender and every receiver know of one tensor. */
typedef struct distro__wire2_tensor {
  distro__tiling t;
  const distro__enum_table *et; /* NULL when ENUM does not apply */
} distro__wire2_tensor;

/* Largest payload the tensor list can produce with codec v. */
size_t distro__wire2_bound(const distro__wire2_tensor *ts, int n, distro_values v);

/* Encodes the selection (idx[i], val[i] for tensor i) into buf (cap >= the
 * bound); returns the payload's size, 0 if it did not fit. */
size_t distro__wire2_encode(uint8_t *buf, size_t cap, const distro__wire2_tensor *ts, int n, distro_values v,
                            uint32_t sender, uint64_t step, uint32_t *const *idx, float *const *val);

/* A payload that says "I cannot step" (status, tensor): header, descriptors
 * with empty sections, CRC. Returns its size. */
size_t distro__wire2_encode_abort(uint8_t *buf, const distro__wire2_tensor *ts, int n, distro_values v,
                                  uint32_t sender, uint64_t step, uint32_t status, uint32_t tensor);

/* Validates and decodes a payload from rank `peer` into idx[i] / val[i]
 * (nchunks*k entries per tensor). DISTRO_ERR_PAYLOAD names the peer and
 * the problem; an abort payload returns OK with *aborted set. */
distro_status distro__wire2_decode(const uint8_t *buf, size_t size, const distro__wire2_tensor *ts, int n,
                                   distro_values v, int peer, int *aborted, uint32_t *abort_status,
                                   uint32_t *abort_tensor, uint32_t *const *idx, float *const *val);

#endif
