/* DiLoCo learner agreement: the option and tensor-list hashes, and the
 * collective check that a learner's ranks, then the learners of a column,
 * start from the same options, tensors, schedule position and global copy. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "common/fnv.h"
#include "optim/diloco_internal.h"
#include "optim/optim_internal.h"

static uint64_t options_hash(const distro_diloco *d) {
  const distro_diloco_options *o = &d->opt;
  int64_t f[18] = {o->H, o->fragments, o->overlap, o->nesterov, (int64_t)o->codec, o->codec_block, (int64_t)o->merge,
                   (int64_t)o->fragmenting, d->max_block, 0, 0, 0, (int64_t)o->compressor, 0, o->sparse_chunk,
                   o->sparse_dct, 0, (int64_t)o->sparse_values};
  uint32_t a, l, m, dn, b;
  memcpy(&a, &o->alpha, 4);
  memcpy(&l, &o->outer_lr, 4);
  memcpy(&m, &o->outer_momentum, 4);
  memcpy(&dn, &o->density, 4);
  memcpy(&b, &o->ef_beta, 4);
  f[9] = a;
  f[10] = l;
  f[11] = m;
  f[13] = dn;
  f[16] = b;
  return distro__fnv1a(DISTRO__FNV1A_INIT, f, sizeof f);
}

static uint64_t list_hash(const distro_diloco *d) {
  uint64_t h = DISTRO__FNV1A_INIT;
  for (int i = 0; i < d->nt; i++) {
    const distro__param *p = &d->inner->params[i];
    h = distro__fnv1a(h, p->name, strlen(p->name) + 1);
    h = distro__fnv1a(h, &p->ndim, sizeof p->ndim);
    h = distro__fnv1a(h, p->shape, sizeof(int64_t) * (size_t)p->ndim);
    h = distro__fnv1a(h, &d->layer[i], sizeof d->layer[i]);
    h = distro__fnv1a(h, &d->tflags[i], sizeof d->tflags[i]);
  }
  return h;
}

typedef struct {
  uint64_t status; /* DISTRO_OK, or why this rank cannot go on */
  uint64_t options, list, t;
  uint32_t global_crc, inner_size, inner_rank, pending;
} signature;

static uint32_t global_crc(const distro_diloco *d) {
  uint32_t c = 0;
  for (int p = 0; p < d->frags.nfrag; p++)
    c = distro__crc32c_update(c, d->global[p], sizeof(float) * (size_t)d->frags.numel[p]);
  return c;
}

/* Compares the gathered signatures; `outer` selects the learner checks. */
static distro_status compare(const signature *all, int n, int outer) {
  const char *who = outer ? "learner" : "rank", *group = outer ? "learners" : "ranks of this learner";
  for (int r = 0; r < n; r++)
    if (all[r].status != DISTRO_OK)
      return distro__fail((distro_status)all[r].status, "diloco: %s %d could not start the outer loop (%s)", who, r,
                          distro_status_string((distro_status)all[r].status));
  for (int r = 1; r < n; r++) {
    if (all[r].options != all[0].options)
      return distro__fail(DISTRO_ERR_SHAPE, "diloco: %s disagree: %s %d uses different DiLoCo options than %s 0", group,
                          who, r, who);
    if (all[r].list != all[0].list)
      return distro__fail(DISTRO_ERR_SHAPE,
                          "diloco: %s disagree: %s %d has a different tensor list (names, shapes, layers, flags)",
                          group, who, r);
    if (all[r].t != all[0].t || all[r].pending != all[0].pending)
      return distro__fail(DISTRO_ERR_SHAPE, "diloco: %s are at different points of the schedule (%s %d at step %llu, "
                          "%s 0 at %llu)", group, who, r, (unsigned long long)all[r].t, who,
                          (unsigned long long)all[0].t);
    if (all[r].global_crc != all[0].global_crc)
      return distro__fail(DISTRO_ERR_SHAPE,
                          "diloco: %s start from different global copies (%s %d differs from %s 0): initialize every "
                          "learner identically or load the same outer state", group, who, r, who);
    if (outer && (all[r].inner_size != all[0].inner_size || all[r].inner_rank != all[0].inner_rank))
      return distro__fail(DISTRO_ERR_SHAPE,
                          "diloco: learner %d is rank %u of %u inside its learner, learner 0 is rank %u of %u: the outer "
                          "comm must join rank r of every learner, and learners need the same number of ranks",
                          r, all[r].inner_rank, all[r].inner_size, all[0].inner_rank, all[0].inner_size);
  }
  return DISTRO_OK;
}

/* Collective over the inner comm (the learner's ranks agree), then over the
 * outer comm (the learners of this column agree). Every rank takes part in
 * both rounds whatever happened before, carrying its failure, so no rank is
 * left waiting and all return the same status. */
distro_status distro__diloco_verify(distro_diloco *d, distro_status local) {
  distro_comm *ic = d->inner->comm;
  const int R = ic->size, M = d->M;
  char why[512] = "";
  signature me;
  memset(&me, 0, sizeof me);
  me.status = (uint64_t)local;
  me.inner_size = (uint32_t)R;
  me.inner_rank = (uint32_t)ic->rank;
  if (local == DISTRO_OK) {
    me.options = options_hash(d);
    me.list = list_hash(d);
    me.t = (uint64_t)d->t;
    me.global_crc = global_crc(d);
    me.pending = d->pending.active ? (uint32_t)d->pending.frag + 1 : 0;
  }
  signature *all = malloc(sizeof *all * (size_t)(R > M ? R : M));
  if (!all) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  distro_status verdict = DISTRO_OK, st;
  if (R > 1) {
    st = distro_comm_allgather(ic, &me, sizeof me, all);
    if (st != DISTRO_OK) {
      free(all);
      return st;
    }
    verdict = compare(all, R, 0);
    if (verdict != DISTRO_OK) {
      snprintf(why, sizeof why, "%s", distro_last_error());
      me.status = (uint64_t)verdict;
    }
  }
  st = distro_comm_allgather(d->outer, &me, sizeof me, all);
  if (st != DISTRO_OK) {
    free(all);
    return st;
  }
  distro_status ov = compare(all, M, 1);
  free(all);
  if (verdict != DISTRO_OK) return distro__fail(verdict, "%s", why);
  if (ov != DISTRO_OK) return ov;
  d->verified = 1;
  return DISTRO_OK;
}
