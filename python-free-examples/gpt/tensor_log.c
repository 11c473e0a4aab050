/* gpt-train --tensor-log (tensor_log.h). */
#include "tensor_log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gpt_tensor_log {
  FILE *f;
  real *before;  /* the parameters before the logged step */
  double *grms;  /* each tensor's gradient RMS as the step received it */
};

gpt_tensor_log *gpt_tensor_log_open(const char *path, int append, const gpt_model *m, char *err, size_t errlen) {
  gpt_tensor_log *t = calloc(1, sizeof *t);
  if (t) t->before = malloc(m->nparams * sizeof *t->before);
  if (t) t->grms = calloc((size_t)m->ntensors, sizeof *t->grms);
  if (!t || !t->before || !t->grms) {
    snprintf(err, errlen, "--tensor-log: out of memory for a copy of %zu parameters", m->nparams);
    goto fail;
  }
  t->f = fopen(path, append ? "a" : "w");
  if (!t->f) {
    snprintf(err, errlen, "cannot open tensor log '%s'", path);
    goto fail;
  }
  if (fseek(t->f, 0, SEEK_END) == 0 && ftell(t->f) == 0) /* a new file (a resume appends) */
    fprintf(t->f, "step,tensor,numel,weight_rms,grad_rms,update_rms_over_lr\n");
  return t;
fail:
  if (t) {
    free(t->before);
    free(t->grms);
  }
  free(t);
  return NULL;
}

static double rms(const real *a, const real *b, size_t n) { /* of a - b, or of a when b is NULL */
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = b ? (double)a[i] - (double)b[i] : (double)a[i];
    s += d * d;
  }
  return n ? sqrt(s / (double)n) : 0.0;
}

void gpt_tensor_log_before(gpt_tensor_log *t, const gpt_model *m) {
  memcpy(t->before, m->params, m->nparams * sizeof *t->before);
  for (int k = 0; k < m->ntensors; k++) t->grms[k] = rms(m->grads + m->tensors[k].offset, NULL, m->tensors[k].numel);
}

int gpt_tensor_log_after(gpt_tensor_log *t, const gpt_model *m, int step, float lr) {
  for (int k = 0; k < m->ntensors; k++) {
    const gpt_tensor *x = &m->tensors[k];
    const real *p = m->params + x->offset, *q = t->before + x->offset;
    const double upd = rms(p, q, x->numel);
    fprintf(t->f, "%d,%s,%zu,%.6g,%.6g,%.6g\n", step, x->name, x->numel, rms(p, NULL, x->numel), t->grms[k],
            lr > 0 ? upd / (double)lr : NAN);
  }
  return ferror(t->f) ? -1 : 0;
}

int gpt_tensor_log_close(gpt_tensor_log *t) {
  if (!t) return 0;
  int rc = ferror(t->f) ? -1 : 0;
  if (fclose(t->f) != 0) rc = -1;
  free(t->before);
  free(t->grms);
  free(t);
  return rc;
}
