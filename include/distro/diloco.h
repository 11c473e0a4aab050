/* distro: DiLoCo outer loop (docs/algorithms.md sections 2-4, docs/diloco.md).
 *
 * M learners each train on their own data with an inner optimizer (any
 * distro_optim: the AdamW all-reduce baseline, DeMo or DisTrO-AdamW, over
 * the learner's own communicator). Every H inner steps the pseudo-gradient
 * of each parameter fragment, delta = theta_global - theta_local, is
 * exchanged between learners over a second communicator, merged, and fed to
 * an outer SGD with Nesterov momentum that every learner runs identically.
 * With sparse outer gradients (SparseLoCo) each learner keeps an
 * error-feedback buffer and sends only each chunk's top-k of it, a few
 * percent of the dense payload.
 *
 * Learners that are data-parallel inside (R ranks each): rank r of every
 * learner joins the outer communicator of "column" r (size M). All ranks of
 * a learner hold the same parameters, so every column computes the same
 * outer step and the learner's ranks stay bit-identical. */
#ifndef DISTRO_DILOCO_H
#define DISTRO_DILOCO_H

#include <stdint.h>
#include <stddef.h>
#include <distro/status.h>
#include <distro/comm.h>
#include <distro/optim.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How outer gradients travel (all decoded and accumulated in float32). */
typedef enum {
  DISTRO_OUTER_F32,  /* 4 bytes per element, exact */
  DISTRO_OUTER_BF16, /* 2 bytes, round to nearest even */
  DISTRO_OUTER_INT8, /* 1 byte + float32 absmax scale per block */
  DISTRO_OUTER_INT4, /* 4 bits + float32 absmax scale per block */
  DISTRO_OUTER_FP4   /* 4-bit float E3M0 (sign, 3 exponent bits) + scale per block */
} distro_outer_codec;

/* What a learner sends of its outer gradient. */
typedef enum {
  DISTRO_OUTER_DENSE,  /* every element, with `codec` */
  DISTRO_OUTER_SPARSE  /* SparseLoCo: an error-feedback buffer e <- beta*e + delta,
                          each chunk's top-k of e with `sparse_values`; what was
                          sent (decoded) leaves e (docs/diloco.md) */
} distro_outer_compressor;

/* How the learners' outer gradients are combined. */
typedef enum {
  DISTRO_MERGE_MEAN,   /* plain mean */
  DISTRO_MERGE_TOKENS, /* weights tokens^2 / steps since the fragment's last send */
  DISTRO_MERGE_RADIAL, /* radial-directional: mean norm times mean unit direction */
  DISTRO_MERGE_RADIAL_TOKENS /* radial-directional with the token weights */
} distro_merge;

/* How parameters are split into the P streaming fragments. */
typedef enum {
  DISTRO_FRAG_BALANCED,  /* greedy bin-packing of blocks into near-equal sizes */
  DISTRO_FRAG_STRIDED,   /* layer l -> fragment l mod P (whole tensors) */
  DISTRO_FRAG_SEQUENTIAL /* contiguous runs of blocks in registration order */
} distro_fragmenting;

#define DISTRO_DILOCO_OPTIONS_VERSION 2

typedef struct distro_diloco_options {
  int version;            /* DISTRO_DILOCO_OPTIONS_VERSION */
  int H;                  /* inner steps between two syncs of a fragment (500) */
  int fragments;          /* P, 1 <= P <= H (1) */
  int overlap;            /* tau: a sync started at step t is applied at t + tau;
                             0 <= tau < H / P (0) */
  float alpha;            /* on arrival theta_local <- alpha*theta_local +
                             (1 - alpha)*theta_global; 0 takes the global copy (0) */
  float outer_lr;         /* 0.7 */
  float outer_momentum;   /* mu in [0, 1) (0.9) */
  int nesterov;           /* 1: Nesterov (default); 0: heavy-ball momentum */
  distro_outer_codec codec; /* F32 */
  int codec_block;        /* elements per scale block for INT8/INT4/FP4 (64) */
  distro_merge merge;     /* MEAN */
  distro_fragmenting fragmenting; /* BALANCED */
  int64_t max_block;      /* BALANCED/SEQUENTIAL: tensors larger than this many
                             elements are split into near-equal blocks; 0 picks
                             ceil(total / 8P) rounded up to a multiple of 64 */
  int progress_thread;    /* 1: run each exchange (all-gather, decode, merge,
                             outer step) on a helper thread while inner steps
                             continue; the outer comm must then be usable from
                             that thread (MPI: MPI_THREAD_MULTIPLE). Same bits
                             as 0 (the default). */
  /* Sparse outer gradients (version 2; used when compressor is SPARSE, and
   * then codec and codec_block are not): */
  distro_outer_compressor compressor; /* DENSE */
  float density;          /* kept fraction of each chunk, in (0, 1]: k =
                             round(density * chunk elements), at least 1 (0.02) */
  int sparse_chunk;       /* chunk edge in [1, 256]: whole rows of a matrix are
                             tiled like DeMo (chunk rule, target edge), other
                             ranges in runs of edge^2 elements (64) */
  int sparse_dct;         /* 1: top-k of the orthonormal DCT of each tile (e then
                             lives in that domain); vectors never (0) */
  float ef_beta;          /* error-feedback decay beta in [0, 1) (0.95) */
  distro_values sparse_values; /* INT2 (2 bits + bf16 scale per chunk), INT4,
                             INT8, BF16 or F32; SIGN1 is refused (no magnitude) */
} distro_diloco_options;

/* Defaults: H 500, P 1, tau 0, alpha 0, outer lr 0.7, momentum 0.9 Nesterov,
 * F32 codec with block 64, mean merge, balanced fragments, auto max_block,
 * no progress thread, dense outer gradients (the sparse fields at the
 * values of distro_diloco_options_sparseloco). */
DISTRO_API distro_diloco_options distro_diloco_options_default(void);

/* SparseLoCo's recommended settings: the defaults with SPARSE outer
 * gradients (density 0.02, chunk 64, no DCT, beta 0.95, INT2 values), outer
 * lr 1 and no outer momentum (e plays its role). */
DISTRO_API distro_diloco_options distro_diloco_options_sparseloco(void);

typedef struct distro_diloco_stats {
  distro_step_stats inner;   /* the inner optimizer's step */
  int64_t step;              /* inner steps completed (after this call) */
  int inner_done;            /* 1 if this call's inner step was applied */
  int fragment_sent;         /* fragment whose exchange started here, or -1 */
  int fragment_applied;      /* fragment merged into the local parameters here, or -1 */
  uint64_t outer_bytes_sent;     /* this rank's outer payload started here */
  uint64_t outer_bytes_received; /* the other learners' payloads (sparse: sizes
                                    vary, counted when the exchange is applied) */
  uint64_t peak_outer_bytes_sent;  /* largest outer_bytes_sent of any call so far */
  uint64_t total_outer_bytes_sent; /* sum since the start of training (saved) */
  double seconds_outer;      /* on this thread: encode, exchange, merge, apply */
  double seconds_wait;       /* of which waiting for the progress thread */
} distro_diloco_stats;

typedef struct distro_diloco distro_diloco;

/* `inner` and `outer` are borrowed and must outlive the DiLoCo object; the
 * inner optimizer's registered tensors are the parameters (register them,
 * before the first distro_diloco_step). Every learner must pass the same
 * options. Checks H >= 1, 1 <= P <= H, 0 <= tau < H/P, known codec, merge and
 * fragmenting, compressor, density in (0, 1], ef_beta in [0, 1), sparse_chunk,
 * sparse_dct and a sparse_values codec with magnitudes, and P <= the number
 * of blocks (strided: layers) when tensors are already registered
 * (DISTRO_ERR_INVALID, naming the field). */
DISTRO_API distro_status distro_diloco_create(const distro_diloco_options *o, distro_optim *inner,
                                              distro_comm *outer, distro_diloco **out);

/* Optional, per tensor, before the first step: `layer` (>= 0, or -1 to keep
 * the default, the registration index) is the unit of STRIDED fragmenting;
 * DISTRO_DILOCO_PLAIN_MERGE makes RADIAL use the plain weighted average for
 * this tensor (embeddings). Learners must agree (checked). */
#define DISTRO_DILOCO_PLAIN_MERGE 1u
DISTRO_API distro_status distro_diloco_set_tensor(distro_diloco *d, const char *name, int layer, unsigned flags);

/* One inner step (distro_optim_step with lr_inner) and, when due, the outer
 * work: apply the exchange started tau steps ago, then start the exchange of
 * the fragment whose turn it is. `tokens` is the number of tokens this rank
 * processed in this step (summed over the learner's ranks internally, for
 * token-weighted merging). Collective over the inner and outer comms: every
 * rank of every learner must call it the same number of times.
 *
 * If the inner step fails, nothing happened (stats->inner_done == 0) and the
 * schedule did not advance. An outer failure is returned after the inner
 * step was applied (inner_done == 1): a corrupt or non-finite payload from
 * any learner (DISTRO_ERR_PAYLOAD) drops that exchange on every learner and
 * leaves the global copy and the local parameters (and with sparse outer
 * gradients every learner's error feedback) as they were. */
DISTRO_API distro_status distro_diloco_step(distro_diloco *d, float lr_inner, uint64_t tokens,
                                            distro_diloco_stats *stats /* may be NULL */);

/* Completes an exchange in flight and applies it now instead of at t + tau.
 * Makes no collective call of its own. */
DISTRO_API distro_status distro_diloco_flush(distro_diloco *d, distro_diloco_stats *stats);

/* Flushes, then runs an outer step for every fragment with inner steps
 * since its last send, and sets every local parameter to the global copy
 * (alpha is not used), so all learners end identical: for the final
 * evaluation or export. Collective. The schedule position does not move;
 * the token/step counters restart. */
DISTRO_API distro_status distro_diloco_sync_all(distro_diloco *d, distro_diloco_stats *stats);

/* Copies the global copy of tensor `name` (numel floats) into `out` (before
 * the first step: the parameters). Waits for an exchange in flight and
 * reports its failure if it failed. */
DISTRO_API distro_status distro_diloco_get_global(distro_diloco *d, const char *name, float *out, int64_t numel);

/* Outer payload bytes of fragment p (header and checksum included), and the
 * fragment's parameter count. Available once tensors are registered. Sparse
 * payloads vary with the data: this is their upper bound (real sizes are in
 * the stats). */
DISTRO_API distro_status distro_diloco_fragment_bytes(distro_diloco *d, int p, uint64_t *bytes, int64_t *numel);

/* Outer state (global copy, outer momentum, sparse: error feedback, schedule
 * position, per-fragment token counters, an exchange awaiting application),
 * atomic and checksummed.
 * The inner optimizer's state and the parameters are saved separately
 * (distro_optim_save; the caller's buffers). save completes an exchange in
 * flight first. load: before the first step or between steps. */
DISTRO_API distro_status distro_diloco_save(distro_diloco *d, const char *path);
DISTRO_API distro_status distro_diloco_load(distro_diloco *d, const char *path);

/* Waits for an exchange in flight, stops the progress thread. Accepts NULL. */
DISTRO_API void distro_diloco_free(distro_diloco *d);

#ifdef __cplusplus
}
#endif
#endif
