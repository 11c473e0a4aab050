/* Checksummed state files. Writes are atomic: everything goes to a
 * temporary file next to the target, which is flushed, synced, renamed over
 * the target, and the directory synced, so a crash leaves the old file or
 * the new one, never a mix; a CRC32C of everything written is the trailer.
 * Reads fold every byte into the same CRC and check the trailer at the end. */
#ifndef DISTRO_COMMON_ATOMIC_FILE_H
#define DISTRO_COMMON_ATOMIC_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <distro/status.h>

typedef struct {
  FILE *f;
  char *tmp, *path;
  uint32_t crc; /* of every byte written so far */
  int err;      /* first write error (errno), sticky */
} distro__afile;

/* Creates the temporary file; on failure sets the last error and leaves
 * nothing behind. */
distro_status distro__afile_open(distro__afile *a, const char *path);

/* Appends n bytes and folds them into the CRC; errors are reported by commit. */
void distro__afile_write(distro__afile *a, const void *p, size_t n);
void distro__afile_u32(distro__afile *a, uint32_t v); /* host order: little-endian hosts */
void distro__afile_u64(distro__afile *a, uint64_t v);

/* Appends the CRC32C of everything before, then flushes, syncs and renames
 * the file into place. On failure removes the temporary file. Either way the
 * handle is released. */
distro_status distro__afile_commit(distro__afile *a);

/* Drops a write in progress (safe on a handle that was never opened). */
void distro__afile_abort(distro__afile *a);

/* Reading: open, read (a short read is "truncated"), then finish, which
 * checks the CRC trailer and that nothing follows it. close accepts a
 * handle that was never opened or is already closed. */
typedef struct {
  FILE *f;
  const char *path; /* borrowed, for messages */
  uint32_t crc;
} distro__rfile;

distro_status distro__rfile_open(distro__rfile *r, const char *path);
distro_status distro__rfile_read(distro__rfile *r, void *p, size_t n);
distro_status distro__rfile_finish(distro__rfile *r);
void distro__rfile_close(distro__rfile *r);

#endif
