/* Internal: sparse DiLoCo outer payloads (SparseLoCo, docs/diloco.md).
 *
 * A fragment's outer gradient is cut into sections, each a rows x cols view
 * of a contiguous range of one tensor tiled into chunks (compress/chunk.h);
 * a section sends, per chunk, k sorted in-chunk indices and k values.
 * Payload, integers little-endian:
 *   the DLC header (outer_codec.h) with version 2, codec = the values codec
 *     (distro_values), block = the chunk edge, flag bit 1 = DCT
 *   56 u64 total bytes   64 u32 density (float bits)   68 u32 0
 *   72 per section a 12-byte descriptor: u8 index codec, u8 index
 *     parameter, u8 values parameter, u8 0, u32 index bytes, u32 value bytes
 *   per section: its index section (index_codec.h), then its value section
 *     (value_codec.h)
 *   u32 CRC32C of everything before
 * Sizes depend on the data (the encoder picks each section's smallest index
 * codec), so payloads travel with a variable-size all-gather. An abort
 * payload (flag bit 0) has empty sections. */
#ifndef DISTRO_COMPRESS_OUTER_SPARSE_H
#define DISTRO_COMPRESS_OUTER_SPARSE_H

#include <stddef.h>
#include <stdint.h>
#include <distro/optim.h>

#include "compress/chunk.h"
#include "compress/index_codec.h"
#include "compress/outer_codec.h"

#define DISTRO__SPARSE_VERSION 2
#define DISTRO__SPARSE_HEADER 72
#define DISTRO__SPARSE_DESC 12
#define DISTRO__DLC_FLAG_DCT 2u
#define DISTRO__SPARSE_MAX_EDGE 256 /* chunks of at most 65536 elements */

typedef struct distro__sparse_section {
  int64_t elem, count;          /* elements [elem, elem + count) of the fragment */
  int piece;                    /* the fragment piece they belong to */
  distro__tiling t;             /* rows x cols = count, chunks of h x w, k kept per chunk */
  int dct;                      /* the chunked DCT applies (2-D views) */
  const distro__enum_table *et; /* ENUM table of (h*w, k), or NULL */
  int64_t sel;                  /* first of its nchunks*k entries in the flat selection */
} distro__sparse_section;

/* Kept per chunk of n elements: round(density * n), clamped to [1, n]. */
int64_t distro__sparse_k(int64_t n, double density);

/* The views of elements [offset, offset + count) of a tensor of shape
 * (ndim, shape): whole rows of a tensor with >= 2 dims are one (count/cols,
 * cols) matrix tiled by the chunk rule with target `edge`; anything else is
 * 1-D: runs of edge^2 elements, then the remainder as one shorter chunk.
 * Writes 1 or 2 tilings with k set and *matrix (1 for the matrix view);
 * returns how many (-1: bad arguments). */
int distro__sparse_views(int ndim, const int64_t *shape, int64_t offset, int64_t count, int edge, double density,
                         distro__tiling out[2], int *matrix);

/* Sets each section's `sel`; returns the entries of the whole selection. */
int64_t distro__sparse_layout(distro__sparse_section *s, int n);

/* Largest payload the sections can produce with values codec v (the
 * chooser never picks more than fixed-width indices). */
uint64_t distro__sparse_bound(const distro__sparse_section *s, int n, distro_values v);

typedef struct distro__sparse_head {
  distro__dlc_head dlc; /* version DISTRO__SPARSE_VERSION, codec = values, block = edge */
  float density;
} distro__sparse_head;

/* Encodes the flat selection (idx, val: section i's entries from s[i].sel,
 * indices sorted within each chunk) into buf; returns the payload's size,
 * 0 if it does not fit in cap. With DISTRO__DLC_FLAG_ABORT the sections are
 * left empty and idx/val are not read. */
size_t distro__sparse_encode(uint8_t *buf, size_t cap, const distro__sparse_section *s, int n,
                             const distro__sparse_head *h, const uint32_t *idx, const float *val);

/* Validates the `size`-byte payload in slot `slot` against `want` (the
 * header checks of distro__dlc_check_header, then the total, the density,
 * the descriptors and every section) and decodes its selection into idx and
 * val. *got receives the header (tokens and steps are the sender's).
 * DISTRO_ERR_PAYLOAD names the learner, and *bad_section is the failing
 * section (-1 when the header or descriptors failed). */
distro_status distro__sparse_decode(const uint8_t *buf, size_t size, int slot, const distro__sparse_section *s, int n,
                                    const distro__sparse_head *want, distro__dlc_head *got, int *bad_section,
                                    uint32_t *idx, float *val);

#endif
