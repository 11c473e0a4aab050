/* Gradient clipping for the trainer (clip.h). */
#include "clip.h"

#include <math.h>

/* Sum of squares of g[0..n) over nblk (<= 64) fixed blocks, added in
 * block order: the same whatever the thread count (MPI and in-process
 * ranks must agree bit for bit). */
static double sum_squares(const real *g, size_t n, int nblk) {
  double part[64];
#pragma omp parallel for schedule(static)
  for (int b = 0; b < nblk; b++) {
    double s = 0;
    for (size_t i = n * b / nblk; i < n * (b + 1) / nblk; i++) s += (double)g[i] * g[i];
    part[b] = s;
  }
  double ss = 0;
  for (int b = 0; b < nblk; b++) ss += part[b];
  return ss;
}

float gpt_clip_global(gpt_model *m, float max_norm) {
  const size_t n = m->nparams;
  real *g = m->grads;
  const float norm = (float)sqrt(sum_squares(g, n, 64));
  if (max_norm > 0 && norm > max_norm) {
    const float scale = max_norm / norm;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) g[i] *= scale;
  }
  return norm;
}
