/* Step time of distro_optim_step on the 1.2B Llama-2 shape set (CPU, one
 * in-process rank), split into transform, top-k, exchange and decode from
 * the step stats, next to a memory-bandwidth floor measured in the same run.
 * Prints figures; asserts nothing about time.
 *
 *   bench_step [--layers N] [--algo demo|adamw] [--update sign|adamw]
 *              [--values f32|bf16|sign1|int8|int4] [--topk K] [--chunk C] [--threads T]
 *              [--steps S] [--warmup W] [--model llama|gpt2] [--wire 1|2]
 *              [--overlap off|lookahead|stale]
 *
 * --overlap times the overlapped step (options.overlap; with one in-process
 * rank the exchange in the background is instant, so the figure is the
 * step's own compute: look-ahead adds an inverse DCT of the rank's whole
 * momentum and the agreed copy of the parameters). bench/overlap-cost.sh
 * runs every mode against the installed library.
 * The cost of the compact wire format (v2: entropy-coded indices, coded
 * values) is the difference between --wire 2 and --wire 1 (fixed-width u16
 * indices, raw values) in the top-k phase (which includes the encoding) and
 * the decode phase.
 *
 * Memory: params and grads are 4 bytes per parameter each and the optimizer
 * keeps its own state (two momentum buffers for DeMo sign; Adam moments as
 * well for the AdamW variants), so the full 1.2B set needs about 16-24 bytes
 * per parameter, 20-30 GB. Without --layers the benchmark keeps as many of
 * the 16 blocks as fit in 90% of MemAvailable by that estimate (all 16 for
 * DeMo sign on a 24 GiB machine, fewer for the AdamW variants) and says so;
 * embeddings and head stay whole.
 *
 * The first two steps are warm-up by default: they fault in the momentum
 * buffers (the library allocates lazily), which costs more than the step. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

#include <distro/distro.h>

#include "shapes.h"

/* Value of a /proc file's "Key:  N kB" line, in bytes; -1 if absent. */
static int64_t proc_kb(const char *path, const char *key) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[256];
  int64_t v = -1;
  size_t kl = strlen(key);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, key, kl) && line[kl] == ':') {
      v = atoll(line + kl + 1) * 1024;
      break;
    }
  fclose(f);
  return v;
}

/* Uniform in [-scale, scale), from a hash of (seed, i): parallel and
 * deterministic. */
static void fill(float *p, int64_t n, uint64_t seed, float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull + seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    p[i] = scale * (float)((double)(z >> 40) / (double)(1ull << 23) - 1.0);
  }
}

/* 1-minute load average: other work on the machine shows up in the timings. */
static double loadavg(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1) l = -1;
    fclose(f);
  }
  return l;
}

static int die(const char *what, distro_status s) {
  fprintf(stderr, "bench_step: %s: %s: %s\n", what, distro_status_string(s), distro_last_error());
  return 1;
}

int main(int argc, char **argv) {
  int layers = -1, threads = 0, steps = 3, warmup = 2, topk = -1, chunk = -1, wire = 0;
  const char *algo = "demo", *update = NULL, *values = NULL, *model = "llama", *overlap = "off";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) goto usage;
    if (!strcmp(a, "--layers")) layers = atoi(v);
    else if (!strcmp(a, "--algo")) algo = v;
    else if (!strcmp(a, "--update")) update = v;
    else if (!strcmp(a, "--values")) values = v;
    else if (!strcmp(a, "--topk")) topk = atoi(v);
    else if (!strcmp(a, "--chunk")) chunk = atoi(v);
    else if (!strcmp(a, "--threads")) threads = atoi(v);
    else if (!strcmp(a, "--steps")) steps = atoi(v);
    else if (!strcmp(a, "--warmup")) warmup = atoi(v);
    else if (!strcmp(a, "--model")) model = v;
    else if (!strcmp(a, "--wire")) wire = atoi(v);
    else if (!strcmp(a, "--overlap")) overlap = v;
    else goto usage;
    i++;
  }
  if (steps < 1 || warmup < 0) goto usage;

  distro_options o;
  if (!strcmp(algo, "demo")) o = distro_options_default(DISTRO_ALG_DEMO);
  else if (!strcmp(algo, "adamw")) o = distro_options_default(DISTRO_ALG_ADAMW);
  else goto usage;
  if (update) {
    if (!strcmp(update, "sign")) o.update = DISTRO_UPDATE_SIGN;
    else if (!strcmp(update, "adamw")) o.update = DISTRO_UPDATE_ADAMW;
    else goto usage;
  }
  if (values) {
    if (!strcmp(values, "f32")) o.values = DISTRO_VALUES_F32;
    else if (!strcmp(values, "bf16")) o.values = DISTRO_VALUES_BF16;
    else if (!strcmp(values, "sign1")) o.values = DISTRO_VALUES_SIGN1;
    else if (!strcmp(values, "int8")) o.values = DISTRO_VALUES_INT8;
    else if (!strcmp(values, "int4")) o.values = DISTRO_VALUES_INT4;
    else goto usage;
  }
  if (wire == 1 || wire == 2) o.wire_version = wire;
  else if (wire) goto usage;
  if (!strcmp(overlap, "lookahead")) o.overlap = DISTRO_OVERLAP_LOOKAHEAD;
  else if (!strcmp(overlap, "stale")) o.overlap = DISTRO_OVERLAP_STALE;
  else if (strcmp(overlap, "off")) goto usage;
  if (topk > 0) o.topk = topk;
  if (chunk > 0) o.chunk = chunk;
  int is_llama = !strcmp(model, "llama");
  if (!is_llama && strcmp(model, "gpt2")) goto usage;
  if (threads > 0) omp_set_num_threads(threads);

  /* Parameter-sized state buffers: `state` is what the algorithm itself must
   * read and write each step (momentum; Adam moments), used for the floor;
   * `held` is what the library keeps (it double-buffers the momentum so a
   * failed step changes nothing), used for the memory estimate. */
  int state, held;
  if (o.algorithm == DISTRO_ALG_ADAMW) state = 2, held = 3;       /* m, v (+ reduce buffer) */
  else if (o.update == DISTRO_UPDATE_ADAMW) state = 2, held = 3;  /* momentum, v */
  else state = 1, held = 2;                                       /* momentum */
  if (o.overlap == DISTRO_OVERLAP_LOOKAHEAD) state++, held++; /* the agreed copy of the parameters */
  if (o.overlap && o.update == DISTRO_UPDATE_ADAMW) held++;     /* the staged v */
  int full = is_llama ? 16 : 12;
  int64_t avail = proc_kb("/proc/meminfo", "MemAvailable");
  /* Estimate: params + grads + held state, 5% slack, and scratch for the
   * largest tensor (the 32000x2048 embedding/head, or GPT-2's wte). */
  const double big = is_llama ? 32000.0 * 2048 : 50257.0 * 768;
#define EST(L) (4.0 * (double)(is_llama ? bench_llama_params(L) : bench_gpt2_params(L)) * (2 + held) * 1.05 + 16.0 * big)
  int cut = 0;
  if (layers <= 0) {
    layers = full;
    while (avail > 0 && layers > 1 && EST(layers) > 0.9 * (double)avail) layers--;
    cut = layers < full;
  }
  double est = EST(layers);
#undef EST
  bench_model m;
  if ((is_llama ? bench_model_llama_1b2(&m, layers) : bench_model_gpt2_124m(&m, layers)) != 0) {
    fprintf(stderr, "bench_step: out of memory building shapes\n");
    return 1;
  }
  const int64_t N = m.nparams;

  printf("bench_step: ");
  bench_model_print(&m, stdout);
  static const char *const vname[] = {"f32", "bf16", "sign1", "int8", "int4"};
  printf("  algorithm %s, update %s, values %s, wire v%d, chunk %d, topk %d, %d OpenMP threads, overlap %s, world 1 "
         "(in-process)\n",
         o.algorithm == DISTRO_ALG_ADAMW ? "AdamW all-reduce" : "DeMo",
         o.algorithm == DISTRO_ALG_ADAMW ? "-" : (o.update == DISTRO_UPDATE_SIGN ? "sign" : "adamw"),
         o.algorithm == DISTRO_ALG_ADAMW ? "-" : vname[o.values], o.wire_version, o.chunk, o.topk,
         omp_get_max_threads(), overlap);
  printf("  load average %.2f on %d CPUs at start\n", loadavg(), omp_get_num_procs());
  printf("  memory estimate %.1f GB (params, grads, %d state buffers, slack) of %.1f GB available%s\n", est / 1e9,
         held, avail / 1e9, cut ? " -> fewer blocks (set --layers to override)" : "");

  /* Floor, measured while memory is free: 1 GiB copy, now and again after
   * the steps; the higher figure counts (other work only lowers it). */
  double bw0 = bench_copy_gbs("bench_step", (size_t)1 << 30);
  /* The copy's 2 GiB would otherwise be the peak resident memory reported
   * below for a small model: reset the peak (Linux; best effort). */
  FILE *cr = fopen("/proc/self/clear_refs", "w");
  if (cr) {
    fputs("5", cr);
    fclose(cr);
  }

  float *params = bench_alloc("bench_step", (size_t)N * 4), *grads = bench_alloc("bench_step", (size_t)N * 4);
  double t0 = bench_now();
  fill(params, N, 1, 0.02f);
  fill(grads, N, 2, 1e-2f);
  printf("  filled params and grads (%.1f GB) in %.1f s\n", 8.0 * N / 1e9, bench_now() - t0);

  distro_comm *comm = NULL;
  distro_optim *opt = NULL;
  distro_status s = distro_comm_local_group(1, &comm);
  if (s != DISTRO_OK) return die("comm", s);
  s = distro_optim_create(&o, comm, &opt);
  if (s != DISTRO_OK) return die("create", s);
  for (int i = 0; i < m.ntensors; i++) {
    bench_tensor *t = &m.t[i];
    s = distro_optim_add_param(opt, t->name, params + t->offset, grads + t->offset, t->ndim, t->shape);
    if (s != DISTRO_OK) return die(t->name, s);
  }
  uint64_t payload = 0;
  s = distro_optim_payload_bytes(opt, &payload);
  if (s != DISTRO_OK) return die("payload_bytes", s);

  distro_step_stats st, sum;
  memset(&sum, 0, sizeof sum);
  double wall = 0, best = 1e30;
  for (int i = 0; i < warmup + steps; i++) {
    memset(&st, 0, sizeof st);
    t0 = bench_now();
    s = distro_optim_step(opt, o.lr, &st);
    double dt = bench_now() - t0;
    if (s != DISTRO_OK) return die("step", s);
    printf("  step %d%s: %.3f s\n", i + 1, i < warmup ? " (warm-up)" : "", dt);
    fflush(stdout);
    if (i < warmup) continue;
    wall += dt;
    if (dt < best) best = dt;
    sum.seconds_transform += st.seconds_transform;
    sum.seconds_topk += st.seconds_topk;
    sum.seconds_exchange += st.seconds_exchange;
    sum.seconds_decode += st.seconds_decode;
    sum.seconds_total += st.seconds_total;
    sum.seconds_codec += st.seconds_codec;
    sum.bytes_sent += st.bytes_sent;
  }

  double n = steps;
  double tr = sum.seconds_transform / n, tk = sum.seconds_topk / n, ex = sum.seconds_exchange / n;
  double de = sum.seconds_decode / n, tot = sum.seconds_total / n, w = wall / n;
  double other = tot - tr - tk - ex - de;
  printf("\nper step, mean of %d after %d warm-up (%lld parameters)\n", steps, warmup, (long long)N);
  printf("  %-22s %10s %8s %14s\n", "phase", "seconds", "share", "Mparams/s");
  const char *names[] = {"transform (DCT)", "top-k + encode", "exchange", "decode + update", "other", "total (stats)"};
  double vals[] = {tr, tk, ex, de, other, tot};
  for (int i = 0; i < 6; i++)
    printf("  %-22s %10.3f %7.1f%% %14.1f\n", names[i], vals[i], tot > 0 ? 100.0 * vals[i] / tot : 0.0,
           vals[i] > 0 ? N / vals[i] / 1e6 : 0.0);
  printf("  %-22s %10.3f %7.1f%%   (wire encode + validate/decode, inside the two phases above)\n",
         "of which wire codec", sum.seconds_codec / n, tot > 0 ? 100.0 * sum.seconds_codec / n / tot : 0.0);
  printf("  %-22s %10.3f %8s %14.1f\n", "wall (around step)", w, "", N / w / 1e6);
  printf("  %-22s %10.3f %8s %14.1f\n", "wall, best step", best, "", N / best / 1e6);

  s = distro_optim_flush(opt, NULL);
  if (s != DISTRO_OK) return die("flush", s);
  int64_t hwm = proc_kb("/proc/self/status", "VmHWM");
  distro_optim_free(opt);
  distro_comm_free(comm);
  free(params);
  free(grads);
  double bw1 = bench_copy_gbs("bench_step", (size_t)1 << 30), bw = bw0 > bw1 ? bw0 : bw1;

  /* Floor: one pass that reads params, grads and the state and writes params
   * and the state back, at the measured copy bandwidth. */
  double floor_bytes = 4.0 * N * (3 + 2 * state);
  double floor_t = floor_bytes / (bw * 1e9);
  printf("\nmemory floor: memcpy %.2f GB/s (1 GiB, bytes read + written, best of 5; %.2f before, %.2f after)\n",
         bw, bw0, bw1);
  printf("  one pass: read params, grads, %d state buffer%s; write params, state = %.0f B/param = %.2f GB -> %.3f s\n",
         state, state > 1 ? "s" : "", floor_bytes / N, floor_bytes / 1e9, floor_t);
  printf("  step / floor = %.1fx mean, %.1fx best step (%.3f s, %.3f s vs %.3f s)\n", w / floor_t, best / floor_t,
         w, best, floor_t);
  printf("\nbytes sent per rank per step: %.2f MB (step stats, mean); bound %.2f MB (distro_optim_payload_bytes)\n",
         (double)(sum.bytes_sent / (uint64_t)steps) / 1e6, payload / 1e6);
  printf("load average %.2f at the end (above the thread count means other work shared the CPUs)\n", loadavg());
  printf("peak resident memory: %.2f GB (%.1f B/param incl. params and grads)\n", hwm / 1e9, (double)hwm / N);

  bench_model_free(&m);
  return 0;

usage:
  fprintf(stderr,
          "usage: %s [--layers N] [--algo demo|adamw] [--update sign|adamw] [--values f32|bf16|sign1|int8|int4]\n"
          "          [--topk K] [--chunk C] [--threads T] [--steps S] [--warmup W] [--model llama|gpt2]\n"
          "          [--wire 1|2] [--overlap off|lookahead|stale]\n"
          "  --layers N  transformer blocks to keep (default: as many of the model's as fit in memory)\n",
          argv[0]);
  return 2;
}
