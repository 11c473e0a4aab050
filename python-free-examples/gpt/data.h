/* The training text: loading, the train/validation split, each rank's shard
 * and batch sampling. Tokens are bytes. */
#ifndef GPT_DATA_H
#define GPT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "rng.h"

#define GPT_FORTUNES_DIR "/usr/share/games/fortunes"

/* Where a rank draws its windows from. */
typedef enum {
  GPT_SAMPLE_GLOBAL = 0, /* the whole training split, each rank with its own random stream (IID ranks) */
  GPT_SAMPLE_SHARD = 1   /* rank r: only the r-th contiguous 1/N of it (ranks see different text) */
} gpt_sampling;

typedef struct {
  uint8_t *bytes;
  size_t n;
  size_t ntrain;     /* bytes [0, ntrain) train, [ntrain, n) validate (the last ~5%) */
  char source[512];  /* what was loaded, for the log */
} gpt_corpus;

/* Loads `path`, or with path NULL the default corpus: the plain-text files of
 * Debian's fortunes package (GPT_FORTUNES_DIR; .dat and .u8 skipped),
 * concatenated in sorted order. On failure returns -1 with a message in err. */
int corpus_load(gpt_corpus *c, const char *path, char *err, size_t errlen);
void corpus_free(gpt_corpus *c);

/* 0 if the range every rank draws from and the validation split hold at
 * least one window of context+1 bytes; else -1 and a message naming the
 * minimum. */
int corpus_check(const gpt_corpus *c, int context, int world, gpt_sampling s, char *err, size_t errlen);

/* The part of the training split rank r draws from: [lo, hi). */
void corpus_shard(const gpt_corpus *c, int rank, int world, gpt_sampling s, size_t *lo, size_t *hi);

/* B windows of T+1 bytes drawn uniformly from [lo, hi): inputs are the first
 * T bytes of each, targets the last T. */
void corpus_sample(const gpt_corpus *c, size_t lo, size_t hi, gpt_rng *r, int B, int T, uint8_t *inputs,
                   uint8_t *targets);

/* Validation windows: consecutive, non-overlapping, T+1 bytes each. */
size_t corpus_val_windows(const gpt_corpus *c, int T);
void corpus_val_window(const gpt_corpus *c, size_t i, int T, uint8_t *inputs, uint8_t *targets);

#endif
