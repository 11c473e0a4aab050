/* Test support: a rogue client of the syncer protocol, speaking it by hand
 * (internal headers), for the tests that attack a running job. */
#ifndef DISTRO_TEST_SYNC_ROGUE_H
#define DISTRO_TEST_SYNC_ROGUE_H

#include <stdint.h>

#include "sync/sync_internal.h"

/* A DEALER connected to ep (linger 0). */
void *sr_dealer(void *ctx, const char *ep);
/* HELLO as learner `id` with tensors numel[0..nt) (flags 0), advertising
 * serve_ep and no key. Returns distro__sy_send's status. */
int sr_hello(void *sock, uint32_t id, uint64_t signature, int has_state, const int64_t *numel, int nt,
             const char *serve_ep);
/* HEARTBEAT as learner `id`, with the ready bit. */
int sr_heartbeat(void *sock, uint32_t id, int ready);
/* Receives and drops everything pending. */
void sr_drain(void *sock);
/* The first reply other than a HEARTBEAT within `seconds`: its type, or
 * 100 + the error code of an ERROR, 0 for none. */
int sr_first_reply(void *sock, double seconds);

#endif
