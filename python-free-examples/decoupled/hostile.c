/* gpt-train-hostile: gpt-train (python-free-examples/gpt) linked with this
 * file, for measuring the syncer's defences (docs/protocol.md, "Threat
 * model"; run-hostile.sh). It trains like any learner, but when
 * DISTRO_HOSTILE_ATTACK names an attack of attacks.h (grad100, neg20,
 * noise, huge, tokens, freeride, nan), every report it sends is rewritten
 * as an attacker holding a valid key would.
 *
 * The link wraps distro_learner_start (-Wl,--wrap) to install the learner's
 * report hook (an internal of the static library) before the join. */
#include <stdio.h>
#include <stdlib.h>

#include "attacks.h"
#include "sync/learner_state.h"

static attack_state g_attack; /* this program's one learner */

distro_status __real_distro_learner_start(distro_learner *l);
distro_status __wrap_distro_learner_start(distro_learner *l);

distro_status __wrap_distro_learner_start(distro_learner *l) {
  const char *a = getenv("DISTRO_HOSTILE_ATTACK");
  if (a && *a) {
    const attack_kind k = attack_parse(a);
    if (k == ATTACK_COUNT) {
      fprintf(stderr, "gpt-train-hostile: DISTRO_HOSTILE_ATTACK=%s is not one of grad100, neg20, noise, huge, "
                      "tokens, freeride, nan\n", a);
      return DISTRO_ERR_INVALID;
    }
    g_attack.kind = k;
    g_attack.rng = 12345;
    distro__learner_set_report_hook(l, attack_rewrite, &g_attack);
    fprintf(stderr, "gpt-train-hostile: every report rewritten (%s)\n", a);
  }
  return __real_distro_learner_start(l);
}
