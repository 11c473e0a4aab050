/* Running the GPT trainer binary in tests: a temporary directory with a
 * generated corpus (setup/teardown as a suite's init/fini), the tiny model
 * setting, and runs that expect success (train) or a given failure
 * (expect_error). Include after <criterion/criterion.h>; GPT_TRAIN is the
 * binary's path (tests/gpt.cmake). */
#ifndef DISTRO_TEST_GPT_CLI_H
#define DISTRO_TEST_GPT_CLI_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#ifndef GPT_TRAIN
#error "GPT_TRAIN (path of gpt-train) must be defined by tests/gpt.cmake"
#endif

static char dir[256];
static char corpus[300];

/* Readable pseudo-English, the same every time. */
static __attribute__((unused)) void write_corpus(const char *path, size_t bytes) {
  static const char *words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "to",
                                "see", "dog", "who", "was", "very", "happy", "with", "his", "old", "red", "ball"};
  FILE *f = fopen(path, "w");
  cr_assert(f);
  uint64_t s = 12345;
  size_t n = 0;
  while (n < bytes) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const char *w = words[(s >> 33) % (sizeof words / sizeof *words)];
    n += (size_t)fprintf(f, "%s%s", w, (s >> 20) % 7 == 0 ? ".\n" : " ");
  }
  fclose(f);
}

static __attribute__((unused)) void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/test_gpt.XXXXXX");
  cr_assert(mkdtemp(dir));
  snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
  write_corpus(corpus, 40000);
}

static __attribute__((unused)) void teardown(void) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Runs a shell command; its stdout and stderr go to *out (caller frees).
 * Returns the exit status. */
static __attribute__((unused)) int run(const char *cmd, char **out) {
  char full[8192];
  snprintf(full, sizeof full, "%s 2>&1", cmd);
  FILE *p = popen(full, "r");
  cr_assert(p, "popen failed");
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
    n += got;
    if (cap - n < 1024) buf = realloc(buf, cap *= 2);
  }
  buf[n] = 0;
  int st = pclose(p);
  *out = buf;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The tiny setting: 1 layer, dim 32, context 32, 2 ranks x batch 4, 1 thread each. */
#define TINY "--layers 1 --dim 32 --heads 2 --context 32 --batch 4 --ranks 2 --threads 1 --eval-batches 2"

/* Runs the trainer with `args` on the generated corpus, expecting success. */
static __attribute__((unused)) char *train(const char *args) {
  char cmd[4096], *out;
  snprintf(cmd, sizeof cmd, "'%s' --data '%s' " TINY " %s", GPT_TRAIN, corpus, args);
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 0, "gpt-train failed (exit %d):\n%s\n%s", rc, cmd, out);
  return out;
}

/* Column `col` (0-based) of every line after the header of a CSV file. */
static __attribute__((unused)) int csv_column(const char *path, int col, char vals[][32], int max) {
  FILE *f = fopen(path, "r");
  cr_assert(f, "no log %s", path);
  char line[1024];
  int n = 0;
  cr_assert(fgets(line, sizeof line, f)); /* header */
  while (n < max && fgets(line, sizeof line, f)) {
    char *p = line;
    for (int c = 0; c < col; c++) p = strchr(p, ',') + 1;
    size_t len = strcspn(p, ",\n");
    snprintf(vals[n++], 32, "%.*s", (int)len, p);
  }
  fclose(f);
  return n;
}

static __attribute__((unused)) unsigned long long checksum_of(const char *out) {
  const char *p = strstr(out, "param checksum ");
  cr_assert(p, "no checksum in output:\n%s", out);
  return strtoull(p + 15, NULL, 16);
}

/* Runs the trainer with `args` (nothing added), expecting exit `code` and
 * `msg` in its output. */
static __attribute__((unused)) void expect_error(const char *args, int code, const char *msg) {
  char cmd[4096], *out;
  snprintf(cmd, sizeof cmd, "'%s' %s", GPT_TRAIN, args);
  int rc = run(cmd, &out);
  cr_expect_eq(rc, code, "%s: exit %d, expected %d\n%s", args, rc, code, out);
  cr_expect(strstr(out, msg), "%s: output lacks \"%s\":\n%s", args, msg, out);
  free(out);
}

#endif
