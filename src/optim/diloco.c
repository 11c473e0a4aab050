/* DiLoCo outer loop: schedule, exchange, merge, outer Nesterov step,
 * overlap and the progress thread (docs/diloco.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "compress/outer_codec.h"
#include "optim/diloco_internal.h"
#include "optim/optim_internal.h"
#include "optim/outer_merge.h"

#define PAR_MIN 32768

/* ---- options ---------------------------------------------------------------- */

distro_diloco_options distro_diloco_options_default(void) {
  distro_diloco_options o;
  memset(&o, 0, sizeof o);
  o.version = DISTRO_DILOCO_OPTIONS_VERSION;
  o.H = 500;
  o.fragments = 1;
  o.overlap = 0;
  o.alpha = 0.0f;
  o.outer_lr = 0.7f;
  o.outer_momentum = 0.9f;
  o.nesterov = 1;
  o.codec = DISTRO_OUTER_F32;
  o.codec_block = 64;
  o.merge = DISTRO_MERGE_MEAN;
  o.fragmenting = DISTRO_FRAG_BALANCED;
  o.max_block = 0;
  o.progress_thread = 0;
  o.compressor = DISTRO_OUTER_DENSE;
  o.density = 0.02f;
  o.sparse_chunk = 64;
  o.sparse_dct = 0;
  o.ef_beta = 0.95f;
  o.sparse_values = DISTRO_VALUES_INT2;
  return o;
}

distro_diloco_options distro_diloco_options_sparseloco(void) {
  distro_diloco_options o = distro_diloco_options_default();
  o.compressor = DISTRO_OUTER_SPARSE;
  o.outer_lr = 1.0f;
  o.outer_momentum = 0.0f;
  return o;
}

static int merge_known(int m) {
  return m == DISTRO_MERGE_MEAN || m == DISTRO_MERGE_TOKENS || m == DISTRO_MERGE_RADIAL ||
         m == DISTRO_MERGE_RADIAL_TOKENS;
}

static distro_status options_check(const distro_diloco_options *o) {
  if (o->version != DISTRO_DILOCO_OPTIONS_VERSION)
    return distro__fail(DISTRO_ERR_INVALID, "diloco options.version is %d, expected %d (use distro_diloco_options_default)",
                        o->version, DISTRO_DILOCO_OPTIONS_VERSION);
  if (o->H <= 0) return distro__fail(DISTRO_ERR_INVALID, "diloco: H must be >= 1 (got %d)", o->H);
  if (o->fragments < 1 || o->fragments > o->H)
    return distro__fail(DISTRO_ERR_INVALID, "diloco: fragments must be in [1, H=%d] (got %d)", o->H, o->fragments);
  if (o->overlap < 0 || (int64_t)o->overlap * o->fragments >= o->H)
    return distro__fail(DISTRO_ERR_INVALID, "diloco: overlap tau must satisfy 0 <= tau < H/P = %d/%d (got %d)", o->H,
                        o->fragments, o->overlap);
  if (!(o->alpha >= 0.0f && o->alpha <= 1.0f))
    return distro__fail(DISTRO_ERR_INVALID, "diloco: alpha must be in [0, 1] (got %g)", (double)o->alpha);
  if (!(isfinite(o->outer_lr) && o->outer_lr >= 0.0f))
    return distro__fail(DISTRO_ERR_INVALID, "diloco: outer_lr must be finite and >= 0 (got %g)", (double)o->outer_lr);
  if (!(o->outer_momentum >= 0.0f && o->outer_momentum < 1.0f))
    return distro__fail(DISTRO_ERR_INVALID, "diloco: outer_momentum must be in [0, 1) (got %g)",
                        (double)o->outer_momentum);
  if (o->nesterov != 0 && o->nesterov != 1)
    return distro__fail(DISTRO_ERR_INVALID, "diloco: nesterov must be 0 or 1 (got %d)", o->nesterov);
  if (!distro__outer_codec_known((int)o->codec))
    return distro__fail(DISTRO_ERR_INVALID, "diloco: unknown outer codec %d", (int)o->codec);
  if (o->codec_block < 1 || o->codec_block > (1 << 20))
    return distro__fail(DISTRO_ERR_INVALID, "diloco: codec_block must be in [1, 2^20] (got %d)", o->codec_block);
  if (!merge_known((int)o->merge)) return distro__fail(DISTRO_ERR_INVALID, "diloco: unknown merge %d", (int)o->merge);
  if (o->fragmenting != DISTRO_FRAG_BALANCED && o->fragmenting != DISTRO_FRAG_STRIDED &&
      o->fragmenting != DISTRO_FRAG_SEQUENTIAL)
    return distro__fail(DISTRO_ERR_INVALID, "diloco: unknown fragmenting strategy %d", (int)o->fragmenting);
  if (o->max_block < 0)
    return distro__fail(DISTRO_ERR_INVALID, "diloco: max_block must be >= 0 (got %lld)", (long long)o->max_block);
  if (o->progress_thread != 0 && o->progress_thread != 1)
    return distro__fail(DISTRO_ERR_INVALID, "diloco: progress_thread must be 0 or 1 (got %d)", o->progress_thread);
  return distro__sparse_options_check(o);
}

/* ---- lifecycle ------------------------------------------------------------ */

static int64_t inner_total(const distro_optim *o) {
  int64_t n = 0;
  for (int i = 0; i < o->nparams; i++) n += o->params[i].numel;
  return n;
}

distro_status distro_diloco_create(const distro_diloco_options *opt, distro_optim *inner, distro_comm *outer,
                                   distro_diloco **out) {
  if (!out) return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_create: out is NULL");
  *out = NULL;
  DISTRO__NONNULL("distro_diloco_create", opt);
  DISTRO__NONNULL("distro_diloco_create", inner);
  DISTRO__NONNULL("distro_diloco_create", outer);
  distro_status st = options_check(opt);
  if (st != DISTRO_OK) return st;
  if (inner->opt.overlap)
    return distro__fail(DISTRO_ERR_UNSUPPORTED,
                        "distro_diloco_create: the inner optimizer overlaps its exchange (options.overlap), but DiLoCo "
                        "reads and resets the parameters after each inner step: use a blocking inner optimizer");
  if (inner->nparams > 0) { /* fail early on P > units where we can */
    int64_t *n = malloc(sizeof *n * (size_t)inner->nparams);
    if (!n) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
    for (int i = 0; i < inner->nparams; i++) n[i] = inner->params[i].numel;
    const int64_t B = opt->max_block > 0 ? opt->max_block : distro__fragments_auto_block(inner_total(inner), opt->fragments);
    int64_t units = distro__fragments_units(opt->fragmenting, inner->nparams, n, NULL, B);
    free(n);
    if (units >= 0 && units < opt->fragments)
      return distro__fail(DISTRO_ERR_INVALID, "diloco: %d fragments but the tensors make only %lld %s", opt->fragments,
                          (long long)units, opt->fragmenting == DISTRO_FRAG_STRIDED ? "layers" : "blocks");
  }
  distro_diloco *d = calloc(1, sizeof *d);
  if (!d) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  d->opt = *opt;
  d->inner = inner;
  d->outer = outer;
  d->M = outer->size;
  d->learner = outer->rank;
  if (pthread_mutex_init(&d->mu, NULL) != 0) {
    free(d);
    return distro__fail(DISTRO_ERR_NOMEM, "diloco: cannot create a mutex");
  }
  if (pthread_cond_init(&d->cv, NULL) != 0) {
    pthread_mutex_destroy(&d->mu);
    free(d);
    return distro__fail(DISTRO_ERR_NOMEM, "diloco: cannot create a condition variable");
  }
  *out = d;
  return DISTRO_OK;
}

distro_status distro_diloco_set_tensor(distro_diloco *d, const char *name, int layer, unsigned flags) {
  DISTRO__NONNULL("distro_diloco_set_tensor", d);
  DISTRO__NONNULL("distro_diloco_set_tensor", name);
  if (d->ready) return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_set_tensor('%s'): only before the first step", name);
  if (layer < -1) return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_set_tensor('%s'): layer %d < -1", name, layer);
  if (flags & ~DISTRO_DILOCO_PLAIN_MERGE)
    return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_set_tensor('%s'): unknown flags 0x%x", name, flags);
  int found = 0;
  for (int i = 0; i < d->inner->nparams && !found; i++) found = !strcmp(d->inner->params[i].name, name);
  if (!found)
    return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_set_tensor: the inner optimizer has no tensor '%s'", name);
  for (int i = 0; i < d->nhints; i++)
    if (!strcmp(d->hints[i].name, name)) {
      d->hints[i].layer = layer;
      d->hints[i].flags = flags;
      return DISTRO_OK;
    }
  if (d->nhints == d->hints_cap) {
    int cap = d->hints_cap ? 2 * d->hints_cap : 16;
    distro__diloco_hint *h = realloc(d->hints, sizeof *h * (size_t)cap);
    if (!h) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
    d->hints = h;
    d->hints_cap = cap;
  }
  char *copy = strdup(name);
  if (!copy) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  d->hints[d->nhints++] = (distro__diloco_hint){copy, layer, flags};
  return DISTRO_OK;
}

static void free_layout(distro_diloco *d) {
  distro__sparse_free(d); /* first: it walks the fragments */
  if (d->global)
    for (int p = 0; p < d->frags.nfrag; p++) free(d->global[p]);
  if (d->mom)
    for (int p = 0; p < d->frags.nfrag; p++) free(d->mom[p]);
  free(d->global);
  free(d->mom);
  distro__fragments_destroy(&d->frags);
  free(d->layer);
  free(d->tflags);
  free(d->offset);
  free(d->piece_elem);
  free(d->piece_byte);
  free(d->payload);
  free(d->send);
  free(d->recv);
  free(d->acc);
  free(d->dec);
  free(d->tok);
  free(d->steps);
  free(d->w);
  free(d->nrm);
  free(d->coef);
  free(d->tokbuf);
  d->tokbuf = NULL;
  d->w = d->nrm = NULL;
  d->coef = NULL;
  d->global = d->mom = NULL;
  d->layer = NULL;
  d->tflags = NULL;
  d->offset = d->piece_elem = NULL;
  d->piece_byte = d->payload = NULL;
  d->send = d->recv = NULL;
  d->acc = d->dec = NULL;
  d->tok = d->steps = NULL;
  d->ready = 0;
}

static void *progress_main(void *arg);

void distro_diloco_free(distro_diloco *d) {
  if (!d) return;
  (void)distro__diloco_wait(d, NULL);
  if (d->th_started) {
    pthread_mutex_lock(&d->mu);
    d->th_stop = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->th, NULL);
  }
  pthread_cond_destroy(&d->cv);
  pthread_mutex_destroy(&d->mu);
  free_layout(d);
  for (int i = 0; i < d->nhints; i++) free(d->hints[i].name);
  free(d->hints);
  free(d);
}

/* ---- layout --------------------------------------------------------------- */

distro_status distro__diloco_prepare(distro_diloco *d) {
  distro_status st = DISTRO_OK;
  int64_t *numel = NULL;
  if (d->ready) {
    if (d->inner->nparams != d->nt)
      return distro__fail(DISTRO_ERR_INVALID, "diloco: %d tensors registered, but the outer loop was laid out for %d",
                          d->inner->nparams, d->nt);
    return DISTRO_OK;
  }
  const distro_optim *in = d->inner;
  const int P = d->opt.fragments, M = d->M;
  if (in->nparams == 0) return distro__fail(DISTRO_ERR_INVALID, "diloco: no tensors registered in the inner optimizer");
  d->nt = in->nparams;
  numel = malloc(sizeof *numel * (size_t)d->nt);
  d->layer = malloc(sizeof *d->layer * (size_t)d->nt);
  d->tflags = calloc((size_t)d->nt, sizeof *d->tflags);
  if (!numel || !d->layer || !d->tflags) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  for (int i = 0; i < d->nt; i++) {
    numel[i] = in->params[i].numel;
    d->layer[i] = i;
  }
  for (int h = 0; h < d->nhints; h++) {
    int i = 0;
    while (i < d->nt && strcmp(in->params[i].name, d->hints[h].name)) i++;
    if (i == d->nt) DISTRO_FAIL(DISTRO_ERR_INVALID, "diloco: no tensor '%s' (distro_diloco_set_tensor)", d->hints[h].name);
    if (d->hints[h].layer >= 0) d->layer[i] = d->hints[h].layer;
    d->tflags[i] = d->hints[h].flags;
  }
  d->max_block = d->opt.max_block > 0 ? d->opt.max_block : distro__fragments_auto_block(inner_total(in), P);
  DISTRO_CHECK(distro__fragments_build(&d->frags, d->opt.fragmenting, P, d->nt, numel, d->layer, d->max_block));
  const distro__fragments *f = &d->frags;
  d->offset = malloc(sizeof *d->offset * (size_t)P);
  d->payload = malloc(sizeof *d->payload * (size_t)P);
  d->piece_elem = malloc(sizeof *d->piece_elem * (size_t)f->npieces);
  d->piece_byte = malloc(sizeof *d->piece_byte * (size_t)f->npieces);
  d->global = calloc((size_t)P, sizeof *d->global);
  d->mom = calloc((size_t)P, sizeof *d->mom);
  d->tok = calloc((size_t)P, sizeof *d->tok);
  d->steps = calloc((size_t)P, sizeof *d->steps);
  if (!d->offset || !d->payload || !d->piece_elem || !d->piece_byte || !d->global || !d->mom || !d->tok || !d->steps)
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  d->max_payload = 0;
  d->max_frag = 0;
  for (int p = 0; p < P; p++) {
    d->offset[p] = (int64_t)p * d->opt.H / P;
    size_t bytes = DISTRO__DLC_HEADER;
    int64_t elems = 0;
    for (int q = f->start[p]; q < f->start[p + 1]; q++) {
      d->piece_elem[q] = elems;
      d->piece_byte[q] = bytes;
      elems += f->pieces[q].count;
      bytes += distro__outer_bytes(d->opt.codec, f->pieces[q].count, d->opt.codec_block);
    }
    d->payload[p] = bytes + 4;
    if (d->payload[p] > d->max_payload) d->max_payload = d->payload[p];
    if (elems > d->max_frag) d->max_frag = elems;
    d->global[p] = malloc(sizeof(float) * (size_t)elems);
    d->mom[p] = calloc((size_t)elems, sizeof(float));
    if (!d->global[p] || !d->mom[p]) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for the global copy");
  }
  if (d->opt.compressor == DISTRO_OUTER_SPARSE) DISTRO_CHECK(distro__sparse_prepare(d)); /* sets the payload bounds */
  d->send = malloc(d->max_payload);
  d->recv = malloc(d->max_payload * (size_t)M);
  d->acc = malloc(sizeof(float) * (size_t)d->max_frag);
  d->dec = malloc(sizeof(float) * (size_t)d->max_frag);
  d->w = malloc(sizeof(double) * (size_t)M);
  d->nrm = malloc(sizeof(double) * (size_t)M);
  d->coef = malloc(sizeof(float) * 2 * (size_t)M);
  d->tokbuf = malloc(4 * sizeof(uint64_t) * (size_t)in->comm->size);
  if (!d->send || !d->recv || !d->acc || !d->dec || !d->w || !d->nrm || !d->coef || !d->tokbuf) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory for outer buffers");
  free(numel);
  d->ready = 1;
  return DISTRO_OK;
fail:
  free(numel);
  free_layout(d);
  return st;
}

static float *tensor_data(const distro_diloco *d, int i) { return d->inner->params[i].param; }

/* global[p] <- the current parameters. */
static void global_from_params(distro_diloco *d) {
  const distro__fragments *f = &d->frags;
  for (int p = 0; p < f->nfrag; p++)
    for (int q = f->start[p]; q < f->start[p + 1]; q++) {
      const distro__piece *pc = &f->pieces[q];
      memcpy(d->global[p] + d->piece_elem[q], tensor_data(d, pc->tensor) + pc->offset, sizeof(float) * (size_t)pc->count);
    }
}

/* Prepare, set the global copy, agree. Collective on first use. */
static distro_status ensure_ready(distro_diloco *d) {
  if (d->verified && d->ready) return distro__diloco_prepare(d); /* re-checks the tensor count */
  distro_status st = distro__diloco_prepare(d);
  char why[512] = "";
  if (st != DISTRO_OK) snprintf(why, sizeof why, "%s", distro_last_error());
  else if (!d->global_init) {
    global_from_params(d);
    d->global_init = 1;
  }
  distro_status vst = distro__diloco_verify(d, st);
  if (st != DISTRO_OK) return distro__fail(st, "%s", why);
  return vst;
}

/* ---- merge and outer step --------------------------------------------------- */

/* The learners' outer gradients of fragment p, decoded from their payloads
 * in d->recv as the merge asks for them (no copy of M decoded fragments). */
typedef struct {
  distro_diloco *d;
  int p;
} payload_source;

static void payload_accumulate(void *ctx, int q0, int q1, const float *coef, float *out) {
  const payload_source *ps = ctx;
  const distro_diloco *d = ps->d;
  const distro__fragments *f = &d->frags;
  for (int r = 0; r < d->M; r++) {
    const uint8_t *buf = d->recv + (size_t)r * d->payload[ps->p];
    for (int q = q0; q < q1; q++)
      distro__outer_decode_axpy(d->opt.codec, buf + d->piece_byte[q], f->pieces[q].count, d->opt.codec_block, coef[r],
                                out + d->piece_elem[q], r == 0);
  }
}

static double payload_norm(void *ctx, int r, int q0, int q1) {
  const payload_source *ps = ctx;
  distro_diloco *d = ps->d;
  const distro__fragments *f = &d->frags;
  const uint8_t *buf = d->recv + (size_t)r * d->payload[ps->p];
  for (int q = q0; q < q1; q++)
    distro__outer_decode(d->opt.codec, buf + d->piece_byte[q], f->pieces[q].count, d->opt.codec_block,
                         d->dec + d->piece_elem[q]);
  const int64_t e0 = d->piece_elem[q0], e1 = q1 < f->start[ps->p + 1] ? d->piece_elem[q1] : f->numel[ps->p];
  return sqrt(distro__sumsq(d->dec + e0, e1 - e0));
}

/* Merges the validated payloads in d->recv for fragment p into d->acc. */
static void merge(distro_diloco *d, int p) {
  double *tok = d->w, *steps = d->nrm; /* become the weights; nrm is free again after */
  for (int r = 0; r < d->M; r++) {
    const uint8_t *h = d->recv + (size_t)r * d->payload[p];
    tok[r] = (double)distro__get_u64(h + 24);
    steps[r] = (double)distro__get_u64(h + 32);
  }
  distro__outer_weights(d->opt.merge, d->M, tok, steps, d->w);
  payload_source ps = {d, p};
  const distro__outer_source src = {&ps, payload_accumulate, payload_norm};
  distro__outer_merge(&d->frags, d->piece_elem, d->tflags, p, d->opt.merge, d->M, d->w, &src, d->acc, d->coef,
                      d->nrm);
}

distro_status distro__diloco_outer_step(distro_diloco *d, int p) {
  const int64_t n = d->frags.numel[p];
  float *acc = d->acc, *dec = d->dec;
  if (!distro__outer_step(d->global[p], d->mom[p], acc, n, d->opt.outer_lr, d->opt.outer_momentum, d->opt.nesterov,
                          acc, dec))
    return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: the merged outer gradient or the outer step of fragment %d overflowed",
                        p);
  memcpy(d->global[p], acc, sizeof(float) * (size_t)n);
  memcpy(d->mom[p], dec, sizeof(float) * (size_t)n);
  return DISTRO_OK;
}

/* All-gather, validate, merge and outer-step the fragment in d->x_frag. Runs
 * on the progress thread or inline; touches only the fragment's global copy
 * and momentum (sparse: and its error feedback), and those only after every
 * check passed. */
static distro_status exchange_run(distro_diloco *d) {
  distro_status st = DISTRO_OK;
  if (d->opt.compressor == DISTRO_OUTER_SPARSE) {
    DISTRO_CHECK(distro__sparse_exchange(d));
    DISTRO_CHECK(distro__diloco_outer_step(d, d->x_frag));
    distro__sparse_commit(d);
    return DISTRO_OK;
  }
  const int p = d->x_frag, M = d->M;
  const size_t bytes = d->payload[p];
  const distro__fragments *f = &d->frags;
  DISTRO_CHECK(distro_comm_allgather(d->outer, d->send, bytes, d->recv));
  const distro__dlc_head want = {DISTRO__DLC_VERSION, (unsigned)d->opt.codec, 0, (uint32_t)p, (uint64_t)d->x_round,
                                 0, 0, (uint64_t)f->numel[p], 0, (uint32_t)d->opt.codec_block};
  for (int r = 0; r < M; r++) {
    const uint8_t *b = d->recv + (size_t)r * bytes;
    distro__dlc_head got;
    DISTRO_CHECK(distro__dlc_check_header(b, bytes, r, &want, &got));
    for (int q = f->start[p]; q < f->start[p + 1]; q++) {
      st = distro__outer_check(d->opt.codec, b + d->piece_byte[q], f->pieces[q].count, d->opt.codec_block);
      if (st != DISTRO_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", distro_last_error());
        DISTRO_FAIL(st, "diloco: learner %d, fragment %d, tensor '%s': %s", r, p,
                    d->inner->params[f->pieces[q].tensor].name, why);
      }
    }
  }
  merge(d, p);
  return distro__diloco_outer_step(d, p);
fail:
  return st;
}

/* ---- progress thread -------------------------------------------------------- */

static void *progress_main(void *arg) {
  distro_diloco *d = arg;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    while (!d->th_stop && !(d->job_posted && !d->job_done)) pthread_cond_wait(&d->cv, &d->mu);
    if (!(d->job_posted && !d->job_done)) break; /* stop, nothing to do */
    pthread_mutex_unlock(&d->mu);
    distro_status st = exchange_run(d);
    pthread_mutex_lock(&d->mu);
    d->job_st = st;
    if (st != DISTRO_OK) snprintf(d->job_msg, sizeof d->job_msg, "%s", distro_last_error());
    d->job_done = 1;
    pthread_cond_broadcast(&d->cv);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

distro_status distro__diloco_wait(distro_diloco *d, double *waited) {
  if (!d->job_posted) return DISTRO_OK;
  double t0 = distro__now();
  pthread_mutex_lock(&d->mu);
  while (!d->job_done) pthread_cond_wait(&d->cv, &d->mu);
  distro_status st = d->job_st;
  d->job_posted = 0;
  d->job_done = 0;
  pthread_mutex_unlock(&d->mu);
  if (waited) *waited += distro__now() - t0;
  if (st != DISTRO_OK) {
    d->pending.active = 0; /* dropped on every learner: they saw the same payloads */
    return distro__fail(st, "%s", d->job_msg);
  }
  return DISTRO_OK;
}

/* ---- schedule --------------------------------------------------------------- */

static int due_fragment(const distro_diloco *d, int64_t t) {
  if (t <= 0) return -1;
  const int64_t r = t % d->opt.H;
  for (int p = 0; p < d->opt.fragments; p++)
    if (d->offset[p] == r) return p;
  return -1;
}

/* θ_local of fragment p <- α θ_local + (1 - α) θ_global. */
static void apply_fragment(distro_diloco *d, int p, float alpha) {
  const distro__fragments *f = &d->frags;
  const float beta = 1.0f - alpha;
  for (int q = f->start[p]; q < f->start[p + 1]; q++) {
    const distro__piece *pc = &f->pieces[q];
    float *x = tensor_data(d, pc->tensor) + pc->offset;
    const float *g = d->global[p] + d->piece_elem[q];
    if (alpha == 0.0f) {
      memcpy(x, g, sizeof(float) * (size_t)pc->count);
      continue;
    }
    const int64_t n = pc->count;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t j = 0; j < n; j++) x[j] = alpha * x[j] + beta * g[j];
  }
}

/* Completes the pending exchange (waiting for the progress thread) and
 * applies it with `alpha`. */
static distro_status finish_pending(distro_diloco *d, float alpha, distro_diloco_stats *s) {
  if (!d->pending.active) return DISTRO_OK;
  double t0 = distro__now();
  distro_status st = distro__diloco_wait(d, &s->seconds_wait);
  if (st != DISTRO_OK) return st;
  const int p = d->pending.frag;
  apply_fragment(d, p, alpha);
  s->outer_bytes_received += d->x_recv_bytes;
  d->x_recv_bytes = 0;
  d->tok[p] -= d->pending.tokens_sent;
  d->steps[p] -= d->pending.steps_sent;
  d->pending.active = 0;
  s->fragment_applied = p;
  s->seconds_outer += distro__now() - t0;
  return DISTRO_OK;
}

/* Encodes fragment p's outer gradient and starts its exchange. */
static distro_status start_exchange(distro_diloco *d, int p, int64_t apply_at, int allow_thread, distro_diloco_stats *s) {
  distro_status st = DISTRO_OK;
  const double t0 = distro__now();
  const distro__fragments *f = &d->frags;
  distro_comm *ic = d->inner->comm;
  /* The learner's token count: sum over its ranks, which must agree on the
   * fragment, the step and the steps counter. */
  uint64_t mine[4] = {(uint64_t)p, (uint64_t)d->t, d->steps[p], d->tok[p]}, *all = d->tokbuf;
  uint64_t tokens = d->tok[p];
  if (ic->size > 1) {
    DISTRO_CHECK(distro_comm_allgather(ic, mine, sizeof mine, all));
    tokens = 0;
    for (int r = 0; r < ic->size; r++) {
      if (all[4 * r] != mine[0] || all[4 * r + 1] != mine[1] || all[4 * r + 2] != mine[2])
        DISTRO_FAIL(DISTRO_ERR_COMM, "diloco: the ranks of this learner are out of step (rank %d at step %llu)", r,
                    (unsigned long long)all[4 * r + 1]);
      tokens += all[4 * r + 3];
    }
  }
  /* Δ = θ_global - θ_local, into dec. */
  float *delta = d->dec;
  int bad = 0;
  for (int q = f->start[p]; q < f->start[p + 1]; q++) {
    const distro__piece *pc = &f->pieces[q];
    const float *x = tensor_data(d, pc->tensor) + pc->offset, *g = d->global[p] + d->piece_elem[q];
    float *o = delta + d->piece_elem[q];
    const int64_t n = pc->count;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n > PAR_MIN)
    for (int64_t j = 0; j < n; j++) {
      o[j] = g[j] - x[j];
      bad |= !isfinite(o[j]);
    }
  }
  size_t bytes = d->payload[p];
  if (d->opt.compressor == DISTRO_OUTER_SPARSE) {
    bytes = distro__sparse_send(d, p, delta, bad, tokens);
  } else {
    uint8_t *b = d->send;
    const distro__dlc_head h = {DISTRO__DLC_VERSION, (unsigned)d->opt.codec, (uint32_t)d->learner, (uint32_t)p,
                                (uint64_t)d->t, tokens, d->steps[p], (uint64_t)f->numel[p],
                                bad ? DISTRO__DLC_FLAG_ABORT : 0u, (uint32_t)d->opt.codec_block};
    distro__dlc_put_header(b, &h);
    if (bad) {
      memset(b + DISTRO__DLC_HEADER, 0, bytes - DISTRO__DLC_HEADER - 4);
    } else {
      for (int q = f->start[p]; q < f->start[p + 1]; q++)
        distro__outer_encode(d->opt.codec, delta + d->piece_elem[q], f->pieces[q].count, d->opt.codec_block,
                             b + d->piece_byte[q]);
    }
    distro__put_u32(b + bytes - 4, distro__crc32c(b, bytes - 4));
    s->outer_bytes_received += bytes * (size_t)(d->M - 1); /* sparse: counted when the exchange completes */
  }
  d->pending = (distro__diloco_pending){1, p, d->t, apply_at, d->tok[p], d->steps[p]};
  d->x_frag = p;
  d->x_round = d->t;
  s->fragment_sent = p;
  s->outer_bytes_sent += bytes;
  d->total_sent += bytes;
  if (allow_thread && d->opt.progress_thread && !d->th_started) {
    d->th_stop = 0;
    if (pthread_create(&d->th, NULL, progress_main, d) == 0) d->th_started = 1;
    /* else: run inline; same results */
  }
  if (allow_thread && d->th_started) {
    pthread_mutex_lock(&d->mu);
    d->job_posted = 1;
    d->job_done = 0;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
  } else {
    st = exchange_run(d);
    if (st != DISTRO_OK) d->pending.active = 0; /* dropped by every learner */
  }
  s->seconds_outer += distro__now() - t0;
  return st;
fail:
  s->seconds_outer += distro__now() - t0;
  return st;
}

/* ---- public calls ----------------------------------------------------------- */

static void stats_init(distro_diloco_stats *s, const distro_diloco *d) {
  memset(s, 0, sizeof *s);
  s->fragment_sent = s->fragment_applied = -1;
  s->step = d->t;
}

static void stats_close(distro_diloco *d, distro_diloco_stats *s, distro_diloco_stats *out) {
  if (s->outer_bytes_sent > d->peak_sent) d->peak_sent = s->outer_bytes_sent;
  s->peak_outer_bytes_sent = d->peak_sent;
  s->total_outer_bytes_sent = d->total_sent;
  s->step = d->t;
  if (out) *out = *s;
}

distro_status distro_diloco_step(distro_diloco *d, float lr_inner, uint64_t tokens, distro_diloco_stats *stats) {
  distro_diloco_stats s;
  if (!d) return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_step: NULL object");
  stats_init(&s, d);
  distro_status st = ensure_ready(d);
  if (st != DISTRO_OK) {
    stats_close(d, &s, stats);
    return st;
  }
  st = distro_optim_step(d->inner, lr_inner, &s.inner);
  if (st != DISTRO_OK) {
    stats_close(d, &s, stats);
    return st;
  }
  s.inner_done = 1;
  d->t++;
  for (int p = 0; p < d->opt.fragments; p++) {
    d->tok[p] += tokens;
    d->steps[p]++;
  }
  distro_status first = DISTRO_OK;
  char why[512] = "";
  if (d->pending.active && d->pending.apply_at == d->t) {
    st = finish_pending(d, d->opt.alpha, &s);
    if (st != DISTRO_OK) {
      first = st;
      snprintf(why, sizeof why, "%s", distro_last_error());
    }
  }
  const int p = due_fragment(d, d->t);
  if (p >= 0 && first != DISTRO_ERR_COMM) {
    /* tau < H/P: the previous exchange has been applied by now */
    st = d->pending.active ? finish_pending(d, d->opt.alpha, &s) : DISTRO_OK;
    if (st == DISTRO_OK) st = start_exchange(d, p, d->t + d->opt.overlap, 1, &s);
    if (st == DISTRO_OK && d->opt.overlap == 0) st = finish_pending(d, d->opt.alpha, &s);
    if (st != DISTRO_OK && first == DISTRO_OK) {
      first = st;
      snprintf(why, sizeof why, "%s", distro_last_error());
    }
  }
  stats_close(d, &s, stats);
  if (first != DISTRO_OK) return distro__fail(first, "%s", why);
  return DISTRO_OK;
}

distro_status distro_diloco_flush(distro_diloco *d, distro_diloco_stats *stats) {
  distro_diloco_stats s;
  if (!d) return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_flush: NULL object");
  stats_init(&s, d);
  distro_status st = finish_pending(d, d->opt.alpha, &s);
  stats_close(d, &s, stats);
  return st;
}

distro_status distro_diloco_sync_all(distro_diloco *d, distro_diloco_stats *stats) {
  distro_diloco_stats s;
  if (!d) return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_sync_all: NULL object");
  stats_init(&s, d);
  distro_status st = ensure_ready(d);
  if (st == DISTRO_OK) st = finish_pending(d, d->opt.alpha, &s);
  for (int p = 0; p < d->opt.fragments && st == DISTRO_OK; p++) {
    if (d->steps[p] == 0) { /* synced at this step already: only take the global copy */
      apply_fragment(d, p, 0.0f);
      continue;
    }
    st = start_exchange(d, p, d->t, 0, &s);
    if (st == DISTRO_OK) st = finish_pending(d, 0.0f, &s);
  }
  s.fragment_sent = s.fragment_applied = -1;
  stats_close(d, &s, stats);
  return st;
}

distro_status distro_diloco_get_global(distro_diloco *d, const char *name, float *out, int64_t numel) {
  DISTRO__NONNULL("distro_diloco_get_global", d);
  DISTRO__NONNULL("distro_diloco_get_global", name);
  DISTRO__NONNULL("distro_diloco_get_global", out);
  distro_status st = distro__diloco_prepare(d);
  if (st != DISTRO_OK) return st;
  int i = 0;
  while (i < d->nt && strcmp(d->inner->params[i].name, name)) i++;
  if (i == d->nt) return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_get_global: no tensor '%s'", name);
  if (numel != d->inner->params[i].numel)
    return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_get_global('%s'): numel %lld, the tensor has %lld", name,
                        (long long)numel, (long long)d->inner->params[i].numel);
  st = distro__diloco_wait(d, NULL);
  if (st != DISTRO_OK) return st;
  if (!d->global_init) {
    memcpy(out, tensor_data(d, i), sizeof(float) * (size_t)numel);
    return DISTRO_OK;
  }
  const distro__fragments *f = &d->frags;
  for (int p = 0; p < f->nfrag; p++)
    for (int q = f->start[p]; q < f->start[p + 1]; q++)
      if (f->pieces[q].tensor == i)
        memcpy(out + f->pieces[q].offset, d->global[p] + d->piece_elem[q], sizeof(float) * (size_t)f->pieces[q].count);
  return DISTRO_OK;
}

distro_status distro_diloco_fragment_bytes(distro_diloco *d, int p, uint64_t *bytes, int64_t *numel) {
  if (!d) return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_fragment_bytes: NULL object");
  distro_status st = distro__diloco_prepare(d);
  if (st != DISTRO_OK) return st;
  if (p < 0 || p >= d->opt.fragments)
    return distro__fail(DISTRO_ERR_INVALID, "distro_diloco_fragment_bytes: fragment %d not in [0, %d)", p, d->opt.fragments);
  if (bytes) *bytes = d->payload[p];
  if (numel) *numel = d->frags.numel[p];
  return DISTRO_OK;
}
