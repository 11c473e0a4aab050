/* distro: status codes and error reporting. */
#ifndef DISTRO_STATUS_H
#define DISTRO_STATUS_H

#if defined(DISTRO_BUILDING) && defined(__GNUC__)
#define DISTRO_API __attribute__((visibility("default")))
#else
#define DISTRO_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Every fallible call returns one of these. On failure the calling thread's
 * distro_last_error() holds a message naming the problem. */
typedef enum {
  DISTRO_OK = 0,
  DISTRO_ERR_INVALID,     /* bad argument: NULL, out of range, wrong call order */
  DISTRO_ERR_NOMEM,       /* allocation failed */
  DISTRO_ERR_SHAPE,       /* tensor lists or shapes disagree (ranks, files) */
  DISTRO_ERR_PAYLOAD,     /* a received payload is corrupt or out of range */
  DISTRO_ERR_COMM,        /* the communicator failed */
  DISTRO_ERR_NONFINITE,   /* NaN or Inf in an input */
  DISTRO_ERR_IO,          /* file could not be read/written or is corrupt */
  DISTRO_ERR_UNSUPPORTED, /* feature not built in or not available */
  DISTRO_ERR_CUDA,        /* CUDA runtime/library failure */
  DISTRO_ERR_TIMEOUT      /* a peer or service did not answer in time */
} distro_status;

/* Static, never NULL; "unknown status" for values outside the enum. */
DISTRO_API const char *distro_status_string(distro_status s);

/* Thread-local detail of the last failure on this thread ("" if none).
 * Valid until the next failing distro call on the same thread. */
DISTRO_API const char *distro_last_error(void);

/* Library version, e.g. "0.1.0". */
DISTRO_API const char *distro_version_string(void);

#ifdef __cplusplus
}
#endif
#endif
