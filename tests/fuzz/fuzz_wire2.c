/* libFuzzer target for the wire v2 decoder (docs/wire-format.md).
 *
 * Input: one mode byte, then the payload (checked at its exact size, so
 * AddressSanitizer sees any read past it).
 *   mode & 7     values codec: (mode & 7) % 5
 *   mode & 0x08  fix the header: magic, version 2, codec, tensor count, and
 *                the total field = the payload's size
 *   mode & 0x10  fix the descriptors: h, w, k, nchunks, reserved byte, and
 *                the last value section's size so the sections fill the
 *                payload (when they can)
 *   mode & 0x20  reseal: recompute the CRC32C trailer
 *   mode & 0x40  with 0x08: clear the flags and abort fields too
 * The fixes let mutations reach the section decoders behind the framing
 * checks and the CRC.
 *
 * Oracles (abort() on violation):
 *   - a rejection is DISTRO_ERR_PAYLOAD and its message names the peer
 *     ("rank 3", not "rank 31"); `aborted` stays 0;
 *   - an accepted abort payload has the ABORT flag and reports the header's
 *     status and tensor;
 *   - an accepted payload has, per chunk, strictly increasing indices below
 *     the chunk size, and finite values (+-1 for SIGN1);
 *   - re-encoding what was decoded gives a payload the decoder accepts, with
 *     the same indices and the same values (F32, BF16, SIGN1) or values
 *     within the quantizer's error (INT8, INT4).
 *
 * The tensor list mixes shapes where ENUM applies ((128,128) and (64,67)
 * prime columns at topk 4, a 1-D (100)), where RICE or PACK12 wins (one
 * 4096-element chunk at topk 32), and k > n/2 ((8,8) at topk 40).
 *
 * Built with -DFUZZ_WIRE2_SEED_MAIN it is instead a program that writes the
 * seed corpus (real encodes, forced codec choices, an abort payload) into the
 * directory given as its argument. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "compress/chunk.h"
#include "compress/index_codec.h"
#include "compress/value_codec.h"
#include "compress/wire.h"
#include "compress/wire2.h"

#define NT 5
#define PEER 3
#define HEAD (40 + 40 * NT)

static const struct {
  int ndim;
  int64_t shape[2];
  int64_t target, topk;
} specs[NT] = {
    {2, {128, 128}, 64, 4}, /* 4 chunks of 64x64, k 4: ENUM (44 bits) */
    {1, {100}, 64, 4},      /* 2 chunks of 1x50: ENUM */
    {2, {64, 67}, 64, 4},   /* 67 prime columns: 67 chunks of 64x1 */
    {2, {64, 64}, 64, 32},  /* one chunk of 4096, k 32: RICE / PACK12 */
    {2, {8, 8}, 8, 40},     /* k 40 of 64: no ENUM */
};

static distro__wire2_tensor ts[NT];
static distro__enum_table et[NT];
static int64_t counts[NT];

static void die(const char *what) {
  fprintf(stderr, "fuzz_wire2: %s\n", what);
  abort();
}

static void setup(void) {
  static int done = 0;
  if (done) return;
  for (int i = 0; i < NT; i++) {
    if (distro__tiling_init(&ts[i].t, specs[i].ndim, specs[i].shape, specs[i].target, specs[i].topk) != DISTRO_OK)
      die("tiling");
    distro__enum_table_init(&et[i], ts[i].t.chunk_elems, ts[i].t.k);
    ts[i].et = et[i].c ? &et[i] : NULL;
    counts[i] = ts[i].t.nchunks * ts[i].t.k;
  }
  if (!ts[0].et || !ts[2].et || ts[3].et || ts[4].et) die("ENUM tables are not where expected");
  done = 1;
}

static void seal_raw(uint8_t *buf, size_t size) {
  if (size >= 4) distro__put_u32(buf + size - 4, distro__crc32c(buf, size - 4));
}

/* Does the last error name exactly "rank 3"? */
static int names_peer(void) {
  const char *m = distro_last_error();
  for (const char *p = strstr(m, "rank 3"); p; p = strstr(p + 1, "rank 3"))
    if (p[6] < '0' || p[6] > '9') return 1;
  return 0;
}

typedef struct {
  uint32_t *idx[NT];
  float *val[NT];
} selection;

static void sel_alloc(selection *s) {
  for (int i = 0; i < NT; i++) {
    s->idx[i] = malloc(sizeof(uint32_t) * (size_t)counts[i]);
    s->val[i] = malloc(sizeof(float) * (size_t)counts[i]);
    if (!s->idx[i] || !s->val[i]) die("malloc");
  }
}
static void sel_free(selection *s) {
  for (int i = 0; i < NT; i++) {
    free(s->idx[i]);
    free(s->val[i]);
  }
}

static distro_status decode(const uint8_t *buf, size_t n, distro_values v, selection *out, int *aborted,
                            uint32_t *why, uint32_t *tensor) {
  return distro__wire2_decode(buf, n, ts, NT, v, PEER, aborted, why, tensor, out->idx, out->val);
}

/* What validation promises about a decoded selection. */
static void check_selection(const selection *s, distro_values v) {
  for (int i = 0; i < NT; i++) {
    const int64_t k = ts[i].t.k, n = ts[i].t.chunk_elems;
    for (int64_t j = 0; j < counts[i]; j++) {
      if ((int64_t)s->idx[i][j] >= n) die("accepted an index outside its chunk");
      if (j % k && s->idx[i][j] <= s->idx[i][j - 1]) die("accepted indices out of order");
      if (!isfinite(s->val[i][j])) die("accepted a non-finite value");
      if (v == DISTRO_VALUES_SIGN1 && s->val[i][j] != 1.0f && s->val[i][j] != -1.0f) die("SIGN1 value not +-1");
    }
  }
}

/* Re-encode an accepted selection; the result must decode to the same. */
static void check_reencode(const selection *s, distro_values v) {
  const size_t cap = distro__wire2_bound(ts, NT, v);
  uint8_t *buf = malloc(cap);
  if (!buf) die("malloc");
  const size_t n = distro__wire2_encode(buf, cap, ts, NT, v, PEER, 77, s->idx, s->val);
  if (n == 0 || n > cap) die("re-encoding an accepted selection failed");
  selection back;
  sel_alloc(&back);
  int aborted = -1;
  uint32_t why, tensor;
  if (decode(buf, n, v, &back, &aborted, &why, &tensor) != DISTRO_OK || aborted != 0) {
    fprintf(stderr, "fuzz_wire2: %s\n", distro_last_error());
    die("the re-encoded payload was rejected");
  }
  const int qmax = v == DISTRO_VALUES_INT8 ? 127 : 7;
  for (int i = 0; i < NT; i++) {
    const int64_t k = ts[i].t.k;
    if (memcmp(back.idx[i], s->idx[i], sizeof(uint32_t) * (size_t)counts[i]) != 0) die("re-encoded indices differ");
    for (int64_t c = 0; c < ts[i].t.nchunks; c++) {
      double amax = 0;
      for (int64_t j = c * k; j < (c + 1) * k; j++) amax = fmax(amax, fabs((double)s->val[i][j]));
      for (int64_t j = c * k; j < (c + 1) * k; j++) {
        const float a = s->val[i][j], b = back.val[i][j];
        if (!isfinite(b)) die("re-encoded value not finite");
        if (v == DISTRO_VALUES_INT8 || v == DISTRO_VALUES_INT4) {
          /* Decoded values q * s requantize within half the new scale,
           * which is at most one bf16 step above amax / qmax (2^-133
           * among the subnormals). */
          if (fabs((double)a - b) > (amax / qmax * (1 + ldexp(1, -7)) + ldexp(1, -133)) / 2 * (1 + ldexp(1, -15)))
            die("re-encoded value outside the quantizer's error");
        } else if (memcmp(&a, &b, 4) != 0) {
          die("re-encoded value differs");
        }
      }
    }
  }
  sel_free(&back);
  free(buf);
}

static void fix_header(uint8_t *buf, size_t n, distro_values v, int clear_flags) {
  if (n < HEAD + 4) return;
  distro__put_u32(buf, DISTRO__WIRE_MAGIC);
  buf[4] = 2;
  buf[5] = 0;
  buf[6] = (uint8_t)v;
  distro__put_u32(buf + 8, NT);
  distro__put_u64(buf + 24, n);
  if (clear_flags) {
    buf[7] = 0;
    memset(buf + 32, 0, 8);
  }
}

static void fix_descriptors(uint8_t *buf, size_t n) {
  if (n < HEAD + 4) return;
  uint64_t sum = 0;
  for (int i = 0; i < NT; i++) {
    uint8_t *d = buf + 40 + 40 * i;
    distro__put_u32(d, (uint32_t)ts[i].t.h);
    distro__put_u32(d + 4, (uint32_t)ts[i].t.w);
    distro__put_u32(d + 8, (uint32_t)ts[i].t.k);
    d[15] = 0;
    distro__put_u64(d + 16, (uint64_t)ts[i].t.nchunks);
    /* Keep section sizes small enough to sum; the last value section takes
     * what is left. */
    uint64_t ib = distro__get_u64(d + 24) % (n + 1), vb = distro__get_u64(d + 32) % (n + 1);
    distro__put_u64(d + 24, ib);
    distro__put_u64(d + 32, vb);
    sum += ib + (i < NT - 1 ? vb : 0);
  }
  if (sum <= n - 4 - HEAD) distro__put_u64(buf + 40 + 40 * (NT - 1) + 32, n - 4 - HEAD - sum);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  setup();
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const distro_values v = (distro_values)((mode & 7) % 5);
  const size_t n = size - 1;
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) die("malloc");
  memcpy(buf, data + 1, n);
  if (mode & 0x08) fix_header(buf, n, v, mode & 0x40);
  if (mode & 0x10) fix_descriptors(buf, n);
  if (mode & 0x20) seal_raw(buf, n);

  selection out;
  sel_alloc(&out);
  int aborted = -1;
  uint32_t why = 0, tensor = 0;
  distro_status st = decode(buf, n, v, &out, &aborted, &why, &tensor);
  if (st != DISTRO_OK) {
    if (st != DISTRO_ERR_PAYLOAD || !names_peer()) {
      fprintf(stderr, "fuzz_wire2: status %d: %s\n", (int)st, distro_last_error());
      die("a rejection must be DISTRO_ERR_PAYLOAD naming the peer");
    }
    if (aborted != 0) die("aborted set on a rejected payload");
  } else if (aborted == 1) {
    if (!(buf[7] & DISTRO__WIRE_FLAG_ABORT)) die("abort accepted without its flag");
    if (why != distro__get_u32(buf + 32) || tensor != distro__get_u32(buf + 36)) die("abort status/tensor not reported");
  } else if (aborted == 0) {
    if (buf[7] != 0) die("accepted a payload with flags");
    if (distro__get_u64(buf + 24) != n) die("accepted a payload whose total field is not its size");
    check_selection(&out, v);
    check_reencode(&out, v);
  } else {
    die("aborted left unset");
  }
  sel_free(&out);
  free(buf);
  return 0;
}

#ifdef FUZZ_WIRE2_SEED_MAIN
#include "fuzz_seeds.h"

/* kind 0: uniform selections; 1: clustered at the low indices. */
static void random_selection(selection *s, int kind) {
  for (int i = 0; i < NT; i++) {
    const int64_t k = ts[i].t.k, n = ts[i].t.chunk_elems, span = kind ? (2 * k + 1 < n ? 2 * k + 1 : n) : n;
    for (int64_t c = 0; c < ts[i].t.nchunks; c++) {
      int64_t got = 0;
      for (int64_t e = 0; e < span && got < k; e++)
        if ((uint64_t)next_u32() % (uint64_t)(span - e) < (uint64_t)(k - got)) s->idx[i][c * k + got++] = (uint32_t)e;
    }
    for (int64_t j = 0; j < counts[i]; j++) {
      float x = ((float)next_u32() / 4294967296.0f - 0.5f) * 8.0f;
      s->val[i][j] = j % 7 == 3 ? x * 1e-6f : x;
    }
  }
}

/* A payload with forced codec choices (index codec per tensor, RICE and BF16
 * parameters), assembled as the document describes. */
static size_t forced(uint8_t *out, size_t cap, const selection *s, distro_values v, const int *icodec,
                     const int *iparam, int vparam) {
  size_t at = HEAD;
  memset(out, 0, cap);
  for (int i = 0; i < NT; i++) {
    const distro__tiling *t = &ts[i].t;
    uint8_t *d = out + 40 + 40 * i;
    size_t ib = distro__idx_encode(s->idx[i], t->nchunks, t->k, t->chunk_elems, ts[i].et,
                                   (distro__idx_codec)icodec[i], iparam[i], out + at, cap - at);
    if (!ib) die("forced index section does not fit");
    size_t vb = distro__val_encode(v, vparam, s->val[i], t->nchunks, t->k, out + at + ib, cap - at - ib);
    if (!vb) die("forced value section does not fit");
    distro__put_u32(d, (uint32_t)t->h);
    distro__put_u32(d + 4, (uint32_t)t->w);
    distro__put_u32(d + 8, (uint32_t)t->k);
    d[12] = (uint8_t)icodec[i];
    d[13] = (uint8_t)iparam[i];
    d[14] = (uint8_t)vparam;
    distro__put_u64(d + 16, (uint64_t)t->nchunks);
    distro__put_u64(d + 24, ib);
    distro__put_u64(d + 32, vb);
    at += ib + vb;
  }
  distro__put_u32(out, DISTRO__WIRE_MAGIC);
  out[4] = 2;
  out[6] = (uint8_t)v;
  distro__put_u32(out + 8, NT);
  distro__put_u32(out + 12, PEER);
  distro__put_u64(out + 16, 5);
  distro__put_u64(out + 24, at + 4);
  seal_raw(out, at + 4);
  return at + 4;
}

static void must_accept(const uint8_t *buf, size_t n, distro_values v) {
  selection s;
  sel_alloc(&s);
  int aborted;
  uint32_t why, tensor;
  if (decode(buf, n, v, &s, &aborted, &why, &tensor) != DISTRO_OK) {
    fprintf(stderr, "%s\n", distro_last_error());
    die("seed payload rejected");
  }
  sel_free(&s);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  setup();
  char name[64];
  selection s;
  sel_alloc(&s);
  for (int c = 0; c < 5; c++) {
    const distro_values v = (distro_values)c;
    const size_t cap = 8192;
    uint8_t *buf = malloc(cap);
    if (!buf) return 1;
    for (int kind = 0; kind < 2; kind++) {
      random_selection(&s, kind);
      size_t n = distro__wire2_encode(buf, cap, ts, NT, v, PEER, 42 + (uint64_t)c, s.idx, s.val);
      if (!n) die("seed encode failed");
      must_accept(buf, n, v);
      const uint8_t modes[3] = {(uint8_t)c, (uint8_t)(c | 0x38), (uint8_t)(c | 0x20)};
      for (int m = 0; m < 3; m++) {
        snprintf(name, sizeof name, "valid-c%d-k%d-m%02x", c, kind, modes[m]);
        write_seed(argv[1], name, modes[m], buf, n);
      }
      snprintf(name, sizeof name, "short-c%d-k%d", c, kind);
      write_seed(argv[1], name, (uint8_t)(c | 0x78), buf, n / 2);
    }
    /* Forced codecs: FIXED everywhere; PACK12 / RICE with odd parameters;
     * BF16 raw words and each exponent-code parameter. */
    const int fixed[NT] = {0, 0, 0, 0, 0}, zero[NT] = {0};
    const int mix[NT] = {DISTRO__IDX_PACK12, DISTRO__IDX_RICE, DISTRO__IDX_FIXED, DISTRO__IDX_RICE, DISTRO__IDX_PACK12};
    const int mixp[NT] = {0, 5, 0, 2, 0};
    const int rice[NT] = {2, 2, 2, 2, 2}, ricep[NT] = {9, 3, 4, 6, 0};
    const int *forms[3][2] = {{fixed, zero}, {mix, mixp}, {rice, ricep}};
    random_selection(&s, 0);
    for (int f = 0; f < 3; f++)
      for (int vp = 0; vp < (v == DISTRO_VALUES_BF16 ? 5 : 1); vp++) {
        const int vparam = v == DISTRO_VALUES_BF16 ? (vp == 4 ? DISTRO__BF16_RAW : vp) : 0;
        size_t n = forced(buf, cap, &s, v, forms[f][0], forms[f][1], vparam);
        must_accept(buf, n, v);
        snprintf(name, sizeof name, "forced-c%d-f%d-p%d", c, f, vparam);
        write_seed(argv[1], name, (uint8_t)(c | 0x20), buf, n);
      }
    size_t n = distro__wire2_encode_abort(buf, ts, NT, v, PEER, 7, DISTRO_ERR_NONFINITE, 1);
    snprintf(name, sizeof name, "abort-c%d", c);
    write_seed(argv[1], name, (uint8_t)c, buf, n);
    free(buf);
  }
  sel_free(&s);
  for (int i = 0; i < NT; i++) distro__enum_table_destroy(&et[i]);
  return 0;
}
#endif
