/* A section decoder's fault in words (codec_fault.h). */
#include "compress/codec_fault.h"

#include <stdio.h>

const char *distro__codec_fault_text(distro__codec_fault f, char *buf, size_t n) {
  const char *what = f.kind == DISTRO__CODEC_OK            ? "no fault"
                     : f.kind == DISTRO__CODEC_INDEX_SECTION ? "malformed index section"
                     : f.kind == DISTRO__CODEC_INDEX_ORDER   ? "index out of range or order"
                                                             : "malformed or non-finite values";
  if (f.chunk >= 0) snprintf(buf, n, "chunk %lld: %s", (long long)f.chunk, what);
  else snprintf(buf, n, "%s", what);
  return buf;
}
