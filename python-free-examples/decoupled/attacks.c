/* The hostile learner's attacks (attacks.h). */
#include "attacks.h"

#include <math.h>
#include <string.h>

static const char *names[ATTACK_COUNT] = {"none", "grad100", "neg20", "noise", "huge", "tokens", "freeride", "nan"};

const char *attack_name(attack_kind k) { return k >= 0 && k < ATTACK_COUNT ? names[k] : "?"; }

attack_kind attack_parse(const char *name) {
  for (int k = 0; k < ATTACK_COUNT; k++)
    if (name && !strcmp(name, names[k])) return (attack_kind)k;
  return ATTACK_COUNT;
}

double attack_gauss(uint64_t *s) {
  double u[2];
  for (int k = 0; k < 2; k++) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    u[k] = ((double)(*s >> 11) + 0.5) / 9007199254740992.0;
  }
  return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* delta = base - theta: rewrite it (and the claims) as the attack does. */
void attack_rewrite(void *ctx, int p, float *delta, const float *base, int64_t n, uint64_t *tokens, uint64_t *steps) {
  attack_state *a = ctx;
  (void)p;
  for (int64_t j = 0; j < n; j++) {
    const float th = base[j] - delta[j];
    switch (a->kind) {
      case ATTACK_GRAD100: delta[j] = -100.0f * delta[j]; break;
      case ATTACK_NEG20: delta[j] = base[j] - (-20.0f * th); break;
      case ATTACK_NOISE: delta[j] = base[j] - (th + (float)(1000.0 * attack_gauss(&a->rng))); break;
      case ATTACK_HUGE: delta[j] = j % 2 ? -3e38f : 3e38f; break;
      case ATTACK_TOKENS: delta[j] = -delta[j]; break;
      case ATTACK_FREERIDE: delta[j] = 0; break;
      case ATTACK_NAN: delta[j] = j % 3 == 0 ? NAN : j % 3 == 1 ? INFINITY : delta[j]; break;
      default: break;
    }
  }
  if (a->kind == ATTACK_TOKENS) *tokens = 1ull << 53, *steps = 1;
  if (a->kind == ATTACK_FREERIDE) *tokens = 1ull << 53;
}
