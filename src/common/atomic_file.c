/* Checksummed state files: atomic writes, checked reads (see atomic_file.h). */
#include "common/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/error.h"

static const char *kind(mode_t m) {
  return S_ISLNK(m) ? "symbolic link" : S_ISFIFO(m) ? "FIFO" : S_ISDIR(m) ? "directory" : S_ISCHR(m) ? "character device"
         : S_ISBLK(m) ? "block device" : S_ISSOCK(m) ? "socket" : "special file";
}

/* The target may be absent or a regular file; anything else is refused. */
static distro_status check_target(const char *path) {
  struct stat s;
  if (lstat(path, &s) != 0) {
    if (errno == ENOENT) return DISTRO_OK;
    return distro__fail(DISTRO_ERR_IO, "cannot inspect '%s': %s", path, strerror(errno));
  }
  if (!S_ISREG(s.st_mode))
    return distro__fail(DISTRO_ERR_IO, "refusing to replace '%s': it is a %s, not a regular file", path, kind(s.st_mode));
  return DISTRO_OK;
}

distro_status distro__afile_check(const char *path) {
  if (!path || !path[0]) return distro__fail(DISTRO_ERR_INVALID, "empty file path");
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else if ((size_t)(slash - path) >= sizeof dir) return distro__fail(DISTRO_ERR_INVALID, "file path too long");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  struct stat s;
  if (stat(dir, &s) != 0)
    return distro__fail(DISTRO_ERR_IO, "directory '%s' of '%s': %s", dir, path, strerror(errno));
  if (!S_ISDIR(s.st_mode)) return distro__fail(DISTRO_ERR_IO, "'%s' (the directory of '%s') is not a directory", dir, path);
  if (access(dir, W_OK | X_OK) != 0)
    return distro__fail(DISTRO_ERR_IO, "directory '%s' of '%s' is not writable: %s", dir, path, strerror(errno));
  return check_target(path);
}

distro_status distro__open_regular(const char *path, FILE **out, int *errno_out) {
  *out = NULL;
  if (errno_out) *errno_out = 0;
  const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno_out) *errno_out = errno;
    return distro__fail(DISTRO_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
  }
  struct stat s;
  const int ok = fstat(fd, &s) == 0;
  if (!ok || !S_ISREG(s.st_mode)) {
    const distro_status st = distro__fail(DISTRO_ERR_IO, "'%s' is not a regular file (%s)", path,
                                          ok ? kind(s.st_mode) : strerror(errno));
    close(fd);
    if (errno_out) *errno_out = EINVAL;
    return st;
  }
  const int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  *out = fdopen(fd, "rb");
  if (!*out) {
    close(fd);
    return distro__fail(DISTRO_ERR_IO, "fdopen '%s': %s", path, strerror(errno));
  }
  return DISTRO_OK;
}

distro_status distro__afile_open(distro__afile *a, const char *path) {
  memset(a, 0, sizeof *a);
  distro_status cs = check_target(path);
  if (cs != DISTRO_OK) return cs;
  const size_t len = strlen(path) + 32;
  a->tmp = malloc(len);
  a->path = malloc(strlen(path) + 1);
  if (!a->tmp || !a->path) {
    distro__afile_abort(a);
    return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  }
  memcpy(a->path, path, strlen(path) + 1);
  snprintf(a->tmp, len, "%s.tmp.%ld", path, (long)getpid());
  /* Exclusive and never through a link; a leftover of a crashed process
   * with the same pid is removed (only the name, whatever it points to). */
  int fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST && unlink(a->tmp) == 0)
    fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    distro_status st = distro__fail(DISTRO_ERR_IO, "cannot create '%s': %s", a->tmp, strerror(errno));
    free(a->tmp);
    a->tmp = NULL; /* nothing was created */
    distro__afile_abort(a);
    return st;
  }
  a->f = fdopen(fd, "wb");
  if (!a->f) {
    distro_status st = distro__fail(DISTRO_ERR_IO, "fdopen '%s': %s", a->tmp, strerror(errno));
    close(fd);
    distro__afile_abort(a);
    return st;
  }
  return DISTRO_OK;
}

void distro__afile_write(distro__afile *a, const void *p, size_t n) {
  if (a->err || n == 0) return;
  if (fwrite(p, 1, n, a->f) != n) a->err = errno ? errno : EIO;
  a->crc = distro__crc32c_update(a->crc, p, n);
}

void distro__afile_u32(distro__afile *a, uint32_t v) { distro__afile_write(a, &v, 4); }
void distro__afile_u64(distro__afile *a, uint64_t v) { distro__afile_write(a, &v, 8); }

/* The rename is durable only once the directory entry is on disk. */
static void sync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  const int fd = open(dir, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd); /* best effort: some filesystems refuse it on directories */
    close(fd);
  }
}

distro_status distro__afile_commit(distro__afile *a) {
  distro_status st = DISTRO_OK;
  const uint32_t crc = a->crc;
  distro__afile_write(a, &crc, 4);
  if (a->err) DISTRO_FAIL(DISTRO_ERR_IO, "writing '%s': %s", a->tmp, strerror(a->err));
  if (fflush(a->f) != 0 || fsync(fileno(a->f)) != 0)
    DISTRO_FAIL(DISTRO_ERR_IO, "flushing '%s': %s", a->tmp, strerror(errno));
  FILE *f = a->f;
  a->f = NULL;
  if (fclose(f) != 0) DISTRO_FAIL(DISTRO_ERR_IO, "closing '%s': %s", a->tmp, strerror(errno));
  /* Again: something else may have been put in the target's place meanwhile. */
  DISTRO_CHECK(check_target(a->path));
  if (rename(a->tmp, a->path) != 0)
    DISTRO_FAIL(DISTRO_ERR_IO, "renaming '%s' to '%s': %s", a->tmp, a->path, strerror(errno));
  sync_dir(a->path);
  free(a->tmp);
  a->tmp = NULL;
  distro__afile_abort(a);
  return DISTRO_OK;
fail:
  distro__afile_abort(a);
  return st;
}

void distro__afile_abort(distro__afile *a) {
  if (a->f) fclose(a->f);
  if (a->tmp) unlink(a->tmp);
  free(a->tmp);
  free(a->path);
  memset(a, 0, sizeof *a);
}

distro_status distro__rfile_open(distro__rfile *r, const char *path) {
  memset(r, 0, sizeof *r);
  r->path = path;
  return distro__open_regular(path, &r->f, NULL);
}

distro_status distro__rfile_read(distro__rfile *r, void *p, size_t n) {
  if (n == 0) return DISTRO_OK;
  if (fread(p, 1, n, r->f) != n) return distro__fail(DISTRO_ERR_IO, "'%s' is truncated or unreadable", r->path);
  r->crc = distro__crc32c_update(r->crc, p, n);
  return DISTRO_OK;
}

distro_status distro__rfile_finish(distro__rfile *r) {
  const uint32_t want = r->crc;
  uint32_t got;
  distro_status st = distro__rfile_read(r, &got, 4);
  if (st != DISTRO_OK) return st;
  if (got != want) return distro__fail(DISTRO_ERR_IO, "'%s': checksum mismatch (file corrupt)", r->path);
  if (fgetc(r->f) != EOF) return distro__fail(DISTRO_ERR_IO, "'%s': trailing bytes after the checksum", r->path);
  distro__rfile_close(r);
  return DISTRO_OK;
}

void distro__rfile_close(distro__rfile *r) {
  if (r->f) fclose(r->f);
  r->f = NULL;
}
