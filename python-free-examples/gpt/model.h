/* A byte-level GPT, llm.c style: one flat parameter buffer, one flat gradient
 * buffer of the same layout, a table of the tensors inside them, and forward
 * and backward passes written out by hand.
 *
 * Vocabulary: the 256 byte values (no tokenizer). Token and learned position
 * embeddings, pre-LayerNorm blocks (causal multi-head attention, GELU MLP),
 * a final LayerNorm and an output head that is the token embedding (tied) or
 * its own matrix.
 *
 * The code is written over `real`, float by default. Compiled with
 * -DGPT_DOUBLE it is float64 throughout (the gradient check uses that). */
#ifndef GPT_MODEL_H
#define GPT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef GPT_DOUBLE
typedef double real;
#else
typedef float real;
#endif

#define GPT_VOCAB 256

typedef struct {
  int context; /* maximum sequence length T (size of the position table) */
  int layers;
  int dim;     /* channels C */
  int heads;   /* C must be a multiple of heads */
  int tied;    /* 1: logits = lnf(x) . wte^T; 0: a separate head matrix */
} gpt_config;

/* One tensor inside the flat buffers: what the optimizer registers. */
typedef struct {
  char name[40];
  size_t offset, numel;
  int ndim;         /* 1 or 2 */
  int64_t shape[2]; /* (rows, cols) for matrices: out x in */
} gpt_tensor;

/* Pointers into a flat buffer (parameters or gradients) by role. */
typedef struct {
  real *ln1w, *ln1b;   /* (C) */
  real *qkvw, *qkvb;   /* (3C, C), (3C) */
  real *projw, *projb; /* (C, C), (C) */
  real *ln2w, *ln2b;   /* (C) */
  real *fcw, *fcb;     /* (4C, C), (4C) */
  real *fc2w, *fc2b;   /* (C, 4C), (C) */
} gpt_block;

typedef struct {
  real *wte;  /* (V, C) */
  real *wpe;  /* (T, C) */
  gpt_block *blocks;
  real *lnfw, *lnfb; /* (C) */
  real *head; /* (V, C): wte when tied */
} gpt_weights;

/* Activations of one forward pass, kept for the backward pass. Per-layer
 * arrays hold `layers` slices of B*T rows. */
typedef struct {
  real *encoded;                    /* (B,T,C) */
  real *ln1, *ln1_mean, *ln1_rstd;  /* (L,B,T,C), (L,B,T), (L,B,T) */
  real *qkv;                        /* (L,B,T,3C) */
  real *atty;                       /* (L,B,T,C) attention output before the projection */
  real *att;                        /* (L,B,NH,T,T) attention weights (after softmax) */
  real *attproj;                    /* (L,B,T,C) */
  real *res2;                       /* (L,B,T,C) residual after attention */
  real *ln2, *ln2_mean, *ln2_rstd;  /* (L,B,T,C), (L,B,T), (L,B,T) */
  real *fch, *fch_gelu;             /* (L,B,T,4C) */
  real *fcproj;                     /* (L,B,T,C) */
  real *res3;                       /* (L,B,T,C) residual after the MLP */
  real *lnf, *lnf_mean, *lnf_rstd;  /* (B,T,C), (B,T), (B,T) */
  real *logits, *probs;             /* (B,T,V) */
  real *losses;                     /* (B,T) */
} gpt_acts;

typedef struct {
  gpt_config cfg;
  int ntensors;
  gpt_tensor *tensors;
  size_t nparams;
  real *params, *grads; /* flat, nparams each */
  gpt_weights w, g;     /* views of params and grads */
  int max_batch;        /* activations are sized for max_batch x context */
  gpt_acts a, da;       /* activations and their gradients */
  real *acts_memory, *dacts_memory;
  /* the last forward pass */
  int B, T;
  const uint8_t *inputs, *targets;
  real loss;
} gpt_model;

/* Empty string if the configuration is usable; else why not. */
const char *gpt_config_problem(const gpt_config *c);

/* Allocates parameters, gradients and activations for batches of up to
 * max_batch sequences, and initialises the weights (GPT-2 scheme) from seed.
 * Returns 0, or -1 when out of memory. */
int gpt_init(gpt_model *m, const gpt_config *c, int max_batch, uint64_t seed);
void gpt_free(gpt_model *m);

/* Forward pass on B sequences of T bytes (B <= max_batch, T <= context).
 * With targets (B*T bytes) it returns the mean cross-entropy in nats per
 * byte and keeps what backward needs; without, it returns 0 and fills the
 * logits/probabilities only. */
real gpt_forward(gpt_model *m, const uint8_t *inputs, const uint8_t *targets, int B, int T);

/* Sum of the per-position losses of the last forward pass (for evaluation
 * over several batches). */
double gpt_loss_sum(const gpt_model *m);

void gpt_zero_grad(gpt_model *m);

/* Accumulates d(mean loss)/d(params) of the last forward pass into grads. */
void gpt_backward(gpt_model *m);
/* The same, calling ready(ctx, first, count) as soon as the gradients of
 * tensors [first, first + count) of the table are final, in the order
 * backward completes them (the last layers first, the embeddings last). */
typedef void (*gpt_grads_ready_fn)(void *ctx, int first, int count);
void gpt_backward_hooked(gpt_model *m, gpt_grads_ready_fn ready, void *ctx);

/* 64-bit FNV-1a over the parameter bytes: a cheap identity for parameters
 * (e.g. to compare MPI ranks with in-process ranks). */
uint64_t gpt_param_checksum(const gpt_model *m);

#endif
