/* Install check: a program that knows distro only through its installed
 * headers and library (pkg-config or find_package). Two in-process ranks
 * each take one DeMo step on a small model; exits non-zero on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <distro/distro.h>
#ifdef DISTRO_WITH_MPI
#include <distro/mpi.h>
#endif

#define ROWS 96
#define COLS 80
#define BIAS 80

typedef struct {
  distro_status status[2];
  uint64_t bytes_sent[2];
  int changed[2];
  float w_after[2][ROWS * COLS];
} shared_t;

static void fail(int rank, const char *what, distro_status s) {
  fprintf(stderr, "consumer: rank %d: %s: %s (%s)\n", rank, what, distro_status_string(s), distro_last_error());
}

static distro_status rank_main(distro_comm *comm, int rank, void *arg) {
  shared_t *sh = arg;
  static float w[2][ROWS * COLS], gw[2][ROWS * COLS], b[2][BIAS], gb[2][BIAS];
  for (int i = 0; i < ROWS * COLS; i++) {
    w[rank][i] = 0.01f * (float)((i * 7) % 13 - 6);
    gw[rank][i] = sinf(0.1f * (float)i + (float)rank);
  }
  for (int i = 0; i < BIAS; i++) {
    b[rank][i] = 0.0f;
    gb[rank][i] = cosf(0.3f * (float)i - (float)rank);
  }

  distro_options opt = distro_options_default(DISTRO_ALG_DEMO);
  distro_optim *o = NULL;
  distro_status s = distro_optim_create(&opt, comm, &o);
  if (s != DISTRO_OK) { fail(rank, "distro_optim_create", s); return s; }

  const int64_t wshape[2] = {ROWS, COLS}, bshape[1] = {BIAS};
  s = distro_optim_add_param(o, "layer.weight", w[rank], gw[rank], 2, wshape);
  if (s == DISTRO_OK) s = distro_optim_add_param(o, "layer.bias", b[rank], gb[rank], 1, bshape);
  if (s != DISTRO_OK) { fail(rank, "distro_optim_add_param", s); distro_optim_free(o); return s; }

  distro_step_stats st;
  memset(&st, 0, sizeof st);
  s = distro_optim_step(o, 1e-3f, &st);
  sh->status[rank] = s;
  sh->bytes_sent[rank] = st.bytes_sent;
  memcpy(sh->w_after[rank], w[rank], sizeof w[rank]);
  for (int i = 0; i < ROWS * COLS; i++)
    sh->changed[rank] += w[rank][i] != 0.01f * (float)((i * 7) % 13 - 6);
  if (s != DISTRO_OK) fail(rank, "distro_optim_step", s);
  distro_optim_free(o);
  return s;
}

int main(void) {
  static shared_t sh;
  printf("consumer: distro %s\n", distro_version_string());
#ifdef DISTRO_WITH_MPI
  /* Only checks that the MPI entry point is declared and linkable. */
  distro_status (*volatile mpi_entry)(MPI_Comm, distro_comm **) = distro_comm_mpi;
  if (!mpi_entry) return 1;
#endif

  distro_status s = distro_comm_run_local(2, rank_main, &sh);
  if (s != DISTRO_OK) {
    fprintf(stderr, "consumer: distro_comm_run_local: %s\n", distro_status_string(s));
    return 1;
  }
  for (int r = 0; r < 2; r++) {
    if (sh.status[r] != DISTRO_OK) return 1;
    if (sh.bytes_sent[r] == 0) {
      fprintf(stderr, "consumer: rank %d reports bytes_sent == 0\n", r);
      return 1;
    }
    if (sh.changed[r] == 0) {
      fprintf(stderr, "consumer: rank %d: the step left every weight unchanged\n", r);
      return 1;
    }
    printf("consumer: rank %d step OK, bytes_sent %llu\n", r, (unsigned long long)sh.bytes_sent[r]);
  }
  if (memcmp(sh.w_after[0], sh.w_after[1], sizeof sh.w_after[0]) != 0) {
    fprintf(stderr, "consumer: parameters differ between ranks after the step\n");
    return 1;
  }
  printf("consumer: OK\n");
  return 0;
}
