/* Internal: the learner's background thread (learner_bg.c). */
#ifndef DISTRO_SYNC_LEARNER_BG_H
#define DISTRO_SYNC_LEARNER_BG_H

/* The thread's body; arg is the distro_learner. Owns every socket: the
 * join, the syncer's messages, the state endpoint. */
void *distro__ln_bg_main(void *arg);

#endif
