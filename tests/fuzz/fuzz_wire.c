/* libFuzzer target for the payload validator (docs/wire-format.md).
 *
 * Input: one mode byte, then the payload.
 *   mode & 3   codec (3 reads as F32)
 *   mode & 4   fit: zero-pad or truncate the payload to the expected size
 *   mode & 8   reseal: recompute the CRC32C trailer before validating
 * Fit and reseal let mutations reach the checks behind the size and CRC.
 *
 * Oracles (abort() on violation):
 *   - a rejection is DISTRO_ERR_PAYLOAD and names the peer;
 *   - an accepted payload has in-range, strictly increasing indices per
 *     chunk and finite values (+-1 for SIGN1);
 *   - re-encoding what was decoded reproduces the payload byte for byte
 *     (each valid payload has exactly one encoding).
 *
 * Built with -DFUZZ_WIRE_SEED_MAIN it is instead a program that writes a few
 * valid payloads into the directory given as its argument (the seed corpus). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "compress/chunk.h"
#include "compress/wire.h"

#define NT 5
#define PEER 3

/* 1-D u8, 2-D u8, 2-D u16, 3-D, prime (1-element chunks). */
static const struct {
  int ndim;
  int64_t shape[3];
  int64_t target, topk;
} specs[NT] = {
    {1, {40}, 8, 3},        /* 1x8 chunks, 5 of them, 15 coefficients */
    {2, {10, 12}, 6, 4},    /* 5x6 chunks, 4 of them */
    {2, {40, 40}, 20, 3},   /* 20x20 = 400 elements: u16 indices */
    {3, {2, 3, 5}, 4, 2},   /* rows 6: 3x1 chunks, 10 of them */
    {1, {7}, 4, 4},         /* prime: 1x1 chunks, k clamped to 1 */
};

static distro__tiling tilings[NT];
static distro__wire_layout layouts[3];

static void die(const char *what) {
  fprintf(stderr, "fuzz_wire: %s\n", what);
  abort();
}

static void setup(void) {
  static int done = 0;
  if (done) return;
  for (int i = 0; i < NT; i++)
    if (distro__tiling_init(&tilings[i], specs[i].ndim, specs[i].shape, specs[i].target, specs[i].topk) != DISTRO_OK)
      die("tiling");
  for (int c = 0; c < 3; c++)
    if (distro__wire_layout_init(&layouts[c], tilings, NT, (distro_values)c) != DISTRO_OK) die("layout");
  if (layouts[0].idx_width[0] != 1 || layouts[0].idx_width[2] != 2) die("layout widths");
  done = 1;
}


static void seal_raw(uint8_t *buf, size_t size) {
  if (size < 4) return;
  distro__put_u32(buf + size - 4, distro__crc32c(buf, size - 4));
}

/* Decode a validated payload, check what validation promises, re-encode. */
static void check_accepted(const uint8_t *buf, size_t size, const distro__wire_layout *l) {
  uint8_t *again = malloc(size);
  if (!again) die("malloc");
  distro__wire_write_header(again, l, tilings, 0, distro__get_u32(buf + 12), distro__get_u64(buf + 16), distro__get_u32(buf + 32), distro__get_u32(buf + 36));
  for (int i = 0; i < NT; i++) {
    const distro__tiling *t = &tilings[i];
    const int64_t count = t->nchunks * t->k;
    uint32_t *idx = malloc(sizeof *idx * (size_t)count);
    float *val = malloc(sizeof *val * (size_t)count);
    if (!idx || !val) die("malloc");
    for (int64_t j = 0; j < count; j++) {
      idx[j] = distro__wire_index(buf + l->idx_off[i], l->idx_width[i], j);
      if ((int64_t)idx[j] >= t->chunk_elems) die("accepted an index outside its chunk");
      if (j % t->k && idx[j] <= idx[j - 1]) die("accepted indices out of order");
      val[j] = distro__wire_value(buf + l->val_off[i], l->values, j);
      if (!isfinite(val[j])) die("accepted a non-finite value");
      if (l->values == DISTRO_VALUES_SIGN1 && val[j] != 1.0f && val[j] != -1.0f) die("SIGN1 value not +-1");
    }
    distro__wire_write_tensor(again, l, tilings, i, idx, val);
    free(idx);
    free(val);
  }
  distro__wire_seal(again, l);
  if (memcmp(again, buf, size) != 0) die("re-encoding an accepted payload changed it");
  free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  setup();
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const distro__wire_layout *l = &layouts[(mode & 3) % 3];
  size_t n = (mode & 4) ? l->total : size - 1;
  uint8_t *buf = malloc(n ? n : 1); /* exact size: ASan sees any overread */
  if (!buf) die("malloc");
  size_t have = size - 1 < n ? size - 1 : n;
  memcpy(buf, data + 1, have);
  memset(buf + have, 0, n - have);
  if (mode & 8) seal_raw(buf, n);

  int aborted = -1;
  uint32_t why = 0, tensor = 0;
  distro_status st = distro__wire_validate(buf, n, l, tilings, PEER, &aborted, &why, &tensor);
  if (st != DISTRO_OK) {
    if (st != DISTRO_ERR_PAYLOAD || !strstr(distro_last_error(), "rank 3")) {
      fprintf(stderr, "fuzz_wire: status %d: %s\n", (int)st, distro_last_error());
      die("a rejection must be DISTRO_ERR_PAYLOAD naming the peer");
    }
    if (aborted != 0) die("aborted set on a rejected payload");
  } else if (aborted == 1) {
    if (n != l->total || !(buf[7] & DISTRO__WIRE_FLAG_ABORT)) die("abort accepted without its flag");
    if (why != distro__get_u32(buf + 32) || tensor != distro__get_u32(buf + 36)) die("abort status/tensor not reported");
  } else if (aborted == 0) {
    if (n != l->total) die("accepted a payload of the wrong size");
    check_accepted(buf, n, l);
  } else {
    die("aborted left unset");
  }
  free(buf);
  return 0;
}

#ifdef FUZZ_WIRE_SEED_MAIN
/* Seed corpus: valid payloads of each codec, plain, fitted and resealed,
 * an abort payload and a few near misses. */
#include "fuzz_seeds.h"

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  setup();
  char name[64];
  for (int c = 0; c < 3; c++) {
    const distro__wire_layout *l = &layouts[c];
    uint8_t *buf = malloc(l->total);
    if (!buf) return 1;
    distro__wire_write_header(buf, l, tilings, 0, PEER, 42 + (uint64_t)c, 0, 0);
    for (int i = 0; i < NT; i++) {
      const distro__tiling *t = &tilings[i];
      const int64_t count = t->nchunks * t->k;
      uint32_t *idx = malloc(sizeof *idx * (size_t)count);
      float *val = malloc(sizeof *val * (size_t)count);
      if (!idx || !val) return 1;
      for (int64_t ch = 0; ch < t->nchunks; ch++) { /* selection sampling: sorted, distinct */
        int64_t got = 0;
        for (int64_t e = 0; e < t->chunk_elems && got < t->k; e++)
          if ((uint64_t)next_u32() % (uint64_t)(t->chunk_elems - e) < (uint64_t)(t->k - got))
            idx[ch * t->k + got++] = (uint32_t)e;
      }
      for (int64_t j = 0; j < count; j++) val[j] = ((float)next_u32() / 4294967296.0f - 0.5f) * 8.0f;
      distro__wire_write_tensor(buf, l, tilings, i, idx, val);
      free(idx);
      free(val);
    }
    distro__wire_seal(buf, l);
    int aborted;
    uint32_t why, tensor;
    if (distro__wire_validate(buf, l->total, l, tilings, PEER, &aborted, &why, &tensor) != DISTRO_OK) {
      fprintf(stderr, "%s\n", distro_last_error());
      die("seed payload rejected");
    }
    const uint8_t modes[3] = {(uint8_t)c, (uint8_t)(c | 4), (uint8_t)(c | 12)};
    for (int m = 0; m < 3; m++) {
      snprintf(name, sizeof name, "valid-c%d-m%d", c, modes[m]);
      write_seed(argv[1], name, modes[m], buf, l->total);
    }
    snprintf(name, sizeof name, "short-c%d", c); /* fitted: zero-padded to size */
    write_seed(argv[1], name, (uint8_t)(c | 4), buf, l->total / 2);
    distro__wire_write_header(buf, l, tilings, DISTRO__WIRE_FLAG_ABORT, PEER, 7, DISTRO_ERR_NONFINITE, 1);
    distro__wire_clear_body(buf, l);
    distro__wire_seal(buf, l);
    snprintf(name, sizeof name, "abort-c%d", c);
    write_seed(argv[1], name, (uint8_t)c, buf, l->total);
    free(buf);
  }
  return 0;
}
#endif
