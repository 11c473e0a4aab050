/* Training text: loading, split, shards, sampling (see data.h). */
#include "data.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Appends the whole of `path` to c->bytes. */
static int append_file(gpt_corpus *c, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot open data file '%s': %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "data file '%s' is not a regular file", path);
    fclose(f);
    return -1;
  }
  size_t size = (size_t)st.st_size;
  uint8_t *b = realloc(c->bytes, c->n + size + 1);
  if (!b) {
    snprintf(err, errlen, "out of memory reading '%s' (%zu bytes)", path, size);
    fclose(f);
    return -1;
  }
  c->bytes = b;
  size_t got = fread(c->bytes + c->n, 1, size, f);
  int bad = ferror(f);
  fclose(f);
  if (bad || got != size) {
    snprintf(err, errlen, "error reading data file '%s'", path);
    return -1;
  }
  c->n += size;
  return 0;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int load_fortunes(gpt_corpus *c, char *err, size_t errlen) {
  DIR *d = opendir(GPT_FORTUNES_DIR);
  if (!d) {
    snprintf(err, errlen,
             "the default corpus %s is missing (%s): install Debian's fortunes package "
             "(apt-get install fortunes) or pass --data FILE",
             GPT_FORTUNES_DIR, strerror(errno));
    return -1;
  }
  char **names = NULL;
  size_t count = 0, cap = 0;
  int rc = -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    /* The .dat files are strfile indexes and the .u8 files links to the text. */
    if (e->d_name[0] == '.' || ends_with(e->d_name, ".dat") || ends_with(e->d_name, ".u8")) continue;
    char path[1024];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", GPT_FORTUNES_DIR, e->d_name);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (count == cap) {
      cap = cap ? 2 * cap : 64;
      char **nn = realloc(names, cap * sizeof *nn);
      if (!nn) goto out;
      names = nn;
    }
    if (!(names[count] = strdup(e->d_name))) goto out;
    count++;
  }
  if (count == 0) {
    snprintf(err, errlen, "no fortune files in %s: install Debian's fortunes package or pass --data FILE",
             GPT_FORTUNES_DIR);
    goto out;
  }
  qsort(names, count, sizeof *names, cmp_names);
  for (size_t i = 0; i < count; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", GPT_FORTUNES_DIR, names[i]);
    if (append_file(c, path, err, errlen)) goto out;
  }
  snprintf(c->source, sizeof c->source, "%s (%zu files)", GPT_FORTUNES_DIR, count);
  rc = 0;
out:
  if (rc && !*err) snprintf(err, errlen, "out of memory listing %s", GPT_FORTUNES_DIR);
  for (size_t i = 0; i < count; i++) free(names[i]);
  free(names);
  closedir(d);
  return rc;
}

int corpus_load(gpt_corpus *c, const char *path, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  err[0] = 0;
  int rc = path ? append_file(c, path, err, errlen) : load_fortunes(c, err, errlen);
  if (rc == 0 && c->n == 0) {
    snprintf(err, errlen, "data file '%s' is empty", path ? path : GPT_FORTUNES_DIR);
    rc = -1;
  }
  if (rc) {
    corpus_free(c);
    return -1;
  }
  if (path) snprintf(c->source, sizeof c->source, "%s", path);
  c->ntrain = c->n - c->n / 20;
  return 0;
}

void corpus_free(gpt_corpus *c) {
  free(c->bytes);
  memset(c, 0, sizeof *c);
}

static int fits(size_t n, int context, int world) {
  size_t need = (size_t)context + 1, ntrain = n - n / 20;
  return n / 20 >= need && ntrain / (size_t)world >= need;
}

int corpus_check(const gpt_corpus *c, int context, int world, gpt_sampling s, char *err, size_t errlen) {
  const int parts = s == GPT_SAMPLE_GLOBAL ? 1 : world; /* how many pieces the training split is cut into */
  if (fits(c->n, context, parts)) return 0;
  size_t min = 20 * ((size_t)context + 1);
  while (!fits(min, context, parts)) min++;
  snprintf(err, errlen,
           "data '%s' is too short: %zu bytes, but context %d with %d rank(s) needs at least %zu "
           "(the last 5%% validates and %s needs a window of context+1 bytes)",
           c->source, c->n, context, world, min,
           s == GPT_SAMPLE_GLOBAL ? "the training split" : "each rank's training shard");
  return -1;
}

void corpus_shard(const gpt_corpus *c, int rank, int world, gpt_sampling s, size_t *lo, size_t *hi) {
  if (s == GPT_SAMPLE_GLOBAL) {
    *lo = 0;
    *hi = c->ntrain;
    return;
  }
  *lo = c->ntrain * (size_t)rank / (size_t)world;
  *hi = c->ntrain * (size_t)(rank + 1) / (size_t)world;
}

void corpus_sample(const gpt_corpus *c, size_t lo, size_t hi, gpt_rng *r, int B, int T, uint8_t *inputs,
                   uint8_t *targets) {
  const size_t starts = hi - lo - (size_t)T; /* windows [s, s+T] inside [lo, hi) */
  for (int b = 0; b < B; b++) {
    const uint8_t *w = c->bytes + lo + rng_below(r, starts);
    memcpy(inputs + (size_t)b * T, w, (size_t)T);
    memcpy(targets + (size_t)b * T, w + 1, (size_t)T);
  }
}

size_t corpus_val_windows(const gpt_corpus *c, int T) { return (c->n - c->ntrain - 1) / (size_t)T; }

void corpus_val_window(const gpt_corpus *c, size_t i, int T, uint8_t *inputs, uint8_t *targets) {
  const uint8_t *w = c->bytes + c->ntrain + i * (size_t)T;
  memcpy(inputs, w, (size_t)T);
  memcpy(targets, w + 1, (size_t)T);
}
