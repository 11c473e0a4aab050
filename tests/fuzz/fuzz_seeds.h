/* The fuzz harnesses' seed writers: a fixed pseudo-random sequence and one
 * seed file (mode byte, then the payload). Header-only; included under each
 * harness's *_SEED_MAIN. */
#ifndef DISTRO_TESTS_FUZZ_SEEDS_H
#define DISTRO_TESTS_FUZZ_SEEDS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t lcg = 0x243f6a8885a308d3ull;
static uint32_t next_u32(void) {
  lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(lcg >> 32);
}

static void write_seed(const char *dir, const char *name, uint8_t mode, const uint8_t *p, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(&mode, 1, 1, f) != 1 || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

#endif
