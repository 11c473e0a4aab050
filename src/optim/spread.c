/* The aggregate's spread (step_rule.h): how many distinct coefficients the
 * live ranks' selections hold together, per coefficient one rank selects.
 * Counted over an evenly spaced sample of the tiles from the decoded
 * selections, which every rank holds alike; the counts are integers, so
 * every rank, thread count and device (the CUDA step calls this on its host
 * optimizer) gets the same value. */
#include "comm/comm_internal.h"
#include "optim/optim_internal.h"

/* Enough tiles for the ratio to settle, few enough that counting them costs
 * little next to the apply at any model size. */
#define SPREAD_TILES 4096

double distro__aggregate_spread(distro_optim *o) {
  const int world = o->comm->size;
  uint64_t *bits = o->spread_bits; /* all clear on entry and on return */
  int64_t ntiles = 0, distinct = 0, picks = 0;
  for (int i = 0; i < o->nparams; i++) ntiles += o->tilings[i].nchunks;
  const int64_t stride = ntiles > SPREAD_TILES ? (ntiles + SPREAD_TILES - 1) / SPREAD_TILES : 1;
  int64_t g = 0; /* the global number of tensor i's first tile */
  for (int i = 0; i < o->nparams; g += o->tilings[i].nchunks, i++) {
    const distro__tiling *t = &o->tilings[i];
    const int64_t k = t->k;
    for (int64_t c = (stride - g % stride) % stride; c < t->nchunks; c += stride) {
      for (int r = 0; r < world; r++) {
        if (o->dropped[r]) continue;
        const uint32_t *ri = o->dec_idx + distro__sel_at(o, r, i, c);
        for (int64_t j = 0; j < k; j++) {
          const uint64_t b = 1ull << (ri[j] & 63u);
          if (!(bits[ri[j] >> 6] & b)) distinct++;
          bits[ri[j] >> 6] |= b;
        }
      }
      for (int r = 0; r < world; r++) {
        if (o->dropped[r]) continue;
        const uint32_t *ri = o->dec_idx + distro__sel_at(o, r, i, c);
        for (int64_t j = 0; j < k; j++) bits[ri[j] >> 6] = 0;
      }
      picks += k;
    }
  }
  return picks > 0 && distinct > 0 ? (double)distinct / (double)picks : 1.0;
}

/* The anchor of this model's growth: its selections keep sum k / sum h w
 * of its tiles' coefficients (the same on every rank and device). */
static double anchor(const distro_optim *o) {
  int64_t kept = 0, all = 0;
  for (int i = 0; i < o->nparams; i++) {
    kept += o->tilings[i].nchunks * o->tilings[i].k;
    all += o->tilings[i].nchunks * o->tilings[i].chunk_elems;
  }
  return all > 0 ? distro__spread_anchor((double)kept / (double)all) : DISTRO__SPREAD_CALIBRATED;
}

double distro__step_spread(distro_optim *o) {
  /* Only DisTrO-AdamW's step grows with the spread, and only above the
   * anchor, which no more ranks than it can exceed: the count would change
   * nothing there. */
  if (o->opt.update == DISTRO_UPDATE_SIGN || o->comm->size <= anchor(o)) return 1.0;
  return distro__aggregate_spread(o);
}

double distro__step_growth(const distro_optim *o) { return distro__adamw_spread_scale(o->spread, anchor(o)); }
