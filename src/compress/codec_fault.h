/* Internal: what a section decoder (index_codec.h, value_codec.h) found
 * wrong with the bytes it was given: one kind and, where it is known, the
 * chunk. The payload decoders (wire2.c, outer_sparse.c) turn it into
 * DISTRO_ERR_PAYLOAD with a message naming the peer and the tensor or
 * section (distro__codec_fault_text). */
#ifndef DISTRO_COMPRESS_CODEC_FAULT_H
#define DISTRO_COMPRESS_CODEC_FAULT_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  DISTRO__CODEC_OK = 0,
  DISTRO__CODEC_INDEX_SECTION, /* index section: length, trailing bits, codec or parameter */
  DISTRO__CODEC_INDEX_ORDER,   /* a chunk's indices not strictly increasing or >= the chunk's size */
  DISTRO__CODEC_VALUES         /* value section: length, padding, parameter, or a value or scale
                                  that no encoder writes (non-finite included) */
} distro__codec_fault_kind;

typedef struct {
  distro__codec_fault_kind kind;
  int64_t chunk; /* the first bad chunk; -1: the section as a whole (or not known) */
} distro__codec_fault;

static inline distro__codec_fault distro__codec_fault_at(distro__codec_fault_kind kind, int64_t chunk) {
  distro__codec_fault f = {kind, chunk};
  return f;
}
#define DISTRO__CODEC_NO_FAULT distro__codec_fault_at(DISTRO__CODEC_OK, -1)

/* The fault in words, for a message that names where it is: "malformed
 * index section", "chunk 3: index out of range or order", "malformed or
 * non-finite values" (after "chunk 3: " when known). Returns buf. */
const char *distro__codec_fault_text(distro__codec_fault f, char *buf, size_t n);

#endif
