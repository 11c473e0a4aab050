/* Per-tensor figures of a training run (gpt-train --tensor-log): every N
 * steps, for each tensor, the RMS of its weights after the step, of the
 * gradient the optimizer was given (after clipping) and of the update the
 * step made, in units of that step's lr. Written by rank 0 only; what a bad
 * run does differently shows here tensor by tensor (docs/design.md). */
#ifndef GPT_TENSOR_LOG_H
#define GPT_TENSOR_LOG_H

#include <stddef.h>

#include "model.h"

typedef struct gpt_tensor_log gpt_tensor_log;

/* Opens (or, with append, continues) the CSV at path for model m, which
 * stays the same model for the log's life. NULL with a message in err when
 * the file or its buffer cannot be had. */
gpt_tensor_log *gpt_tensor_log_open(const char *path, int append, const gpt_model *m, char *err, size_t errlen);

/* Call before the optimizer step of every step that logs: keeps the
 * parameters, to measure the update against. */
void gpt_tensor_log_before(gpt_tensor_log *t, const gpt_model *m);

/* Call after that step: one row per tensor. step counts from 1; a step of lr
 * 0 has no update ratio (nan). Returns 0, or -1 when the write failed. */
int gpt_tensor_log_after(gpt_tensor_log *t, const gpt_model *m, int step, float lr);

/* Flushes and closes; NULL is fine. Returns 0, or -1 when the file did not
 * reach the disk whole. */
int gpt_tensor_log_close(gpt_tensor_log *t);

#endif
