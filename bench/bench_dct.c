/* Chunked DCT encode + decode throughput for each method (OpenBLAS GEMM,
 * FFTW, naive loops) on the 1.2B model's matrix shapes, next to a memcpy
 * bandwidth floor measured in the same run. Prints figures; asserts nothing
 * about time.
 *
 *   bench_dct [--threads T] [--chunk C] [--rows-max R] [--naive-rows R] [--min-time S]
 *             [--shape RxC]...   (replaces the default shapes; repeatable)
 *
 * Times are the best call of those in --min-time seconds (default 1).
 *
 * Traffic model: encode reads x and writes coef, decode reads coef and
 * writes x, so a pass that only moved the data would touch 16 bytes per
 * parameter; "floor" is that traffic at the measured memcpy bandwidth. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

#include <cblas.h>

#include "compress/chunk.h"
#include "compress/dct.h"

static const char *method_name[] = {"GEMM", "FFTW", "naive", "fast"};
#define NMETHODS 4

typedef struct result {
  int ok;
  int64_t rows, cols;
  double enc, dec; /* seconds per call, best of several */
  double err;      /* max |decode(encode(x)) - x| */
} result;

static result run(int64_t rows, int64_t cols, int64_t chunk, distro__dct_method m, double min_time, float *x,
                  float *coef, float *y, float *scratch) {
  result r = {0};
  r.rows = rows;
  r.cols = cols;
  int64_t shape[2] = {rows, cols};
  distro__tiling t;
  distro__dct_plan p;
  if (distro__tiling_init(&t, 2, shape, chunk, 32) != DISTRO_OK) return r;
  if (distro__dct_plan_init(&p, &t, m) != DISTRO_OK) return r;
  /* One untimed call each (warm-up, round-trip check); it is the measurement
   * only when already slower than 3x the minimum time (the naive method). */
  double t0 = bench_now();
  distro__dct_encode_tiles(&p, x, coef, scratch);
  double first_enc = bench_now() - t0;
  t0 = bench_now();
  distro__dct_decode_tiles(&p, coef, y, scratch);
  double first_dec = bench_now() - t0;
  int64_t n = rows * cols;
  double err = 0;
  for (int64_t i = 0; i < n; i++) err = fmax(err, fabs((double)y[i] - x[i]));
  r.err = err;
  if (first_enc + first_dec > 3 * min_time) {
    r.enc = first_enc;
    r.dec = first_dec;
  } else {
    /* Best call of several: other work on a shared machine only ever adds
     * time, so the minimum is the steadiest figure. */
    double spent = 0;
    r.enc = r.dec = 1e30;
    for (int reps = 0; spent < min_time || reps < 3; reps++) {
      t0 = bench_now();
      distro__dct_encode_tiles(&p, x, coef, scratch);
      double te = bench_now() - t0;
      t0 = bench_now();
      distro__dct_decode_tiles(&p, coef, y, scratch);
      double td = bench_now() - t0;
      r.enc = fmin(r.enc, te);
      r.dec = fmin(r.dec, td);
      spent += te + td;
    }
  }
  distro__dct_plan_destroy(&p);
  r.ok = 1;
  return r;
}

int main(int argc, char **argv) {
  int threads = 0;
  int64_t chunk = 64, rows_max = 32000, naive_rows = 1024;
  double min_time = 1.0;
  /* Default: the 1.2B model's attention, MLP and embedding/head matrices. */
  int64_t shapes[16][2] = {{2048, 2048}, {8192, 2048}, {32000, 2048}};
  int nshapes = 3, user_shapes = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--rows-max") && i + 1 < argc) rows_max = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--naive-rows") && i + 1 < argc) naive_rows = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--min-time") && i + 1 < argc) min_time = atof(argv[++i]);
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc && user_shapes < 16) {
      long long r = 0, c = 0;
      if (sscanf(argv[++i], "%lldx%lld", &r, &c) != 2 || r < 1 || c < 1) {
        fprintf(stderr, "bench_dct: --shape wants RxC, got '%s'\n", argv[i]);
        return 2;
      }
      shapes[user_shapes][0] = r;
      shapes[user_shapes][1] = c;
      nshapes = ++user_shapes;
    }
    else {
      fprintf(stderr,
              "usage: %s [--threads T] [--chunk C] [--rows-max R] [--naive-rows R] [--min-time S] [--shape RxC]...\n"
              "  --rows-max   cap on the rows of every shape (default 32000)\n"
              "  --naive-rows cap on the rows for the naive method, which is slow (default 1024)\n",
              argv[0]);
      return 2;
    }
  }
  /* OpenBLAS runs its own thread pool; give it the same count. */
  if (threads > 0) {
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
  }
  if (chunk < 1 || rows_max < 1 || naive_rows < 1) {
    fprintf(stderr, "bench_dct: sizes must be >= 1\n");
    return 2;
  }

  int64_t maxn = 0;
  for (int s = 0; s < nshapes; s++) {
    int64_t r = shapes[s][0] < rows_max ? shapes[s][0] : rows_max;
    if (r * shapes[s][1] > maxn) maxn = r * shapes[s][1];
  }
  float *x = bench_alloc("bench_dct", (size_t)maxn * 4), *coef = bench_alloc("bench_dct", (size_t)maxn * 4);
  float *y = bench_alloc("bench_dct", (size_t)maxn * 4), *scratch = bench_alloc("bench_dct", (size_t)maxn * 4);
  uint64_t st = 0x9e3779b97f4a7c15ull;
  for (int64_t i = 0; i < maxn; i++) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((double)(st >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
  }
  memset(coef, 0, (size_t)maxn * 4);
  memset(y, 0, (size_t)maxn * 4);
  memset(scratch, 0, (size_t)maxn * 4);

  double bw = bench_copy_gbs("bench_dct", (size_t)1 << 30);
  printf("bench_dct: chunk %lld, %d OpenMP threads, %d OpenBLAS threads, min time %.2f s per measurement\n",
         (long long)chunk, omp_get_max_threads(), openblas_get_num_threads(), min_time);
  printf("memcpy floor: %.2f GB/s (1 GiB copy, bytes read + written, best of 5)\n\n", bw);
  printf("%-13s %-6s %7s %10s %10s %10s %11s %9s %10s\n", "shape", "method", "rows", "enc ms", "dec ms",
         "GB/s", "Mparam/s", "x floor", "max err");

  double tot[NMETHODS] = {0}; /* seconds per parameter, summed over shapes */
  int have[NMETHODS] = {1, 1, 1, 1};
  for (int s = 0; s < nshapes; s++) {
    char sh[48];
    snprintf(sh, sizeof sh, "%lldx%lld", (long long)shapes[s][0], (long long)shapes[s][1]);
    int best = -1;
    double best_pp = 1e30;
    for (int m = 0; m < NMETHODS; m++) {
      int64_t rows = shapes[s][0] < rows_max ? shapes[s][0] : rows_max;
      if (m == DISTRO__DCT_NAIVE && rows > naive_rows) rows = naive_rows;
      result r = run(rows, shapes[s][1], chunk, (distro__dct_method)m, min_time, x, coef, y, scratch);
      if (!r.ok) {
        printf("%-13s %-6s %7s   unavailable (%s)\n", sh, method_name[m], "-", distro_last_error());
        have[m] = 0;
        continue;
      }
      double n = (double)r.rows * r.cols, t = r.enc + r.dec;
      double gbs = 16.0 * n / t / 1e9;
      printf("%-13s %-6s %7lld %10.3f %10.3f %10.2f %11.1f %9.1f %10.2e\n", sh, method_name[m], (long long)r.rows,
             r.enc * 1e3, r.dec * 1e3, gbs, n / t / 1e6, bw / gbs, r.err);
      tot[m] += t / n;
      if (t / n < best_pp) {
        best_pp = t / n;
        best = m;
      }
    }
    if (best >= 0) printf("%-13s fastest: %s\n", sh, method_name[best]);
  }
  int best = -1;
  for (int m = 0; m < NMETHODS; m++)
    if (have[m] && (best < 0 || tot[m] < tot[best])) best = m;
  double bw_end = bench_copy_gbs("bench_dct", (size_t)1 << 30);
  printf("\nmemcpy again at the end: %.2f GB/s (well below the first figure means other work shared the machine)\n",
         bw_end);
  printf("GB/s = 16 bytes per parameter (encode + decode each read and write one float) / time;\n"
         "x floor = memcpy GB/s / that GB/s, the slowdown against a pure copy of the same bytes.\n");
  if (best >= 0) {
    printf("fastest overall (time per parameter summed over shapes): %s", method_name[best]);
    for (int m = 0; m < NMETHODS; m++)
      if (m != best && have[m]) printf(", %.2fx faster than %s", tot[m] / tot[best], method_name[m]);
    printf("\n");
  }
  free(x);
  free(coef);
  free(y);
  free(scratch);
  return 0;
}
