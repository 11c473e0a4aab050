/* Every tool answers --help with its usage on stdout and exit status 0
 * (issue 15; before, distro-syncer printed it on stderr and exited 2, and
 * distro-demo ignored the flag and ran the whole demo), and an unknown
 * flag with the usage on stderr and a non-zero status. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
  int status;
  char out[8192], err[8192];
} run_result;

static void run(const char *bin, const char *arg, run_result *r) {
  char cmd[1200], eout[600];
  snprintf(eout, sizeof eout, "/tmp/distro-tools-%d.err", (int)getpid());
  snprintf(cmd, sizeof cmd, "timeout 60 '%s' %s 2>'%s'", bin, arg, eout);
  FILE *p = popen(cmd, "r");
  cr_assert(p, "cannot run %s", bin);
  const size_t n = fread(r->out, 1, sizeof r->out - 1, p);
  r->out[n] = 0;
  const int st = pclose(p);
  r->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  FILE *e = fopen(eout, "r");
  const size_t m = e ? fread(r->err, 1, sizeof r->err - 1, e) : 0;
  r->err[m] = 0;
  if (e) fclose(e);
  remove(eout);
}

static void check_help(const char *bin) {
  run_result r;
  run(bin, "--help", &r);
  cr_assert_eq(r.status, 0, "%s --help exits %d", bin, r.status);
  cr_assert(strncmp(r.out, "usage: ", 7) == 0, "%s --help prints no usage on stdout: '%.80s'", bin, r.out);
  cr_assert_eq(r.err[0], 0, "%s --help writes to stderr: %s", bin, r.err);
  run(bin, "--no-such-flag", &r);
  cr_assert_neq(r.status, 0, "%s accepts an unknown flag", bin);
  cr_assert(strstr(r.err, "usage: "), "%s: no usage on stderr for an unknown flag", bin);
}

#ifdef SYNC_SYNCER_BIN
Test(sync_tools, syncer_help) { check_help(SYNC_SYNCER_BIN); }
#endif
Test(sync_tools, demo_help) { check_help(TOOL_DEMO_BIN); }
Test(sync_tools, bench_help) { check_help(TOOL_BENCH_BIN); }
