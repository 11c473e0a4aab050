/* bench_payload_spread: wire v2 payloads differ in size across ranks, so the
 * exchange is either "sizes first, then a variable-size gather" (one extra
 * small round trip) or "pad every payload to the largest" (extra bytes).
 * This measures the spread of real payload sizes over ranks and steps and
 * prints what padding would cost against the round trip it saves. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>

#include "shapes.h"

#define WORLD 4
#define STEPS 4

typedef struct {
  const bench_model *m;
  distro_values values;
  int topk;
  uint64_t sent[STEPS][WORLD];
} run;

static float frand(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return (float)((*s >> 11) & 0xffffff) / 16777216.0f - 0.5f;
}

static distro_status rank_fn(distro_comm *comm, int rank, void *arg) {
  run *r = arg;
  const bench_model *m = r->m;
  float *p = calloc((size_t)m->nparams, sizeof(float)), *g = malloc(sizeof(float) * (size_t)m->nparams);
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.topk = r->topk;
  o.values = r->values;
  distro_optim *opt = NULL;
  distro_status st = p && g ? distro_optim_create(&o, comm, &opt) : DISTRO_ERR_NOMEM;
  for (int i = 0; i < m->ntensors && st == DISTRO_OK; i++)
    st = distro_optim_add_param(opt, m->t[i].name, p + m->t[i].offset, g + m->t[i].offset, m->t[i].ndim,
                                m->t[i].shape);
  uint64_t seed = 0x9e3779b97f4a7c15ULL * (uint64_t)(rank + 1);
  for (int s = 0; s < STEPS && st == DISTRO_OK; s++) {
    for (int64_t j = 0; j < m->nparams; j++) g[j] = frand(&seed);
    distro_step_stats stats;
    st = distro_optim_step(opt, 1e-3f, &stats);
    r->sent[s][rank] = stats.bytes_sent;
  }
  distro_optim_free(opt);
  free(p);
  free(g);
  return st;
}

int main(void) {
  bench_model m;
  if (bench_model_gpt2_124m(&m, 2)) return 1;
  bench_model_print(&m, stdout);
  printf("%d in-process ranks, %d steps, uniform random gradients\n\n", WORLD, STEPS);
  printf("%-6s %5s %12s %12s %12s %10s %12s %12s\n", "values", "topk", "mean bytes", "min", "max", "spread", "pad bytes",
         "bound");
  const distro_values vals[3] = {DISTRO_VALUES_BF16, DISTRO_VALUES_INT4, DISTRO_VALUES_SIGN1};
  const char *names[3] = {"bf16", "int4", "sign1"};
  const int topks[2] = {4, 32};
  for (int v = 0; v < 3; v++)
    for (int q = 0; q < 2; q++) {
      run r = {&m, vals[v], topks[q], {{0}}};
      if (distro_comm_run_local(WORLD, rank_fn, &r) != DISTRO_OK) {
        fprintf(stderr, "bench_payload_spread: %s\n", distro_last_error());
        return 1;
      }
      double sum = 0, mn = INFINITY, mx = 0, pad = 0;
      for (int s = 0; s < STEPS; s++) {
        double smax = 0;
        for (int w = 0; w < WORLD; w++) smax = fmax(smax, (double)r.sent[s][w]);
        for (int w = 0; w < WORLD; w++) {
          double b = (double)r.sent[s][w];
          sum += b;
          mn = fmin(mn, b);
          mx = fmax(mx, b);
          pad += smax - b;
        }
      }
      double mean = sum / (STEPS * WORLD);
      distro_options o = distro_options_default(DISTRO_ALG_DEMO);
      o.topk = topks[q];
      o.values = vals[v];
      uint64_t bound = 0;
      distro_payload_bytes(&o, m.ntensors, m.ndims, m.shapes, &bound);
      printf("%-6s %5d %12.0f %12.0f %12.0f %9.3f%% %12.0f %12llu\n", names[v], topks[q], mean, mn, mx,
             100.0 * (mx - mn) / mean, pad / (STEPS * WORLD), (unsigned long long)bound);
    }
  printf("\nspread: (max - min) / mean over all ranks and steps; pad bytes: what padding to the\n"
         "step's largest payload adds per rank per step (finding that largest needs a round trip\n"
         "too); bound: the fixed size every payload would have if padded to the worst case.\n"
         "The library exchanges sizes first (one 8-byte all-gather), then exactly the payloads.\n");
  bench_model_free(&m);
  return 0;
}
