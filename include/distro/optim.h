/* distro: the optimizer. DeMo / DisTrO-AdamW, and the AdamW all-reduce
 * baseline, behind one step call that replaces a trainer's AdamW update. */
#ifndef DISTRO_OPTIM_H
#define DISTRO_OPTIM_H

#include <stdint.h>
#include <distro/status.h>
#include <distro/comm.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DISTRO_ALG_DEMO,   /* DCT + top-k momentum compression, all-gather */
  DISTRO_ALG_ADAMW   /* baseline: gradient all-reduce + AdamW */
} distro_algorithm;

typedef enum {
  DISTRO_UPDATE_SIGN,  /* DeMo reference: momentum of lr * g; p -= lr * sign(Q) */
  DISTRO_UPDATE_ADAMW  /* DisTrO-AdamW: each rank's AdamW second moment (its
                          own, never exchanged) normalizes its gradient
                          before the compression; p -= r_t w_t g lr sign(Q),
                          r_t RAdam's rectification of that second moment
                          at step t (0 for the first steps, then rising to
                          1), w_t the sign step's own warm-up: 2/3 while
                          the lr passed to distro_optim_step rises (the
                          caller's warm-up, W steps), then t / 1.5W up to
                          1, so the sign step warms up over 1.5 times the
                          caller's warm-up, and g = sqrt(s / 2) where the
                          ranks' selections hold s > 2 distinct
                          coefficients per rank's selection (1 otherwise:
                          always at 2 ranks; docs/design.md). beta1 is unused: the
                          compressed momentum is the update's momentum. */
} distro_update;

typedef enum {
  DISTRO_VALUES_F32,   /* 4 bytes per kept coefficient */
  DISTRO_VALUES_BF16,  /* 2 bytes, round-to-nearest-even */
  DISTRO_VALUES_SIGN1, /* 1 bit: sign only; receivers use +-1 (a vote) */
  DISTRO_VALUES_INT8,  /* per-chunk bf16 scale + 8-bit integers (wire v2) */
  DISTRO_VALUES_INT4,  /* per-chunk bf16 scale + 4-bit integers (wire v2) */
  DISTRO_VALUES_INT2   /* per-chunk bf16 scale s + 2-bit codes q: (q + 1/2) s,
                          q in -2..1; for sparse DiLoCo outer gradients
                          (distro_diloco_options.sparse_values), not the DeMo step */
} distro_values;

/* options.overlap (DeMo only; docs/design.md "Overlap"). */
typedef enum {
  DISTRO_OVERLAP_OFF = 0,       /* each step waits for its all-gather */
  DISTRO_OVERLAP_LOOKAHEAD = 1, /* the exchange runs behind the caller's next
                                   forward/backward; the caller's parameters
                                   meanwhile hold the agreed ones plus this
                                   rank's own provisional step */
  DISTRO_OVERLAP_STALE = 2,     /* the same exchange, no provisional step: the
                                   caller's parameters are always the agreed,
                                   one step late */
  DISTRO_OVERLAP_BACKWARD = 3   /* the blocking step, bit for bit, its payload
                                   sent in parts as the caller marks gradients
                                   final during backward
                                   (distro_optim_grad_ready), so the exchange
                                   runs behind the rest of backward */
} distro_overlap;

/* 4 added clip_norm; version 3 structs (without it) are still accepted. */
#define DISTRO_OPTIONS_VERSION 4

typedef struct distro_options {
  int version;                 /* DISTRO_OPTIONS_VERSION */
  distro_algorithm algorithm;
  float lr, beta1, beta2, eps, weight_decay;
  float compression_decay;     /* momentum decay, in [0, 1) */
  int chunk;                   /* target chunk edge (32) */
  int topk;                    /* coefficients kept per chunk (32) */
  distro_update update;
  distro_values values;
  int wire_version;            /* 2 (default): entropy-coded indices, any codec;
                                  1: fixed-size payloads, F32/BF16/SIGN1 only */
  /* Robust aggregation for untrusted peers (both off by default, which is
   * exact DeMo semantics): */
  int drop_invalid_peers;      /* skip a peer whose payload fails validation
                                  instead of failing the step */
  int threads;                 /* OpenMP threads of a step; 0: the caller's
                                  (omp_get_max_threads() on the calling thread
                                  at the first step). The step calls no BLAS,
                                  so the process's BLAS threading is moot. */
  float clip_median_multiple;  /* > 0: scale each peer's values of a tensor
                                  down to this multiple of the median norm
                                  across peers */
  int overlap;                 /* DeMo only, a distro_overlap. OFF (default):
                                  each step waits for its all-gather.
                                  LOOKAHEAD: step t starts its exchange on a
                                  helper thread and applies the aggregate of
                                  step t-1; until the next step the caller's
                                  parameters are the agreed ones plus this
                                  rank's own provisional step, so the next
                                  gradient is taken close to where the
                                  parameters are going. STALE: the same
                                  without the provisional step, as Psyche
                                  runs DeMo. BACKWARD: the blocking step, its
                                  exchange started during backward
                                  (distro_optim_grad_ready). What each costs
                                  in loss: docs/design.md, "Overlap". */
  /* Version 4: */
  float clip_norm;             /* > 0: clip this rank's gradient, tensor by
                                  tensor, before the step uses it (the
                                  caller's buffers are not written): tensor
                                  i is scaled down to clip_norm *
                                  sqrt(share_i) when its L2 norm is larger,
                                  share_i its usual share of the gradient's
                                  squared norm (an EMA, 0.9 per step, of
                                  |g_i|^2 / |g|^2, starting from its share of
                                  the parameters; kept in the saved state).
                                  A tensor whose gradient is usually large
                                  keeps it, so a step is clipped about as a
                                  clip of the whole gradient to clip_norm
                                  would clip it, and the rule needs only the
                                  tensor itself: the gradient-ready exchange
                                  (BACKWARD) sends a tensor before the whole
                                  gradient's norm is known. 0 (default): no
                                  clip. CPU only. */
} distro_options;

/* Defaults, the same for every algorithm: lr 4e-4, beta 0.9/0.95, eps 1e-8,
 * weight decay 0.1, and for DeMo decay 0.999, chunk 32, topk 32, SIGN
 * update, INT8 values, wire version 2, no robust aggregation, no overlap, no
 * clip. Setting
 * update = DISTRO_UPDATE_ADAMW on these gives the recommended DisTrO-AdamW
 * (docs/design.md): keep the lr and schedule of the AdamW it replaces. */
DISTRO_API distro_options distro_options_default(distro_algorithm alg);

typedef struct distro_step_stats {
  uint64_t bytes_sent;      /* this rank's payload on the wire (DeMo), or its
                               share of a ring all-reduce (AdamW) */
  uint64_t bytes_received;  /* from the other ranks */
  double   seconds_transform; /* forward + inverse DCT */
  double   seconds_topk;      /* selection + encode */
  double   seconds_exchange;  /* collective */
  double   seconds_decode;    /* validate + aggregate + update */
  double   seconds_total;
  int64_t  step;              /* steps completed after this one */
  int      peers_dropped;     /* payloads skipped (drop_invalid_peers) */
  uint64_t peers_dropped_mask; /* bit r: rank r's payload was skipped (r < 64) */
  int      peers_clipped;     /* (peer, tensor) pairs scaled down by clipping */
  double   seconds_codec;     /* part of seconds_topk and seconds_decode spent
                                 in the wire format: encoding this rank's
                                 payload, validating and decoding all of them */
  double   seconds_exchange_bg; /* overlap: how long the exchange completed in
                                 this call ran on the helper thread (its
                                 collective and decoding); seconds_exchange is
                                 then the part the caller waited for. 0
                                 without overlap. */
} distro_step_stats;

typedef struct distro_optim distro_optim;

/* `comm` is borrowed and must outlive the optimizer. */
DISTRO_API distro_status distro_optim_create(const distro_options *o, distro_comm *comm, distro_optim **out);

/* Registers a tensor (pointers into the caller's buffers, read at each step).
 * ndim >= 1, every shape entry >= 1. Names must be unique, and no two
 * tensors' param (or grad) buffers may overlap. Only before the first step
 * or load. Tensors with >= 3 dims chunk their last two.
 *
 * `grad` may be NULL for a trainer that allocates its gradients lazily (in
 * the first backward pass, as llm.c does): register everything up front and
 * hand each gradient buffer over with distro_optim_set_grad before the first
 * step. The first step fails with DISTRO_ERR_INVALID, on every rank, if a
 * tensor still has none. */
DISTRO_API distro_status distro_optim_add_param(distro_optim *o, const char *name, float *param, const float *grad,
                                     int ndim, const int64_t *shape);

/* Sets (or moves) the gradient buffer of the tensor registered as `name`.
 * Allowed at any time between steps; the buffer is read at each step. */
DISTRO_API distro_status distro_optim_set_grad(distro_optim *o, const char *name, const float *grad);

/* options.overlap = DISTRO_OVERLAP_BACKWARD: this rank's gradient of tensor
 * `name` is final for the coming step (call it during backward, as soon as
 * the tensor's gradient is complete and clipped), with the lr the coming
 * distro_optim_step will get. The tensors are grouped in a few buckets of
 * consecutive registered tensors; when every tensor of a bucket is marked,
 * its part of the step is compressed here, on the calling thread, and its
 * all-gather starts on the optimizer's helper thread (on the private
 * duplicate of `comm`, as options.overlap's modes make), so it runs while
 * backward goes on. distro_optim_step then does the rest and applies the
 * aggregate: the parameters are those of the blocking step on the same
 * gradients, bit for bit, on every rank.
 *  - Every rank must mark its tensors in the same order (a bucket's
 *    exchange is a collective); marks in another order make the step fail
 *    on every rank with an error saying so, with nothing applied.
 *  - A marked gradient must not change until distro_optim_step returns;
 *    nor may the lr (a step with another lr is refused, and nothing
 *    changes). Marking a tensor twice in one step is refused.
 *  - The first step, and optimizers with any other overlap (the AdamW
 *    baseline too), do nothing here but check the name: the step sends
 *    everything, so a trainer may call this unconditionally.
 *  - distro_optim_load is refused between a mark and its step;
 *    distro_optim_save is not (it saves the state before the step).
 *  - The clip a trainer applies to the whole gradient's norm is known only
 *    at the end of backward: leave the gradients unclipped and set
 *    options.clip_norm, which clips each tensor by its own norm when it is
 *    marked (docs/design.md "Overlap"). */
DISTRO_API distro_status distro_optim_grad_ready(distro_optim *o, const char *name, float lr);

/* One optimizer step on every registered tensor. `lr` overrides the options'
 * lr (for schedules). Collective: every rank must call it. On any failure no
 * parameter and no optimizer state has changed, on any rank.
 *
 * Overlap (options.overlap, DeMo only; docs/design.md "Overlap"):
 *  - Step t waits for the exchange of step t-1, commits its momentum,
 *    compresses this step's gradient, starts its exchange on a helper
 *    thread owned by the optimizer, then applies the aggregate of step t-1
 *    (with step t-1's lr). The agreed parameters after step t are those the
 *    blocking step gives after t-1 steps on the same gradients, on every
 *    rank.
 *  - STALE: the caller's parameters are the agreed ones; the gradient of
 *    step t+1 is taken at parameters one update behind.
 *  - LOOKAHEAD: on return the caller's parameters are the agreed ones minus
 *    this rank's provisional step (1.0 lr for the sign update; for
 *    DisTrO-AdamW its own step grown by g with the spread of the last
 *    applied aggregate, as that step is, times min(1, 0.75 g); times the
 *    sign of its whole momentum of step t, sent or not): an estimate of
 *    the update in flight, different on each rank. The agreed parameters
 *    are kept inside the optimizer (4 bytes per parameter) and replace
 *    the caller's at the next step or flush, so
 *    changes the caller makes to its parameters while an exchange is in
 *    flight are lost; without one in flight (the first step, after a flush
 *    or a failure) the caller's parameters are taken as the agreed ones.
 *    Compare ranks after distro_optim_flush: the parameters are then the
 *    agreed ones, bit-identical on every rank. A checkpoint needs no flush
 *    (see distro_optim_save), so saving does not change the run.
 *  - The first step (and the first after a flush or a failure) has nothing
 *    to apply: the agreed parameters do not move. Stats report the exchange
 *    that completed in the call (bytes, decode, dropped peers);
 *    stats.step counts the steps whose aggregate has been applied.
 *  - The gradient buffers are read only during the call; the helper reads
 *    none of the caller's buffers, so the caller may run its next
 *    forward/backward at once.
 *  - The exchanges run on a private duplicate of `comm`, made collectively
 *    at the first step, so the caller may use `comm` for its own
 *    collectives (loss, evaluation) while one is in flight. A timeout set
 *    on `comm` (distro_comm_set_timeout) is applied to each exchange. In-
 *    process communicators work as they are; MPI needs MPI_Init_thread with
 *    MPI_THREAD_MULTIPLE (else the first step fails with
 *    DISTRO_ERR_UNSUPPORTED on every rank); NCCL is not supported.
 *  - A background exchange that fails (a bad or aborting payload, a
 *    timeout) is reported by the next step or flush, on every rank:
 *    nothing of it is applied, its staged momentum is dropped, and that
 *    call's own gradient is not used either; the optimizer is left with no
 *    exchange in flight, as after a flush, and the next step starts afresh
 *    (LOOKAHEAD: the caller's parameters are reset to the agreed ones).
 *  - Argument errors (a bad lr) are reported before anything is waited for
 *    and leave the exchange in flight. */
DISTRO_API distro_status distro_optim_step(distro_optim *o, float lr, distro_step_stats *stats /* may be NULL */);

/* Overlap: waits for the exchange in flight, if any, and applies its
 * aggregate, so the parameters are the agreed ones: those the blocking step
 * would give after the same steps, on every rank (LOOKAHEAD: without the
 * provisional step). Call it on every rank after the last step (before the
 * final evaluation). An exchange restored by distro_optim_load is sent
 * again and applied here too (collective, like a step). Without an exchange in
 * flight (or without overlap) it does nothing and returns DISTRO_OK. A
 * failed exchange is reported as by distro_optim_step. Stats (may be NULL)
 * report the exchange it completed. */
DISTRO_API distro_status distro_optim_flush(distro_optim *o, distro_step_stats *stats);

/* options.clip_norm > 0: this rank's gradient norm, before the clip, at the
 * latest successful step (over every tensor, as the whole gradient's norm a
 * trainer logs). DISTRO_ERR_INVALID before the first step or without a
 * clip (the step then does not measure the gradient). */
DISTRO_API distro_status distro_optim_grad_norm(const distro_optim *o, double *norm);

/* Optimizer state (momenta, moments, step count), atomic and checksummed.
 * Parameters are the caller's and are not saved here.
 * Overlap: a save with an exchange in flight does not wait for it; it keeps
 * what that step staged, this rank's payload and, with LOOKAHEAD, the
 * agreed parameters and this rank's selection (4 more bytes per parameter
 * per staged array, plus the payload). Such a state loads only into an
 * optimizer with the same options.overlap (else DISTRO_ERR_SHAPE), whose
 * next step or flush sends that payload again (every rank must load states
 * saved at the same step). With STALE, restore the caller's parameters as
 * they were at the save; with LOOKAHEAD the load itself sets them, on each
 * rank, to the agreed ones plus that rank's provisional step (restore the
 * parameters before the load, or not at all). The run then goes on bit for
 * bit as the one that saved, and saving does not change it. A state saved
 * with nothing in flight (after a flush, or without overlap) loads with or
 * without overlap. Load fails with DISTRO_ERR_INVALID while an exchange is
 * in flight. */
DISTRO_API distro_status distro_optim_save(const distro_optim *o, const char *path);
DISTRO_API distro_status distro_optim_load(distro_optim *o, const char *path);

/* Bytes of this rank's payload per step (DeMo), or of the gradient buffer
 * (AdamW), for the registered tensors. With wire version 2 the size depends
 * on the data; this is its upper bound (real sizes are in the step stats). */
DISTRO_API distro_status distro_optim_payload_bytes(const distro_optim *o, uint64_t *bytes);

/* Same figure without buffers: for shapes[i][0..ndims[i]-1], i < ntensors. */
DISTRO_API distro_status distro_payload_bytes(const distro_options *o, int ntensors, const int *ndims,
                                   const int64_t *const *shapes, uint64_t *bytes);

DISTRO_API void distro_optim_free(distro_optim *o); /* accepts NULL */

#ifdef __cplusplus
}
#endif
#endif
