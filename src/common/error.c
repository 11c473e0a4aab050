#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The only mutable global state in the library: one message per thread. */
static _Thread_local char last_error[512];

distro_status distro__fail(distro_status s, const char *fmt, ...) {
  /* Format into a local buffer first: callers may pass distro_last_error()
   * itself as an argument, and vsnprintf must not read what it writes. */
  char msg[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(last_error, msg, sizeof msg);
  return s;
}

const char *distro_last_error(void) { return last_error; }

const char *distro_status_string(distro_status s) {
  switch (s) {
    case DISTRO_OK: return "ok";
    case DISTRO_ERR_INVALID: return "invalid argument";
    case DISTRO_ERR_NOMEM: return "out of memory";
    case DISTRO_ERR_SHAPE: return "shape mismatch";
    case DISTRO_ERR_PAYLOAD: return "corrupt payload";
    case DISTRO_ERR_COMM: return "communication failure";
    case DISTRO_ERR_NONFINITE: return "non-finite value";
    case DISTRO_ERR_IO: return "i/o error";
    case DISTRO_ERR_UNSUPPORTED: return "unsupported";
    case DISTRO_ERR_CUDA: return "cuda error";
    case DISTRO_ERR_TIMEOUT: return "timeout";
  }
  return "unknown status";
}

const char *distro_version_string(void) { return DISTRO_VERSION; }
