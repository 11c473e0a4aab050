/* CRC32C: the library's checksum (hardware, table, and large buffers split
 * over threads and combined) against a bit-by-bit reference of the
 * definition, on fresh random buffers around the split threshold, at
 * several thread counts, whole and continued with update(). */
#include <criterion/criterion.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/crc32c.h"
#include "testutil.h"
#include "wire_ref.h"

static uint8_t *random_bytes(tu_rng *r, size_t n) {
  uint8_t *p = malloc(n ? n : 1);
  cr_assert_not_null(p);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(tu_next(r) >> 56);
  return p;
}

Test(crc32c, check_value) {
  cr_assert_eq(distro__crc32c("123456789", 9), 0xe3069283u);
  cr_assert_eq(distro__crc32c("", 0), 0u);
}

Test(crc32c, large_buffers_equal_the_definition_at_any_thread_count) {
  tu_rng r = {tu_seed()};
  const size_t sizes[] = {0, 1, 7, 8, 4095, (1u << 20) - 1, 1u << 20, (3u << 20) + 5, (9u << 20) + 3};
  const int threads[] = {1, 2, 3, 7, 16};
  const int saved = omp_get_max_threads();
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    uint8_t *p = random_bytes(&r, sizes[s]);
    const uint32_t want = ref_crc32c(p, sizes[s]);
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
      omp_set_num_threads(threads[t]);
      cr_assert_eq(distro__crc32c(p, sizes[s]), want, "%zu bytes, %d threads: 0x%08x != 0x%08x (seed %llu)", sizes[s],
                   threads[t], distro__crc32c(p, sizes[s]), want, (unsigned long long)tu_seed());
    }
    free(p);
  }
  omp_set_num_threads(saved);
}

Test(crc32c, update_continues_across_any_split) {
  tu_rng r = {tu_seed() ^ 0x5bd1e995u};
  const size_t n = (5u << 20) + 11;
  uint8_t *p = random_bytes(&r, n);
  const uint32_t want = ref_crc32c(p, n);
  omp_set_num_threads(4);
  for (int trial = 0; trial < 6; trial++) {
    const size_t cut = (size_t)(tu_next(&r) % (n + 1));
    const uint32_t got = distro__crc32c_update(distro__crc32c(p, cut), p + cut, n - cut);
    cr_assert_eq(got, want, "split at %zu: 0x%08x != 0x%08x", cut, got, want);
  }
  free(p);
}
