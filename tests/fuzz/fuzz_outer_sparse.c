/* libFuzzer target for the sparse DiLoCo outer payload decoder
 * (compress/outer_sparse.h): the 2-bit value codec and the others behind
 * the DLC header, the descriptors and the index codecs.
 *
 * Input: one mode byte, then the payload (checked at its exact size, so
 * AddressSanitizer sees any read past it).
 *   mode & 7     values codec: INT2, INT4, INT8, BF16, F32 by (mode & 7) % 5
 *   mode & 0x08  fix the header: magic, version 2, codec, learner, fragment,
 *                round, elements, flags, chunk edge, total = the size,
 *                density, reserved word
 *   mode & 0x10  fix the descriptors: reserved byte, index codec in range,
 *                and the last value section's size so the sections fill the
 *                payload (when they can)
 *   mode & 0x20  reseal: recompute the CRC32C trailer
 * The fixes let mutations reach the section decoders behind the framing
 * checks and the CRC.
 *
 * Oracles (abort() on violation):
 *   - a rejection is DISTRO_ERR_PAYLOAD and its message names the learner
 *     ("learner 3", not "learner 31");
 *   - an accepted payload has, per chunk, strictly increasing indices below
 *     the chunk size, and finite values (INT2: on the levels (c - 3/2) s of
 *     one scale per chunk);
 *   - re-encoding what was decoded gives a payload the decoder accepts, with
 *     the same indices and the same values (F32, BF16) or values within the
 *     quantizer's error (INT8, INT4, INT2).
 *
 * The sections mix a 64x48 matrix in 16x16 tiles (k 13), a 600-element
 * vector in runs of 256 and a remainder of 88, a 40-element vector, and an
 * 8x8 matrix in one tile, at density 0.05: ENUM, RICE and PACK12 all apply
 * somewhere.
 *
 * Built with -DFUZZ_OUTER_SPARSE_SEED_MAIN it is instead a program that
 * writes the seed corpus (real encodes, forced index codecs, an abort
 * payload, short ones) into the directory given as its argument. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "compress/outer_sparse.h"
#include "compress/value_codec.h"

#define LEARNER 3
#define MAXSEC 8
#define EDGE 16
#define DENSITY 0.05f

static const distro_values codecs[5] = {DISTRO_VALUES_INT2, DISTRO_VALUES_INT4, DISTRO_VALUES_INT8, DISTRO_VALUES_BF16,
                                        DISTRO_VALUES_F32};
static distro__sparse_section sec[MAXSEC];
static distro__enum_table et[MAXSEC];
static int nsec;
static int64_t nsel, elements;

static void die(const char *what) {
  fprintf(stderr, "fuzz_outer_sparse: %s\n", what);
  abort();
}

static void setup(void) {
  static int done = 0;
  if (done) return;
  const struct {
    int ndim;
    int64_t shape[2];
  } tensors[4] = {{2, {64, 48}}, {1, {600, 0}}, {1, {40, 0}}, {2, {8, 8}}};
  for (int t = 0; t < 4; t++) {
    distro__tiling v[2];
    int matrix;
    const int64_t count = tensors[t].ndim == 2 ? tensors[t].shape[0] * tensors[t].shape[1] : tensors[t].shape[0];
    const int nv = distro__sparse_views(tensors[t].ndim, tensors[t].shape, 0, count, EDGE, DENSITY, v, &matrix);
    if (nv < 1) die("views");
    for (int i = 0; i < nv; i++, nsec++) {
      distro__enum_table_init(&et[nsec], v[i].chunk_elems, v[i].k);
      sec[nsec] = (distro__sparse_section){elements, v[i].rows * v[i].cols, t, v[i], 0,
                                           et[nsec].c ? &et[nsec] : NULL, 0};
      elements += sec[nsec].count;
    }
  }
  nsel = distro__sparse_layout(sec, nsec);
  done = 1;
}

static distro__sparse_head head_of(distro_values v, uint32_t flags) {
  distro__sparse_head h = {{DISTRO__SPARSE_VERSION, (unsigned)v, LEARNER, 1, 42, 640, 10, (uint64_t)elements, flags,
                            EDGE},
                           DENSITY};
  return h;
}

static void seal_raw(uint8_t *buf, size_t size) {
  if (size >= 4) distro__put_u32(buf + size - 4, distro__crc32c(buf, size - 4));
}

/* Does the last error name exactly "learner 3"? */
static int names_learner(void) {
  const char *m = distro_last_error();
  for (const char *p = strstr(m, "learner 3"); p; p = strstr(p + 1, "learner 3"))
    if (p[9] < '0' || p[9] > '9') return 1;
  return 0;
}

static distro_status decode(const uint8_t *buf, size_t n, distro_values v, uint32_t *idx, float *val) {
  const distro__sparse_head want = head_of(v, 0);
  distro__dlc_head got;
  int bad;
  return distro__sparse_decode(buf, n, LEARNER, sec, nsec, &want, &got, &bad, idx, val);
}

/* What validation promises about a decoded selection. */
static void check_selection(const uint32_t *idx, const float *val, distro_values v) {
  for (int i = 0; i < nsec; i++) {
    const distro__tiling *t = &sec[i].t;
    for (int64_t c = 0; c < t->nchunks; c++) {
      const uint32_t *ci = idx + sec[i].sel + c * t->k;
      const float *cv = val + sec[i].sel + c * t->k;
      double top = 0;
      for (int64_t j = 0; j < t->k; j++) {
        if ((int64_t)ci[j] >= t->chunk_elems) die("accepted an index outside its chunk");
        if (j && ci[j] <= ci[j - 1]) die("accepted indices out of order");
        if (!isfinite(cv[j])) die("accepted a non-finite value");
        top = fmax(top, fabs((double)cv[j]));
      }
      /* INT2: every magnitude is the largest one or a third of it (0.5 s
       * and 1.5 s), or all are 0 (a zero scale). */
      for (int64_t j = 0; j < t->k && v == DISTRO_VALUES_INT2; j++) {
        const double a = fabs((double)cv[j]);
        if (!(a == top || fabs(3 * a - top) <= 1e-12 * top)) die("INT2 value off the levels of its chunk's scale");
      }
    }
  }
}

/* Re-encode an accepted selection; the result must decode to the same. */
static void check_reencode(const uint32_t *idx, const float *val, distro_values v) {
  const uint64_t cap = distro__sparse_bound(sec, nsec, v);
  uint8_t *buf = malloc(cap);
  uint32_t *bi = malloc(sizeof(uint32_t) * (size_t)nsel);
  float *bv = malloc(sizeof(float) * (size_t)nsel);
  if (!buf || !bi || !bv) die("malloc");
  const distro__sparse_head h = head_of(v, 0);
  const size_t n = distro__sparse_encode(buf, cap, sec, nsec, &h, idx, val);
  if (n == 0 || n > cap) die("re-encoding an accepted selection failed");
  if (decode(buf, n, v, bi, bv) != DISTRO_OK) {
    fprintf(stderr, "fuzz_outer_sparse: %s\n", distro_last_error());
    die("the re-encoded payload was rejected");
  }
  if (memcmp(bi, idx, sizeof(uint32_t) * (size_t)nsel) != 0) die("re-encoded indices differ");
  const int qmax = v == DISTRO_VALUES_INT8 ? 127 : v == DISTRO_VALUES_INT4 ? 7 : 2;
  for (int i = 0; i < nsec; i++) {
    const distro__tiling *t = &sec[i].t;
    for (int64_t c = 0; c < t->nchunks; c++) {
      const int64_t at = sec[i].sel + c * t->k;
      double amax = 0;
      for (int64_t j = 0; j < t->k; j++) amax = fmax(amax, fabs((double)val[at + j]));
      for (int64_t j = 0; j < t->k; j++) {
        const float a = val[at + j], b = bv[at + j];
        if (!isfinite(b)) die("re-encoded value not finite");
        if (v == DISTRO_VALUES_F32 || v == DISTRO_VALUES_BF16) {
          if (memcmp(&a, &b, 4) != 0 && !(a == 0 && b == 0)) die("re-encoded value differs");
        } else if (fabs((double)a - b) >
                   (amax / qmax * (1 + ldexp(1, -7)) + ldexp(1, -133)) / 2 * (1 + ldexp(1, -15))) {
          /* within half the new scale, at most one bf16 step above amax / qmax */
          die("re-encoded value outside the quantizer's error");
        }
      }
    }
  }
  free(buf);
  free(bi);
  free(bv);
}

static void fix_header(uint8_t *buf, size_t n, distro_values v) {
  if (n < DISTRO__SPARSE_HEADER) return;
  const distro__sparse_head h = head_of(v, 0);
  distro__dlc_put_header(buf, &h.dlc);
  uint32_t dbits;
  memcpy(&dbits, &h.density, 4);
  distro__put_u64(buf + 56, n);
  distro__put_u32(buf + 64, dbits);
  distro__put_u32(buf + 68, 0);
}

static void fix_descriptors(uint8_t *buf, size_t n) {
  const size_t head = DISTRO__SPARSE_HEADER + (size_t)nsec * DISTRO__SPARSE_DESC;
  if (n < head + 4) return;
  uint64_t sum = 0;
  for (int i = 0; i < nsec; i++) {
    uint8_t *d = buf + DISTRO__SPARSE_HEADER + (size_t)i * DISTRO__SPARSE_DESC;
    d[0] &= 3;
    d[3] = 0;
    const uint32_t ib = distro__get_u32(d + 4) % (uint32_t)(n + 1), vb = distro__get_u32(d + 8) % (uint32_t)(n + 1);
    distro__put_u32(d + 4, ib);
    distro__put_u32(d + 8, vb);
    sum += ib + (i < nsec - 1 ? vb : 0);
  }
  if (sum <= n - 4 - head)
    distro__put_u32(buf + DISTRO__SPARSE_HEADER + (size_t)(nsec - 1) * DISTRO__SPARSE_DESC + 8, (uint32_t)(n - 4 - head - sum));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  setup();
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const distro_values v = codecs[(mode & 7) % 5];
  const size_t n = size - 1;
  uint8_t *buf = malloc(n ? n : 1);
  uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)nsel);
  float *val = malloc(sizeof(float) * (size_t)nsel);
  if (!buf || !idx || !val) die("malloc");
  memcpy(buf, data + 1, n);
  if (mode & 0x08) fix_header(buf, n, v);
  if (mode & 0x10) fix_descriptors(buf, n);
  if (mode & 0x20) seal_raw(buf, n);
  const distro_status st = decode(buf, n, v, idx, val);
  if (st != DISTRO_OK) {
    if (st != DISTRO_ERR_PAYLOAD || !names_learner()) {
      fprintf(stderr, "fuzz_outer_sparse: status %d: %s\n", (int)st, distro_last_error());
      die("a rejection must be DISTRO_ERR_PAYLOAD naming the learner");
    }
  } else {
    if (distro__get_u64(buf + 56) != n) die("accepted a payload whose total field is not its size");
    if (distro__get_u32(buf + 48) != 0) die("accepted a payload with flags");
    check_selection(idx, val, v);
    check_reencode(idx, val, v);
  }
  free(buf);
  free(idx);
  free(val);
  return 0;
}

#ifdef FUZZ_OUTER_SPARSE_SEED_MAIN
#include "fuzz_seeds.h"

/* kind 0: uniform selections; 1: clustered at the low indices. */
static void random_selection(uint32_t *idx, float *val, int kind) {
  for (int i = 0; i < nsec; i++) {
    const distro__tiling *t = &sec[i].t;
    const int64_t k = t->k, n = t->chunk_elems, span = kind ? (2 * k + 1 < n ? 2 * k + 1 : n) : n;
    for (int64_t c = 0; c < t->nchunks; c++) {
      int64_t got = 0;
      for (int64_t e = 0; e < span && got < k; e++)
        if ((uint64_t)next_u32() % (uint64_t)(span - e) < (uint64_t)(k - got))
          idx[sec[i].sel + c * k + got++] = (uint32_t)e;
    }
  }
  for (int64_t j = 0; j < nsel; j++) {
    const float x = ((float)next_u32() / 4294967296.0f - 0.5f) * 8.0f;
    val[j] = j % 7 == 3 ? x * 1e-6f : x;
  }
}

/* A payload with one index codec forced on every section (where it can
 * code it; FIXED otherwise), assembled as the header describes. */
static size_t forced(uint8_t *out, size_t cap, const uint32_t *idx, const float *val, distro_values v, int icodec,
                     int iparam) {
  const size_t head = DISTRO__SPARSE_HEADER + (size_t)nsec * DISTRO__SPARSE_DESC;
  size_t at = head;
  memset(out, 0, cap);
  for (int i = 0; i < nsec; i++) {
    const distro__tiling *t = &sec[i].t;
    int ic = icodec;
    if ((ic == DISTRO__IDX_ENUM && !sec[i].et) || (ic == DISTRO__IDX_PACK12 && t->chunk_elems > 4096)) ic = 0;
    const int ip = ic == DISTRO__IDX_RICE ? iparam : 0;
    int vparam = 0;
    distro__val_plan(v, val + sec[i].sel, t->nchunks, t->k, &vparam);
    const size_t ib = distro__idx_encode(idx + sec[i].sel, t->nchunks, t->k, t->chunk_elems, sec[i].et,
                                         (distro__idx_codec)ic, ip, out + at, cap - at);
    const size_t vb = distro__val_encode(v, vparam, val + sec[i].sel, t->nchunks, t->k, out + at + ib, cap - at - ib);
    if (!ib || !vb) die("forced section does not fit");
    uint8_t *d = out + DISTRO__SPARSE_HEADER + (size_t)i * DISTRO__SPARSE_DESC;
    d[0] = (uint8_t)ic;
    d[1] = (uint8_t)ip;
    d[2] = (uint8_t)vparam;
    distro__put_u32(d + 4, (uint32_t)ib);
    distro__put_u32(d + 8, (uint32_t)vb);
    at += ib + vb;
  }
  fix_header(out, at + 4, v);
  seal_raw(out, at + 4);
  return at + 4;
}

static void must_accept(const uint8_t *buf, size_t n, distro_values v) {
  uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)nsel);
  float *val = malloc(sizeof(float) * (size_t)nsel);
  if (decode(buf, n, v, idx, val) != DISTRO_OK) {
    fprintf(stderr, "%s\n", distro_last_error());
    die("seed payload rejected");
  }
  free(idx);
  free(val);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  setup();
  char name[64];
  uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)nsel);
  float *val = malloc(sizeof(float) * (size_t)nsel);
  const size_t cap = 8192;
  uint8_t *buf = malloc(cap);
  if (!idx || !val || !buf) return 1;
  for (int c = 0; c < 5; c++) {
    const distro_values v = codecs[c];
    for (int kind = 0; kind < 2; kind++) {
      random_selection(idx, val, kind);
      const distro__sparse_head h = head_of(v, 0);
      const size_t n = distro__sparse_encode(buf, cap, sec, nsec, &h, idx, val);
      if (!n) die("seed encode failed");
      must_accept(buf, n, v);
      const uint8_t modes[3] = {(uint8_t)c, (uint8_t)(c | 0x38), (uint8_t)(c | 0x20)};
      for (int m = 0; m < 3; m++) {
        snprintf(name, sizeof name, "valid-c%d-k%d-m%02x", c, kind, modes[m]);
        write_seed(argv[1], name, modes[m], buf, n);
      }
      snprintf(name, sizeof name, "short-c%d-k%d", c, kind);
      write_seed(argv[1], name, (uint8_t)(c | 0x38), buf, n / 2);
    }
    /* Forced index codecs: FIXED, PACK12, RICE at two parameters, ENUM. */
    const int forms[5][2] = {{DISTRO__IDX_FIXED, 0}, {DISTRO__IDX_PACK12, 0}, {DISTRO__IDX_RICE, 2},
                             {DISTRO__IDX_RICE, 7}, {DISTRO__IDX_ENUM, 0}};
    random_selection(idx, val, 0);
    for (int f = 0; f < 5; f++) {
      const size_t n = forced(buf, cap, idx, val, v, forms[f][0], forms[f][1]);
      must_accept(buf, n, v);
      snprintf(name, sizeof name, "forced-c%d-f%d", c, f);
      write_seed(argv[1], name, (uint8_t)(c | 0x20), buf, n);
    }
    const distro__sparse_head ab = head_of(v, DISTRO__DLC_FLAG_ABORT);
    const size_t n = distro__sparse_encode(buf, cap, sec, nsec, &ab, NULL, NULL);
    snprintf(name, sizeof name, "abort-c%d", c);
    write_seed(argv[1], name, (uint8_t)c, buf, n);
  }
  free(idx);
  free(val);
  free(buf);
  for (int i = 0; i < nsec; i++) distro__enum_table_destroy(&et[i]);
  return 0;
}
#endif
