/* Independent float64 reference of the optimizer step, written from
 * docs/algorithms.md section 1 and issue 2 (not from src/). It simulates every
 * rank of a job: per-rank momenta, the payload exchange and the update.
 *
 * Float32 cannot be compared bit-for-bit with float64, so the model also
 * tracks how far the library may legitimately be off:
 *  - a tile is "tainted" from the step on which some rank's k-th and
 *    (k+1)-th coefficient magnitudes were within DR_TIE_REL of the tile's
 *    largest (float32 rounding may pick the other one); tainted tiles are
 *    not compared any more (tiles are independent of each other);
 *  - each element has a bound on the error of Q (1e-5 of the tensor's
 *    max |Q|, plus the effect of bf16 / sign / INT8 rounding that sits
 *    within the same relative distance of a rounding boundary). */
#ifndef DISTRO_DEMO_REF_H
#define DISTRO_DEMO_REF_H

#include <stdint.h>

#define DR_TIE_REL 1e-5 /* near-tie / rounding-boundary margin (relative) */
#define DR_Q_REL 1e-5   /* error allowed on Q, relative to the tensor's max |Q| */
#define DR_P_REL 1e-5   /* parameter match, relative to |p| + lr*|update| */

typedef struct dr_config {
  int algorithm; /* DISTRO_ALG_DEMO / DISTRO_ALG_ADAMW */
  int update;    /* DISTRO_UPDATE_SIGN / DISTRO_UPDATE_ADAMW */
  int values;    /* DISTRO_VALUES_F32 / BF16 / SIGN1 / INT8 */
  double beta1, beta2, eps, weight_decay, decay;
  int chunk, topk;
} dr_config;

typedef struct dr_model dr_model;

/* Largest divisor of n that is <= target (n < target gives n, a prime
 * n > target gives 1). */
int dr_chunk(int64_t n, int target);

/* Orthonormal DCT-II basis, F[i*n + k] = c_k cos(pi (2i+1) k / 2n). */
void dr_dct_basis(int n, double *F);

/* Round a float to bf16 (round to nearest even), returned as a float. */
float dr_bf16(float x);

/* NULL on allocation failure. shapes[t][0..ndims[t]-1]. */
dr_model *dr_create(const dr_config *cfg, int world, int ntensors, const int *ndims,
                    const int64_t *const *shapes);
void dr_free(dr_model *m);

int64_t dr_numel(const dr_model *m, int t);
/* Chunk edges and tile count of tensor t (h = 1 for 1-D tensors). */
void dr_geometry(const dr_model *m, int t, int *h, int *w, int64_t *tiles);

/* DisTrO-AdamW's growth of the step with the aggregate's spread s (the
 * distinct selected coefficients per coefficient one rank selects) for the
 * model's tiles. Selections keeping at least the calibration's share of
 * the coefficients (32 of 32 x 32): 1 up to s = 2, sqrt(s / 2) above, at
 * most sqrt(2) (s = 4). Sparser: 1 while the union, s times that share,
 * holds at most the calibrated two ranks' (a sixteenth), the square root
 * of its ratio to that above, the ratio at most 2. */
double dr_spread_scale(const dr_model *m, double s);
/* The last step's spread as counts: the sampled tiles' distinct selected
 * coefficients lie in [*lo, *hi] (equal unless a sampled tile is tainted),
 * over the *picks coefficients one rank selected there; 0, 0, 0 before
 * the first step. */
void dr_spread_counts(const dr_model *m, int64_t *lo, int64_t *hi, int64_t *picks);
/* DisTrO-AdamW's step at step t (1-based) in units of lr: RAdam's
 * rectification of the second moment (beta2). */
double dr_adamw_step(double beta2, int64_t t);
/* Its warm-up factor at step t, from the lrs of the steps taken so far:
 * 2/3 while the schedule's opening rise of W steps lasts and through step
 * W, then t / 1.5W up to 1. Defined for up to DR_MAX_STEPS steps. */
#define DR_MAX_STEPS 4096
double dr_warmup(const dr_model *m, int64_t t);
/* The same from the lrs of the first n steps. */
double dr_warmup_of(const double *lrs, int64_t n, int64_t t);

/* One step with learning rate lr. grads[r * ntensors + t] is rank r's
 * gradient for tensor t. Parameters are not held: the update is checked
 * by dr_compare against the library's own parameters before the step. */
void dr_step(dr_model *m, double lr, const float *const *grads);

/* Q of the last step for tensor t (n doubles), for diagnostics. */
const double *dr_last_q(const dr_model *m, int t);
/* Rank `rank`'s whole momentum of the last step (before its selection was
 * removed), in parameter space: what a look-ahead overlap steps along. */
const double *dr_last_m_own(const dr_model *m, int t, int rank);
/* Nonzero if element e of tensor t lies in a tile whose selection was ever a
 * near-tie (the library may have chosen otherwise there). */
int dr_elem_tainted(const dr_model *m, int t, int64_t e);

typedef struct dr_cmp {
  long checked;    /* elements compared strictly */
  long ambiguous;  /* sign update, |Q| within its error bound: any of -1/0/+1 accepted */
  long loose;      /* AdamW update with an error bound above 0.1 * lr */
  long tainted;    /* elements of tainted tiles (not compared) */
  long mismatches;
  long first;      /* first mismatching element, -1 if none */
  double got, want, tol, q;
} dr_cmp;

/* Compares the library's parameters of tensor t after the last step (p1)
 * with the reference update applied to its parameters before it (p0). */
void dr_compare(const dr_model *m, int t, const float *p0, const float *p1, dr_cmp *out);

/* Tiles tainted so far (all tensors), and tiles selected so far (per rank). */
long dr_tainted_tiles(const dr_model *m);
long dr_selections(const dr_model *m);

/* Lower bound of one rank's wire payload: indices (u8 for chunks of <= 256
 * elements, else u16) plus values (4 bytes, 2 bytes or 1 bit each). */
uint64_t dr_payload_min_bytes(const dr_model *m);

/* ---- harness: runs the library on `world` in-process ranks -------------- */
#include <distro/distro.h>

#define DR_MAX_WORLD 8
#define DR_MAX_TENSORS 16

struct dr_run;
/* Fills grad (rank `rank`'s gradient of tensor t for step `step`) from the
 * parameters as the rank holds them before that step. */
typedef void (*dr_grad_fn)(const struct dr_run *x, int step, int rank, int t, const float *param, float *grad);

typedef struct dr_run {
  /* inputs */
  distro_options opt;
  int world, steps, nt;
  int omp_threads;                 /* > 0: omp_set_num_threads in each rank */
  const char *const *names;
  const int *ndims;
  const int64_t *const *shapes;
  float *init[DR_MAX_TENSORS];     /* initial parameters, same on all ranks */
  float **grads;                   /* [(s * world + r) * nt + t] */
  double *lrs;                     /* [s], passed to distro_optim_step */
  const char *load_fmt;            /* optional: "%d" = rank; loaded before step 1 */
  const char *save_fmt;            /* optional: saved after step save_after */
  int save_after;                  /* (with overlap: flushed first, before the snapshot, */
  int save_in_flight;              /*  unless this is set) */
  dr_grad_fn grad_fn;              /* optional: gradients from the parameters; the
                                      ones used are written back into grads */
  int flush;                       /* call distro_optim_flush after the last step */
  int comm_check;                  /* after each step, an all-reduce on the caller's
                                      comm (the trainer's loss), checked */
  /* outputs */
  float **snap;                    /* params after step s: [(s * world + r) * nt + t] */
  distro_step_stats *stats;        /* [s * world + r] */
  float **final;                   /* params at the end (after the flush): [r * nt + t] */
  distro_step_stats flush_stats[DR_MAX_WORLD];
  uint64_t payload[DR_MAX_WORLD];  /* distro_optim_payload_bytes per rank */
  distro_status rank_status[DR_MAX_WORLD];
  char err[DR_MAX_WORLD][256];     /* "where: distro_last_error()" per rank */
} dr_run;

/* Fills init (normal, scale 1) and grads (normal, scale gscale) from seed
 * and allocates the outputs; x->world/steps/nt/shapes must be set. */
int dr_run_prepare(dr_run *x, uint64_t seed, double gscale);
/* Runs the steps; returns what distro_comm_run_local returned. */
distro_status dr_run_exec(dr_run *x);
void dr_run_free(dr_run *x);
float *dr_snap(const dr_run *x, int step, int rank, int t);
int64_t dr_shape_numel(int ndim, const int64_t *shape);

#endif
