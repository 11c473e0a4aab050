/* Internal: the syncer's clock: liveness, schedule, rounds, merges (rounds.c). */
#ifndef DISTRO_SYNC_ROUNDS_H
#define DISTRO_SYNC_ROUNDS_H

#include "sync/syncer_state.h"

/* The longest a round stays open (docs/protocol.md, "Liveness"). */
double distro__syncer_round_bound(distro_syncer *s);
/* A learner said hello again on a new connection (has_state) or as a
 * fresh process: its pending requests are re-asked there, or dropped. */
void distro__syncer_reasked(distro_syncer *s, int id, int has_state);
/* Liveness, schedule, quorum, grace, merges, stall report. */
void distro__syncer_tick(distro_syncer *s, double now);

#endif
