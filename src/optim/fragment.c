/* Fragmenting strategies for streaming DiLoCo (see fragment.h). */
#include "optim/fragment.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"

typedef struct {
  int frag, tensor;
  int64_t offset, count;
} unit;

int64_t distro__fragments_auto_block(int64_t total, int P) {
  if (P < 1) P = 1;
  int64_t per = (total + 8 * (int64_t)P - 1) / (8 * (int64_t)P);
  per = (per + 63) / 64 * 64;
  return per < 64 ? 64 : per;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* Sorted distinct layer ids; returns how many. */
static int distinct_layers(int n, const int *layer, int *sorted) {
  for (int i = 0; i < n; i++) sorted[i] = layer ? layer[i] : i;
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_int);
  int L = 0;
  for (int i = 0; i < n; i++)
    if (i == 0 || sorted[i] != sorted[L - 1]) sorted[L++] = sorted[i];
  return L;
}

int64_t distro__fragments_units(distro_fragmenting s, int n, const int64_t *numel, const int *layer,
                                int64_t max_block) {
  if (n < 1) return 0;
  if (s == DISTRO_FRAG_STRIDED) {
    int *tmp = malloc(sizeof(int) * (size_t)n);
    if (!tmp) return -1;
    int L = distinct_layers(n, layer, tmp);
    free(tmp);
    return L;
  }
  int64_t u = 0;
  for (int i = 0; i < n; i++) u += (numel[i] + max_block - 1) / max_block;
  return u;
}

/* Largest first; ties by tensor, then offset (a total order: deterministic). */
static int cmp_size_desc(const void *a, const void *b) {
  const unit *x = a, *y = b;
  if (x->count != y->count) return x->count > y->count ? -1 : 1;
  if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
  return (x->offset > y->offset) - (x->offset < y->offset);
}

static int cmp_placed(const void *a, const void *b) {
  const unit *x = a, *y = b;
  if (x->frag != y->frag) return x->frag < y->frag ? -1 : 1;
  if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
  return (x->offset > y->offset) - (x->offset < y->offset);
}

void distro__fragments_destroy(distro__fragments *f) {
  if (!f) return;
  free(f->pieces);
  free(f->start);
  free(f->numel);
  memset(f, 0, sizeof *f);
}

distro_status distro__fragments_build(distro__fragments *f, distro_fragmenting s, int P, int n, const int64_t *numel,
                                      const int *layer, int64_t max_block) {
  distro_status st = DISTRO_OK;
  unit *u = NULL;
  int *sorted = NULL;
  int64_t *load = NULL;
  memset(f, 0, sizeof *f);
  if (P < 1) return distro__fail(DISTRO_ERR_INVALID, "fragments: P must be >= 1 (got %d)", P);
  if (n < 1 || !numel) return distro__fail(DISTRO_ERR_INVALID, "fragments: no tensors");
  if (s != DISTRO_FRAG_BALANCED && s != DISTRO_FRAG_STRIDED && s != DISTRO_FRAG_SEQUENTIAL)
    return distro__fail(DISTRO_ERR_INVALID, "unknown fragmenting strategy %d", (int)s);
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    if (numel[i] < 1) return distro__fail(DISTRO_ERR_INVALID, "fragments: tensor %d has no elements", i);
    total += numel[i];
  }
  const int64_t B = max_block > 0 ? max_block : distro__fragments_auto_block(total, P);
  int64_t nu = 0;
  if (s == DISTRO_FRAG_STRIDED) {
    sorted = malloc(sizeof(int) * (size_t)n);
    if (!sorted) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
    const int L = distinct_layers(n, layer, sorted);
    nu = L;
    if (nu < P)
      DISTRO_FAIL(DISTRO_ERR_INVALID, "strided fragments: %lld layers cannot fill %d fragments", (long long)nu, P);
    u = malloc(sizeof *u * (size_t)n);
    if (!u) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
    int64_t *layer_numel = calloc((size_t)nu, sizeof *layer_numel);
    if (!layer_numel) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
      const int id = layer ? layer[i] : i;
      const int *hit = bsearch(&id, sorted, (size_t)nu, sizeof *sorted, cmp_int);
      const int rank = (int)(hit - sorted);
      u[i] = (unit){rank % P, i, 0, numel[i]};
      layer_numel[rank] += numel[i];
    }
    for (int64_t l = 0; l < nu; l++)
      if (layer_numel[l] > f->max_unit) f->max_unit = layer_numel[l];
    free(layer_numel);
    nu = n; /* units placed below are tensors */
    f->nunits = L;
  } else {
    nu = distro__fragments_units(s, n, numel, layer, B);
    if (nu < P)
      DISTRO_FAIL(DISTRO_ERR_INVALID,
                  "%d fragments but only %lld blocks of at most %lld elements (use fewer fragments or a smaller "
                  "max_block)",
                  P, (long long)nu, (long long)B);
    if (nu > 0x7fffffff) DISTRO_FAIL(DISTRO_ERR_INVALID, "fragments: too many blocks (%lld)", (long long)nu);
    u = malloc(sizeof *u * (size_t)nu);
    if (!u) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
    int64_t j = 0;
    for (int i = 0; i < n; i++) {
      const int64_t k = (numel[i] + B - 1) / B, base = numel[i] / k, rem = numel[i] % k;
      int64_t off = 0;
      for (int64_t b = 0; b < k; b++) {
        const int64_t c = base + (b < rem ? 1 : 0);
        u[j++] = (unit){0, i, off, c};
        off += c;
        if (c > f->max_unit) f->max_unit = c;
      }
    }
    f->nunits = (int)nu;
    if (s == DISTRO_FRAG_BALANCED) {
      load = calloc((size_t)P, sizeof *load);
      if (!load) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
      qsort(u, (size_t)nu, sizeof *u, cmp_size_desc);
      for (int64_t q = 0; q < nu; q++) {
        int best = 0;
        for (int p = 1; p < P; p++)
          if (load[p] < load[best]) best = p;
        u[q].frag = best;
        load[best] += u[q].count;
      }
    } else {
      int p = 0;
      int64_t cur = 0, prefix = 0;
      for (int64_t q = 0; q < nu; q++) {
        const int64_t z = u[q].count;
        if (cur > 0 && p < P - 1) {
          /* boundary of fragment p: (p+1) * total / P, compared doubled */
          const double boundary = (double)(p + 1) * (double)total / (double)P;
          if ((double)(2 * prefix + z) > 2.0 * boundary || nu - q <= (int64_t)(P - 1 - p)) {
            p++;
            cur = 0;
          }
        }
        u[q].frag = p;
        cur += z;
        prefix += z;
      }
    }
  }
  /* Fragment-major, then tensor and offset; merge touching ranges. */
  qsort(u, (size_t)nu, sizeof *u, cmp_placed);
  f->pieces = malloc(sizeof *f->pieces * (size_t)nu);
  f->start = calloc((size_t)P + 1, sizeof *f->start);
  f->numel = calloc((size_t)P, sizeof *f->numel);
  if (!f->pieces || !f->start || !f->numel) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  f->nfrag = P;
  int np = 0;
  for (int64_t q = 0; q < nu; q++) {
    distro__piece *last = np ? &f->pieces[np - 1] : NULL;
    if (last && q > 0 && u[q - 1].frag == u[q].frag && last->tensor == u[q].tensor &&
        last->offset + last->count == u[q].offset) {
      last->count += u[q].count;
    } else {
      f->pieces[np++] = (distro__piece){u[q].tensor, u[q].offset, u[q].count};
      f->start[u[q].frag + 1] = np;
    }
    f->numel[u[q].frag] += u[q].count;
  }
  /* start[p+1] holds the end of fragment p where it had pieces; fill gaps */
  for (int p = 1; p <= P; p++)
    if (f->start[p] < f->start[p - 1]) f->start[p] = f->start[p - 1];
  f->npieces = np;
  for (int p = 0; p < P; p++)
    if (f->numel[p] == 0) DISTRO_FAIL(DISTRO_ERR_INVALID, "fragments: fragment %d would be empty", p);
  free(u);
  free(sorted);
  free(load);
  return DISTRO_OK;
fail:
  free(u);
  free(sorted);
  free(load);
  distro__fragments_destroy(f);
  return st;
}
