/* Option defaults and validation. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "common/error.h"
#include "optim/optim_internal.h"

distro_options distro_options_default(distro_algorithm alg) {
  distro_options o = {0};
  o.version = DISTRO_OPTIONS_VERSION;
  o.algorithm = alg;
  o.lr = 4e-4f;
  o.beta1 = 0.9f;
  o.beta2 = 0.95f;
  o.eps = 1e-8f;
  /* One set for every algorithm, so switching AdamW for DisTrO-AdamW (or
   * back) changes one field and nothing else. */
  o.weight_decay = 0.1f;
  o.compression_decay = 0.999f;
  /* Measured best for DisTrO-AdamW (docs/design.md); the DeMo reference's
   * chunk 64 with F32 values sends 1/4 the coefficients at 4x the bytes
   * each, and trained worse in every model we tried. */
  o.chunk = 32;
  o.topk = 32;
  o.update = DISTRO_UPDATE_SIGN;
  o.values = DISTRO_VALUES_INT8;
  o.wire_version = 2;
  o.drop_invalid_peers = 0;
  o.clip_median_multiple = 0.0f;
  o.threads = 0;
  o.overlap = 0;
  o.clip_norm = 0.0f;
  return o;
}

int distro__uses_adam(const distro_options *o) {
  return o->algorithm == DISTRO_ALG_ADAMW || o->update == DISTRO_UPDATE_ADAMW;
}

distro_status distro__options_take(const distro_options *in, distro_options *out) {
  if (in->version != 3 && in->version != DISTRO_OPTIONS_VERSION)
    return distro__fail(DISTRO_ERR_INVALID, "options.version is %d, expected 3 or %d (use distro_options_default)",
                        in->version, DISTRO_OPTIONS_VERSION);
  /* A version 3 struct ends before clip_norm: read no further than it. */
  distro_options o = distro_options_default(in->algorithm);
  memcpy(&o, in, in->version == 3 ? offsetof(distro_options, clip_norm) : sizeof o);
  o.version = DISTRO_OPTIONS_VERSION;
  const distro_status st = distro__options_check(&o);
  if (st == DISTRO_OK) *out = o;
  return st;
}

distro_status distro__options_check(const distro_options *o) {
  if (o->version != DISTRO_OPTIONS_VERSION)
    return distro__fail(DISTRO_ERR_INVALID, "options.version is %d, expected %d (use distro_options_default)",
                        o->version, DISTRO_OPTIONS_VERSION);
  if (!(isfinite(o->clip_norm) && o->clip_norm >= 0))
    return distro__fail(DISTRO_ERR_INVALID, "clip_norm must be finite and >= 0 (0: no clip; got %g)",
                        (double)o->clip_norm);
  if (o->algorithm != DISTRO_ALG_DEMO && o->algorithm != DISTRO_ALG_ADAMW)
    return distro__fail(DISTRO_ERR_INVALID, "unknown algorithm %d", (int)o->algorithm);
  if (o->update != DISTRO_UPDATE_SIGN && o->update != DISTRO_UPDATE_ADAMW)
    return distro__fail(DISTRO_ERR_INVALID, "unknown update rule %d", (int)o->update);
  if (o->values == DISTRO_VALUES_INT2)
    return distro__fail(DISTRO_ERR_INVALID, "values INT2 are for DiLoCo's sparse outer gradients "
                                            "(distro_diloco_options.sparse_values), not the DeMo step");
  if (o->values < DISTRO_VALUES_F32 || o->values > DISTRO_VALUES_INT4)
    return distro__fail(DISTRO_ERR_INVALID, "unknown values codec %d", (int)o->values);
  if (o->wire_version != 1 && o->wire_version != 2)
    return distro__fail(DISTRO_ERR_INVALID, "wire_version must be 1 or 2 (got %d)", o->wire_version);
  if (o->wire_version == 1 && o->values > DISTRO_VALUES_SIGN1)
    return distro__fail(DISTRO_ERR_INVALID, "INT8/INT4 values need wire_version 2");
  if (!(isfinite(o->clip_median_multiple) && o->clip_median_multiple >= 0))
    return distro__fail(DISTRO_ERR_INVALID, "clip_median_multiple must be finite and >= 0");
  if (!(isfinite(o->lr) && o->lr >= 0)) return distro__fail(DISTRO_ERR_INVALID, "lr must be finite and >= 0");
  if (o->overlap < DISTRO_OVERLAP_OFF || o->overlap > DISTRO_OVERLAP_BACKWARD)
    return distro__fail(DISTRO_ERR_INVALID,
                        "overlap must be DISTRO_OVERLAP_OFF (0), _LOOKAHEAD (1), _STALE (2) or _BACKWARD (3) (got %d)",
                        o->overlap);
  if (o->overlap && o->algorithm != DISTRO_ALG_DEMO)
    return distro__fail(DISTRO_ERR_UNSUPPORTED, "overlap is for the DeMo step; the AdamW all-reduce has none");
  if (o->overlap == DISTRO_OVERLAP_BACKWARD && o->wire_version == 1)
    return distro__fail(DISTRO_ERR_UNSUPPORTED,
                        "overlap = DISTRO_OVERLAP_BACKWARD sends the payload in parts, which wire version 1's fixed "
                        "layout cannot: use wire_version 2");
  if (o->threads < 0 || o->threads > 4096)
    return distro__fail(DISTRO_ERR_INVALID, "threads must be in [0, 4096] (0: the caller's; got %d)", o->threads);
  if (!(isfinite(o->weight_decay) && o->weight_decay >= 0))
    return distro__fail(DISTRO_ERR_INVALID, "weight_decay must be finite and >= 0");
  if (distro__uses_adam(o)) {
    if (!(o->beta1 >= 0 && o->beta1 < 1)) return distro__fail(DISTRO_ERR_INVALID, "beta1 must be in [0, 1)");
    if (!(o->beta2 >= 0 && o->beta2 < 1)) return distro__fail(DISTRO_ERR_INVALID, "beta2 must be in [0, 1)");
    if (!(isfinite(o->eps) && o->eps > 0)) return distro__fail(DISTRO_ERR_INVALID, "eps must be finite and > 0");
  }
  if (o->algorithm == DISTRO_ALG_DEMO) {
    if (!(o->compression_decay >= 0 && o->compression_decay < 1))
      return distro__fail(DISTRO_ERR_INVALID, "compression_decay must be in [0, 1) (got %g)",
                          (double)o->compression_decay);
    if (o->chunk <= 0) return distro__fail(DISTRO_ERR_INVALID, "chunk must be > 0 (got %d)", o->chunk);
    if (o->chunk > 4096) return distro__fail(DISTRO_ERR_INVALID, "chunk must be <= 4096 (got %d)", o->chunk);
    if (o->topk <= 0) return distro__fail(DISTRO_ERR_INVALID, "topk must be > 0 (got %d)", o->topk);
    if ((int64_t)o->topk > (int64_t)o->chunk * o->chunk)
      return distro__fail(DISTRO_ERR_INVALID, "topk %d exceeds the %d coefficients of a %dx%d chunk", o->topk,
                          o->chunk * o->chunk, o->chunk, o->chunk);
  }
  return DISTRO_OK;
}
