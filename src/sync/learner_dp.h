/* Internal: data-parallel learners, rank 0 and the ranks that follow it
 * (learner_dp.c). */
#ifndef DISTRO_SYNC_LEARNER_DP_H
#define DISTRO_SYNC_LEARNER_DP_H

#include <stddef.h>

#include "sync/learner_state.h"

/* The chunk of the broadcast; every rank holds nranks of them (bc_tmp). */
#define DISTRO__LN_BCAST_SLOT ((size_t)1 << 20)

/* Rank 0's `bytes` at buf reach every rank's buf. */
distro_status distro__ln_dp_bcast(distro_learner *l, void *buf, size_t bytes);
/* After rank 0 joined (ok) or failed: every rank gets the layout settings,
 * the versions and the parameters. Collective. */
distro_status distro__ln_dp_start(distro_learner *l, int ok);
/* Ranks > 0: apply what rank 0 applied, snapshot what it reported. */
distro_status distro__ln_dp_follow(distro_learner *l, distro_learner_stats *out);

#endif
