/* A small deterministic random generator. The whole state is one uint64, so
 * a checkpoint can store it and a resumed run draws the same numbers. */
#ifndef GPT_RNG_H
#define GPT_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct {
  uint64_t s;
} gpt_rng;

/* splitmix64: every seed (0 too) gives a well-mixed stream. */
static inline uint64_t rng_u64(gpt_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static inline gpt_rng rng_make(uint64_t seed, uint64_t stream) {
  gpt_rng r = {seed ^ (0x632be59bd9b4e019ULL * (stream + 1))};
  rng_u64(&r);
  return r;
}

/* Uniform in [0, 1). */
static inline double rng_uniform(gpt_rng *r) { return (double)(rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

/* Uniform integer in [0, n); n < 2^32 (the bias of the multiply is < 2^-32). */
static inline uint64_t rng_below(gpt_rng *r, uint64_t n) { return ((rng_u64(r) >> 32) * n) >> 32; }

/* Standard normal (Box-Muller; one of the pair is dropped to keep the state
 * a single word). */
static inline double rng_normal(gpt_rng *r) {
  double u = 1.0 - rng_uniform(r), v = rng_uniform(r);
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

#endif
