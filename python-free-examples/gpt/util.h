/* Small helpers shared by the trainer's files: time, agreement across ranks,
 * human-readable figures, the names of the options. */
#ifndef GPT_UTIL_H
#define GPT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <distro/distro.h>

double gpt_now(void); /* seconds, monotonic */

/* Collective: every rank passes whether its part went well. Returns -1 if
 * all did, else the lowest rank that failed (the same on every rank), or -2
 * if the communicator itself failed. */
int first_failed_rank(distro_comm *comm, int ok);

/* "12.3 kB", "4.56 MB": decimal units. */
const char *fmt_bytes(char *buf, size_t n, double bytes);
/* "1:05" or "1:02:03". */
const char *fmt_duration(char *buf, size_t n, double seconds);

typedef enum {
  GPT_OPT_ADAMW,        /* baseline: gradient all-reduce + AdamW (DISTRO_ALG_ADAMW) */
  GPT_OPT_DISTRO,       /* DeMo: DCT + top-k momentum exchange, sign update */
  GPT_OPT_DISTRO_ADAMW, /* DisTrO-AdamW: the same exchange feeding AdamW */
  GPT_OPT_DILOCO,       /* DiLoCo: learners with one of the above inside, outer Nesterov step */
  GPT_OPT_DECOUPLED     /* Decoupled DiLoCo: this process is one learner of a job run by distro-syncer */
} gpt_optim_kind;

/* Names as the command line spells them ("adamw", "int8", ...). */
const char *optim_name(gpt_optim_kind k);
const char *values_name(distro_values v);
const char *outer_codec_name(distro_outer_codec k);
const char *merge_name(distro_merge k);
/* "int4 outer gradients", or for sparse ones "sparse int2 outer gradients
 * (2% of each 64x64 chunk, error feedback beta 0.95)"; returns buf. */
const char *outer_gradients_desc(const distro_diloco_options *o, char *buf, size_t n);

#endif
