/* Communicator front end: argument checks shared by every backend. */
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

distro_status distro_comm_allgather(distro_comm *c, const void *send, size_t bytes, void *recv) {
  if (!c || (!send && bytes) || (!recv && bytes))
    return distro__fail(DISTRO_ERR_INVALID, "distro_comm_allgather: NULL argument");
  return c->ops->allgather(c, send, bytes, recv);
}

distro_status distro_comm_allreduce_sum(distro_comm *c, float *buf, size_t count) {
  if (!c || (!buf && count))
    return distro__fail(DISTRO_ERR_INVALID, "distro_comm_allreduce_sum: NULL argument");
  return c->ops->allreduce_sum(c, buf, count);
}

distro_status distro_comm_barrier(distro_comm *c) {
  if (!c) return distro__fail(DISTRO_ERR_INVALID, "distro_comm_barrier: NULL comm");
  return c->ops->barrier(c);
}
