/* Internal: thread-local last error and error-propagation macros. */
#ifndef DISTRO_COMMON_ERROR_H
#define DISTRO_COMMON_ERROR_H

#include <distro/status.h>

/* Records a formatted message for distro_last_error() and returns `s`. */
distro_status distro__fail(distro_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Returns DISTRO_ERR_INVALID, naming the argument, when it is NULL. */
#define DISTRO__NONNULL(fn, arg)                                                          \
  do {                                                                                  \
    if (!(arg)) return distro__fail(DISTRO_ERR_INVALID, fn ": argument '" #arg "' is NULL"); \
  } while (0)

/* Propagate a failure to the caller's `fail:` cleanup label. */
#define DISTRO_CHECK(expr)               \
  do {                                   \
    st = (expr);                         \
    if (st != DISTRO_OK) goto fail;      \
  } while (0)

#define DISTRO_FAIL(code, ...)                     \
  do {                                             \
    st = distro__fail((code), __VA_ARGS__);        \
    goto fail;                                     \
  } while (0)

#endif
