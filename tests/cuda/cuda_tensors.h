/* The small tensor set of the whole-step CUDA tests: a matrix whose sides
 * are not multiples of the chunk, a prime-length vector and a 3-D tensor. */
#ifndef DISTRO_CUDA_TENSORS_H
#define DISTRO_CUDA_TENSORS_H

#include <stdint.h>

#define NT 3
static const char *names[NT] = {"w", "b", "e"};
static const int ndims[NT] = {2, 1, 3};
static const int64_t shapes[NT][3] = {{96, 100}, {67}, {2, 10, 24}};
static int64_t numel(int i) {
  int64_t n = 1;
  for (int d = 0; d < ndims[i]; d++) n *= shapes[i][d];
  return n;
}

#endif
