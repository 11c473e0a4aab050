/* Checksummed state files. Writes are atomic: everything goes to a
 * temporary file next to the target, which is flushed, synced, renamed over
 * the target, and the directory synced, so a crash leaves the old file or
 * the new one, never a mix; a CRC32C of everything written is the trailer.
 * Reads fold every byte into the same CRC and check the trailer at the end.
 *
 * Only regular files are replaced: a target that exists as anything else
 * (a symbolic link, a FIFO, a device, a directory) is refused with
 * DISTRO_ERR_IO and left as it is, checked when the write starts and again
 * just before the rename. A symbolic link is not followed (a link planted
 * where a state file goes must not redirect the write); give the target's
 * own path instead. The temporary file is created exclusively and never
 * through a link. Readers open only regular files (a link to one is fine),
 * so a FIFO put in a state file's place cannot block a load. */
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

/* DISTRO_OK when an atomic write to `path` can start: its directory exists
 * and is writable, and `path` is absent or a regular file (not a link).
 * Lets a caller refuse a bad path at setup rather than at the first save. */
distro_status distro__afile_check(const char *path);

/* Opens `path` for reading only if it is a regular file (following links),
 * without blocking on a FIFO. DISTRO_ERR_IO names the problem; errno_out
 * (may be NULL) gets ENOENT when the file does not exist. */
distro_status distro__open_regular(const char *path, FILE **out, int *errno_out);

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
