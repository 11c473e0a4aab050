/* Internal: the framing both payload wire versions share
 * (docs/wire-format.md): the 40-byte header (magic, version, values codec,
 * flags, tensor count, sender, step, total size, abort status and tensor),
 * the CRC32C trailer, and the helpers the codecs of both use (bf16, index
 * width). wire.h is version 1's layout, wire2.h version 2's. */
#ifndef DISTRO_COMPRESS_FRAME_H
#define DISTRO_COMPRESS_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <distro/optim.h>

#define DISTRO__WIRE_MAGIC 0x4f525444u /* "DTRO" */
#define DISTRO__WIRE_HEADER 40
#define DISTRO__WIRE_FLAG_ABORT 1u  /* sender could not step; no data */

/* Bytes of one index: 1, 2 or 4 for chunks of up to 256, 65536 or more elements. */
int distro__wire_index_width(int64_t chunk_elems);

/* The 40-byte header both wire versions share (docs/wire-format.md). */
void distro__wire_put_header(uint8_t *buf, unsigned version, distro_values v, uint32_t flags, int ntensors,
                             uint32_t sender, uint64_t step, uint64_t total, uint32_t abort_status,
                             uint32_t abort_tensor);

/* The checks wire v1 and v2 share, in order: magic, version, CRC32C over
 * all but the trailer, values codec, tensor count and total size (= size),
 * flags, abort fields. An abort payload sets *aborted and its fields. The
 * caller has checked that size covers the header and trailer. */
distro_status distro__wire_check_header(const uint8_t *buf, size_t size, unsigned version, distro_values v, int ntensors,
                                        int peer, int *aborted, uint32_t *abort_status, uint32_t *abort_tensor);

/* Sender rank and step stamped in the header. */
void distro__wire_read_origin(const uint8_t *buf, uint32_t *sender, uint64_t *step);

/* float <-> bf16 bits, round to nearest even; a finite value saturates at
 * the largest finite bf16 instead of rounding to Inf. */
uint16_t distro__bf16_from_float(float x);
float distro__bf16_to_float(uint16_t b);

#endif
