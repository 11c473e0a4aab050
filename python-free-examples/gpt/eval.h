/* Validation loss of the trainer's model: its own parameters, or a global
 * copy that DiLoCo or a decoupled learner holds. Collective over `comm`. */
#ifndef GPT_EVAL_H
#define GPT_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include <distro/distro.h>

#include "data.h"
#include "model.h"

/* Mean validation loss over `count` windows spread evenly over the split;
 * the windows are dealt round-robin to the ranks and the sums all-reduced.
 * inp and tgt hold a batch of windows. Returns NAN if the all-reduce failed. */
double evaluate(gpt_model *m, const gpt_corpus *d, distro_comm *comm, size_t count, uint8_t *inp, uint8_t *tgt);
/* The same for DiLoCo's global copy: the consensus model, the same on every
 * learner. The local parameters wait in `scratch` (nparams) meanwhile. */
double evaluate_global(gpt_model *m, distro_diloco *dl, real *scratch, const gpt_corpus *d, distro_comm *comm,
                       size_t count, uint8_t *inp, uint8_t *tgt);
#ifdef DISTRO_WITH_SYNC
/* The same for the global copy a decoupled learner last applied. */
double evaluate_learner(gpt_model *m, distro_learner *l, real *scratch, const gpt_corpus *d, distro_comm *comm,
                        size_t count, uint8_t *inp, uint8_t *tgt);
#endif

#endif
