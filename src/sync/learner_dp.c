/* Data-parallel learners (distro_learner_options.comm): rank 0 talks to
 * the syncer; at the start and at every step it broadcasts over the
 * communicator what it joined with, applied and reported, and the other
 * ranks repeat it, so all ranks stay bit-identical (docs/protocol.md). */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/error.h"
#include "sync/learner_dp.h"
#include "sync/learner_state.h"

/* Rank 0's `bytes` at buf reach every rank's buf, in chunks of
 * DISTRO__LN_BCAST_SLOT through the communicator's variable all-gather (the
 * other ranks send nothing). */
distro_status distro__ln_dp_bcast(distro_learner *l, void *buf, size_t bytes) {
  size_t sizes[256];
  for (size_t off = 0; off < bytes; off += DISTRO__LN_BCAST_SLOT) {
    const size_t n = bytes - off < DISTRO__LN_BCAST_SLOT ? bytes - off : DISTRO__LN_BCAST_SLOT;
    uint8_t *b = (uint8_t *)buf + off;
    distro_status st = l->comm->ops->allgatherv(l->comm, b, l->rank == 0 ? n : 0, l->bc_tmp, DISTRO__LN_BCAST_SLOT, sizes);
    if (st != DISTRO_OK) return st;
    if (sizes[0] != n)
      return distro__fail(DISTRO_ERR_COMM, "learner %d rank %d: broadcast of %zu bytes got %zu", l->opt.learner_id,
                          l->rank, n, sizes[0]);
    if (l->rank != 0) memcpy(b, l->bc_tmp, n);
  }
  return DISTRO_OK;
}

/* Control words a data-parallel step broadcasts: applied count, requested
 * count, (fragment, version, keep-local) per apply, fragment per request,
 * then rank 0's stats. */
static size_t ctl_words(int P) { return 2 + 4 * (size_t)P + (sizeof(distro_learner_stats) + 7) / 8; }

static distro_status dp_alloc(distro_learner *l) {
  l->ctl_words = ctl_words(l->L.P);
  l->ctl = calloc(l->ctl_words, 8);
  l->stage = calloc((size_t)l->L.total, sizeof(float));
  if (!l->ctl || !l->stage) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  return DISTRO_OK;
}

/* After rank 0 joined (ok) or failed: every rank gets the layout settings,
 * the versions and the parameters. */
distro_status distro__ln_dp_start(distro_learner *l, int ok) {
  distro_status st;
  uint64_t h[9] = {0};
  if (l->rank == 0 && ok)
    h[0] = 1, h[1] = (uint64_t)l->L.P, h[2] = (uint64_t)l->fr, h[3] = (uint64_t)l->maxb, h[4] = (uint64_t)l->L.codec,
    h[5] = (uint64_t)l->L.block, h[6] = (uint64_t)l->tau, h[7] = (uint64_t)l->join_source,
    h[8] = (uint64_t)l->L.total;
  if ((st = distro__ln_dp_bcast(l, h, sizeof h)) != DISTRO_OK) return st;
  if (!h[0]) {
    if (l->rank == 0) return DISTRO_OK; /* its own error stands */
    return distro__fail(DISTRO_ERR_COMM, "learner %d rank %d: rank 0 could not join the syncer", l->opt.learner_id,
                        l->rank);
  }
  if (l->rank != 0) {
    int64_t *numel = malloc(sizeof *numel * (size_t)l->nt);
    unsigned *flags = malloc(sizeof *flags * (size_t)l->nt);
    st = DISTRO_ERR_NOMEM;
    if (numel && flags) {
      for (int i = 0; i < l->nt; i++) numel[i] = l->t[i].numel, flags[i] = l->t[i].flags;
      st = distro__sy_layout_build(&l->L, l->nt, numel, flags, l->signature, (int)h[1], (distro_fragmenting)h[2],
                                   (int64_t)h[3], (distro_outer_codec)h[4], (int)h[5]);
    }
    free(numel);
    free(flags);
    if (st != DISTRO_OK) return distro__fail(st, "learner %d rank %d: cannot lay out the model as rank 0 did",
                                             l->opt.learner_id, l->rank);
    if ((int64_t)h[8] != l->L.total)
      return distro__fail(DISTRO_ERR_SHAPE, "learner %d rank %d: %lld parameters, rank 0 has %lld", l->opt.learner_id,
                          l->rank, (long long)l->L.total, (long long)h[8]);
    if ((st = distro__ln_alloc_buffers(l)) != DISTRO_OK) return st;
    l->have_layout = 1;
    l->tau = (int)h[6];
    l->join_source = (int)h[7];
  }
  if ((st = dp_alloc(l)) != DISTRO_OK) return st;
  if ((st = distro__ln_dp_bcast(l, l->version, 8 * (size_t)l->L.P)) != DISTRO_OK) return st;
  if ((st = distro__ln_dp_bcast(l, l->base, sizeof(float) * (size_t)l->L.total)) != DISTRO_OK) return st;
  if (l->rank != 0) {
    for (int p = 0; p < l->L.P; p++) distro__sy_scatter(&l->L, p, l->base + l->L.frag_off[p], l->tp);
    memcpy(l->snap, l->base, sizeof(float) * (size_t)l->L.total);
    memset(&l->mirror, 0, sizeof l->mirror);
    l->mirror.reported = -1;
    l->mirror.goodput = 1;
    l->mirror.joined_from_peer = l->join_source;
    l->mirror.ranks = l->nranks;
    l->mirror.connected = 1;
  }
  return DISTRO_OK;
}

/* Ranks > 0: apply what rank 0 applied, snapshot what it reported. */
distro_status distro__ln_dp_follow(distro_learner *l, distro_learner_stats *out) {
  distro_status st;
  if ((st = distro__ln_dp_bcast(l, l->ctl, 8 * l->ctl_words)) != DISTRO_OK) return st;
  const int P = l->L.P, na = (int)l->ctl[0], nr = (int)l->ctl[1];
  if (na < 0 || na > P || nr < 0 || nr > P)
    return distro__fail(DISTRO_ERR_COMM, "learner %d rank %d: bad control block", l->opt.learner_id, l->rank);
  const uint64_t *ap = l->ctl + 2, *rq = l->ctl + 2 + 3 * (size_t)P;
  size_t packed = 0;
  for (int k = 0; k < na; k++) {
    if (ap[3 * k] >= (uint64_t)P)
      return distro__fail(DISTRO_ERR_COMM, "learner %d rank %d: bad control block", l->opt.learner_id, l->rank);
    packed += (size_t)l->L.frags.numel[ap[3 * k]];
  }
  if (packed && (st = distro__ln_dp_bcast(l, l->stage, sizeof(float) * packed)) != DISTRO_OK) return st;
  size_t off = 0;
  for (int k = 0; k < na; k++) {
    const int p = (int)ap[3 * k];
    const int64_t n = l->L.frags.numel[p], o = l->L.frag_off[p];
    const float *in = l->stage + off;
    float *th = l->scratch;
    distro__sy_gather(&l->L, p, l->tp, th);
    if (ap[3 * k + 2]) {
      const float *sn = l->snap + o;
      for (int64_t j = 0; j < n; j++) th[j] = in[j] + (th[j] - sn[j]);
    } else {
      memcpy(th, in, sizeof(float) * (size_t)n);
    }
    distro__sy_scatter(&l->L, p, th, l->tp);
    memcpy(l->base + o, in, sizeof(float) * (size_t)n);
    l->version[p] = ap[3 * k + 1];
    off += (size_t)n;
  }
  for (int k = 0; k < nr; k++) {
    const int p = (int)rq[k];
    if (p < 0 || p >= P)
      return distro__fail(DISTRO_ERR_COMM, "learner %d rank %d: bad control block", l->opt.learner_id, l->rank);
    distro__sy_gather(&l->L, p, l->tp, l->snap + l->L.frag_off[p]);
  }
  memcpy(&l->mirror, l->ctl + 2 + 4 * (size_t)P, sizeof l->mirror);
  l->tstep = l->mirror.step;
  l->reports = l->mirror.reports;
  l->applies = l->mirror.applies;
  l->tokens = l->mirror.tokens;
  if (out) *out = l->mirror;
  return DISTRO_OK;
}

