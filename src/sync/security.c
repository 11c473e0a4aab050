/* CURVE keys and the ZAP handler: key files (mode and pair checked), lists
 * of allowed keys, and the handler that admits allowed clients and vouches
 * for their key, which the syncer then binds to a learner id
 * (docs/protocol.md, "Threat model"). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "sync/sync_internal.h"

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
  return distro__sy_is_z85_key(out) ? 1 : -1;
}

distro_status distro__sy_read_key(const char *path, char pub[41], char sec[41]) {
  distro_status st = DISTRO_OK;
  FILE *f = NULL;
  int have_pub = 0, have_sec = 0;
  char line[256];
  if (!path) return distro__fail(DISTRO_ERR_INVALID, "key file path is NULL");
  DISTRO_CHECK(distro__open_regular(path, &f, NULL));
  if (sec) {
    /* A secret others can read is no secret: refuse it, as ssh does. */
    struct stat s;
    if (fstat(fileno(f), &s) != 0) DISTRO_FAIL(DISTRO_ERR_IO, "key file '%s': %s", path, strerror(errno));
    if (s.st_mode & 077)
      DISTRO_FAIL(DISTRO_ERR_IO, "key file '%s' has mode %04o; a secret key file must be 0600 (chmod 600 '%s')", path,
                  (unsigned)(s.st_mode & 07777), path);
  }
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
  if (sec) {
    char derived[41];
    if (zmq_curve_public(derived, sec) != 0)
      DISTRO_FAIL(DISTRO_ERR_UNSUPPORTED, "zmq_curve_public: %s (libzmq built without CURVE?)", zmq_strerror(errno));
    if (strcmp(derived, pub) != 0)
      DISTRO_FAIL(DISTRO_ERR_IO, "key file '%s': the public key is not the one its secret key gives (mixed-up pair)",
                  path);
  }
fail:
  if (f) fclose(f);
  return st;
}

distro_status distro__sy_load_allowed(const char *path, uint8_t **keys, int *nkeys) {
  distro_status st = DISTRO_OK;
  FILE *f = NULL;
  char line[256];
  *keys = NULL;
  *nkeys = 0;
  DISTRO_CHECK(distro__open_regular(path, &f, NULL));
  while (fgets(line, sizeof line, f)) {
    char *k = line;
    while (*k == ' ' || *k == '\t') k++;
    if (*k == '#' || *k == '\n' || *k == '\r' || *k == 0) continue;
    if (strncmp(k, "secret", 6) == 0) continue; /* a keypair file also lists its public key */
    if (strncmp(k, "public", 6) == 0) {
      k += 6;
      while (*k == ' ' || *k == '\t') k++;
      if (*k == '=') k++;
      while (*k == ' ' || *k == '\t') k++;
    }
    size_t n = 0;
    while (k[n] && k[n] != '\n' && k[n] != '\r' && k[n] != ' ') n++;
    k[n] = 0;
    if (!distro__sy_is_z85_key(k))
      DISTRO_FAIL(DISTRO_ERR_IO, "allowed-keys file '%s': a key is not 40 Z85 characters", path);
    if (*nkeys >= 65536) DISTRO_FAIL(DISTRO_ERR_IO, "allowed-keys file '%s' lists more than 65536 keys", path);
    uint8_t *nk = realloc(*keys, (size_t)(*nkeys + 1) * 32);
    if (!nk) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
    *keys = nk;
    if (!zmq_z85_decode(*keys + 32 * *nkeys, k)) DISTRO_FAIL(DISTRO_ERR_IO, "allowed-keys file '%s': bad Z85 key", path);
    (*nkeys)++;
  }
  if (*nkeys == 0) DISTRO_FAIL(DISTRO_ERR_IO, "allowed-keys file '%s' lists no key", path);
fail:
  if (f) fclose(f);
  if (st != DISTRO_OK) {
    free(*keys);
    *keys = NULL;
    *nkeys = 0;
  }
  return st;
}

int distro__sy_zap_serve(void *zap, const uint8_t *allowed, int nallowed) {
  int refused = 0;
  for (;;) {
    zmq_msg_t parts[8];
    int n = 0, more = 1;
    while (more && n < 8) {
      zmq_msg_init(&parts[n]);
      if (zmq_msg_recv(&parts[n], zap, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
        zmq_msg_close(&parts[n]);
        if (n == 0) return refused;
        break;
      }
      more = zmq_msg_more(&parts[n]);
      n++;
    }
    /* version, request id, domain, address, identity, mechanism, key */
    int ok = 0;
    char user[41] = "";
    if (n >= 7 && zmq_msg_size(&parts[5]) == 5 && memcmp(zmq_msg_data(&parts[5]), "CURVE", 5) == 0 &&
        zmq_msg_size(&parts[6]) == 32) {
      ok = nallowed == 0;
      for (int i = 0; i < nallowed && !ok; i++) ok = memcmp(allowed + 32 * i, zmq_msg_data(&parts[6]), 32) == 0;
      if (ok && !zmq_z85_encode(user, zmq_msg_data(&parts[6]), 32)) ok = 0;
    }
    if (!ok) refused++;
    if (n >= 2) {
      zmq_send(zap, "1.0", 3, ZMQ_SNDMORE);
      zmq_send(zap, zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), ZMQ_SNDMORE);
      zmq_send(zap, ok ? "200" : "400", 3, ZMQ_SNDMORE);
      zmq_send(zap, ok ? "OK" : "key not allowed", ok ? 2 : 15, ZMQ_SNDMORE);
      zmq_send(zap, user, ok ? 40 : 0, ZMQ_SNDMORE); /* User-Id: the client's key */
      zmq_send(zap, "", 0, 0);
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&parts[i]);
  }
}

/* Key files are written in place (not renamed over: a key path is chosen
 * by the operator), only as regular files, never through a link, and the
 * secret one is 0600 whatever mode an existing file had. */
static distro_status write_key(const char *path, const char *pub, const char *sec) {
  distro_status st = DISTRO_OK;
  FILE *f = NULL;
  struct stat s;
  if (lstat(path, &s) == 0 && !S_ISREG(s.st_mode))
    return distro__fail(DISTRO_ERR_IO, "refusing to write key file '%s': it exists and is not a regular file", path);
  const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, sec ? 0600 : 0644);
  if (fd < 0) return distro__fail(DISTRO_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
  if (fstat(fd, &s) != 0 || !S_ISREG(s.st_mode) || fchmod(fd, sec ? 0600 : 0644) != 0) {
    close(fd);
    return distro__fail(DISTRO_ERR_IO, "key file '%s': not a regular file or cannot set its mode", path);
  }
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
  if (!path || !path[0]) return distro__fail(DISTRO_ERR_INVALID, "distro_sync_keygen: path is NULL or empty");
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
