/* --compare: the all-reduce baseline and the DisTrO variants on the same
 * data, seed and token budget; a table and a plot. */
#ifndef GPT_COMPARE_H
#define GPT_COMPARE_H

#include "train.h"

/* Which settings the user fixed on the command line (they then apply to
 * every variant); the others come from each variant's tuned defaults. */
typedef struct {
  int lr, warmup, topk, chunk, decay, values, wd;
  int inner, learners, ranks_per_learner, H, fragments, codec, outer_lr, outer_momentum; /* DiLoCo */
  int density, ef_beta, sparse_values; /* SparseLoCo */
} compare_overrides;

/* Runs the variants with `base` (steps, batch, model, seed, ...): adamw,
 * distro and distro-adamw, or with `all` every row. Rank 0 prints the table
 * (and with tsv_path writes it as data) and, with plot_path, renders it with
 * gnuplot. Returns 0, 1 if a run
 * failed, 2 if only the plot could not be made. */
int compare_run(const train_config *base, const compare_overrides *ov, const gpt_corpus *data, distro_comm *comm,
                const char *plot_path, const char *tsv_path, int all);

/* A row of the comparison: an optimizer with its tuned settings. */
typedef struct {
  const char *name;
  gpt_optim_kind optim;
  float lr;
  float warmup; /* fraction of the steps */
  int chunk, topk;
  float decay;
  distro_values values;
  /* DiLoCo rows: inner optimizer (its DisTrO settings are the ones above),
   * learners, inner steps between syncs, fragments, outer-gradient codec */
  gpt_optim_kind inner;
  int learners, H, fragments;
  distro_outer_codec codec;
  float outer_lr, outer_momentum;
  /* SparseLoCo rows: sparse outer gradients (chunk and DCT: the library's
   * defaults unless given) */
  distro_outer_compressor compressor;
  float density, ef_beta;
  distro_values sparse_values;
} variant;

/* The tuned settings of an optimizer (its first row in the comparison),
 * also the defaults of a single run. */
const variant *tuned_variant(gpt_optim_kind k);
/* The row called `name` (NULL if none): the defaults of --optim sparseloco. */
const variant *named_variant(const char *name);

/* Sets c's optimizer and those of its settings the user did not fix. */
void apply_variant(train_config *c, const variant *v, const compare_overrides *ov);

#endif
