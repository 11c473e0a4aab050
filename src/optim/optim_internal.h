/* Internal: the functions the optimizer's files share (the DeMo and AdamW
 * steps, the payload exchange, overlap, state files); the state itself is in
 * optim_state.h. */
#ifndef DISTRO_OPTIM_INTERNAL_H
#define DISTRO_OPTIM_INTERNAL_H

#include <stdint.h>
#include <distro/optim.h>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "optim/optim_state.h"

int distro__uses_adam(const distro_options *o);
distro_status distro__options_check(const distro_options *o);
/* Reads the caller's options of version 3 or 4 into out (version 4, its
 * newer fields at their defaults) and checks them; out untouched on failure. */
distro_status distro__options_take(const distro_options *in, distro_options *out);

/* options.clip_norm (clip.c). The shares start at each tensor's share of
 * the parameters (at prepare); measure sets tensor i's gscale and clip_ss
 * from its gradient as it is now (when it is marked ready, or at the
 * step); commit, after a successful step, takes the step's norm and moves
 * the shares. */
void distro__clip_init(distro_optim *o);
void distro__clip_measure(distro_optim *o, int i);
void distro__clip_commit(distro_optim *o);
/* options.overlap BACKWARD: tensor i was marked ready this step. */
int distro__backward_marked(const distro_optim *o, int i);

/* Allocates state once (before the first step or a load). */
distro_status distro__optim_prepare(distro_optim *o);
/* Collective: agrees on the tensor list and on every rank having prepared
 * its state (first step only). */
distro_status distro__optim_verify(distro_optim *o, int local_ok);

/* p <- p(1 - lr wd); m, v <- moments of q; p <- p - lr mhat / (sqrt(vhat) + eps).
 * `t` is the 1-based step for bias correction. Element-wise: deterministic. */
void distro__adamw_update(float *p, float *m, float *v, const float *q, int64_t n, float q_scale,
                          const distro_options *o, float lr, int64_t t);

distro_status distro__demo_step(distro_optim *o, float lr, distro_step_stats *s);
/* The DeMo step's phases (demo.c), for callers that run them apart: compress
 * every tile into the staged momentum and encode this rank's payload
 * (returns its size; 0 with the error set on an internal failure); then,
 * after distro__payload_exchange succeeded, commit the staged momentum and
 * apply the aggregate (cannot fail). */
size_t distro__demo_compress(distro_optim *o, float lr, distro_step_stats *s);
/* Bucket b's tensors compressed and encoded into its payload; 0 when the
 * encode did not fit (a bug). distro__demo_compress: bucket 0 of one. */
size_t distro__demo_compress_bucket(distro_optim *o, int b, float lr, distro_step_stats *s);
/* The staged state (momentum; with overlap DisTrO-AdamW's moments) becomes
 * current and the decoded aggregate's spread is taken (o->spread): the
 * step's exchange succeeded. */
void distro__demo_commit(distro_optim *o);
/* The apply phase. agg: apply the aggregate decoded into the optimizer's
 * own set with lr_agg (the step's own lr; with overlap the lr of the step
 * that sent it), to the caller's parameters or, with look-ahead, to the
 * agreed ones (base). With look-ahead it then sets the caller's parameters
 * to base - ahead sign(this rank's whole momentum of the step, what it sent
 * plus what it kept), or to base when ahead is 0. */
void distro__demo_apply(distro_optim *o, int agg, float lr_agg, int64_t t_agg, float ahead, distro_step_stats *s);
/* Bytes of one thread's workspace of the DeMo step for tiles of up to
 * max_tile elements. */
size_t distro__demo_ws_bytes(int64_t max_tile);
/* The spread of the decoded aggregate (spread.c; step_rule.h): distinct
 * selected coefficients of the live ranks per coefficient one rank selects,
 * over a fixed sample of the tiles; 1 with nothing selected. */
double distro__aggregate_spread(distro_optim *o);
/* The spread the step grows with: distro__aggregate_spread where it can
 * change the step (DisTrO-AdamW, more ranks than the growth's anchor,
 * step_rule.h), else 1, uncounted. */
double distro__step_spread(distro_optim *o);
/* DisTrO-AdamW's growth of the step with the latest committed spread
 * (distro__adamw_spread_scale at this optimizer's anchor). */
double distro__step_growth(const distro_optim *o);

/* A payload format (payload_format.c): one entry per wire version, chosen
 * once by distro__payload_prepare. bound: the largest payload of a tensor
 * list; prepare: the format's tables and o->slot (the whole list's bound);
 * encode / encode_abort: this rank's payload of bucket b (o->buckets) at
 * its place in o->send, stamped `stamp`, returning its size (0: a bug);
 * gather: bucket b's all-gather into recv (world slots of its slot bytes),
 * each rank's size into sizes; decode: validate a peer's payload of bucket
 * b and decode it into idx[i] / val[i] (i: the tensor's index in the whole
 * list; an abort notice returns OK with *aborted set). */
typedef struct distro__payload_format {
  int version;
  distro_status (*bound)(const distro__tiling *t, int n, distro_values v, uint64_t *bytes);
  distro_status (*prepare)(distro_optim *o);
  size_t (*encode)(distro_optim *o, int b, uint32_t rank, uint64_t stamp);
  size_t (*encode_abort)(distro_optim *o, int b, uint32_t rank, uint64_t stamp, uint32_t status, uint32_t tensor);
  distro_status (*gather)(const distro_optim *o, distro_comm *comm, int b, size_t size, uint8_t *recv,
                          size_t *sizes);
  distro_status (*decode)(const distro_optim *o, int b, const uint8_t *buf, size_t size, int peer, int *aborted,
                          uint32_t *why, uint32_t *tensor, uint32_t *const *idx, float *const *val);
} distro__payload_format;
/* The entry of a wire version; NULL if none (options_check refuses it first). */
const distro__payload_format *distro__payload_format_of(int wire_version);

/* Payload handling of the DeMo step (payload.c). */
distro_status distro__payload_prepare(distro_optim *o);
void distro__payload_destroy(distro_optim *o);
/* Encodes this rank's selection, or an abort notice when bad_tensor >= 0;
 * returns the payload size (0: encoding failed, which is a bug). The whole
 * list's (one bucket), or bucket b's. */
size_t distro__payload_encode(distro_optim *o, int bad_tensor);
size_t distro__payload_encode_bucket(distro_optim *o, int b, int bad_tensor);
/* What bucket b's payload of `step` is stamped with: the step itself when
 * there is one bucket. */
uint64_t distro__payload_stamp(const distro_optim *o, int64_t step, int b);
/* A rank that failed locally before its payload was ready (the GPU step's
 * CUDA, cuBLAS or cuFFT errors) still joins this step's exchange, with an
 * abort payload carrying `why`, so every rank fails the step with an error
 * naming it instead of waiting for the missing payload. The caller reports
 * its own error afterwards (distro_last_error is overwritten). */
void distro__payload_join_failed(distro_optim *o, distro_status why, distro_step_stats *s);
/* The abort payload alone (what join_failed sends): its size, 0 if it did
 * not fit. */
size_t distro__payload_encode_failed(distro_optim *o, distro_status why);
/* Exchanges, validates and decodes every rank's payload into dec_idx /
 * dec_val; applies the robust-aggregation options. Changes no state but
 * the receive buffers. */
distro_status distro__payload_exchange(distro_optim *o, size_t size, distro_step_stats *s);
/* The same into `x`, over `comm`, expecting payloads stamped `step`. Reads
 * `o` only (its send buffer, layout and options), so a helper thread can
 * run it while the caller applies the previous aggregate. */
distro_status distro__payload_exchange_into(const distro_optim *o, distro_comm *comm, int64_t step,
                                            distro__xset *x, size_t size, distro_step_stats *s);
/* Its two halves: bucket b's all-gather of `size` bytes into x (adds the
 * bytes to s); then, with every bucket gathered, validate and decode all. */
distro_status distro__payload_gather(const distro_optim *o, distro_comm *comm, int b, distro__xset *x, size_t size,
                                     distro_step_stats *s);
distro_status distro__payload_decode(const distro_optim *o, distro_comm *comm, int64_t step, distro__xset *x,
                                     distro_step_stats *s);
/* A second exchange set shaped like the optimizer's (overlap.c); free
 * accepts a zeroed set. */
distro_status distro__xset_alloc(const distro_optim *o, distro__xset *x);
void distro__xset_free(distro__xset *x);
/* The optimizer's own set, as an xset (pointers into it). */
distro__xset distro__xset_own(const distro_optim *o);

/* The one-step-stale step (overlap.c): apply the aggregate of the previous
 * step, compress this one and start its exchange on a helper thread. */
distro_status distro__overlap_init(distro_optim *o);   /* local: buffers, thread */
distro_status distro__overlap_attach(distro_optim *o); /* collective: the private comm */
distro_status distro__overlap_step(distro_optim *o, float lr, distro_step_stats *s);
/* Waits for the exchange in flight, if any, and applies it. */
distro_status distro__overlap_flush(distro_optim *o, distro_step_stats *s);
/* An exchange not yet applied: handed over, or restored by a load. */
int distro__overlap_pending(const distro_optim *o);
/* An exchange handed over to the helper and not yet waited for. */
int distro__overlap_in_flight(const distro_optim *o);
/* What a state file keeps of a pending exchange: 1 with this rank's payload
 * size (the payload is in o->send, which the helper only reads) and the
 * step's lr; 0 if none is pending. */
int distro__overlap_saved(const distro_optim *o, size_t *size, float *lr);
/* A loaded state's pending exchange (o->step, the ramp and the staged state
 * already restored): the payload (size <= o->slot bytes) is sent again at
 * the next step or flush, before anything else; with look-ahead the
 * caller's parameters are rebuilt now. NULL clears one restored earlier. */
void distro__overlap_restore(distro_optim *o, const uint8_t *payload, size_t size, float lr);
void distro__overlap_free(distro_optim *o);

/* The overlapped step of an optimizer whose state lives elsewhere (the
 * GPU's): `o` holds the payload code and the background exchange, the
 * callbacks the arithmetic. Each call waits for the previous step's
 * exchange, applies its aggregate (apply: with that step's lr, for
 * aggregate number o->step + 1, onto the agreed parameters; it commits
 * what compress staged), then compresses this step's gradient (compress:
 * stages the momentum, fills the selection p->idx / p->val of `o`, *bad the
 * first tensor whose state is not finite or -1) and hands the exchange
 * over. With look-ahead (ahead and agree set), ahead(a) then sets the
 * caller's parameters to the agreed ones minus a sign(this rank's whole
 * momentum), a = 0 meaning a copy, and agree copies the caller's
 * parameters into the agreed ones when nothing is in flight. The
 * arithmetic is that of distro__overlap_step, in another order: the apply
 * of step t-1 only writes the agreed parameters and commits staged state,
 * which the compress of step t reads after its commit either way. A failed
 * compress still hands over an abort payload, so every rank fails that
 * step at its next wait. A failed apply leaves the external state half
 * written: the caller treats that as fatal (distro__overlap_ext_fail from then
 * on). */
typedef struct {
  void *ctx;
  distro_status (*apply)(void *ctx, float lr);
  distro_status (*compress)(void *ctx, float lr, int *bad);
  distro_status (*ahead)(void *ctx, float a); /* look-ahead only, else NULL */
  distro_status (*agree)(void *ctx);          /* look-ahead only, else NULL */
} distro__overlap_ext_ops;
distro_status distro__overlap_ext_step(distro_optim *o, const distro__overlap_ext_ops *ops, float lr,
                                       distro_step_stats *s);
/* Waits for the exchange in flight, if any, and applies it. */
distro_status distro__overlap_ext_flush(distro_optim *o, const distro__overlap_ext_ops *ops, distro_step_stats *s);
/* A rank that cannot step (its state is broken): waits for what is in
 * flight and hands over an abort payload with `why`, so that every rank
 * fails its next step; returns why with the current error message. */
distro_status distro__overlap_ext_fail(distro_optim *o, distro_status why);

/* The gradient-ready exchange (backward.c, options.overlap BACKWARD): the
 * blocking step's arithmetic, its payload sent in buckets as the caller
 * marks their gradients final (distro_optim_grad_ready), each bucket's
 * all-gather on a helper thread while backward goes on. */
distro_status distro__backward_init(distro_optim *o); /* local: thread, buffers */
/* Collective, at each step before it runs: the private comm (first step),
 * and the check that every bucket sent early used this lr. */
distro_status distro__backward_begin(distro_optim *o, float lr);
distro_status distro__backward_step(distro_optim *o, float lr, distro_step_stats *s);
/* Tensors marked ready for a step not taken yet: a state cannot be loaded
 * then (a save keeps the state before that step). */
int distro__backward_in_flight(const distro_optim *o);
void distro__backward_free(distro_optim *o);

/* Clip each peer's values per tensor to a multiple of the median norm. */
int distro__robust_clip(float *const *vals, const uint8_t *dropped, int world, int64_t count, float multiple);
distro_status distro__adamw_step(distro_optim *o, float lr, distro_step_stats *s);

/* State files (state_io.c): one tensor's entry, shared by the optimizer and
 * the DiLoCo state. */
/* A tensor's state arrays in state-file order: DeMo's momentum, then AdamW's
 * m (the baseline only) and v. Returns how many (<= 3); the CUDA optimizer
 * copies its device arrays in the same order. */
typedef enum { DISTRO__STATE_MOM, DISTRO__STATE_M, DISTRO__STATE_V } distro__state_array;
int distro__state_arrays(const distro_options *o, distro__state_array out[3]);
void distro__state_put_tensor(distro__afile *w, const distro__param *p);
distro_status distro__state_check_tensor(distro__rfile *r, const distro__param *p, int i);

#endif
