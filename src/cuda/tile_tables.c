/* The exact method's DCT tables on the device: the CPU's FAST plan for one
 * tile shape, uploaded as it is, so the device multiplies by the same
 * floats (src/cuda/step_math.h, distro__hd_dct). */
#include <string.h>

#include <cuda_runtime_api.h>

#include "compress/dct.h"
#include "cuda/cuda_internal.h"

distro_status distro__cuda_tile_tables(const distro__tiling *t, float **out_blob, distro__hd_dct *out) {
  distro_status st = DISTRO_OK;
  distro__dct_plan plan;
  float *blob = NULL;
  memset(&plan, 0, sizeof plan);
  *out_blob = NULL;
  DISTRO_CHECK(distro__dct_plan_init(&plan, t, DISTRO__DCT_FAST));
  distro__hd_dct host;
  distro__hd_dct_from_plan(&plan, &host);
  /* Every table with its size in floats; the device copy's pointers are set
   * member by member (dev_slot mirrors slot). */
  const float **slot[2 + 8 + 1 + 2 + 24];
  const float **dev_slot[2 + 8 + 1 + 2 + 24];
  int64_t len[2 + 8 + 1 + 2 + 24], total = 0;
  int n = 0;
  distro__hd_dct dev = host;
  const int64_t w = t->w, hb = host.hbase;
#define TABLE(member, count) (slot[n] = &host.member, dev_slot[n] = &dev.member, len[n++] = (count))
  TABLE(fw, w * w);
  TABLE(fwt, w * w);
  for (int l = 0; l < host.wl; l++) TABLE(fo[l], (w >> (l + 1)) * (w >> (l + 1)));
  if (host.wl > 0) TABLE(fe, (w >> host.wl) * (w >> host.wl));
  if (t->h > 1) {
    TABLE(cb, hb * hb);
    TABLE(cbt, hb * hb);
    for (int l = 0; l < host.hl; l++) TABLE(s4[l], (t->h >> (l + 1)) * (t->h >> (l + 1)));
  } else {
    dev.cb = dev.cbt = NULL; /* a one-row tile has no height transform */
  }
#undef TABLE
  for (int a = 0; a < n; a++) total += len[a];
  DISTRO_CUDA_TRY(cudaMalloc((void **)&blob, sizeof(float) * (size_t)(total ? total : 1)));
  int64_t at = 0;
  for (int a = 0; a < n; a++) {
    DISTRO_CUDA_TRY(cudaMemcpy(blob + at, *slot[a], sizeof(float) * (size_t)len[a], cudaMemcpyHostToDevice));
    *dev_slot[a] = blob + at;
    at += len[a];
  }
  distro__dct_plan_destroy(&plan);
  *out_blob = blob;
  *out = dev;
  return DISTRO_OK;
fail:
  cudaFree(blob);
  distro__dct_plan_destroy(&plan);
  return st;
}
