/* ZeroMQ helpers: whole multipart messages without blocking, ERROR replies,
 * CURVE key files, the monotonic clock. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/error.h"
#include "sync/sync_internal.h"

double distro__sy_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void distro__sy_frames_free(distro__sy_frames *f) {
  for (int i = 0; i < f->n; i++) free(f->data[i]);
  memset(f, 0, sizeof *f);
}

int distro__sy_recv(void *sock, distro__sy_frames *f) {
  memset(f, 0, sizeof *f);
  for (;;) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    int rc = zmq_msg_recv(&msg, sock, f->n == 0 ? ZMQ_DONTWAIT : 0);
    if (rc < 0) {
      int e = errno;
      zmq_msg_close(&msg);
      if (f->n == 0 && e == EAGAIN) return 0;
      distro__sy_frames_free(f);
      return -1;
    }
    const int more = zmq_msg_more(&msg);
    if (f->n < DISTRO__SY_MAX_FRAMES) {
      const size_t sz = zmq_msg_size(&msg);
      f->data[f->n] = malloc(sz ? sz : 1);
      if (!f->data[f->n]) {
        zmq_msg_close(&msg);
        distro__sy_frames_free(f);
        return -1;
      }
      memcpy(f->data[f->n], zmq_msg_data(&msg), sz);
      f->size[f->n] = sz;
      f->n++;
    } else {
      f->truncated = 1;
    }
    zmq_msg_close(&msg);
    if (!more) return 1;
  }
}

int distro__sy_send(void *sock, const void *id, size_t id_n, const distro__sy_msg *m, const void *payload) {
  uint8_t hdr[DISTRO__SY_HEADER];
  distro__sy_encode(m, payload, hdr);
  const int has_payload = m->payload_bytes > 0;
  if (id && zmq_send(sock, id, id_n, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) return -1;
  if (zmq_send(sock, hdr, sizeof hdr, ZMQ_DONTWAIT | (has_payload ? ZMQ_SNDMORE : 0)) < 0) return -1;
  if (has_payload && zmq_send(sock, payload, m->payload_bytes, ZMQ_DONTWAIT) < 0) return -1;
  return 0;
}

int distro__sy_send_error(void *sock, const void *id, size_t id_n, uint64_t epoch, uint32_t learner, int code,
                          int offending_type, const char *msg) {
  distro__sy_msg m = {0};
  m.type = DISTRO__SY_ERROR;
  m.learner = learner;
  m.fragment = DISTRO__SY_NONE;
  m.epoch = epoch;
  m.a = (uint64_t)code;
  m.b = (uint64_t)offending_type;
  m.payload_bytes = (uint32_t)strlen(msg);
  return distro__sy_send(sock, id, id_n, &m, msg);
}

static int parse_key_line(const char *line, const char *name, char out[41]) {
  const size_t n = strlen(name);
  if (strncmp(line, name, n) != 0) return 0;
  line += n;
  /* "name = KEY": Z85 keys may themselves start with '=', so skip one. */
  while (*line == ' ' || *line == '\t') line++;
  if (*line != '=') return 0;
  line++;
  while (*line == ' ' || *line == '\t') line++;
  size_t k = 0;
  while (line[k] && line[k] != '\n' && line[k] != '\r' && line[k] != ' ') k++;
  if (k != 40) return -1;
  memcpy(out, line, 40);
  out[40] = 0;
  return 1;
}

distro_status distro__sy_read_key(const char *path, char pub[41], char sec[41]) {
  distro_status st = DISTRO_OK;
  FILE *f = fopen(path, "r");
  int have_pub = 0, have_sec = 0;
  char line[256];
  if (!f) DISTRO_FAIL(DISTRO_ERR_IO, "cannot open key file '%s': %s", path, strerror(errno));
  while (fgets(line, sizeof line, f)) {
    int r = parse_key_line(line, "public", pub);
    if (r < 0) DISTRO_FAIL(DISTRO_ERR_IO, "key file '%s': public key is not 40 Z85 characters", path);
    if (r > 0) have_pub = 1;
    if (sec) {
      r = parse_key_line(line, "secret", sec);
      if (r < 0) DISTRO_FAIL(DISTRO_ERR_IO, "key file '%s': secret key is not 40 Z85 characters", path);
      if (r > 0) have_sec = 1;
    }
  }
  if (!have_pub) DISTRO_FAIL(DISTRO_ERR_IO, "key file '%s' has no 'public = ' line", path);
  if (sec && !have_sec) DISTRO_FAIL(DISTRO_ERR_IO, "key file '%s' has no 'secret = ' line", path);
fail:
  if (f) fclose(f);
  return st;
}

static distro_status write_key(const char *path, const char *pub, const char *sec) {
  distro_status st = DISTRO_OK;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, sec ? 0600 : 0644);
  FILE *f = NULL;
  if (fd < 0) DISTRO_FAIL(DISTRO_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
  f = fdopen(fd, "w");
  if (!f) {
    close(fd);
    DISTRO_FAIL(DISTRO_ERR_IO, "fdopen '%s': %s", path, strerror(errno));
  }
  fprintf(f, "# distro CURVE key (ZeroMQ Z85)\npublic = %s\n", pub);
  if (sec) fprintf(f, "secret = %s\n", sec);
  if (fclose(f) != 0) {
    f = NULL;
    DISTRO_FAIL(DISTRO_ERR_IO, "writing '%s': %s", path, strerror(errno));
  }
  f = NULL;
fail:
  if (f) fclose(f);
  return st;
}

distro_status distro_sync_keygen(const char *path) {
  distro_status st = DISTRO_OK;
  char pub[41], sec[41], *pubpath = NULL;
  if (!path) return distro__fail(DISTRO_ERR_INVALID, "distro_sync_keygen: path is NULL");
  if (zmq_curve_keypair(pub, sec) != 0)
    return distro__fail(DISTRO_ERR_UNSUPPORTED, "zmq_curve_keypair: %s (libzmq built without CURVE?)",
                        zmq_strerror(errno));
  pubpath = malloc(strlen(path) + 5);
  if (!pubpath) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  sprintf(pubpath, "%s.pub", path);
  DISTRO_CHECK(write_key(path, pub, sec));
  DISTRO_CHECK(write_key(pubpath, pub, NULL));
fail:
  free(pubpath);
  return st;
}
