/* Internal: the syncer's checkpoint file (checkpoint.c). */
#ifndef DISTRO_SYNC_CHECKPOINT_H
#define DISTRO_SYNC_CHECKPOINT_H

#include "sync/syncer_state.h"

/* Saves under s->mu. */
distro_status distro__syncer_ckpt_save(distro_syncer *s);
/* Loads at create; *found = 0 when there is no file yet. */
distro_status distro__syncer_ckpt_load(distro_syncer *s, int *found);

#endif
