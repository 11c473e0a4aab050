/* Parameter shape sets of the models the benchmarks and the demo talk about:
 * GPT-2 124M and the 1.2B Llama-2 of the DisTrO report. */
#ifndef DISTRO_BENCH_SHAPES_H
#define DISTRO_BENCH_SHAPES_H

#include <stdint.h>
#include <stdio.h>

typedef struct bench_tensor {
  char name[48];
  int ndim;          /* 1 or 2 */
  int64_t shape[2];
  int64_t numel;
  int64_t offset;    /* position in a flat buffer holding every tensor */
} bench_tensor;

typedef struct bench_model {
  const char *name;
  int layers;        /* transformer blocks actually in this set */
  int full_layers;   /* blocks of the real model */
  int ntensors;
  bench_tensor *t;
  int64_t nparams;
  /* Views for distro_payload_bytes: ndims[i], shapes[i] -> t[i].shape. */
  int *ndims;
  const int64_t **shapes;
} bench_model;

/* layers <= 0 or above the real count means the full model; a smaller value
 * keeps that many blocks (embeddings and head stay whole). 0 on success,
 * -1 if out of memory. */
int bench_model_gpt2_124m(bench_model *m, int layers);
int bench_model_llama_1b2(bench_model *m, int layers);
void bench_model_free(bench_model *m);

/* Parameters of `layers` blocks of the model, without building it. */
int64_t bench_gpt2_params(int layers);
int64_t bench_llama_params(int layers);

/* One line: name, blocks, tensors, parameters. */
void bench_model_print(const bench_model *m, FILE *f);

/* Chunk rule of docs/algorithms.md section 1, restated here so the demo can count
 * the reference format without the library's internals. */
int64_t bench_chunk_size(int64_t n, int64_t target);

/* Coefficients kept per step by DeMo with this chunk target and top-k:
 * sum over tensors of chunks * min(k, chunk elements). */
int64_t bench_kept_coefs(const bench_model *m, int64_t chunk, int64_t topk);

#endif
