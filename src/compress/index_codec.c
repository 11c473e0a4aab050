/* Index codecs of wire v2. See index_codec.h. */
#include "compress/index_codec.h"

#include <stdlib.h>

#include "compress/bits.h"

typedef unsigned __int128 u128;

static int bits_for(u128 count) { /* bits to code values in [0, count) */
  int b = 0;
  u128 m = count - 1;
  while (m) {
    b++;
    m >>= 1;
  }
  return b;
}

int distro__enum_table_init(distro__enum_table *t, int64_t n, int64_t k) {
  t->n = n;
  t->k = k;
  t->bits = 0;
  t->c = NULL;
  /* Only for k <= n/2, where every C(c, i) with c < n, i <= k is at most
   * C(n, k), and only while C(n, k) fits in 127 bits. */
  /* C(n, k) >= 2^k for k <= n/2, so k >= 127 never fits: check before
   * allocating n*(k+1) entries. */
  if (k < 1 || 2 * k > n || n > 65536 || k >= 127) return 0;
  const u128 limit = (u128)1 << 127;
  u128 *c = calloc((size_t)n * (size_t)(k + 1), sizeof *c);
  if (!c) return 0;
  for (int64_t r = 0; r < n; r++) {
    c[r] = 1; /* C(r, 0) */
    for (int64_t i = 1; i <= k; i++) {
      u128 v = r == 0 ? 0 : c[(i - 1) * n + r - 1] + c[i * n + r - 1];
      if (v >= limit) {
        free(c);
        return 0;
      }
      c[i * n + r] = v;
    }
  }
  /* C(n, k) = C(n-1, k-1) + C(n-1, k). */
  u128 total = c[(k - 1) * n + n - 1] + c[k * n + n - 1];
  if (total >= limit) {
    free(c);
    return 0;
  }
  t->bits = bits_for(total);
  t->c = c;
  return 1;
}

void distro__enum_table_destroy(distro__enum_table *t) {
  if (t) {
    free(t->c);
    t->c = NULL;
  }
}

static int fixed_width(int64_t n) { return n <= 256 ? 8 : n <= 65536 ? 16 : 32; }

static uint64_t gap(const uint32_t *ci, int64_t j) { return j ? (uint64_t)(ci[j] - ci[j - 1] - 1) : ci[0]; }

static uint64_t rice_bits(const uint32_t *idx, int64_t nchunks, int64_t k, int b) {
  uint64_t bits = 0;
  for (int64_t c = 0; c < nchunks; c++)
    for (int64_t j = 0; j < k; j++) bits += (gap(idx + c * k, j) >> b) + 1 + (uint64_t)b;
  return bits;
}

size_t distro__idx_choose(const uint32_t *idx, int64_t nchunks, int64_t k, int64_t n, const distro__enum_table *et,
                          distro__idx_codec *codec, int *param) {
  const uint64_t count = (uint64_t)nchunks * (uint64_t)k;
  uint64_t best = count * (uint64_t)fixed_width(n);
  *codec = DISTRO__IDX_FIXED;
  *param = 0;
  if (n <= 4096 && count * 12 < best) {
    best = count * 12;
    *codec = DISTRO__IDX_PACK12;
  }
  if (et && et->c && (uint64_t)nchunks * (uint64_t)et->bits < best) {
    best = (uint64_t)nchunks * (uint64_t)et->bits;
    *codec = DISTRO__IDX_ENUM;
  }
  /* Rice: every b, costed exactly from a histogram of the gaps (gaps are
   * < n, and clustered low-frequency selections want a much smaller b than
   * uniform ones, so no guess from the mean gap). */
  const int maxb = n > 1 ? 64 - __builtin_clzll((unsigned long long)(n - 1)) : 0;
  uint64_t *hist = n <= (1 << 20) ? calloc((size_t)n, sizeof *hist) : NULL;
  for (int b = 0; b <= maxb && b <= 30; b++) {
    uint64_t bits = 0;
    if (hist) {
      if (b == 0)
        for (int64_t c = 0; c < nchunks; c++)
          for (int64_t j = 0; j < k; j++) hist[gap(idx + c * k, j)]++;
      for (int64_t g = 0; g < n; g++)
        if (hist[g]) bits += hist[g] * ((uint64_t)(g >> b) + 1 + (uint64_t)b);
    } else {
      bits = rice_bits(idx, nchunks, k, b);
    }
    if (bits < best) {
      best = bits;
      *codec = DISTRO__IDX_RICE;
      *param = b;
    }
  }
  free(hist);
  return (size_t)((best + 7) / 8);
}

size_t distro__idx_encode(const uint32_t *idx, int64_t nchunks, int64_t k, int64_t n, const distro__enum_table *et,
                          distro__idx_codec codec, int param, uint8_t *out, size_t cap) {
  distro__bitw w;
  distro__bitw_init(&w, out, cap);
  for (int64_t c = 0; c < nchunks && !w.overflow; c++) {
    const uint32_t *ci = idx + c * k;
    switch (codec) {
      case DISTRO__IDX_FIXED:
        for (int64_t j = 0; j < k; j++) distro__bitw_put(&w, ci[j], fixed_width(n));
        break;
      case DISTRO__IDX_PACK12:
        for (int64_t j = 0; j < k; j++) distro__bitw_put(&w, ci[j], 12);
        break;
      case DISTRO__IDX_RICE:
        for (int64_t j = 0; j < k; j++) distro__bitw_rice(&w, gap(ci, j), param);
        break;
      case DISTRO__IDX_ENUM: {
        u128 rank = 0;
        for (int64_t j = 0; j < k; j++) rank += et->c[(j + 1) * n + (int64_t)ci[j]];
        distro__bitw_put_long(&w, rank, et->bits);
        break;
      }
    }
  }
  return w.overflow ? 0 : distro__bitw_bytes(&w);
}

distro__codec_fault distro__idx_decode(const uint8_t *in, size_t len, int64_t nchunks, int64_t k, int64_t n,
                                       const distro__enum_table *et, distro__idx_codec codec, int param,
                                       uint32_t *idx) {
  const distro__codec_fault framing = distro__codec_fault_at(DISTRO__CODEC_INDEX_SECTION, -1);
  distro__bitr r;
  distro__bitr_init(&r, in, len);
  if (codec == DISTRO__IDX_PACK12 && n > 4096) return framing;
  if (codec == DISTRO__IDX_ENUM && (!et || !et->c)) return framing;
  if (codec == DISTRO__IDX_RICE && (param < 0 || param > 30)) return framing;
  if (codec > DISTRO__IDX_ENUM) return framing;
  for (int64_t c = 0; c < nchunks; c++) {
    uint32_t *ci = idx + c * k;
    int64_t prev = -1;
    switch (codec) {
      case DISTRO__IDX_FIXED:
      case DISTRO__IDX_PACK12: {
        int wbits = codec == DISTRO__IDX_FIXED ? fixed_width(n) : 12;
        for (int64_t j = 0; j < k; j++) {
          int64_t v = (int64_t)distro__bitr_get(&r, wbits);
          if (r.error) return framing;
          if (v <= prev || v >= n) return distro__codec_fault_at(DISTRO__CODEC_INDEX_ORDER, c);
          ci[j] = (uint32_t)(prev = v);
        }
        break;
      }
      case DISTRO__IDX_RICE:
        for (int64_t j = 0; j < k; j++) {
          uint64_t g = distro__bitr_rice(&r, param, (uint64_t)n >> param);
          if (r.error) return framing;
          int64_t v = prev + 1 + (int64_t)g;
          if (g >= (uint64_t)n || v >= n) return distro__codec_fault_at(DISTRO__CODEC_INDEX_ORDER, c);
          ci[j] = (uint32_t)(prev = v);
        }
        break;
      case DISTRO__IDX_ENUM: {
        u128 rank = distro__bitr_get_long(&r, et->bits);
        if (r.error) return framing;
        /* Greedy: the largest element is the largest c with C(c, k) <= rank.
         * Elements lie a gap apart (about n/k), so each search gallops down
         * from the last one and then bisects, along one row of c. */
        int64_t hi = n - 1;
        for (int64_t j = k - 1; j >= 0; j--) {
          if (hi < j) return distro__codec_fault_at(DISTRO__CODEC_INDEX_ORDER, c);
          const u128 *row = et->c + (j + 1) * n; /* row[j] = C(j, j+1) = 0 <= rank */
          int64_t good = hi, bad = hi + 1, step = 1;
          while (good > j && row[good] > rank) { /* row[bad] > rank (or bad = hi + 1) */
            bad = good;
            good = bad - step > j ? bad - step : j;
            step *= 2;
          }
          while (bad - good > 1) {
            const int64_t mid = good + (bad - good) / 2;
            if (row[mid] <= rank) good = mid;
            else bad = mid;
          }
          rank -= row[good];
          ci[j] = (uint32_t)good;
          hi = good - 1;
        }
        if (rank != 0)
          return distro__codec_fault_at(DISTRO__CODEC_INDEX_ORDER, c); /* rank >= C(n, k): not a valid set */
        break;
      }
    }
  }
  /* Exactly the section: no spare byte, and zero padding bits. */
  if ((r.pos + 7) / 8 != len) return framing;
  if (r.pos % 8 && (in[len - 1] >> (r.pos % 8))) return framing;
  return DISTRO__CODEC_NO_FAULT;
}
