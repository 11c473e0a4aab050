/* Validation loss (see eval.h). */
#include "eval.h"

#include <math.h>
#include <string.h>

#include "util.h"

double evaluate(gpt_model *m, const gpt_corpus *d, distro_comm *comm, size_t count, uint8_t *inp, uint8_t *tgt) {
  const int world = distro_comm_size(comm), rank = distro_comm_rank(comm);
  const int B = m->max_batch, T = m->cfg.context;
  const size_t nwin = corpus_val_windows(d, T);
  if (count > nwin) count = nwin;
  double sum = 0, tokens = 0;
  int b = 0;
  for (size_t k = (size_t)rank; k < count; k += (size_t)world) {
    corpus_val_window(d, k * nwin / count, T, inp + (size_t)b * T, tgt + (size_t)b * T);
    if (++b == B || k + (size_t)world >= count) {
      gpt_forward(m, inp, tgt, b, T);
      sum += gpt_loss_sum(m);
      tokens += (double)b * T;
      b = 0;
    }
  }
  float buf[2] = {(float)sum, (float)tokens};
  if (distro_comm_allreduce_sum(comm, buf, 2) != DISTRO_OK) return NAN;
  return buf[1] > 0 ? (double)buf[0] / buf[1] : NAN;
}

/* Validates a global copy, tensor by tensor from `get` (DiLoCo's or a
 * decoupled learner's); the local parameters wait in `scratch`. */
typedef distro_status (*get_global_fn)(void *src, const char *name, float *out, int64_t numel);
static double evaluate_copy(gpt_model *m, get_global_fn get, void *src, real *scratch, const gpt_corpus *d,
                            distro_comm *comm, size_t count, uint8_t *inp, uint8_t *tgt) {
  memcpy(scratch, m->params, sizeof(real) * m->nparams);
  double v = NAN;
  int ok = 1;
  for (int i = 0; ok && i < m->ntensors; i++) {
    const gpt_tensor *t = &m->tensors[i];
    ok = get(src, t->name, m->params + t->offset, (int64_t)t->numel) == DISTRO_OK;
  }
  if (first_failed_rank(comm, ok) == -1) v = evaluate(m, d, comm, count, inp, tgt);
  memcpy(m->params, scratch, sizeof(real) * m->nparams);
  return v;
}

static distro_status diloco_global(void *src, const char *name, float *out, int64_t numel) {
  return distro_diloco_get_global(src, name, out, numel);
}

double evaluate_global(gpt_model *m, distro_diloco *dl, real *scratch, const gpt_corpus *d, distro_comm *comm,
                       size_t count, uint8_t *inp, uint8_t *tgt) {
  return evaluate_copy(m, diloco_global, dl, scratch, d, comm, count, inp, tgt);
}

#ifdef DISTRO_WITH_SYNC
static distro_status learner_global(void *src, const char *name, float *out, int64_t numel) {
  return distro_learner_get_global(src, name, out, numel);
}

double evaluate_learner(gpt_model *m, distro_learner *l, real *scratch, const gpt_corpus *d, distro_comm *comm,
                        size_t count, uint8_t *inp, uint8_t *tgt) {
  return evaluate_copy(m, learner_global, l, scratch, d, comm, count, inp, tgt);
}
#endif
