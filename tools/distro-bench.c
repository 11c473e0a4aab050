/* distro-bench: measured figures about the wire formats.
 *
 *   distro-bench bytes [--model gpt2|llama|both] [--topk LIST] [--peers N]
 *                      [--up MBIT] [--down MBIT] [--steps S] [--seed X]
 *                      [--table demo|outer|both] [--density LIST]
 *
 * For each model's shape set, builds a momentum the way the optimizer does
 * (a few steps of decay*m + g on gradients with low-rank structure plus
 * noise, in the DCT domain), selects each chunk's top-k and encodes the
 * selection with every wire variant; the table reports the encoded bytes,
 * not a formula. The reference format (int64 index + f32 value per kept
 * coefficient) has a fixed size and is counted.
 *
 * The outer table: one DiLoCo learner's outer payload per sync of the whole
 * model (one fragment): dense f32 and int4, and sparse (SparseLoCo) at each
 * density with 2-bit and 4-bit values, encoded from a synthetic pseudo-
 * gradient of the same structure (its first sync: e = delta). */
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/chunk.h"
#include "compress/dct.h"
#include "compress/index_codec.h"
#include "compress/outer_codec.h"
#include "compress/outer_sparse.h"
#include "compress/topk.h"
#include "compress/value_codec.h"
#include "compress/wire.h"
#include "compress/wire2.h"
#include "shapes.h"

#define MAX_TOPK 8
#define MAX_DENSITY 6

/* Wire variants of the table, in order. */
typedef enum { ROW_REF, ROW_V1_F32, ROW_U16_BF16, ROW_P12_BF16, ROW_ENT_BF16, ROW_ENT_INT4, ROW_ENT_SIGN1, NROWS } row_kind;
static const char *row_name[NROWS] = {"reference int64+f32", "v1 u16+f32",    "u16+bf16",    "12-bit+bf16",
                                      "entropy+bf16",        "entropy+int4", "entropy+1-bit"};

typedef struct {
  uint64_t bytes[NROWS];
  double encode_s, decode_s; /* entropy+1-bit and entropy+bf16 codecs, summed */
} tally;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* xorshift-based fill: cheap enough for a billion values. */
static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static float noise(uint64_t seed, int64_t i) { /* roughly N(0, 1): sum of 4 uniforms */
  uint64_t z = mix(seed + (uint64_t)i * 0x9e3779b97f4a7c15ULL);
  float s = 0;
  for (int q = 0; q < 4; q++) s += (float)((z >> (16 * q)) & 0xffff) * (1.0f / 65536.0f);
  return (s - 2.0f) * 1.7320508f;
}

/* A gradient: rank-4 structure (what makes real gradients compressible)
 * plus as much white noise. */
static void make_grad(float *g, int64_t rows, int64_t cols, uint64_t seed) {
  enum { R = 4 };
  float *u = malloc(sizeof(float) * (size_t)(rows * R)), *v = malloc(sizeof(float) * (size_t)(cols * R));
  for (int64_t i = 0; i < rows * R; i++) u[i] = noise(seed ^ 0x1111, i);
  for (int64_t i = 0; i < cols * R; i++) v[i] = noise(seed ^ 0x2222, i);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      float s = 0;
      for (int q = 0; q < R; q++) s += u[r * R + q] * v[c * R + q];
      g[r * cols + c] = 0.5f * s + noise(seed, r * cols + c);
    }
  free(u);
  free(v);
}

static size_t section_bytes_forced(const uint32_t *idx, const float *val, const distro__tiling *t,
                                   distro__idx_codec ic, distro_values v, int bf16_raw, uint8_t *buf, size_t cap) {
  /* The bit writer clears its whole buffer: give it what a section needs. */
  const size_t need = (size_t)(t->nchunks * t->k) * 4 + (size_t)t->nchunks * 4 + 64;
  if (need < cap) cap = need;
  size_t ib = distro__idx_encode(idx, t->nchunks, t->k, t->chunk_elems, NULL, ic, 0, buf, cap);
  int param = 0;
  distro__val_plan(v, val, t->nchunks, t->k, &param);
  if (bf16_raw) param = DISTRO__BF16_RAW;
  size_t vb = distro__val_encode(v, param, val, t->nchunks, t->k, buf, cap);
  return ib + vb;
}

/* Encodes one tensor's selection with every variant; adds to tally. */
static void encode_tensor(const distro__tiling *t, const distro__enum_table *et, const uint32_t *idx,
                          const float *val, uint8_t *buf, size_t cap, uint32_t *didx, float *dval, tally *tl) {
  const int64_t count = t->nchunks * t->k;
  tl->bytes[ROW_REF] += 12 * (uint64_t)count;
  /* v1: fixed-width indices and f32 values, as the v1 encoder lays them out. */
  distro__wire_layout l;
  distro__wire_layout_init(&l, t, 1, DISTRO_VALUES_F32);
  tl->bytes[ROW_V1_F32] += l.total - DISTRO__WIRE_HEADER - 4; /* per-tensor part; headers added once */
  distro__wire_layout_destroy(&l);
  tl->bytes[ROW_U16_BF16] +=
      DISTRO__WIRE2_DESC + section_bytes_forced(idx, val, t, DISTRO__IDX_FIXED, DISTRO_VALUES_BF16, 1, buf, cap);
  tl->bytes[ROW_P12_BF16] +=
      DISTRO__WIRE2_DESC + (t->chunk_elems <= 4096
                                ? section_bytes_forced(idx, val, t, DISTRO__IDX_PACK12, DISTRO_VALUES_BF16, 1, buf, cap)
                                : section_bytes_forced(idx, val, t, DISTRO__IDX_FIXED, DISTRO_VALUES_BF16, 1, buf, cap));
  /* Entropy rows: the real v2 encoder on a one-tensor payload, less its
   * header and CRC (added once per payload). */
  const distro_values ent[3] = {DISTRO_VALUES_BF16, DISTRO_VALUES_INT4, DISTRO_VALUES_SIGN1};
  const row_kind rows[3] = {ROW_ENT_BF16, ROW_ENT_INT4, ROW_ENT_SIGN1};
  distro__wire2_tensor w2 = {*t, et};
  uint32_t *ip[1] = {(uint32_t *)idx};
  float *vp[1] = {(float *)val};
  for (int e = 0; e < 3; e++) {
    double t0 = now();
    size_t n = distro__wire2_encode(buf, distro__wire2_bound(&w2, 1, ent[e]), &w2, 1, ent[e], 0, 0, ip, vp);
    double t1 = now();
    int ab;
    uint32_t why, tens;
    uint32_t *dip[1] = {didx};
    float *dvp[1] = {dval};
    distro_status st = distro__wire2_decode(buf, n, &w2, 1, ent[e], 0, &ab, &why, &tens, dip, dvp);
    double t2 = now();
    if (n == 0 || st != DISTRO_OK || memcmp(didx, idx, sizeof(uint32_t) * (size_t)count) != 0) {
      fprintf(stderr, "distro-bench: round trip failed (%s)\n", distro_last_error());
      exit(1);
    }
    tl->bytes[rows[e]] += n - DISTRO__WIRE_HEADER - 4;
    if (ent[e] != DISTRO_VALUES_INT4) {
      tl->encode_s += t1 - t0;
      tl->decode_s += t2 - t1;
    }
  }
}

typedef struct {
  const char *model;
  int peers;
  double up_mbit, down_mbit;
  int steps;
  uint64_t seed;
  int ntopk;
  int topk[MAX_TOPK];
  int demo, outer;   /* which tables */
  int ndensity;
  double density[MAX_DENSITY]; /* fractions */
} config;

static void run_model(const bench_model *m, const config *cfg) {
  const int64_t chunk = 64;
  tally tl[MAX_TOPK];
  memset(tl, 0, sizeof tl);
  int64_t max_numel = 0;
  for (int i = 0; i < m->ntensors; i++)
    if (m->t[i].numel > max_numel) max_numel = m->t[i].numel;
  float *g = malloc(sizeof(float) * (size_t)max_numel), *mom = malloc(sizeof(float) * (size_t)max_numel),
        *coef = malloc(sizeof(float) * (size_t)max_numel), *scr = malloc(sizeof(float) * (size_t)max_numel);
  uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)max_numel), *didx = malloc(sizeof(uint32_t) * (size_t)max_numel);
  float *val = malloc(sizeof(float) * (size_t)max_numel), *dval = malloc(sizeof(float) * (size_t)max_numel);
  size_t cap = 8 * (size_t)max_numel + 4096;
  uint8_t *buf = malloc(cap);
  if (!g || !mom || !coef || !scr || !idx || !didx || !val || !dval || !buf) {
    fprintf(stderr, "distro-bench: out of memory\n");
    exit(1);
  }
  double t_start = now();
  for (int i = 0; i < m->ntensors; i++) {
    const bench_tensor *bt = &m->t[i];
    distro__tiling t;
    distro__tiling_init(&t, bt->ndim, bt->shape, chunk, 1);
    distro__dct_plan plan;
    distro__dct_plan_init(&plan, &t, DISTRO__DCT_GEMM);
    /* Momentum in the DCT domain after a few steps of decay 0.999. */
    memset(mom, 0, sizeof(float) * (size_t)bt->numel);
    for (int s = 0; s < cfg->steps; s++) {
      make_grad(g, t.rows, t.cols, cfg->seed * 1000003ULL + (uint64_t)(i * 7919 + s));
      distro__dct_encode_tiles(&plan, g, coef, scr);
      for (int64_t j = 0; j < bt->numel; j++) mom[j] = 0.999f * mom[j] + coef[j];
    }
    for (int q = 0; q < cfg->ntopk; q++) {
      distro__tiling tk;
      distro__tiling_init(&tk, bt->ndim, bt->shape, chunk, cfg->topk[q]);
      distro__enum_table et;
      distro__enum_table_init(&et, tk.chunk_elems, tk.k);
      distro__topk_tiles(&tk, mom, idx, val);
      encode_tensor(&tk, et.c ? &et : NULL, idx, val, buf, cap, didx, dval, &tl[q]);
      distro__enum_table_destroy(&et);
    }
    distro__dct_plan_destroy(&plan);
  }
  /* Once per payload: header and CRC (v1 also has 24-byte descriptors,
   * counted per tensor above). */
  for (int q = 0; q < cfg->ntopk; q++)
    for (int r = ROW_V1_F32; r < NROWS; r++) tl[q].bytes[r] += DISTRO__WIRE_HEADER + 4;

  const double W = cfg->peers, N = (double)m->nparams;
  const double ring_fp32 = 2.0 * (W - 1) / W * 4.0 * N, ring_bf16 = ring_fp32 / 2;
  printf("\n== %s: %lld tensors, %.1f M parameters, chunk 64, %d peers, %.0f Mbit/s up / %.0f Mbit/s down ==\n",
         m->name, (long long)m->ntensors, N / 1e6, cfg->peers, cfg->up_mbit, cfg->down_mbit);
  printf("dense ring all-reduce per rank per step: fp32 %.1f MB, bf16 %.1f MB\n", ring_fp32 / 1e6, ring_bf16 / 1e6);
  printf("s/step = own payload uploaded once + the %d others' downloaded (a relay or tree all-gather)\n\n",
         cfg->peers - 1);
  printf("%5s  %-20s %14s %11s %11s %10s\n", "topk", "format", "bytes/rank", "x vs bf16", "x vs fp32", "s/step");
  for (int q = 0; q < cfg->ntopk; q++) {
    for (int r = 0; r < NROWS; r++) {
      double b = (double)tl[q].bytes[r];
      double secs = b * 8 / (cfg->up_mbit * 1e6) + (W - 1) * b * 8 / (cfg->down_mbit * 1e6);
      char k[16] = "";
      if (r == 0) snprintf(k, sizeof k, "%d", cfg->topk[q]);
      printf("%5s  %-20s %14llu %10.0fx %10.0fx %10.3f\n", k, row_name[r], (unsigned long long)tl[q].bytes[r],
             ring_bf16 / b, ring_fp32 / b, secs);
    }
    printf("       entropy codecs (bf16 + 1-bit): encode %.3f s, decode %.3f s per step, one payload\n\n",
           tl[q].encode_s, tl[q].decode_s);
  }
  printf("(%.1f s to build momenta and encode)\n", now() - t_start);
  free(g);
  free(mom);
  free(coef);
  free(scr);
  free(idx);
  free(didx);
  free(val);
  free(dval);
  free(buf);
}

/* One learner's outer payload per sync, P = 1 (every tensor one section,
 * chunk edge 64). The sparse rows are real encodes of each tensor's
 * selection, decoded again as a check; the per-payload header, descriptors
 * and CRC are added once. */
static void run_outer(const bench_model *m, const config *cfg) {
  enum { EDGE = 64 };
  const distro_values vals[2] = {DISTRO_VALUES_INT2, DISTRO_VALUES_INT4};
  uint64_t sparse[MAX_DENSITY][2] = {{0}};
  int64_t kept[MAX_DENSITY] = {0};
  int nsec = 0;
  int64_t max_numel = 0;
  for (int i = 0; i < m->ntensors; i++)
    if (m->t[i].numel > max_numel) max_numel = m->t[i].numel;
  float *g = malloc(sizeof(float) * (size_t)max_numel), *val = malloc(sizeof(float) * (size_t)max_numel);
  float *dval = malloc(sizeof(float) * (size_t)max_numel);
  uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)max_numel), *didx = malloc(sizeof(uint32_t) * (size_t)max_numel);
  const size_t cap = 8 * (size_t)max_numel + 4096;
  uint8_t *buf = malloc(cap);
  if (!g || !val || !dval || !idx || !didx || !buf) {
    fprintf(stderr, "distro-bench: out of memory\n");
    exit(1);
  }
  const double t_start = now();
  uint64_t dense_f32 = DISTRO__DLC_HEADER + 4, dense_int4 = DISTRO__DLC_HEADER + 4;
  for (int i = 0; i < m->ntensors; i++) {
    const bench_tensor *bt = &m->t[i];
    dense_f32 += distro__outer_bytes(DISTRO_OUTER_F32, bt->numel, 64);
    dense_int4 += distro__outer_bytes(DISTRO_OUTER_INT4, bt->numel, 64);
    const int64_t rows = bt->ndim == 2 ? bt->shape[0] : 1, cols = bt->ndim == 2 ? bt->shape[1] : bt->shape[0];
    make_grad(g, rows, cols, cfg->seed * 7777ULL + (uint64_t)i);
    for (int q = 0; q < cfg->ndensity; q++) {
      distro__tiling t[2];
      int matrix;
      const int nv = distro__sparse_views(bt->ndim, bt->shape, 0, bt->numel, EDGE, cfg->density[q], t, &matrix);
      if (q == 0) nsec += nv;
      int64_t elem = 0;
      for (int v = 0; v < nv; v++) {
        distro__enum_table et;
        distro__enum_table_init(&et, t[v].chunk_elems, t[v].k);
        distro__sparse_section s = {0, t[v].rows * t[v].cols, 0, t[v], 0, et.c ? &et : NULL, 0};
        const int64_t nsel = distro__sparse_layout(&s, 1);
        distro__topk_tiles(&t[v], g + elem, idx, val);
        kept[q] += nsel;
        for (int c = 0; c < 2; c++) {
          distro__sparse_head h = {{DISTRO__SPARSE_VERSION, (unsigned)vals[c], 0, 0, 1, 0, 0, (uint64_t)s.count, 0, EDGE},
                                   (float)cfg->density[q]};
          const size_t n = distro__sparse_encode(buf, cap, &s, 1, &h, idx, val);
          distro__dlc_head got;
          int bad;
          if (n == 0 || distro__sparse_decode(buf, n, 0, &s, 1, &h, &got, &bad, didx, dval) != DISTRO_OK ||
              memcmp(didx, idx, sizeof(uint32_t) * (size_t)nsel) != 0) {
            fprintf(stderr, "distro-bench: sparse round trip failed (%s)\n", distro_last_error());
            exit(1);
          }
          sparse[q][c] += n - DISTRO__SPARSE_HEADER - 4; /* descriptor and sections */
        }
        distro__enum_table_destroy(&et);
        elem += s.count;
      }
    }
  }
  printf("\n== %s: one learner's outer payload per sync (whole model, 1 fragment), sparse chunks %dx%d ==\n", m->name,
         EDGE, EDGE);
  printf("%-26s %14s %12s %10s %12s\n", "format", "bytes", "x vs f32", "% of f32", "bits/kept");
  printf("%-26s %14llu %11.1fx %9.3f%% %12s\n", "dense f32", (unsigned long long)dense_f32, 1.0, 100.0, "-");
  printf("%-26s %14llu %11.1fx %9.3f%% %12s\n", "dense int4 (block 64)", (unsigned long long)dense_int4,
         (double)dense_f32 / dense_int4, 100.0 * dense_int4 / dense_f32, "-");
  for (int q = 0; q < cfg->ndensity; q++)
    for (int c = 0; c < 2; c++) {
      const uint64_t b = sparse[q][c] + DISTRO__SPARSE_HEADER + 4;
      char name[64];
      snprintf(name, sizeof name, "sparse %g%% %s", 100 * cfg->density[q], c ? "int4" : "int2 (2-bit)");
      printf("%-26s %14llu %11.1fx %9.3f%% %12.2f\n", name, (unsigned long long)b, (double)dense_f32 / b,
             100.0 * b / dense_f32, 8.0 * b / (double)kept[q]);
    }
  printf("(%d sections; sparse sizes are real encodes of a synthetic pseudo-gradient, rank-4 structure plus as much\n"
         "noise, with each section's smallest index codec; %.1f s)\n", nsec, now() - t_start);
  free(g);
  free(val);
  free(dval);
  free(idx);
  free(didx);
  free(buf);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: distro-bench bytes [--model gpt2|llama|both] [--topk 1,4,8,32] [--peers 32]\n"
          "                          [--up 10] [--down 100] [--steps 3] [--seed 1]\n"
          "                          [--table demo|outer|both] [--density 1,2,3 (percent)]\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "bytes") != 0) {
    usage(argc >= 2 && !strcmp(argv[1], "--help") ? stdout : stderr);
    return argc >= 2 && !strcmp(argv[1], "--help") ? 0 : 2;
  }
  config cfg = {"both", 32, 10, 100, 3, 1, 4, {1, 4, 8, 32}, 1, 1, 3, {0.01, 0.02, 0.03}};
  static const struct option opts[] = {{"model", 1, 0, 'm'}, {"topk", 1, 0, 'k'},    {"peers", 1, 0, 'p'},
                                       {"up", 1, 0, 'u'},    {"down", 1, 0, 'd'},    {"steps", 1, 0, 's'},
                                       {"seed", 1, 0, 'x'},  {"table", 1, 0, 't'},   {"density", 1, 0, 'D'},
                                       {"help", 0, 0, 'h'},  {0, 0, 0, 0}};
  optind = 2;
  int c;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (c) {
      case 'm': cfg.model = optarg; break;
      case 'k': {
        cfg.ntopk = 0;
        for (char *tok = strtok(optarg, ","); tok && cfg.ntopk < MAX_TOPK; tok = strtok(NULL, ","))
          cfg.topk[cfg.ntopk++] = atoi(tok);
        break;
      }
      case 'p': cfg.peers = atoi(optarg); break;
      case 'u': cfg.up_mbit = atof(optarg); break;
      case 'd': cfg.down_mbit = atof(optarg); break;
      case 's': cfg.steps = atoi(optarg); break;
      case 'x': cfg.seed = strtoull(optarg, NULL, 0); break;
      case 't':
        cfg.demo = !strcmp(optarg, "demo") || !strcmp(optarg, "both");
        cfg.outer = !strcmp(optarg, "outer") || !strcmp(optarg, "both");
        if (!cfg.demo && !cfg.outer) {
          fprintf(stderr, "distro-bench: --table is demo, outer or both\n");
          return 2;
        }
        break;
      case 'D': {
        cfg.ndensity = 0;
        for (char *tok = strtok(optarg, ","); tok && cfg.ndensity < MAX_DENSITY; tok = strtok(NULL, ",")) {
          const double pct = atof(tok);
          if (!(pct > 0 && pct <= 100)) {
            fprintf(stderr, "distro-bench: --density values are percentages in (0, 100]\n");
            return 2;
          }
          cfg.density[cfg.ndensity++] = pct / 100;
        }
        break;
      }
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  for (int q = 0; q < cfg.ntopk; q++)
    if (cfg.topk[q] < 1) {
      fprintf(stderr, "distro-bench: --topk values must be >= 1\n");
      return 2;
    }
  if (cfg.peers < 2 || cfg.up_mbit <= 0 || cfg.down_mbit <= 0 || cfg.steps < 1 || cfg.ntopk == 0 ||
      cfg.ndensity == 0) {
    fprintf(stderr, "distro-bench: --peers >= 2, --up/--down > 0, --steps >= 1, at least one --topk and --density\n");
    return 2;
  }
  int gpt = !strcmp(cfg.model, "gpt2") || !strcmp(cfg.model, "both");
  int llama = !strcmp(cfg.model, "llama") || !strcmp(cfg.model, "both");
  if (!gpt && !llama) {
    fprintf(stderr, "distro-bench: unknown --model '%s' (gpt2, llama or both)\n", cfg.model);
    return 2;
  }
  bench_model m;
  if (gpt) {
    if (bench_model_gpt2_124m(&m, 0)) return 1;
    if (cfg.demo) run_model(&m, &cfg);
    if (cfg.outer) run_outer(&m, &cfg);
    bench_model_free(&m);
  }
  if (llama) {
    if (bench_model_llama_1b2(&m, 0)) return 1;
    if (cfg.demo) run_model(&m, &cfg);
    if (cfg.outer) run_outer(&m, &cfg);
    bench_model_free(&m);
  }
  return 0;
}
