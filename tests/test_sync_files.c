/* Files and setup checks (issue 15):
 *  - state saves (optimizer, syncer checkpoint) onto a FIFO, a symbolic link,
 *    a directory: refused, the path left as it was (before: each became a
 *    regular file, the link's target untouched but the link gone);
 *  - a checkpoint in a missing directory, malformed endpoints, tensors
 *    beyond the job's size, curve_allowed without a keypair, a non-loopback
 *    endpoint without CURVE: refused at create, not later;
 *  - key files: keygen makes an existing 0644 file 0600, a 0644 secret key
 *    file and a key file whose public half is not its secret's are refused;
 *  - without CURVE on loopback the syncer says so (log warning). */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <distro/distro.h>

#ifdef DISTRO_WITH_SYNC
#include "sync_harness.h"

static const char *kind(const char *p) {
  struct stat s;
  if (lstat(p, &s) != 0) return "missing";
  return S_ISFIFO(s.st_mode) ? "fifo" : S_ISLNK(s.st_mode) ? "symlink" : S_ISREG(s.st_mode) ? "regular" : S_ISDIR(s.st_mode) ? "dir" : "other";
}

static void read_file(const char *path, char *out, size_t n) {
  FILE *f = fopen(path, "r");
  cr_assert(f, "cannot read %s", path);
  const size_t k = fread(out, 1, n - 1, f);
  out[k] = 0;
  fclose(f);
}

/* A FIFO, a symlink to a regular file, and a directory in dir. */
static void specials(const char *dir, char *fifo, char *link, char *target, char *sub) {
  sprintf(fifo, "%s/fifo", dir);
  sprintf(link, "%s/link", dir);
  sprintf(target, "%s/target", dir);
  sprintf(sub, "%s/sub", dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  FILE *f = fopen(target, "w");
  fputs("precious\n", f);
  fclose(f);
  cr_assert_eq(symlink(target, link), 0);
  cr_assert_eq(mkdir(sub, 0700), 0);
}

static void expect_untouched(const char *fifo, const char *link, const char *target, const char *sub) {
  cr_assert_str_eq(kind(fifo), "fifo");
  cr_assert_str_eq(kind(link), "symlink");
  cr_assert_str_eq(kind(sub), "dir");
  char text[64];
  read_file(target, text, sizeof text);
  cr_assert_str_eq(text, "precious\n", "the link's target was written");
}

Test(sync_files, optimizer_save_refuses_fifo_symlink_and_directory) {
  char dir[256], fifo[300], link[300], target[300], sub[300], ok[300];
  sh_tmpdir(dir, sizeof dir);
  specials(dir, fifo, link, target, sub);
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_options oo = distro_options_default(DISTRO_ALG_ADAMW);
  distro_optim *opt = NULL;
  static float w[64], g[64];
  cr_assert_eq(distro_optim_create(&oo, c[0], &opt), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(distro_optim_add_param(opt, "w", w, g, 1, (int64_t[]){64}), DISTRO_OK, "%s", distro_last_error());
  const char *paths[3] = {fifo, link, sub};
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(distro_optim_save(opt, paths[k]), DISTRO_ERR_IO, "save onto %s accepted", kind(paths[k]));
    cr_assert(strstr(distro_last_error(), "not a regular file"), "message: %s", distro_last_error());
  }
  expect_untouched(fifo, link, target, sub);
  /* A load from the FIFO fails at once instead of waiting for a writer. */
  cr_assert_eq(distro_optim_load(opt, fifo), DISTRO_ERR_IO);
  /* A regular target still works, twice (replacing the first). */
  sprintf(ok, "%s/state.bin", dir);
  cr_assert_eq(distro_optim_save(opt, ok), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(distro_optim_save(opt, ok), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(distro_optim_load(opt, ok), DISTRO_OK, "%s", distro_last_error());
  cr_assert_str_eq(kind(ok), "regular");
  distro_optim_free(opt);
  distro_comm_free(c[0]);
}

Test(sync_files, syncer_checkpoint_refuses_fifo_symlink_and_missing_directory) {
  char dir[256], fifo[300], link[300], target[300], sub[300], missing[300], ep[300];
  sh_tmpdir(dir, sizeof dir);
  specials(dir, fifo, link, target, sub);
  sprintf(missing, "%s/no/such/dir/ck", dir);
  sprintf(ep, "ipc://%s/s.ipc", dir);
  const char *bad[4] = {fifo, link, sub, missing};
  for (int k = 0; k < 4; k++) {
    distro_syncer_options o = distro_syncer_options_default();
    o.endpoint = ep;
    o.checkpoint = bad[k];
    distro_syncer *s = NULL;
    cr_assert_neq(distro_syncer_create(&o, &s), DISTRO_OK, "checkpoint at %s (%s) accepted at create", bad[k],
                  kind(bad[k]));
    cr_assert_null(s);
    cr_assert(strstr(distro_last_error(), "checkpoint"), "message: %s", distro_last_error());
  }
  expect_untouched(fifo, link, target, sub);
}

Test(sync_files, learner_and_syncer_options_refused_at_create) {
  static float w[16];
  distro_learner_options lo = distro_learner_options_default();
  lo.syncer = "ipc:///tmp/distro-unused.ipc";
  distro_learner *l = NULL;
  /* Malformed endpoints. */
  const char *bad_serve[] = {"tcp://:::notaport", "tcp://127.0.0.1", "tcp://127.0.0.1:0", "tcp://127.0.0.1:99999",
                             "udp://127.0.0.1:5", "ipc://", "tcp://has space:5", "", "tcp://[::1:5"};
  for (size_t k = 0; k < sizeof bad_serve / sizeof *bad_serve; k++) {
    lo.serve_endpoint = bad_serve[k];
    cr_assert_eq(distro_learner_create(&lo, &l), DISTRO_ERR_INVALID, "serve endpoint '%s' accepted", bad_serve[k]);
    cr_assert_null(l);
  }
  lo.serve_endpoint = "tcp://127.0.0.1:*";
  lo.syncer = "tcp://127.0.0.1:*"; /* a wildcard port cannot be connected to */
  cr_assert_eq(distro_learner_create(&lo, &l), DISTRO_ERR_INVALID);
  /* Reachable from other machines without CURVE: only with insecure. */
  lo.syncer = "tcp://10.1.2.3:5555";
  cr_assert_eq(distro_learner_create(&lo, &l), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "CURVE"), "%s", distro_last_error());
  lo.insecure = 1;
  cr_assert_eq(distro_learner_create(&lo, &l), DISTRO_OK, "%s", distro_last_error());
  distro_learner_free(l);
  l = NULL;
  lo.insecure = 0;
  lo.syncer = "ipc:///tmp/distro-unused.ipc";
  lo.serve_endpoint = "tcp://0.0.0.0:*";
  cr_assert_eq(distro_learner_create(&lo, &l), DISTRO_ERR_INVALID);
  lo.serve_endpoint = "tcp://127.0.0.1:*";
  lo.curve_allowed = "/tmp/whatever";
  cr_assert_eq(distro_learner_create(&lo, &l), DISTRO_ERR_INVALID, "curve_allowed without a keypair accepted");
  lo.curve_allowed = NULL;
  /* Tensors the protocol cannot carry: refused at add_tensor. */
  cr_assert_eq(distro_learner_create(&lo, &l), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(distro_learner_add_tensor(l, "huge", w, INT64_MAX, 0), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_learner_add_tensor(l, "huge", w, (int64_t)1 << 62, 0), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_learner_add_tensor(l, "a", w, (int64_t)1 << 28, 0), DISTRO_OK);
  cr_assert_eq(distro_learner_add_tensor(l, "b", w, (int64_t)1 << 28, 0), DISTRO_OK);
  cr_assert_eq(distro_learner_add_tensor(l, "c", w, 1, 0), DISTRO_ERR_INVALID, "the sum passed 2^29");
  cr_assert_eq(distro_learner_add_tensor(l, "d", w, 16, 0x80), DISTRO_ERR_INVALID, "unknown flag bits");
  distro_learner_free(l);

  distro_syncer_options so = distro_syncer_options_default();
  distro_syncer *s = NULL;
  so.curve_allowed = "/tmp/whatever";
  cr_assert_eq(distro_syncer_create(&so, &s), DISTRO_ERR_INVALID, "curve_allowed without curve_keypair accepted");
  so = distro_syncer_options_default();
  const char *open_eps[] = {"tcp://0.0.0.0:*", "tcp://*:*", "tcp://10.0.0.1:*", "tcp://eth0:*"};
  for (size_t k = 0; k < sizeof open_eps / sizeof *open_eps; k++) {
    so.endpoint = open_eps[k];
    cr_assert_eq(distro_syncer_create(&so, &s), DISTRO_ERR_INVALID, "'%s' without CURVE accepted", open_eps[k]);
    cr_assert(strstr(distro_last_error(), "CURVE"), "%s", distro_last_error());
  }
  so.endpoint = "tcp://nohost";
  cr_assert_eq(distro_syncer_create(&so, &s), DISTRO_ERR_INVALID);
  so.endpoint = "tcp://0.0.0.0:*";
  so.insecure = 1;
  cr_assert_eq(distro_syncer_create(&so, &s), DISTRO_OK, "%s", distro_last_error());
  distro_syncer_free(s);
  /* Version-1 options (before `insecure`) still work, with the defaults. */
  so = distro_syncer_options_default();
  so.version = 1;
  s = NULL;
  cr_assert_eq(distro_syncer_create(&so, &s), DISTRO_OK, "%s", distro_last_error());
  distro_syncer_free(s);
}

static char logbuf[4096];
static void keep_log(void *ctx, const char *line) {
  (void)ctx;
  strncat(logbuf, line, sizeof logbuf - strlen(logbuf) - 2);
  strcat(logbuf, "\n");
}

Test(sync_files, syncer_without_curve_on_loopback_warns) {
  distro_syncer_options so = distro_syncer_options_default();
  so.log = keep_log;
  distro_syncer *s = NULL;
  logbuf[0] = 0;
  cr_assert_eq(distro_syncer_create(&so, &s), DISTRO_OK, "%s", distro_last_error());
  cr_assert(strstr(logbuf, "warning") && strstr(logbuf, "without CURVE"), "log: %s", logbuf);
  distro_syncer_free(s);
}

Test(sync_files, key_files_mode_and_pair_checked) {
  char dir[256], key[300], key2[300], mixed[300], ep[300], link[300];
  sh_tmpdir(dir, sizeof dir);
  sprintf(key, "%s/k", dir);
  sprintf(key2, "%s/k2", dir);
  sprintf(mixed, "%s/mixed", dir);
  sprintf(link, "%s/link", dir);
  sprintf(ep, "ipc://%s/s.ipc", dir);
  /* keygen over an existing world-readable file leaves it 0600. */
  const int fd = open(key, O_CREAT | O_WRONLY, 0644);
  cr_assert_geq(fd, 0);
  close(fd);
  chmod(key, 0644);
  cr_assert_eq(distro_sync_keygen(key), DISTRO_OK, "%s", distro_last_error());
  struct stat st;
  cr_assert_eq(stat(key, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0600, "secret key file mode %04o", (unsigned)(st.st_mode & 0777));
  /* keygen does not write through a link. */
  cr_assert_eq(symlink(key, link), 0);
  cr_assert_eq(distro_sync_keygen(link), DISTRO_ERR_IO);
  cr_assert_eq(distro_sync_keygen(key2), DISTRO_OK);
  distro_syncer_options o = distro_syncer_options_default();
  o.endpoint = ep;
  distro_syncer *s = NULL;
  /* A secret key others can read. */
  chmod(key2, 0644);
  o.curve_keypair = key2;
  cr_assert_eq(distro_syncer_create(&o, &s), DISTRO_ERR_IO, "a 0644 secret key file accepted");
  cr_assert(strstr(distro_last_error(), "0600"), "%s", distro_last_error());
  chmod(key2, 0600);
  cr_assert_eq(distro_syncer_create(&o, &s), DISTRO_OK, "%s", distro_last_error());
  distro_syncer_free(s);
  s = NULL;
  /* k2's public key with k's secret key. */
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "grep '^public' %s > %s && grep '^secret' %s >> %s", key2, mixed, key, mixed);
  cr_assert_eq(system(cmd), 0);
  chmod(mixed, 0600);
  o.curve_keypair = mixed;
  cr_assert_eq(distro_syncer_create(&o, &s), DISTRO_ERR_IO, "a mixed-up key pair accepted");
  cr_assert(strstr(distro_last_error(), "pair"), "%s", distro_last_error());
  /* The learner checks its keys at create, too. */
  distro_learner_options lo = distro_learner_options_default();
  lo.syncer = ep;
  lo.curve_keypair = mixed;
  lo.curve_server_key = key2;
  distro_learner *l = NULL;
  cr_assert_eq(distro_learner_create(&lo, &l), DISTRO_ERR_IO);
  lo.curve_keypair = key;
  cr_assert_eq(distro_learner_create(&lo, &l), DISTRO_OK, "%s", distro_last_error());
  distro_learner_free(l);
}
#else
Test(sync_files, skipped) { cr_skip_test("built without libzmq (no syncer)"); }
#endif
