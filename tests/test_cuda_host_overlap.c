/* The GPU step's overlap without a GPU: overlap.c's distro__overlap_ext_step
 * (what src/cuda/optim_cuda.c calls) driving the GPU arithmetic emulated on
 * the CPU (support/cuda_emu.c), three ranks:
 * - bit for bit against the CPU optimizer's DISTRO_OVERLAP_STALE and
 *   DISTRO_OVERLAP_LOOKAHEAD (the caller's parameters, provisional step
 *   included) after every step and after the flush, DeMo sign and
 *   DisTrO-AdamW, wire v1 and v2;
 * - a rank whose compress fails (a CUDA error) hands over an abort payload:
 *   that call fails on that rank, the next call fails on every rank naming
 *   it, none waits, and the steps after work with every rank's parameters
 *   still identical. Built with -ffp-contract=off (tests/cuda_host.cmake). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>

#include "common/error.h"
#include "cuda_emu.h"
#include "optim/optim_internal.h"
#include "testutil.h"

#define WORLD 3
#define CALLS 8 /* DisTrO-AdamW's rectified step is 0 for its first 4 aggregates */
static const int64_t tshapes[][3] = {{2, 96, 40}, {2, 7, 64}, {1, 130, 0}, {2, 64, 64}, {2, 65, 33}};
#define NT (int)(sizeof tshapes / sizeof tshapes[0])

static distro_status cb_apply(void *ctx, float lr) { return emu_apply(ctx, lr); }
static distro_status cb_compress(void *ctx, float lr, int *bad) { return emu_compress(ctx, lr, bad); }
static distro_status cb_ahead(void *ctx, float a) { return emu_ahead(ctx, a); }
static distro_status cb_agree(void *ctx) { return emu_agree(ctx); }
static distro_status cb_compress_fails(void *ctx, float lr, int *bad) {
  (void)ctx, (void)lr;
  *bad = -1;
  return distro__fail(DISTRO_ERR_CUDA, "emulated: an illegal memory access in the compress kernel");
}

typedef struct {
  distro_comm *cpu_comm, *emu_comm;
  distro_options opt;
  int rank, fail_call; /* fail_call: the call whose compress fails on rank 1 (-1: none); no CPU reference then */
  char why[512];
  distro_status st[CALLS];
  char msg[CALLS][512];
  float *final; /* the emulated parameters after the flush, all tensors */
} job;

static void *run_rank(void *arg) {
  job *J = arg;
  const int ref = J->fail_call < 0;
  tu_rng rng = {0x5151ull + (uint64_t)J->rank * 7919u};
  distro_optim *cpu = NULL, *hopt = NULL;
  emu E;
  memset(&E, 0, sizeof E);
  float *cparam[NT], *eparam[NT], *grad[NT];
  int64_t total = 0;
#define FAIL(...)                                 \
  do {                                            \
    snprintf(J->why, sizeof J->why, __VA_ARGS__); \
    return NULL;                                  \
  } while (0)
  if ((ref && distro_optim_create(&J->opt, J->cpu_comm, &cpu) != DISTRO_OK) ||
      distro_optim_create(&J->opt, J->emu_comm, &hopt) != DISTRO_OK)
    FAIL("create: %s", distro_last_error());
  distro_comm_set_timeout(J->emu_comm, 30.0);
  for (int i = 0; i < NT; i++) total += emu_numel(tshapes[i]);
  if (emu_add_tensors(cpu, hopt, NT, tshapes, 0x77ull, cparam, eparam, grad) != 0)
    FAIL("add_param: %s", distro_last_error());
  /* as distro_cuda_optim_step's first call: prepare, verify, attach */
  if (distro__optim_prepare(hopt) != DISTRO_OK || distro__optim_verify(hopt, 1) != DISTRO_OK ||
      distro__overlap_attach(hopt) != DISTRO_OK)
    FAIL("prepare: %s", distro_last_error());
  if (emu_init(&E, hopt, eparam, grad, 1) != 0) FAIL("emu_init: %s", distro_last_error());
  const int la = J->opt.overlap == DISTRO_OVERLAP_LOOKAHEAD;
  const distro__overlap_ext_ops ok_ops = {&E, cb_apply, cb_compress, la ? cb_ahead : NULL, la ? cb_agree : NULL},
                          bad_ops = {&E, cb_apply, cb_compress_fails, la ? cb_ahead : NULL, la ? cb_agree : NULL};
  for (int call = 0; call < CALLS; call++) {
    for (int i = 0; i < NT; i++) tu_fill_normal(&rng, grad[i], (size_t)emu_numel(tshapes[i]), 1.0f + (float)call);
    const float lr = 0.02f / (float)(call + 1);
    distro_step_stats s;
    memset(&s, 0, sizeof s);
    const int fails = J->rank == 1 && call == J->fail_call;
    const distro__ramp ramp = hopt->ramp; /* as distro_cuda_optim_step does around the step */
    distro__ramp_observe(&hopt->ramp, lr);
    J->st[call] = distro__overlap_ext_step(hopt, fails ? &bad_ops : &ok_ops, lr, &s);
    if (J->st[call] != DISTRO_OK) hopt->ramp = ramp;
    snprintf(J->msg[call], sizeof J->msg[call], "%s", distro_last_error());
    if (!ref) continue;
    if (J->st[call] != DISTRO_OK) FAIL("emulated call %d: %s", call, J->msg[call]);
    if (distro_optim_step(cpu, lr, NULL) != DISTRO_OK) FAIL("cpu call %d: %s", call, distro_last_error());
    if (cpu->step != hopt->step) FAIL("call %d: cpu step %lld, emulated %lld", call, (long long)cpu->step,
                                      (long long)hopt->step);
    for (int i = 0; i < NT; i++) {
      int64_t at = -1;
      if (!same_bits(cparam[i], eparam[i], emu_numel(tshapes[i]), &at))
        FAIL("rank %d call %d tensor %d: element %lld: cpu %a, gpu arithmetic %a", J->rank, call, i, (long long)at,
             (double)cparam[i][at], (double)eparam[i][at]);
    }
  }
  distro_step_stats s;
  memset(&s, 0, sizeof s);
  if (distro__overlap_ext_flush(hopt, &ok_ops, &s) != DISTRO_OK) FAIL("emulated flush: %s", distro_last_error());
  if (distro__overlap_pending(hopt)) FAIL("an exchange is still pending after the flush");
  if (ref) {
    if (distro_optim_flush(cpu, NULL) != DISTRO_OK) FAIL("cpu flush: %s", distro_last_error());
    for (int i = 0; i < NT; i++) {
      int64_t at = -1;
      if (!same_bits(cparam[i], eparam[i], emu_numel(tshapes[i]), &at))
        FAIL("rank %d after the flush, tensor %d: element %lld differs", J->rank, i, (long long)at);
    }
  }
  J->final = malloc(sizeof(float) * (size_t)total);
  for (int i = 0, off = 0; i < NT; off += (int)emu_numel(tshapes[i]), i++)
    memcpy(J->final + off, eparam[i], sizeof(float) * (size_t)emu_numel(tshapes[i]));
  emu_release(&E, cpu, hopt, NT, cparam, eparam, grad);
  return NULL;
#undef FAIL
}

static int64_t total_numel(void) {
  int64_t n = 0;
  for (int i = 0; i < NT; i++) n += emu_numel(tshapes[i]);
  return n;
}

static void run(job *J, distro_overlap overlap, distro_update update, distro_values values, int wire, int fail_call) {
  distro_comm *cc[WORLD], *ec[WORLD];
  cr_assert_eq(emu_comm_groups(WORLD, cc, ec), 0);
  for (int r = 0; r < WORLD; r++) {
    memset(&J[r], 0, sizeof J[r]);
    J[r].cpu_comm = cc[r];
    J[r].emu_comm = ec[r];
    J[r].rank = r;
    J[r].fail_call = fail_call;
    J[r].opt = emu_options(update, values, wire, 32, 7);
    J[r].opt.overlap = overlap;
  }
  cr_assert_eq(emu_run_ranks(WORLD, run_rank, J, sizeof J[0]), 0, "cannot start the rank threads");
  for (int r = 0; r < WORLD; r++) {
    cr_assert(J[r].why[0] == 0, "overlap %d update %d values %d wire %d: rank %d: %s", (int)overlap, (int)update,
              (int)values, wire, r, J[r].why);
    distro_comm_free(cc[r]);
    distro_comm_free(ec[r]);
  }
  /* every rank ends with the same parameters */
  for (int r = 1; r < WORLD; r++) {
    int64_t at = -1;
    cr_assert(same_bits(J[0].final, J[r].final, total_numel(), &at), "rank %d differs from rank 0 at %lld", r,
              (long long)at);
  }
}

static void free_jobs(job *J) {
  for (int r = 0; r < WORLD; r++) free(J[r].final);
}

static void bit_identical(distro_overlap overlap) {
  static const distro_values values[] = {DISTRO_VALUES_F32, DISTRO_VALUES_SIGN1, DISTRO_VALUES_INT8,
                                         DISTRO_VALUES_INT4};
  for (int u = 0; u < 2; u++) {
    const distro_update update = u ? DISTRO_UPDATE_ADAMW : DISTRO_UPDATE_SIGN;
    job J[WORLD];
    run(J, overlap, update, DISTRO_VALUES_BF16, 1, -1);
    free_jobs(J);
    for (unsigned v = 0; v < sizeof values / sizeof values[0]; v++) {
      run(J, overlap, update, values[v], 2, -1);
      free_jobs(J);
    }
  }
}

Test(cuda_host_overlap, stale_bit_identical_to_the_cpu, .timeout = 240) { bit_identical(DISTRO_OVERLAP_STALE); }

Test(cuda_host_overlap, lookahead_bit_identical_to_the_cpu, .timeout = 240) { bit_identical(DISTRO_OVERLAP_LOOKAHEAD); }

Test(cuda_host_overlap, a_local_failure_fails_every_rank_at_the_next_call, .timeout = 120) {
  for (int u = 0; u < 4; u++) {
    job J[WORLD];
    const int at = 3;
    run(J, u / 2 ? DISTRO_OVERLAP_LOOKAHEAD : DISTRO_OVERLAP_STALE, u % 2 ? DISTRO_UPDATE_ADAMW : DISTRO_UPDATE_SIGN,
        DISTRO_VALUES_INT8, 2, at);
    for (int r = 0; r < WORLD; r++) {
      for (int c = 0; c < CALLS; c++) {
        const int want_ok = c != at + 1 && !(r == 1 && c == at);
        cr_assert_eq(J[r].st[c] == DISTRO_OK, want_ok, "update %d rank %d call %d: status %d (%s)", u, r, c,
                     (int)J[r].st[c], J[r].msg[c]);
      }
      /* the failed rank says its own error at once; the others learn it at the next call */
      if (r == 1)
        cr_assert(J[r].st[at] == DISTRO_ERR_CUDA && strstr(J[r].msg[at], "illegal memory access"),
                  "rank 1's own failure: %d '%s'", (int)J[r].st[at], J[r].msg[at]);
      else
        cr_assert(J[r].st[at + 1] == DISTRO_ERR_COMM && strstr(J[r].msg[at + 1], "rank 1") &&
                      strstr(J[r].msg[at + 1], distro_status_string(DISTRO_ERR_CUDA)),
                  "rank %d: the call after rank 1's failure: %d '%s'", r, (int)J[r].st[at + 1], J[r].msg[at + 1]);
    }
    free_jobs(J);
  }
}
