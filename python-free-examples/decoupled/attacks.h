/* The hostile learner's attacks (issue 30): a report hook for
 * distro__learner_set_report_hook that rewrites every report as an
 * attacker holding a valid key would. Shared by gpt-train-hostile
 * (hostile.c) and tests/test_sync_hostile.c. */
#ifndef DISTRO_EXAMPLE_ATTACKS_H
#define DISTRO_EXAMPLE_ATTACKS_H

#include <stdint.h>

typedef enum {
  ATTACK_NONE,
  ATTACK_GRAD100,  /* outer gradient -100 delta */
  ATTACK_NEG20,    /* theta <- -20 theta */
  ATTACK_NOISE,    /* theta + 1000 N(0, 1) */
  ATTACK_HUGE,     /* finite +-3e38 values */
  ATTACK_TOKENS,   /* 2^53 tokens claimed in 1 step, delta negated */
  ATTACK_FREERIDE, /* delta 0 with 2^53 tokens */
  ATTACK_NAN,      /* NaN and Inf values */
  ATTACK_COUNT
} attack_kind;

typedef struct {
  attack_kind kind;
  uint64_t rng; /* the noise's state (any seed) */
} attack_state;

/* "grad100", ... ("none" for ATTACK_NONE). */
const char *attack_name(attack_kind k);
/* ATTACK_COUNT when the name is none of them. */
attack_kind attack_parse(const char *name);
/* The report hook; ctx is an attack_state. */
void attack_rewrite(void *ctx, int p, float *delta, const float *base, int64_t n, uint64_t *tokens, uint64_t *steps);
/* A standard normal draw (Box-Muller on a 64-bit LCG). */
double attack_gauss(uint64_t *state);

#endif
