/* The payload formats of the DeMo step, one table entry per wire version.
 * distro__payload_prepare picks the entry once from options.wire_version;
 * the step only calls through it.
 *
 * v2 (the default) is what the step sends. v1 (fixed-size sections, f32 /
 * bf16 / 1-bit values) stays selectable: options.wire_version is public,
 * and a job whose ranks all set it still runs (the tensor-list agreement
 * refuses mixed versions). Both share the framing in compress/frame.h. */
#include <stdlib.h>

#include "comm/comm_internal.h"
#include "common/error.h"
#include "optim/optim_internal.h"

/* ---- v1: a fixed layout, the same size on every rank ---------------------- */

static distro_status v1_bound(const distro__tiling *t, int n, distro_values v, uint64_t *bytes) {
  distro__wire_layout l;
  distro_status st = distro__wire_layout_init(&l, t, n, v);
  if (st == DISTRO_OK) *bytes = l.total;
  distro__wire_layout_destroy(&l);
  return st;
}

static distro_status v1_prepare(distro_optim *o) {
  distro_status st = distro__wire_layout_init(&o->layout, o->tilings, o->nparams, o->opt.values);
  o->slot = o->layout.total;
  return st;
}

/* v1 has one layout for the whole tensor list: one bucket (options_check
 * refuses BACKWARD with it), so b is always 0. */
static size_t v1_encode(distro_optim *o, int b, uint32_t rank, uint64_t step) {
  (void)b;
  const distro__wire_layout *l = &o->layout;
  distro__wire_write_header(o->send, l, o->tilings, 0, rank, step, 0, 0);
  for (int i = 0; i < o->nparams; i++)
    distro__wire_write_tensor(o->send, l, o->tilings, i, o->params[i].idx, o->params[i].val);
  distro__wire_seal(o->send, l);
  return l->total;
}

static size_t v1_encode_abort(distro_optim *o, int b, uint32_t rank, uint64_t step, uint32_t status,
                              uint32_t tensor) {
  (void)b;
  const distro__wire_layout *l = &o->layout;
  distro__wire_write_header(o->send, l, o->tilings, DISTRO__WIRE_FLAG_ABORT, rank, step, status, tensor);
  distro__wire_clear_body(o->send, l);
  distro__wire_seal(o->send, l);
  return l->total;
}

static distro_status v1_gather(const distro_optim *o, distro_comm *comm, int b, size_t size, uint8_t *recv,
                               size_t *sizes) {
  (void)b;
  distro_status st = comm->ops->allgather(comm, o->send, size, recv);
  for (int r = 0; r < comm->size; r++) sizes[r] = size;
  return st;
}

static distro_status v1_decode(const distro_optim *o, int b, const uint8_t *buf, size_t size, int peer,
                               int *aborted, uint32_t *why, uint32_t *tensor, uint32_t *const *idx,
                               float *const *val) {
  (void)b;
  const distro__wire_layout *l = &o->layout;
  distro_status st = distro__wire_validate(buf, size, l, o->tilings, peer, aborted, why, tensor);
  if (st != DISTRO_OK || *aborted) return st;
  for (int i = 0; i < o->nparams; i++) {
    const int64_t count = o->tilings[i].nchunks * o->tilings[i].k;
    uint32_t *di = idx[i];
    float *dv = val[i];
    const uint8_t *is = buf + l->idx_off[i], *vs = buf + l->val_off[i];
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < count; j++) {
      di[j] = distro__wire_index(is, l->idx_width[i], j);
      dv[j] = distro__wire_value(vs, l->values, j);
    }
  }
  return DISTRO_OK;
}

/* ---- v2: per-tensor codec choice, sizes depend on the data ---------------- */

static distro_status v2_bound(const distro__tiling *t, int n, distro_values v, uint64_t *bytes) {
  distro__wire2_tensor *w2 = calloc((size_t)n, sizeof *w2);
  if (!w2) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  for (int i = 0; i < n; i++) w2[i].t = t[i];
  *bytes = distro__wire2_bound(w2, n, v);
  free(w2);
  return DISTRO_OK;
}

static distro_status v2_prepare(distro_optim *o) {
  const int n = o->nparams;
  o->w2 = calloc((size_t)n, sizeof *o->w2);
  o->etabs = calloc((size_t)n, sizeof *o->etabs);
  if (!o->w2 || !o->etabs) return distro__fail(DISTRO_ERR_NOMEM, "out of memory for wire v2 tables");
  for (int i = 0; i < n; i++) {
    const distro__tiling *t = &o->tilings[i];
    o->w2[i].t = *t;
    /* Tensors with the same chunk size and k share one ENUM table. */
    int e = 0;
    while (e < o->n_etabs && !(o->etabs[e].n == t->chunk_elems && o->etabs[e].k == t->k)) e++;
    if (e == o->n_etabs) {
      distro__enum_table_init(&o->etabs[e], t->chunk_elems, t->k); /* may not apply: then c == NULL */
      o->n_etabs++;
    }
    o->w2[i].et = o->etabs[e].c ? &o->etabs[e] : NULL;
  }
  o->slot = distro__wire2_bound(o->w2, n, o->opt.values);
  return DISTRO_OK;
}

/* v2 encodes bucket b's tensors at its place in the send buffer. */
static size_t v2_encode(distro_optim *o, int b, uint32_t rank, uint64_t step) {
  const distro__bucket *k = &o->buckets[b];
  for (int i = k->first; i < k->first + k->count; i++) {
    o->idx_ptrs[i] = o->params[i].idx;
    o->val_ptrs[i] = o->params[i].val;
  }
  return distro__wire2_encode(o->send + k->off, k->slot, o->w2 + k->first, k->count, o->opt.values, rank, step,
                              o->idx_ptrs + k->first, o->val_ptrs + k->first);
}

static size_t v2_encode_abort(distro_optim *o, int b, uint32_t rank, uint64_t step, uint32_t status,
                              uint32_t tensor) {
  const distro__bucket *k = &o->buckets[b];
  return distro__wire2_encode_abort(o->send + k->off, o->w2 + k->first, k->count, o->opt.values, rank, step, status,
                                    tensor);
}

static distro_status v2_gather(const distro_optim *o, distro_comm *comm, int b, size_t size, uint8_t *recv,
                               size_t *sizes) {
  const distro__bucket *k = &o->buckets[b];
  return comm->ops->allgatherv(comm, o->send + k->off, size, recv, k->slot, sizes);
}

static distro_status v2_decode(const distro_optim *o, int b, const uint8_t *buf, size_t size, int peer,
                               int *aborted, uint32_t *why, uint32_t *tensor, uint32_t *const *idx,
                               float *const *val) {
  const distro__bucket *k = &o->buckets[b];
  return distro__wire2_decode(buf, size, o->w2 + k->first, k->count, o->opt.values, peer, aborted, why, tensor,
                              idx + k->first, val + k->first);
}

static const distro__payload_format FORMATS[] = {
    {1, v1_bound, v1_prepare, v1_encode, v1_encode_abort, v1_gather, v1_decode},
    {2, v2_bound, v2_prepare, v2_encode, v2_encode_abort, v2_gather, v2_decode},
};

const distro__payload_format *distro__payload_format_of(int wire_version) {
  for (size_t i = 0; i < sizeof FORMATS / sizeof *FORMATS; i++)
    if (FORMATS[i].version == wire_version) return &FORMATS[i];
  return NULL;
}
