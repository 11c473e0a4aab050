/* Fragmenting strategies: every parameter element in exactly one fragment,
 * no empty fragment, balanced sizes within one block, sequential order,
 * strided layers, and too many fragments rejected. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/fragment.h"
#include "testutil.h"

static const char *sname(distro_fragmenting s) {
  return s == DISTRO_FRAG_BALANCED ? "balanced" : s == DISTRO_FRAG_STRIDED ? "strided" : "sequential";
}

/* Coverage and structure checks common to every strategy. */
static void check_cover(const distro__fragments *f, int n, const int64_t *numel, const char *what) {
  int64_t total = 0, *base = malloc(sizeof *base * (size_t)n);
  for (int i = 0; i < n; i++) {
    base[i] = total;
    total += numel[i];
  }
  unsigned char *seen = calloc((size_t)total, 1);
  cr_assert_eq(f->start[0], 0, "%s", what);
  cr_assert_eq(f->start[f->nfrag], f->npieces, "%s", what);
  for (int p = 0; p < f->nfrag; p++) {
    int64_t sum = 0;
    cr_assert_gt(f->start[p + 1], f->start[p], "%s: fragment %d is empty", what, p);
    for (int q = f->start[p]; q < f->start[p + 1]; q++) {
      const distro__piece *pc = &f->pieces[q];
      cr_assert(pc->tensor >= 0 && pc->tensor < n && pc->count > 0 && pc->offset >= 0 &&
                pc->offset + pc->count <= numel[pc->tensor], "%s: bad piece", what);
      if (q > f->start[p]) { /* sorted by (tensor, offset), touching ranges merged */
        const distro__piece *pr = &f->pieces[q - 1];
        cr_assert(pr->tensor < pc->tensor || (pr->tensor == pc->tensor && pr->offset + pr->count < pc->offset),
                  "%s: fragment %d pieces unsorted or unmerged", what, p);
      }
      for (int64_t j = 0; j < pc->count; j++) {
        const int64_t at = base[pc->tensor] + pc->offset + j;
        cr_assert_eq(seen[at], 0, "%s: element %lld of tensor %d is in two fragments", what, (long long)(pc->offset + j),
                     pc->tensor);
        seen[at] = 1;
      }
      sum += pc->count;
    }
    cr_assert_eq(sum, f->numel[p], "%s: fragment %d size", what, p);
  }
  for (int64_t j = 0; j < total; j++) cr_assert_eq(seen[j], 1, "%s: element %lld in no fragment", what, (long long)j);
  free(seen);
  free(base);
}

Test(fragment, cover_every_parameter_once) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int trial = 0; trial < 60; trial++) {
    const int n = 1 + (int)(tu_next(&r) % 40);
    int64_t numel[40];
    int layer[40];
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
      numel[i] = 1 + (int64_t)(tu_next(&r) % (tu_next(&r) % 3 == 0 ? 20000 : 300));
      layer[i] = (int)(tu_next(&r) % 12);
      total += numel[i];
    }
    for (int s = 0; s < 3; s++)
      for (int P = 1; P <= 9; P += 2) {
        const distro_fragmenting strat = (distro_fragmenting)s;
        const int64_t B = trial % 2 ? 0 : 1 + (int64_t)(tu_next(&r) % 1000);
        const int *lay = trial % 3 ? layer : NULL;
        distro__fragments f;
        char what[160];
        snprintf(what, sizeof what, "%s P %d max_block %lld trial %d (DISTRO_TEST_SEED=%llu)", sname(strat), P,
                 (long long)B, trial, (unsigned long long)seed);
        const int64_t Beff = B > 0 ? B : distro__fragments_auto_block(total, P);
        const int64_t units = distro__fragments_units(strat, n, numel, lay, Beff);
        distro_status st = distro__fragments_build(&f, strat, P, n, numel, lay, B);
        if (units < P) {
          cr_assert_eq(st, DISTRO_ERR_INVALID, "%s: %lld units accepted", what, (long long)units);
          continue;
        }
        cr_assert_eq(st, DISTRO_OK, "%s: %s", what, distro_last_error());
        cr_assert_eq(f.nunits, units, "%s", what);
        check_cover(&f, n, numel, what);
        int64_t lo = f.numel[0], hi = f.numel[0];
        for (int p = 1; p < P; p++) {
          if (f.numel[p] < lo) lo = f.numel[p];
          if (f.numel[p] > hi) hi = f.numel[p];
        }
        if (strat == DISTRO_FRAG_BALANCED) {
          cr_assert_leq(hi - lo, f.max_unit, "%s: balanced sizes %lld..%lld differ by more than one block (%lld)", what,
                        (long long)lo, (long long)hi, (long long)f.max_unit);
          cr_assert_leq(f.max_unit, Beff, "%s", what);
        }
        if (strat == DISTRO_FRAG_SEQUENTIAL) /* fragment p+1 starts where p ends */
          for (int p = 0; p + 1 < P; p++) {
            const distro__piece *a = &f.pieces[f.start[p + 1] - 1], *b = &f.pieces[f.start[p + 1]];
            cr_assert(b->tensor == a->tensor ? b->offset == a->offset + a->count
                                             : (b->tensor == a->tensor + 1 && b->offset == 0 &&
                                                a->offset + a->count == numel[a->tensor]),
                      "%s: fragments %d and %d are not contiguous", what, p, p + 1);
          }
        if (strat == DISTRO_FRAG_STRIDED)
          for (int p = 0; p < P; p++)
            for (int q = f.start[p]; q < f.start[p + 1]; q++) {
              const int t = f.pieces[q].tensor, id = lay ? lay[t] : t;
              int rank = 0; /* rank of the layer id among the distinct ids */
              for (int v = 0; v < id; v++) {
                int present = 0;
                for (int i = 0; i < n && !present; i++) present = (lay ? lay[i] : i) == v;
                rank += present;
              }
              cr_assert_eq(rank % P, p, "%s: tensor %d (layer %d) in fragment %d", what, t, id, p);
              cr_assert(f.pieces[q].offset == 0 && f.pieces[q].count == numel[t], "%s: strided split a tensor", what);
            }
        distro__fragments_destroy(&f);
      }
  }
}

/* A GPT-2-small-like list: balanced fragments are near-equal even though
 * the embedding is far larger than a fragment. */
Test(fragment, balanced_splits_large_tensors) {
  int64_t numel[2 + 12 * 4];
  int n = 0;
  numel[n++] = 50257 * 768; /* wte */
  numel[n++] = 1024 * 768;  /* wpe */
  for (int l = 0; l < 12; l++) {
    numel[n++] = 768 * 2304;
    numel[n++] = 768 * 768;
    numel[n++] = 768 * 3072;
    numel[n++] = 3072 * 768;
  }
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += numel[i];
  for (int P = 1; P <= 24; P++) {
    distro__fragments f;
    cr_assert_eq(distro__fragments_build(&f, DISTRO_FRAG_BALANCED, P, n, numel, NULL, 0), DISTRO_OK);
    int64_t lo = INT64_MAX, hi = 0;
    for (int p = 0; p < P; p++) {
      lo = f.numel[p] < lo ? f.numel[p] : lo;
      hi = f.numel[p] > hi ? f.numel[p] : hi;
    }
    cr_assert_leq(hi - lo, f.max_unit);
    /* auto block is ~1/8 of a fragment: peak within ~13% of total/P */
    cr_assert_leq((double)hi, 1.13 * (double)total / P + 64, "P %d: largest fragment %lld, total/P %g", P,
                  (long long)hi, (double)total / P);
    distro__fragments_destroy(&f);
  }
}

Test(fragment, too_many_fragments_rejected) {
  const int64_t numel[3] = {10, 20, 30};
  distro__fragments f;
  cr_assert_eq(distro__fragments_build(&f, DISTRO_FRAG_STRIDED, 4, 3, numel, NULL, 0), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "layers") != NULL, "%s", distro_last_error());
  const int same[3] = {5, 5, 7};
  cr_assert_eq(distro__fragments_build(&f, DISTRO_FRAG_STRIDED, 3, 3, numel, same, 0), DISTRO_ERR_INVALID);
  cr_assert_eq(distro__fragments_build(&f, DISTRO_FRAG_STRIDED, 2, 3, numel, same, 0), DISTRO_OK);
  distro__fragments_destroy(&f);
  cr_assert_eq(distro__fragments_build(&f, DISTRO_FRAG_BALANCED, 4, 3, numel, NULL, 64), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "blocks") != NULL, "%s", distro_last_error());
  cr_assert_eq(distro__fragments_build(&f, DISTRO_FRAG_SEQUENTIAL, 6, 3, numel, NULL, 10), DISTRO_OK);
  cr_assert_eq(f.nunits, 6);
  for (int p = 0; p < 6; p++) cr_assert_eq(f.numel[p], 10);
  distro__fragments_destroy(&f);
  cr_assert_eq(distro__fragments_build(&f, DISTRO_FRAG_SEQUENTIAL, 7, 3, numel, NULL, 10), DISTRO_ERR_INVALID);
  cr_assert_eq(distro__fragments_build(&f, (distro_fragmenting)9, 1, 3, numel, NULL, 0), DISTRO_ERR_INVALID);
  cr_assert_eq(distro__fragments_build(&f, DISTRO_FRAG_BALANCED, 0, 3, numel, NULL, 0), DISTRO_ERR_INVALID);
}
