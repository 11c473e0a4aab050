/* Checkpoints (see checkpoint.h).
 *
 * File: "GPTCKPT\0" | u32 version | i32 context, layers, dim, heads, tied |
 * i32 optim, world, topk, chunk, values | i64 step | u64 nparams |
 * f32 params[nparams] | per rank: u64 rng state, u64 n, n bytes of its
 * distro_optim_save file (which holds --clip-per-tensor's shares) | u64
 * FNV-1a of everything before. Version 3; versions 1 and 2 are still read
 * (version 2 put {u32 k, f64 shares[k]} before the optimizer's file, for
 * the trainer's own clip; a file with k > 0 is refused, as this trainer
 * could not restore them).
 *
 * The optimizer state of each rank is its own (DeMo momenta differ across
 * ranks), so it is gathered to rank 0. distro_optim_save/load only take
 * paths, so each state makes a round trip through a file of its own. */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h" /* gpt_optim_kind, optim_name, values_name */

_Static_assert(sizeof(real) == 4, "checkpoints hold float32 parameters");

#define MAGIC "GPTCKPT"
#define VERSION 3u

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}
#define FNV_INIT 0xcbf29ce484222325ULL

/* Reads a whole file into memory. */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long size = ftell(f);
    if (size >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)size + 1))) {
      if (fread(buf, 1, (size_t)size, f) == (size_t)size) {
        *n = (size_t)size;
      } else {
        free(buf);
        buf = NULL;
      }
    }
  }
  fclose(f);
  return buf;
}

typedef struct {
  FILE *f;
  uint64_t h;
  int err;
} writer;

static void put(writer *w, const void *p, size_t n) {
  if (w->err) return;
  if (fwrite(p, 1, n, w->f) != n) w->err = errno ? errno : EIO;
  w->h = fnv1a(w->h, p, n);
}

static void header_fields(const ckpt_meta *meta, int32_t f[10]) {
  const int32_t v[10] = {meta->model.context, meta->model.layers, meta->model.dim, meta->model.heads,
                         meta->model.tied,    meta->optim,        meta->world,     meta->topk,
                         meta->chunk,         meta->values};
  memcpy(f, v, sizeof v);
}

/* Rank 0: writes the gathered states to path via a synced temp file. */
/* info: per rank {state length, rng state}; blobs: per rank, `stride` apart. */
static int write_file(const char *path, const ckpt_meta *meta, int64_t step, const gpt_model *m, int world,
                      const uint64_t *info, const unsigned char *blobs, size_t stride, char *err, size_t errlen) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    snprintf(err, errlen, "cannot create checkpoint '%s': %s", tmp, strerror(errno));
    return -1;
  }
  writer w = {fdopen(fd, "wb"), FNV_INIT, 0};
  if (!w.f) {
    close(fd);
    snprintf(err, errlen, "cannot write checkpoint '%s'", tmp);
    return -1;
  }
  const uint32_t version = VERSION;
  int32_t fields[10];
  header_fields(meta, fields);
  const uint64_t np = m->nparams;
  put(&w, MAGIC, 8);
  put(&w, &version, 4);
  put(&w, fields, sizeof fields);
  put(&w, &step, 8);
  put(&w, &np, 8);
  put(&w, m->params, sizeof(real) * m->nparams);
  for (int r = 0; r < world; r++) {
    put(&w, &info[2 * r + 1], 8);
    put(&w, &info[2 * r], 8);
    put(&w, blobs + (size_t)r * stride, info[2 * r]);
  }
  const uint64_t h = w.h;
  put(&w, &h, 8);
  int bad = w.err || fflush(w.f) != 0 || fsync(fileno(w.f)) != 0;
  bad |= fclose(w.f) != 0;
  if (bad || rename(tmp, path) != 0) {
    snprintf(err, errlen, "cannot write checkpoint '%s': %s", path, strerror(errno ? errno : EIO));
    unlink(tmp);
    return -1;
  }
  return 0;
}

/* first_failed_rank, with a broken communicator reported as rank 0. */
static int agree(distro_comm *comm, int ok, char *err, size_t errlen) {
  int who = first_failed_rank(comm, ok);
  if (who == -2) {
    snprintf(err, errlen, "the communicator failed: %s", distro_last_error());
    who = 0;
  }
  return who;
}

int checkpoint_save(distro_comm *comm, const char *path, const ckpt_meta *meta, int64_t step, const gpt_model *m,
                    const distro_optim *opt, uint64_t rng_state, char *err, size_t errlen) {
  const int world = distro_comm_size(comm), rank = distro_comm_rank(comm);
  unsigned char *blob = NULL, *padded = NULL, *all = NULL;
  uint64_t *info = NULL;
  size_t len = 0, stride = 1;
  err[0] = 0;

  /* 1. This rank's optimizer state, through a file of its own. */
  char own[4200];
  snprintf(own, sizeof own, "%s.rank%d.opt", path, rank);
  distro_status s = distro_optim_save(opt, own);
  if (s != DISTRO_OK)
    snprintf(err, errlen, "saving the optimizer state: %s: %s", distro_status_string(s), distro_last_error());
  else if (!(blob = slurp(own, &len)))
    snprintf(err, errlen, "cannot read back '%s'", own);
  unlink(own);
  int who = agree(comm, blob != NULL, err, errlen);
  if (who != -1) goto out;

  /* 2. Lengths and RNG states to everyone, then the states, padded to the
   * longest (all-gather takes equal sizes). */
  uint64_t mine[2] = {len, rng_state};
  int ok = (info = malloc(sizeof mine * (size_t)world)) != NULL;
  ok = ok && distro_comm_allgather(comm, mine, sizeof mine, info) == DISTRO_OK;
  for (int r = 0; ok && r < world; r++)
    if (info[2 * r] > stride) stride = info[2 * r];
  ok = ok && (padded = calloc(stride, 1)) && (all = malloc(stride * (size_t)world));
  if (ok) memcpy(padded, blob, len);
  ok = ok && distro_comm_allgather(comm, padded, stride, all) == DISTRO_OK;
  if (!ok) snprintf(err, errlen, "gathering the optimizer states failed (out of memory or communicator)");
  if ((who = agree(comm, ok, err, errlen)) != -1) goto out;

  /* 3. Rank 0 writes; everyone learns whether it worked. */
  ok = rank != 0 || write_file(path, meta, step, m, world, info, all, stride, err, errlen) == 0;
  who = agree(comm, ok, err, errlen);
out:
  free(blob);
  free(padded);
  free(all);
  free(info);
  return who;
}

/* Bounds-checked reader over the loaded file. */
typedef struct {
  const unsigned char *p;
  size_t n, at;
} cursor;

static int get(cursor *c, void *out, size_t n) {
  if (c->n - c->at < n) return -1;
  memcpy(out, c->p + c->at, n);
  c->at += n;
  return 0;
}

static const char *field_name[10] = {"context", "layers", "dim", "heads", "tied", "optimizer", "ranks",
                                     "topk",    "chunk",  "values"};

/* Checks the file and finds this rank's state. 0 or -1 with err. */
static int parse(const unsigned char *buf, size_t n, const char *path, const ckpt_meta *meta, int rank,
                 int64_t *step, gpt_model *m, uint64_t *rng, const unsigned char **blob, uint64_t *blen,
                 uint32_t *version_out, char *err, size_t errlen) {
  cursor c = {buf, n, 0};
  char magic[8];
  uint32_t version = 0;
  int32_t got[10], want[10];
  uint64_t np, h;
  if (n < 16 || get(&c, magic, 8) || memcmp(magic, MAGIC, 8)) {
    snprintf(err, errlen, "'%s' is not a checkpoint of this trainer", path);
    return -1;
  }
  memcpy(&h, buf + n - 8, 8);
  if (h != fnv1a(FNV_INIT, buf, n - 8)) {
    snprintf(err, errlen, "checkpoint '%s' is corrupt (checksum mismatch)", path);
    return -1;
  }
  c.n = n - 8;
  if (get(&c, &version, 4) || version < 1 || version > VERSION) {
    snprintf(err, errlen, "checkpoint '%s' has version %u, this trainer reads 1 to %u", path, version, VERSION);
    return -1;
  }
  *version_out = version;
  if (get(&c, got, sizeof got) || get(&c, step, 8) || get(&c, &np, 8)) goto truncated;
  header_fields(meta, want);
  for (int i = 0; i < 10; i++)
    if (got[i] != want[i] && !(i >= 7 && meta->optim == GPT_OPT_ADAMW /* no topk/chunk/values */)) {
      if (i == 5 || i == 9) /* by name */
        snprintf(err, errlen, "checkpoint '%s' was written with %s %s; this run has %s", path, field_name[i],
                 i == 5 ? optim_name((gpt_optim_kind)got[i]) : values_name((distro_values)got[i]),
                 i == 5 ? optim_name((gpt_optim_kind)want[i]) : values_name((distro_values)want[i]));
      else
        snprintf(err, errlen, "checkpoint '%s' was written with %s %d; this run has %d", path, field_name[i],
                 got[i], want[i]);
      return -1;
    }
  if (np != m->nparams) {
    snprintf(err, errlen, "checkpoint '%s' holds %llu parameters; this model has %zu", path, (unsigned long long)np,
             m->nparams);
    return -1;
  }
  if (get(&c, m->params, sizeof(real) * m->nparams)) goto truncated;
  for (int r = 0; r < meta->world; r++) {
    uint64_t rr, len;
    if (get(&c, &rr, 8) || get(&c, &len, 8) || c.n - c.at < len) goto truncated;
    if (r == rank) {
      *rng = rr;
      *blob = c.p + c.at;
      *blen = len;
    }
    c.at += len;
  }
  if (c.at != c.n) goto truncated;
  return 0;
truncated:
  snprintf(err, errlen, "checkpoint '%s' is truncated or malformed", path);
  return -1;
}

/* Version 2: rank's blob starts with u32 k and k shares of the trainer's
 * own per-tensor clip. k 0 (no clip) leaves blob at the optimizer's file;
 * shares are refused: the clip's state now lives in the optimizer's file.
 * 0, or -1 with err. */
static int skip_shares(const unsigned char **blob, uint64_t *blen, const char *path, int rank, char *err,
                       size_t errlen) {
  uint32_t k = 0;
  if (*blen >= 4) memcpy(&k, *blob, 4);
  if (*blen < 4) {
    snprintf(err, errlen, "checkpoint '%s' is truncated or malformed (rank %d's clip record)", path, rank);
    return -1;
  }
  if (k) {
    snprintf(err, errlen,
             "checkpoint '%s' (version 2) keeps --clip-per-tensor's shares outside the optimizer's state, where "
             "this trainer cannot restore them: resume it with the build that saved it",
             path);
    return -1;
  }
  *blob += 4;
  *blen -= 4;
  return 0;
}

int checkpoint_load(distro_comm *comm, const char *path, const ckpt_meta *meta, int64_t *step, gpt_model *m,
                    distro_optim *opt, uint64_t *rng_state, char *err, size_t errlen) {
  const int rank = distro_comm_rank(comm);
  size_t n = 0;
  const unsigned char *blob = NULL;
  uint64_t blen = 0;
  uint32_t version = 0;
  int ok = 0;
  err[0] = 0;
  unsigned char *buf = slurp(path, &n);
  if (!buf) {
    snprintf(err, errlen, "cannot read checkpoint '%s': %s", path, strerror(errno ? errno : EIO));
  } else if (parse(buf, n, path, meta, rank, step, m, rng_state, &blob, &blen, &version, err, errlen) == 0 &&
             (version != 2 || skip_shares(&blob, &blen, path, rank, err, errlen) == 0)) {
    /* This rank's optimizer state goes back through a file of its own. */
    char own[4200];
    snprintf(own, sizeof own, "%s.rank%d.load", path, rank);
    FILE *f = fopen(own, "wb");
    int wrote = f && fwrite(blob, 1, blen, f) == blen;
    if (f && fclose(f) != 0) wrote = 0;
    if (!wrote) {
      snprintf(err, errlen, "cannot write '%s': %s", own, strerror(errno ? errno : EIO));
    } else {
      distro_status s = distro_optim_load(opt, own);
      if (s != DISTRO_OK)
        snprintf(err, errlen, "loading the optimizer state from '%s': %s: %s", path, distro_status_string(s),
                 distro_last_error());
      else
        ok = 1;
    }
    unlink(own);
  }
  free(buf);
  return agree(comm, ok, err, errlen);
}
