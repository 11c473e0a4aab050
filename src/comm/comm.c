/* Communicator front end: argument checks shared by every backend. */
#include <math.h>
#include <stdlib.h>

#include "comm/comm_internal.h"
#include "common/error.h"

int distro_comm_rank(const distro_comm *c) { return c ? c->rank : -1; }
int distro_comm_size(const distro_comm *c) { return c ? c->size : -1; }

void distro_comm_free(distro_comm *c) {
  if (!c) return;
  if (c->ops && c->ops->destroy) c->ops->destroy(c);
  free(c);
}

static distro_status broken(const distro_comm *c, const char *what) {
  return distro__fail(DISTRO_ERR_TIMEOUT,
                      "%s: the %s communicator timed out in an earlier collective (%.3g s) and is unusable; abort the job",
                      what, c->ops->name, c->timeout_s);
}

distro_status distro_comm_allgather(distro_comm *c, const void *send, size_t bytes, void *recv) {
  DISTRO__NONNULL("distro_comm_allgather", c);
  if (bytes) {
    DISTRO__NONNULL("distro_comm_allgather", send);
    DISTRO__NONNULL("distro_comm_allgather", recv);
  }
  if (c->broken) return broken(c, "distro_comm_allgather");
  return c->ops->allgather(c, send, bytes, recv);
}

distro_status distro_comm_allreduce_sum(distro_comm *c, float *buf, size_t count) {
  DISTRO__NONNULL("distro_comm_allreduce_sum", c);
  if (count) DISTRO__NONNULL("distro_comm_allreduce_sum", buf);
  if (c->broken) return broken(c, "distro_comm_allreduce_sum");
  return c->ops->allreduce_sum(c, buf, count);
}

distro_status distro_comm_barrier(distro_comm *c) {
  if (!c) return distro__fail(DISTRO_ERR_INVALID, "distro_comm_barrier: NULL comm");
  if (c->broken) return broken(c, "distro_comm_barrier");
  return c->ops->barrier(c);
}

distro_status distro_comm_set_timeout(distro_comm *c, double seconds) {
  if (!c) return distro__fail(DISTRO_ERR_INVALID, "distro_comm_set_timeout: NULL comm");
  if (!(seconds >= 0) || !isfinite(seconds) || seconds > 1e6)
    return distro__fail(DISTRO_ERR_INVALID, "distro_comm_set_timeout: %g s is not in [0, 1e6]", seconds);
  if (!c->ops->timeouts || c->no_timeout)
    return distro__fail(DISTRO_ERR_UNSUPPORTED, "distro_comm_set_timeout: the %s communicator has no timeout",
                        c->ops->name);
  c->timeout_s = seconds;
  return DISTRO_OK;
}

distro_status distro__comm_dup(distro_comm *c, distro_comm **out) {
  *out = NULL;
  if (c->broken) return broken(c, "duplicating the communicator");
  if (!c->ops->dup)
    return distro__fail(DISTRO_ERR_UNSUPPORTED,
                        "the %s communicator cannot be duplicated for a background exchange (options.overlap)",
                        c->ops->name);
  distro_status st = c->ops->dup(c, out);
  if (st == DISTRO_OK) (*out)->timeout_s = c->timeout_s;
  return st;
}
